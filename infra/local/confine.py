"""Embedded instances confined as VMs are: their own user, PID and mount namespaces, their own files.

A confined instance (root, with util-linux's ``unshare``, ``setpriv`` and ``chroot``) runs as
``unshare --pid --fork --mount`` (inside its network namespace when the network has one) of a
short shell script, PID 1 of the instance, that builds the instance's file system on an empty
tmpfs and starts the startup script in it, dropped to the instance's own user:

* read-only: the system's programs and libraries (``/usr``, ``/bin``, ``/lib*``, ``/sbin``),
  ``/etc`` with ``shadow``/``gshadow`` masked and ``passwd``/``group`` naming root, the
  instance's user and nobody only, and the image (its Python, the interpreter's files and
  the site-packages they link to);
* read-write: the instance's root (its HOME, working and temporary directory, owned by its
  user), a fresh ``/tmp`` and ``/dev/shm`` (tmpfs: torch's shared memory), and the trace file
  when audited;
* a fresh ``/proc`` of its PID namespace (no process of the host or of another instance),
  ``/sys`` read-only, ``/dev`` with null, zero, full, random, urandom, tty (and the host's
  ``nvidia*`` devices where it has them);
* then ``chroot`` and ``setpriv`` to a uid of its own (``UID_BASE`` up: no user of this
  machine), with no supplementary groups, no capabilities (bounding and inheritable sets
  emptied) and ``no_new_privs``: it cannot mount, enter another namespace (``nsenter``, ``ip
  netns exec``), trace or signal a process of another user, or regain privileges by a set-uid
  program.

PID 1 (the script, as root, outside the chroot) only waits: the kernel drops signals it has no
handler for, so the cloud's SIGTERM of the group reaches the startup script and not it, and its
end (the startup script's end, or SIGKILL) takes every process of the instance with it.

Without root or namespaces the instance runs unconfined (``SAILOR_EMBEDDED_CONFINE``, said in one
line at start): a process group of this user, separated by nothing but its working directory
and environment.  Why util-linux over bubblewrap or nsjail: docs/clouds.md.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from sailor_core import settings
from sailor_core.errors import InputError

log = logging.getLogger("sailor.infra.local")

_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_MASKED = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
UID_BASE = 1_000_000_000  # above any distribution's users and the usual subordinate-id ranges
_UIDS_PER_CLOUD = 256  # a cloud's instances cycle through these (pid-keyed: clouds of one machine differ)
USER_NAME = "sailor"
_TOOLS = ("unshare", "setpriv", "chroot", "mount")


def confine_unavailable() -> str | None:
    """Why this machine cannot confine instances, or None when it can."""
    if os.geteuid() != 0:
        return "not root"
    for tool in _TOOLS:
        if shutil.which(tool) is None:
            return f"no {tool} command (util-linux)"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount", "true"], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0:
        return f"no PID and mount namespaces here ({probe.stderr.strip()[:200]})"
    return None


def choose_confined() -> bool:
    """Whether this cloud's instances are confined (``SAILOR_EMBEDDED_CONFINE``), saying so in one
    line where the machine falls back to unconfined instances."""
    mode = settings.embedded_confine()
    if mode not in ("auto", "on", "off"):
        raise InputError(f"{settings.EMBEDDED_CONFINE_ENV}={mode!r}: expected auto, on or off")
    if mode == "off":
        return False
    why = confine_unavailable()
    if why and mode == "on":
        raise InputError(f"{settings.EMBEDDED_CONFINE_ENV}=on but instances cannot be confined here: {why}")
    if why:
        log.warning("embedded cloud: instances run unconfined, as this user with its view of the machine (%s)", why)
        return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Jail:
    """One instance's confinement: its user and what it sees."""

    uid: int
    root: Path  # the instance's disk: read-write, its user's
    directory: Path  # the hypervisor's folder of the instance (the script, passwd, the mount point)
    read_only: tuple[Path, ...]
    writable_files: tuple[Path, ...] = ()

    @property
    def mount_point(self) -> Path:
        return self.directory / "fs"

    @property
    def script(self) -> Path:
        return self.directory / "confine.sh"


