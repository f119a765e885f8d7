"""Which of our GPUs a preemption takes, in the replay and in its lookahead.

A pool of n GPUs losing k, of which we hold u, takes ``max(u - n_after, floor(u * k / n + r))``
of ours (at most u), with r uniform in [0, 1) drawn per event from the seed -- the expected
share of a random pick, and the same draw for every policy.
"""

from __future__ import annotations

import math


def gpus_taken(*, held: int, before: int, after: int, num_taken: int, share: float) -> int:
    """How many of the ``held`` GPUs of a pool a preemption takes (see the module doc)."""
    if held <= 0 or before <= 0:
        return 0
    return max(0, min(held, max(held - after, math.floor(held * num_taken / before + share))))
