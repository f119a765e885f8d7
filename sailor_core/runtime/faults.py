"""Fault injection for tests and chaos trials: one hook, ``at``, at named points of the hot paths.

The engine calls ``at(POINT, **where)`` where a fault may strike; with nothing configured
(every real run) it returns at once.  Two faults exist:

- a kill: one worker rank SIGKILLs itself (a real process death, not an exception) at a
  point of one step: ``MID_STEP`` (after the step's first forward, while its peers are in
  the step's collectives) or ``BEFORE_COMMIT`` (after it wrote its layer files of that
  step's checkpoint, before the manifest commits it);
- an upload fault: the next checkpoint file upload (``UPLOAD``) is delayed or fails.  It is
  armed at run time (``arm_upload``) by writing a small file that the first upload to see
  it claims, so exactly one rank of all the running workers takes it; or, armed with
  ``every``, a slow store: every upload of every rank waits, unclaimed, while the file exists.

A parent passes the configuration to its workers in the environment (``FaultConfig.to_env``;
the variables are named in ``sailor_core.settings``); a worker reads it once, at its first
``at``.  Tests in one process set it with ``injected``.  Stdlib only: the agent and the
flow import this without torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sailor_core import settings
from sailor_core.errors import InputError

# The named points, and what ``where`` carries at each.
MID_STEP = "mid_step"            # rank, step: the step being run (1-based), after its first forward
BEFORE_COMMIT = "before_commit"  # rank, step: this rank's layer files of the step's checkpoint are written
UPLOAD = "upload"                # path: the checkpoint file about to be uploaded
POINTS = (MID_STEP, BEFORE_COMMIT, UPLOAD)
KILL_POINTS = (MID_STEP, BEFORE_COMMIT)

_SAVE_SUFFIX = "save"  # "RANK:STEP:save" in the environment means BEFORE_COMMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill:
    """Worker ``rank`` SIGKILLs itself at ``point`` of step ``step``."""

    rank: int
    step: int
    point: str = MID_STEP

    def __post_init__(self) -> None:
        if self.point not in KILL_POINTS:
            raise InputError(f"a kill strikes at {' or '.join(KILL_POINTS)}, not {self.point!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultConfig:
    """What may strike a run: a kill, and where armed upload faults wait (``arm_upload``)."""

    kill: Kill | None = None
    upload_file: str | None = None

    @property
    def empty(self) -> bool:
        return self.kill is None and not self.upload_file

    def to_env(self) -> dict[str, str]:
        """The environment that gives a worker this configuration."""
        env = {}
        if self.kill is not None:
            suffix = f":{_SAVE_SUFFIX}" if self.kill.point == BEFORE_COMMIT else ""
            env[settings.FAULT_KILL_ENV] = f"{self.kill.rank}:{self.kill.step}{suffix}"
        if self.upload_file:
            env[settings.FAULT_UPLOAD_ENV] = str(self.upload_file)
        return env

    @classmethod
    def from_env(cls) -> FaultConfig:
        return cls(kill=_parse_kill(settings.fault_kill()), upload_file=settings.fault_upload() or None)


def _parse_kill(text: str) -> Kill | None:
    if not text:
        return None
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != _SAVE_SUFFIX):
            raise ValueError
        point = BEFORE_COMMIT if len(parts) == 3 else MID_STEP
        return Kill(rank=int(parts[0]), step=int(parts[1]), point=point)
    except ValueError:
        raise InputError(f"{settings.FAULT_KILL_ENV} must be RANK:STEP or RANK:STEP:save, got {text!r}") from None


_UNREAD = object()
_config: FaultConfig | None | object = _UNREAD  # None: nothing configured


def _load() -> FaultConfig | None:
    global _config
    config = FaultConfig.from_env()
    _config = None if config.empty else config
    return _config


def active() -> bool:
    """Whether any fault is configured (lets a caller skip building a hook it would not need)."""
    config = _config if _config is not _UNREAD else _load()
    return config is not None


def at(point: str, **where) -> None:
    """The hook: apply whatever fault is configured for ``point`` here (``where``: see the points)."""
    config = _config if _config is not _UNREAD else _load()
    if config is None:
        return
    assert point in POINTS, point
    kill = config.kill
    if kill is not None and point == kill.point and where.get("rank") == kill.rank \
            and where.get("step") == kill.step:
        os.kill(os.getpid(), signal.SIGKILL)
    if point == UPLOAD and config.upload_file:
        _take_armed_upload_fault(config.upload_file)


def _take_armed_upload_fault(path: str) -> None:
    if not os.path.exists(path):
        return
    try:
        with open(path) as fh:
            slow = json.load(fh)
    except (OSError, ValueError):
        return
    if slow.get("every"):  # a slow store: every upload waits while the file exists
        time.sleep(float(slow.get("delay_s", 0.0)))
        return
    claimed = f"{path}.claimed-{os.getpid()}"
    try:
        os.rename(path, claimed)  # atomic: of all the ranks polling it, one takes the fault
        with open(claimed) as fh:
            fault = json.load(fh)
    except (OSError, ValueError):
        return
    time.sleep(float(fault.get("delay_s", 0.0)))
    if fault.get("fail"):
        raise OSError("injected checkpoint upload failure")


def arm_upload(path: str | Path, *, delay_s: float = 0.0, fail: bool = False, every: bool = False) -> dict:
    """Make the next upload of a run whose ``upload_file`` is ``path`` wait ``delay_s``, then fail if asked
    (``every``: every upload waits ``delay_s``, until the file is removed: a slow store).

    Written atomically, so no upload ever reads half of it.  Returns the fault as written.
    """
    if every and fail:
        raise InputError("a slow store delays every upload; a failure is armed for one")
    fault = {"fail": True} if fail else {"delay_s": float(delay_s), **({"every": True} if every else {})}
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(fault))
    tmp.replace(path)
    return fault


@contextlib.contextmanager
def injected(config: FaultConfig) -> Iterator[None]:
    """In this process only, for the ``with`` block: the faults of ``config`` instead of the environment's."""
    global _config
    saved = _config
    _config = None if config.empty else config
    try:
        yield
    finally:
        _config = saved