def _outermost(paths: list[Path]) -> tuple[Path, ...]:
    """``paths`` without those inside another (binding the outer one shows them)."""
    kept: list[Path] = []
    for p in sorted({Path(os.path.normpath(p)) for p in paths}, key=lambda p: len(p.parts)):
        if not any(p == k or k in p.parents for k in kept):
            kept.append(p)
    return tuple(kept)


def image_paths(image) -> tuple[Path, ...]:
    """The image's folders an instance reads: its own, the interpreter's and what its
    site-packages' links point into (a venv whose packages are links into another one)."""
    found = [Path(p) for p in image.read_only_paths()]
    for entry in image.backing_dir.iterdir():
        if entry.is_symlink():
            found.append(entry.resolve().parent)
    return _outermost(found)


class Confinement:
    """The jails of one cloud's instances: a uid each, the image read-only to all; thread-safe."""

    def __init__(self, image) -> None:
        # no image: the instance runs this interpreter (SAILOR_PYTHON), so its environment is read-only to it
        self.read_only = image_paths(image) if image is not None else _outermost([Path(sys.base_prefix),
                                                                                   Path(sys.prefix)])
        self._first_uid = UID_BASE + (os.getpid() % 4_194_304) * _UIDS_PER_CLOUD  # pid_max is at most 2**22
        self._next = 0
        self._lock = threading.Lock()

    def _uid(self) -> int:
        with self._lock:
            n, self._next = self._next, self._next + 1
        return self._first_uid + n % _UIDS_PER_CLOUD

    def prepare(self, directory: Path, root: Path, *, writable_files: tuple[Path, ...] = ()) -> Jail:
        """The instance's jail: its user owns its root (and ``writable_files``); the script that
        builds its file system is written beside."""
        jail = Jail(uid=self._uid(), root=root, directory=directory, read_only=self.read_only,
                    writable_files=writable_files)
        jail.mount_point.mkdir(mode=0o700, exist_ok=True)
        for path in writable_files:
            path.touch()
        for path in (root, root / "tmp", *writable_files):
            os.chown(path, jail.uid, jail.uid)
        (directory / "passwd").write_text(
            f"root:x:0:0:root:/root:/usr/sbin/nologin\n{USER_NAME}:x:{jail.uid}:{jail.uid}:instance:{root}:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        (directory / "group").write_text(f"root:x:0:\n{USER_NAME}:x:{jail.uid}:\nnogroup:x:65534:\n")
        jail.script.write_text(setup_script(jail))
        return jail

    @staticmethod
    def wrap(jail: Jail, argv: list[str]) -> list[str]:
        """``argv`` run confined in ``jail``."""
        return [_tool("unshare"), "--pid", "--fork", "--mount", "--propagation", "private", "--",
                "/bin/sh", str(jail.script), *argv]


def _tool(name: str) -> str:
    """Where this machine's ``name`` is (the instance's PATH is its own: no ``sbin``)."""
    return shutil.which(name) or name


def _system_dirs() -> list[str]:
    return [p for p in _SYSTEM if os.path.isdir(p) and not os.path.islink(p)]


def _system_lines() -> list[str]:
    lines = [f'ln -s {shlex.quote(os.readlink(p))} "$R"{p}' for p in _SYSTEM if os.path.islink(p)]  # merged /usr
    lines += [f"ro {p}" for p in _system_dirs()]
    lines += [f'mount --bind /dev/null "$R"{p}' for p in _MASKED if os.path.exists(p)]
    return lines


def _device_lines() -> list[str]:
    names = [*_DEVICES, *sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))]
    names = [n for n in names if os.path.exists(f"/dev/{n}") and not os.path.isdir(f"/dev/{n}")]
    lines = ['mount -t tmpfs -o mode=755,size=64k,nosuid tmpfs "$R/dev"',
             'mkdir "$R/dev/shm" && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"']
    lines += [f': > "$R/dev/{n}" && mount --bind /dev/{n} "$R/dev/{n}"' for n in names]
    lines += [f'ln -s {target} "$R/dev/{name}"' for name, target in
              (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
               ("stderr", "/proc/self/fd/2"))]
    return lines


