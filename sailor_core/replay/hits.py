"""Which of our GPUs a preemption takes, in the replay and in its lookahead.

A pool of n GPUs losing k, of which we hold u, takes ``max(u - n_after, floor(u * k / n + r))``
of ours (at most u), with r uniform in [0, 1) drawn per event from the seed -- the expected
share of a random pick, and the same draw for every policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from sailor_core.traces import AvailabilityTrace, GpuZone


def gpus_taken(*, held: int, before: int, after: int, num_taken: int, share: float) -> int:
    """How many of the ``held`` GPUs of a pool a preemption takes (see the module doc)."""
    if held <= 0 or before <= 0:
        return 0
    return max(0, min(held, max(held - after, math.floor(held * num_taken / before + share))))


def gpus_lost(
    trace: AvailabilityTrace,
    event_indices: Iterable[int],
    shares: Sequence[float],
    *,
    held: Mapping[GpuZone, int],
    before: Mapping[GpuZone, int],
    after: Mapping[GpuZone, int],
) -> dict[GpuZone, int]:
    """GPUs of ``held`` per pool that the trace's preemptions ``event_indices`` (of one instant)
    take, pools going from ``before`` to ``after``; a pool hit twice loses from what is left."""
    lost: dict[GpuZone, int] = {}
    for i in event_indices:
        e = trace.preemptions[i]
        key = (e.gpu, e.zone)
        take = gpus_taken(held=held.get(key, 0) - lost.get(key, 0), before=before.get(key, 0),
                          after=after.get(key, 0), num_taken=e.num_gpus, share=shares[i])
        if take > 0:
            lost[key] = lost.get(key, 0) + take
    return lost
