"""The embedded cloud's machine image: Python with the framework, without Sailor.

A GPU image (an AWS Deep Learning AMI, a GCP Deep Learning VM) brings Python, torch and the
usual libraries, not Sailor: the instance installs Sailor's wheel from the job's bucket.  The
embedded image is the same thing made from what this machine has: a venv of the base
interpreter whose site-packages point at a directory of links to the controller's
site-packages, less Sailor's own entries (the editable install that would put the checkout on
``sys.path``).  So the instance gets the framework read-only and Sailor only from its wheel.
Beside it: ``bin/nvidia-smi``, a stand-in that lists the GPUs the embedded "hardware" has
(``SAILOR_EMBEDDED_GPUS``), and ``envs/``, the environments instances make per wheel.

Made once per controller environment, inside it (``.venv/sailor-embedded-image/<key>``: it goes
with the environment it is made from), and reused by later clouds and test runs.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra import cache_dirs


_OUR_PACKAGES = frozenset({"sailor_core", "infra", "flows", "tasks"})

NVIDIA_SMI = """#!/bin/sh
# The embedded image's nvidia-smi: lists the GPUs of the embedded instance (SAILOR_EMBEDDED_GPUS = "N NAME").
set -- ${SAILOR_EMBEDDED_GPUS:-0 none}
n=$1; name=$2
[ "$n" -gt 0 ] 2>/dev/null || { echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9; }
i=0; while [ $i -lt "$n" ]; do echo "NVIDIA $name"; i=$((i+1)); done
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    root: Path
    python: Path  # the image's Python (SAILOR_PYTHON of its instances)
    bin_dir: Path  # on the instances' PATH after the image Python's bin: nvidia-smi
    site_dir: Path  # the framework: links to the controller's site-packages, Sailor left out
    env_cache: Path  # SAILOR_ENV_CACHE: environments made per wheel, shared by the instances
    base_prefix: Path  # the interpreter's own files (the stdlib)
    backing_dir: Path  # what the links of site_dir point into

    def read_only_paths(self) -> tuple[Path, ...]:
        """Where an instance's processes may read outside their root: the image itself, and where
        the backing site-packages' own links lead (a checkout whose venv links another's packages:
        importing torch resolves its real path there)."""
        return (self.root, self.base_prefix, self.backing_dir, *_link_targets(self.backing_dir))


@functools.cache
def _link_targets(directory: Path) -> tuple[Path, ...]:
    """The folders that ``directory``'s symbolic links point into (once per process: an audit asks
    for every line of a trace)."""
    return tuple(sorted({entry.resolve().parent for entry in directory.iterdir() if entry.is_symlink()}))


def _ours(entry: Path) -> bool:
    """Sailor's own entries: its packages, its dist-info, the editable install's finder and .pth."""
    name = entry.name
    return (name in _OUR_PACKAGES or name.startswith("__editable__")
            or (name.startswith("sailor-") and name.endswith((".dist-info", ".egg-info")))
            or (entry.suffix == ".pth" and _mentions_checkout(entry)))


def image_key(purelib: Path) -> str:
    """The image's name: the environment it links and what that holds.  Its entries' names count
    (a package's dist-info names its version), so installing or upgrading a package, as a new
    Sailor with a new dependency does, makes a new image instead of one that lacks it (its
    instances would then try to download the package at boot)."""
    entries = sorted(e.name for e in purelib.iterdir() if e.name != "__pycache__" and not _ours(e))
    return hashlib.sha256("\0".join([str(purelib), sys.version, *entries]).encode()).hexdigest()[:16]


def image_for_this_machine(home: Path | None = None) -> Image:
    """The image, made the first time (a second or so) in this environment (or under ``home``)."""
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    key = image_key(purelib)
    root = Path(home or Path(sys.prefix) / "sailor-embedded-image") / key
    image = Image(root=root, python=root / "python" / "bin" / "python3", bin_dir=root / "bin",
                  site_dir=root / "site-packages", env_cache=root / "envs", base_prefix=Path(sys.base_prefix),
                  backing_dir=purelib)
    if (root / ".complete").exists():
        root.chmod(0o755)  # made by mkdtemp (0700) before instances ran as users of their own
        cache_dirs.prune(image.env_cache)  # one environment per wheel the instances installed
        return image
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{key}.tmp-", dir=root.parent))
    tmp.chmod(0o755)  # confined instances run as users of their own (infra/local/confine.py)
    try:
        site = tmp / "site-packages"
        site.mkdir()
        for entry in sorted(purelib.iterdir()):
            if entry.name == "__pycache__" or _ours(entry):
                continue
            (site / entry.name).symlink_to(entry)
        subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(tmp / "python")], check=True,
                       capture_output=True)
        venv_site = subprocess.run([str(tmp / "python" / "bin" / "python3"), "-c",
                                    "import site; print(site.getsitepackages()[0])"],
                                   check=True, capture_output=True, text=True).stdout.strip()
        # A .pth line that is a path adds it to sys.path without running the .pth files in it.
        Path(venv_site, "_sailor_image.pth").write_text(f"{root / 'site-packages'}\n")
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
        (bin_dir / "nvidia-smi").chmod(0o755)
        (tmp / "envs").mkdir()
        (tmp / ".complete").touch()
        try:
            os.rename(tmp, root)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return image


def _mentions_checkout(pth: Path) -> bool:
    root = Path(__file__).resolve().parents[2]
    try:
        return str(root) in pth.read_text() or "__editable__" in pth.read_text()
    except OSError:
        return True

