"""Bounded build caches: the wheels of ``.whl/`` and the embedded image's per-wheel environments.

Each state of the source builds a wheel, and each wheel an environment (~5 MB) the embedded
instances share; a developer's checkout would otherwise keep every one it ever made.  An entry
is marked used (its mtime) whenever it is reused; pruning removes those neither among the
newest ``keep`` nor used within ``max_idle_s`` -- a wheel a long job still runs from is recent
by both measures on any machine whose clock moves forward.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

KEEP = 8
MAX_IDLE_S = 7 * 24 * 3600.0
_ENTRY = re.compile(r"[0-9a-f]{64}")  # both caches name a finished entry by a SHA-256; builds in progress differ


def mark_used(entry: Path) -> None:
    try:
        os.utime(entry)
    except OSError:  # pruned or never made by this user: nothing to mark
        pass


def prune(cache: Path, *, keep: int = KEEP, max_idle_s: float = MAX_IDLE_S, now: float | None = None) -> list[Path]:
    """Remove ``cache``'s finished entries (directories named by a SHA-256) that are neither among
    the ``keep`` most recently used nor used within ``max_idle_s``; returns the removed."""
    if keep < 1 or max_idle_s < 0:
        raise ValueError(f"keep must be >= 1 and max_idle_s >= 0, got {keep} and {max_idle_s}")
    try:
        entries = [p for p in cache.iterdir() if _ENTRY.fullmatch(p.name) and p.is_dir()]
    except FileNotFoundError:
        return []
    used = sorted(((_mtime(p), p) for p in entries), key=lambda t: t[0], reverse=True)
    cutoff = (time.time() if now is None else now) - max_idle_s
    gone = [p for t, p in used[keep:] if t < cutoff]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return 0.0