def setup_script(jail: Jail) -> str:
    """PID 1 of the instance: builds its file system, starts ``"$@"`` in it as its user, waits.
    Each line is a process or two, and the instance's boot waits for them all: few of them."""
    q = shlex.quote
    system = [Path(d) for d in _system_dirs()]
    read_only = [p for p in jail.read_only if not any(p == d or d in p.parents for d in system)]  # e.g. /usr/lib/python3
    mount_points = [*map(str, system), *map(str, read_only), str(jail.root),
                    *(str(f.parent) for f in jail.writable_files), "/proc", "/sys", "/dev"]
    lines = [
        "# PID 1 of an embedded instance (infra/local/confine.py): its file system, then its program, confined",
        "set -eu",
        "umask 022",
        'INSTANCE_PATH="$PATH"',
        f"PATH={q(os.pathsep.join(sorted({os.path.dirname(_tool(t)) for t in _TOOLS})))}:/usr/bin:/bin",
        f"R={q(str(jail.mount_point))}",
        'ro() { mount -o bind,ro,nosuid,nodev "$1" "$R$1"; }',
        'rw() { mount -o bind,nosuid,nodev "$1" "$R$1"; }',
        'mount -t tmpfs -o mode=755,size=1m tmpfs "$R"',
        # /tmp first: a checkout, an image or a root under /tmp is then mounted inside it, not hidden by it
        'mkdir "$R/tmp" && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"',
        "mkdir -p " + " ".join(f'"$R"{q(p)}' for p in mount_points),
        *_system_lines(),
        f'mount --bind {q(str(jail.directory / "passwd"))} "$R/etc/passwd"',
        f'mount --bind {q(str(jail.directory / "group"))} "$R/etc/group"',
        *(f"ro {q(str(p))}" for p in read_only),
        f"rw {q(str(jail.root))}",
        *(f': > "$R"{q(str(f))} && mount --bind {q(str(f))} "$R"{q(str(f))}' for f in jail.writable_files),
        'mount -t proc -o nosuid,nodev,noexec proc "$R/proc"',
        'mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"',
        *_device_lines(),
        'mount -o remount,ro "$R"',
        "set +e",
        'PATH="$INSTANCE_PATH"',
        f'{_tool("chroot")} "$R" {_tool("setpriv")} --reuid {jail.uid} --regid {jail.uid} --clear-groups --inh-caps=-all '
        f"--bounding-set=-all --no-new-privs -- /bin/sh -c 'cd \"$0\" && exec \"$@\"' {q(str(jail.root))} \"$@\" &",
        "child=$!",
        # PID 1 ignores the signals it has no handler for; it waits for the program and leaves with it
        'while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || exit "$rc"; done',
    ]
    return "\n".join(lines) + "\n"


def host_pid(instance_id: str, pid: int) -> int | None:
    """This machine's pid of the live process that embedded instance ``instance_id`` numbers
    ``pid`` (what its agent reports: in its own PID namespace when confined, the same number when
    not), found by its environment's instance id; None when no such process lives.  For tests and
    harnesses that signal or watch an instance's workers from outside, as no real cloud lets one."""
    marker = f"{settings.INSTANCE_ID_ENV}={instance_id}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as fh:
                nspid = next((line.split()[1:] for line in fh if line.startswith("NSpid:")), [])
            if not nspid or int(nspid[-1]) != pid:
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    return int(entry.name)
        except (OSError, ValueError):
            continue
    return None
