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


def stop_group(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM to the process group ``pid`` leads, SIGKILL if it outlives ``timeout_s``."""
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
