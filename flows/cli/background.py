"""Processes the CLI leaves running after it exits (the local Prefect server, a worker).

Each runs in its own session (a Ctrl-C in the terminal that started it does not reach it),
writes its output to a log file, and is recorded in a small JSON file, so a later command
finds it and ``sailor ui --stop`` stops its whole process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path


def read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_record(path: Path, record: dict) -> None:
    """Written aside and renamed: a reader never sees half a record."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def start(cmd: list[str], *, env: dict[str, str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def pid_alive(pid: int) -> bool:
    """A live process (not a zombie) with this id."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, children first (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo += children.get(child, ())
    return out


def stop_group(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM to the process group ``pid`` leads, SIGKILL if it outlives ``timeout_s``; then the same
    for the groups of its descendants in other sessions (a worker's flow runs start their own)."""
    if pid <= 0:
        return
    below = descendants(pid)
    _stop_one_group(pid, timeout_s)
    for group in dict.fromkeys(_pgid(p) for p in below):
        if group not in (None, pid):
            _stop_one_group(group, timeout_s)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _stop_one_group(pid: int, timeout_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if not pid_alive(pid):
            return
