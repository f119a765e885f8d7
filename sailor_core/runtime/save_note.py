"""A stopping worker's note of its saves' progress, so its agent waits while they progress.

When the agent stops a generation (a plan change's park, a stop, the UI's cancel), each worker
first lets the checkpoint write in flight commit (it holds the newest state no older than one
interval), then writes the stop's own.  On a slow store both take longer than any fixed grace, and
a kill in the middle loses both: up to two intervals.  So the agent does not kill on a fixed
timer: each worker writes a note (``<log dir>/rank<R>.save.json``, named by the agent in
``SAILOR_SAVE_NOTE``) after every piece of every write (staged, each file, the commit) and when
its stop's saves begin and end, with how long one piece has taken it at most (``expected_s``:
a slow store gives a long one).  A worker blocked behind the write in flight (at most one is)
sees the stop only after it, but its note moves meanwhile.  The agent waits while some worker's
note moves, up to ``grace_s + 2 * expected_s`` after its last move, and never past a hard bound
(``StopWait``): a worker that makes no progress is killed as before.

Written whole (a temporary file, then a rename).  No torch here: the agent imports this module.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

STAGED, FILE, COMMITTED = "staged", "file", "committed"  # what the checkpoint writer reports


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveNote:
    """What a stopping worker tells its agent about its saves."""

    progress: int  # pieces of writes done by this worker in this generation, and its stop's start
    expected_s: float  # the longest a piece has taken this worker so far
    done: bool = False  # its stop's saves are over (it parks or exits next)


def note_path(log_dir: str | Path, rank: int) -> Path:
    return Path(log_dir) / f"rank{rank}.save.json"


def write_note(path: str | Path, note: SaveNote) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"progress": note.progress, "expected_s": note.expected_s, "done": note.done}))
    os.replace(tmp, path)


def read_note(path: str | Path) -> SaveNote | None:
    """The worker's note, once its stop save has begun (None before, or unreadable)."""
    try:
        doc = json.loads(Path(path).read_text())
        return SaveNote(progress=int(doc["progress"]), expected_s=float(doc["expected_s"]), done=bool(doc["done"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class SaveProgress:
    """The worker's side: times and notes every piece of every write (``on_write``, from the
    training thread or the writer's), and a stop's saves beginning and ending."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._mark_s: float | None = None  # when the current write's last piece ended
        self._slowest_s = 0.0
        self._progress = 0

    def on_write(self, what: str) -> None:
        """A write's piece is done: ``STAGED`` (it begins), a ``FILE`` written, ``COMMITTED`` (it ends)."""
        with self._lock:
            now = time.monotonic()
            if what != STAGED and self._mark_s is not None:
                self._slowest_s = max(self._slowest_s, now - self._mark_s)
            self._mark_s = None if what == COMMITTED else now
            self._note(done=False)

    def begin(self) -> None:
        """The stop is agreed: its saves begin."""
        with self._lock:
            self._note(done=False)

    def end(self) -> None:
        with self._lock:
            self._note(done=True)

    def _note(self, *, done: bool) -> None:
        self._progress += 1
        if self.path:
            write_note(self.path, SaveNote(progress=self._progress, expected_s=self._slowest_s, done=done))


class StopWait:
    """The agent's side: whether to go on waiting for stopping workers, from their notes."""

    def __init__(self, grace_s: float, max_s: float, before: dict[object, SaveNote | None]) -> None:
        """``before``: the workers' notes when the stop was sent (what they did before is no progress)."""
        now = time.monotonic()
        self.grace_s = grace_s
        self.hard_deadline = now + max(grace_s, max_s)
        self.deadline = now + grace_s
        self._seen: dict[object, int] = {who: note.progress for who, note in before.items() if note is not None}

    def over(self, notes: dict[object, SaveNote | None]) -> bool:
        """True once no worker's note has moved for its window, or at the hard bound."""
        now = time.monotonic()
        for who, note in notes.items():
            if note is None or note.done or self._seen.get(who) == note.progress:
                continue
            self._seen[who] = note.progress
            self.deadline = max(self.deadline, now + self.grace_s + 2.0 * note.expected_s)
        return now >= min(self.deadline, self.hard_deadline)
