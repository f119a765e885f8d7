"""Iteration time of a 1F1B pipeline whose stages and links run at different speeds.

The pipeline is a chain of resources: stage 0, link 0->1, stage 1, ..., stage
P-1.  Resource k takes ``t_k`` per micro-batch (a stage: forward + backward of
its slowest replica, the straggler; a link: the activation forward and its
gradient back over the slowest replica pair the routing uses) and handles
``n_k`` micro-batches (a stage: the most any of its replicas gets under
``m mod D``; a link: the most any sender or receiver NIC carries).

One micro-batch must cross every resource down and back up (warm-up and
cool-down), and the busiest resource repeats its step for each further
micro-batch (steady state):

    T = sum_k t_k + max_k (n_k - 1) t_k

Named parts (they sum to T): ``compute`` is the busiest stage's own work
``n_c t_c``; ``bubble`` the other stages' share of warm-up and cool-down;
``p2p`` the transfers on the critical path (their fill/drain share plus any
steady-state time a slow link adds beyond the busiest stage).  Transfers are
asynchronous (isend/irecv), so a link only costs steady-state time when it is
the bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineTime:
    compute_s: float
    bubble_s: float
    p2p_s: float
    busiest_stage: int
    bottleneck: str  # "stage <i>" or "link <i>-><i+1>"

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + self.p2p_s


def one_f_one_b(
    stage_s: Sequence[float],
    stage_counts: Sequence[int],
    link_s: Sequence[float],
    link_counts: Sequence[int],
) -> PipelineTime:
    """Compose per-micro-batch stage and link times into the 1F1B pipeline time (see module doc)."""
    busiest = 0
    busiest_busy = -1.0
    worst_repeat = 0.0
    bottleneck = "stage 0"
    for i, (t, n) in enumerate(zip(stage_s, stage_counts)):
        busy = n * t
        if busy > busiest_busy:
            busiest, busiest_busy = i, busy
        repeat = (n - 1) * t
        if repeat > worst_repeat:
            worst_repeat, bottleneck = repeat, f"stage {i}"
    for i, (t, n) in enumerate(zip(link_s, link_counts)):
        repeat = (n - 1) * t
        if repeat > worst_repeat:
            worst_repeat, bottleneck = repeat, f"link {i}->{i + 1}"
    t_c, n_c = stage_s[busiest], stage_counts[busiest]
    compute = n_c * t_c
    bubble = sum(stage_s) - t_c
    # worst_repeat >= (n_c - 1) t_c because the busiest stage was a candidate.
    p2p = sum(link_s) + worst_repeat - (n_c - 1) * t_c
    return PipelineTime(
        compute_s=compute, bubble_s=bubble, p2p_s=max(0.0, p2p),
        busiest_stage=busiest, bottleneck=bottleneck,
    )
