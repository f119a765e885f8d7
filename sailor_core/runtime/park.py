"""Parked workers: survivors of a generation keep their process and training state for the next.

Restarting a generation from scratch costs every rank a new process (interpreter, torch,
CUDA context), a rendezvous and a checkpoint read.  When the agent stops a generation it
asks its workers to *park* (``SIGNAL``): the ranks agree on a step, checkpoint it as for a
preemption notice, leave the process group and wait, model and optimizer state in memory.
A worker that was itself given the notice (SIGTERM: its instance is going away) exits as
before.  Each parked worker writes ``<pid>.parked.json`` in the agent's park directory; for
the next generation the agent writes ``<pid>.handover.json``: the worker's new arguments and
environment (it joins the new process group and, where it holds the same shard at the
checkpoint's step, keeps its state instead of reading it), or ``exit``.

Standby workers are parked from the start: the agent starts one per GPU at boot
(``python -m sailor_core.runtime.worker --standby``), each imports the engine, creates its
device context and parks without state (``STANDBY_RANK``), so an instance's first assignment is
a handover like a survivor's rejoin instead of a process start after the VM runs.

Files are written whole (a temporary file, then a rename), so a reader never sees half of
one.  No torch here: the agent imports this module.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SIGNAL = signal.SIGUSR1  # agent -> worker: stop at the next agreed step, checkpoint, park
POLL_S = 0.05
STANDBY_RANK = -1  # a standby worker's note: parked before any generation, no state


@dataclass(frozen=True, slots=True, kw_only=True)
class Parked:
    """What a parked worker tells its agent."""

    pid: int
    rank: int         # its rank in the generation it left
    local_rank: int   # its GPU on the instance: a handover keeps it
    step: int         # the step its state is at (the checkpoint it saved)


@dataclass(frozen=True, slots=True, kw_only=True)
class Handover:
    """The agent's answer: the next generation's worker arguments and environment, or exit."""

    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: str | None = None  # the new generation's log file (stdout and stderr move there)
    exit: bool = False


def parked_path(park_dir: str | Path, pid: int) -> Path:
    return Path(park_dir) / f"{pid}.parked.json"


def handover_path(park_dir: str | Path, pid: int) -> Path:
    return Path(park_dir) / f"{pid}.handover.json"


def _write_whole(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def write_parked(park_dir: str | Path, parked: Parked) -> None:
    _write_whole(parked_path(park_dir, parked.pid),
                 {"pid": parked.pid, "rank": parked.rank, "local_rank": parked.local_rank, "step": parked.step})


def read_parked(park_dir: str | Path, pid: int) -> Parked | None:
    """The worker's note, once it has parked (None before)."""
    try:
        doc = json.loads(parked_path(park_dir, pid).read_text())
    except (OSError, ValueError):
        return None
    return Parked(pid=int(doc["pid"]), rank=int(doc["rank"]), local_rank=int(doc["local_rank"]),
                  step=int(doc["step"]))


def write_handover(park_dir: str | Path, pid: int, handover: Handover) -> None:
    parked_path(park_dir, pid).unlink(missing_ok=True)  # the note is answered
    _write_whole(handover_path(park_dir, pid), {"argv": list(handover.argv), "env": dict(handover.env),
                                                "log_path": handover.log_path, "exit": handover.exit})


def wait_handover(park_dir: str | Path, pid: int, *, stopped: Callable[[], bool],
                  parent_pid: int | None = None) -> Handover | None:
    """Wait for the agent's handover; None (exit) when told to, when ``stopped()`` (SIGTERM: the
    instance is going away) or when the agent that started this worker is gone."""
    path = handover_path(park_dir, pid)
    while not stopped():
        if parent_pid is not None and os.getppid() != parent_pid:
            return None
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(POLL_S)
            continue
        path.unlink(missing_ok=True)
        # a standby worker may write its note after the agent answered it: none outlives the answer
        parked_path(park_dir, pid).unlink(missing_ok=True)
        if doc.get("exit"):
            return None
        return Handover(argv=tuple(doc["argv"]), env=dict(doc["env"]), log_path=doc.get("log_path"))
    return None
