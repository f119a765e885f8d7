"""The code an instance runs: this checkout built as a wheel, with a lock of its dependencies.

The controller builds the project once per state of its source (the key is a hash of every
file the wheel holds), keeps the wheel in the checkout's ``.whl/`` (ignored by git), and uploads it with the
lock to the job's bucket under its SHA-256 (``<job URL>/code/<sha256>.whl``).  An instance's
startup script (``infra.bootstrap``) fetches it from there, checks the hash, installs it into
an environment over the image's framework and starts the agent, so the instance runs exactly
the controller's code whatever its image holds.

The wheel is built by setuptools (the project's own backend) from a copy of the sources, so
the checkout gets no ``build/`` or ``*.egg-info``; the copy carries ``sailor_core/_build.py``
with the source hash, which the startup script checks after installing (a stale Sailor in the
image that shadows the wheel is a version mismatch, reported, not run).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from infra import cache_dirs
from infra.errors import CloudConfigError
from sailor_core.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
WHEEL_CACHE = ROOT / ".whl"  # per checkout: every Sailor home and test run of it shares the builds
PACKAGES = ("sailor_core", "infra", "flows", "tasks")  # pyproject's [tool.setuptools.packages.find]
PACKAGE_DATA = (".json", ".csv", ".parquet", ".yaml")  # pyproject's [tool.setuptools.package-data]
DIST = "sailor"
BUILD_MODULE = "sailor_core/_build.py"
_lock = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeBundle:
    """The wheel and lock as uploaded to a job's bucket (keys relative to the job's URL)."""

    source_hash: str  # what sailor_core._build.SOURCE_HASH says once installed
    wheel_sha256: str
    wheel_key: str  # code/<wheel sha256>.whl
    wheel_name: str  # the wheel's file name (pip needs it to install the file)
    lock_key: str  # code/<wheel sha256>.lock: "name==version" per dependency
    version: str


def _wheel_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(root / pkg):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(".py") or name.endswith(PACKAGE_DATA):
                    files.append(Path(dirpath, name))
    return [f for f in files if f.relative_to(root).as_posix() != BUILD_MODULE]


def source_hash(root: Path = ROOT) -> str:
    """SHA-256 over pyproject.toml and every file the wheel holds (paths and contents)."""
    h = hashlib.sha256()
    for path in [root / "pyproject.toml", *_wheel_files(root)]:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1) if m else "0"


def build_wheel(cache_dir: Path | None = None) -> tuple[Path, str]:
    """(the wheel, its source hash), built once per state of the source and kept in ``cache_dir``."""
    cache = Path(cache_dir or WHEEL_CACHE)
    key = source_hash()
    with _lock:
        done = cache / key
        wheels = sorted(done.glob("*.whl")) if done.is_dir() else []
        if wheels:
            cache_dirs.mark_used(done)
            return wheels[0], key
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="sailor-wheel-", dir=cache) as tmp:
            src = Path(tmp) / "src"
            for path in [ROOT / "pyproject.toml", ROOT / "README.md", *_wheel_files()]:
                target = src / path.relative_to(ROOT)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            (src / BUILD_MODULE).write_text(
                '"""Written when the wheel is built (infra/code.py): the hash of the source it holds."""\n'
                f'SOURCE_HASH = "{key}"\n')
            out = Path(tmp) / "out"
            cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                   "--disable-pip-version-check", "-q", "-w", str(out), str(src)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
            if proc.returncode != 0:
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
                raise CloudConfigError(f"could not build Sailor's wheel for the instances: {tail}")
            built = sorted(out.glob("*.whl"))
            staged = Path(tmp) / key
            staged.mkdir()
            shutil.move(str(built[0]), staged / built[0].name)
            try:
                os.replace(staged, done)  # atomic: a concurrent builder finds a whole directory or none
            except OSError:  # another process (a test worker, a second controller) got there first
                if not any(done.glob("*.whl")):
                    raise
        cache_dirs.prune(cache)  # a new state of the source: the oldest idle builds go
        return next(done.glob("*.whl")), key


def dependency_lock(dist: str = DIST) -> str:
    """``name==version`` for every installed distribution ``dist`` needs (transitively), sorted."""
    seen: dict[str, str] = {}
    todo = [dist]
    while todo:
        name = todo.pop()
        try:
            meta = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        canonical = re.sub(r"[-_.]+", "-", meta.metadata["Name"]).lower()
        if canonical in seen:
            continue
        seen[canonical] = meta.version
        for req in meta.requires or ():
            if "extra ==" in req:  # optional extras are not installed for the instances
                continue
            todo.append(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0])
    seen.pop(DIST, None)
    return "".join(f"{name}=={version}\n" for name, version in sorted(seen.items()))


def upload_code(job_url: str, *, cache_dir: Path | None = None) -> CodeBundle:
    """Build (or reuse) the wheel and put it and its lock under ``<job_url>/code/``; idempotent."""
    wheel, key = build_wheel(cache_dir)
    data = wheel.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    store = open_storage(job_url)
    wheel_key, lock_key = f"code/{digest}.whl", f"code/{digest}.lock"
    if not store.exists(wheel_key) or store.size(wheel_key) != len(data):
        store.put_atomic(wheel_key, data)
    if not store.exists(lock_key):
        store.put_atomic(lock_key, dependency_lock().encode())
    return CodeBundle(source_hash=key, wheel_sha256=digest, wheel_key=wheel_key, wheel_name=wheel.name,
                      lock_key=lock_key, version=_version())
