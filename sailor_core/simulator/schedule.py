"""Iteration time of a 1F1B pipeline whose stages and links run at different speeds.

The pipeline is a chain of resources: stage 0, link 0->1, stage 1, ..., stage
P-1.  A stage's replica r takes ``t_r`` per micro-batch (forward + backward)
and gets ``n_r`` micro-batches (micro-batch m -> replica m mod D).  A link
takes ``t`` per micro-batch (activation forward, gradient back, over the
slowest replica pair the routing uses) and its busiest NIC carries ``n``.

One micro-batch must cross every resource down and back up (warm-up and
cool-down), paced by each stage's slowest replica (the straggler,
``t_k = max_r t_r``); then the busiest resource repeats its step for each
further micro-batch (steady state, ``R_k = max_r (n_r - 1) t_r``):

    T = sum_k t_k + max_k R_k

Named parts (they sum to T): ``compute`` is the busiest stage's own work
``max_r n_r t_r``; ``bubble`` the other stages' share of warm-up and
cool-down; ``p2p`` the transfers on the critical path (their fill/drain
share plus any steady-state time a slow link adds beyond the busiest stage).
Transfers are asynchronous (isend/irecv), so a link only costs steady-state
time when it is the bottleneck.
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


@dataclass(frozen=True, slots=True)
class StageTiming:
    """A stage as a pipeline resource (see the module doc)."""

    step_s: float  # the straggler's forward + backward of one micro-batch
    busy_s: float  # max_r n_r t_r: the busiest replica's work in one iteration
    repeat_s: float  # max_r (n_r - 1) t_r: its steady-state share


def stage_timing(replica_step_s: Sequence[float], replica_counts: Sequence[int]) -> StageTiming:
    """Combine a stage's replicas: per-micro-batch times ``t_r`` and micro-batch counts ``n_r``."""
    step = busy = repeat = 0.0
    for t, n in zip(replica_step_s, replica_counts):
        step = t if t > step else step
        busy = n * t if n * t > busy else busy
        rep = (n - 1) * t if n > 0 else 0.0
        repeat = rep if rep > repeat else repeat
    return StageTiming(step, busy, repeat)


def one_f_one_b(
    stages: Sequence[StageTiming],
    link_s: Sequence[float],
    link_counts: Sequence[int],
) -> PipelineTime:
    """Compose stage resources and per-micro-batch link times into the 1F1B time (see module doc)."""
    busiest = 0
    worst_repeat = -1.0
    bottleneck = "stage 0"
    for i, s in enumerate(stages):
        if s.busy_s > stages[busiest].busy_s:
            busiest = i
        if s.repeat_s > worst_repeat:
            worst_repeat, bottleneck = s.repeat_s, f"stage {i}"
    for i, (t, n) in enumerate(zip(link_s, link_counts)):
        repeat = (n - 1) * t
        if repeat > worst_repeat:
            worst_repeat, bottleneck = repeat, f"link {i}->{i + 1}"
    c = stages[busiest]
    bubble = sum(s.step_s for s in stages) - c.step_s
    # worst_repeat >= c.repeat_s >= c.busy_s - c.step_s, so p2p >= sum(link_s).
    p2p = sum(link_s) + worst_repeat - (c.busy_s - c.step_s)
    return PipelineTime(
        compute_s=c.busy_s, bubble_s=bubble, p2p_s=max(0.0, p2p),
        busiest_stage=busiest, bottleneck=bottleneck,
    )
