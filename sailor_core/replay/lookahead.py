"""Which availabilities a re-planning policy will ask the planner about next.

The trace, and which of our GPUs each preemption takes, are known ahead; only the
plans are not.  Assuming the plan in use keeps what a loss leaves it, the next
planner requests of a ``replan`` controller follow from the trace: one at every
preemption that takes GPUs of ours, every change that leaves the plan without
room, and every growth the controller re-plans on (``min_growth``).  The replay
hands these guesses to the planner's prefetcher, which answers them in worker
processes while the replay gets there.  A wrong guess costs a wasted search in a
worker, never a different result: the prefetcher's answers are the planner's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sailor_core.controller import ControllerConfig, restrict
from sailor_core.controller.policy import grew
from sailor_core.replay.hits import gpus_lost
from sailor_core.traces import AvailabilityTrace, GpuZone


def upcoming_requests(
    *,
    trace: AvailabilityTrace,
    times: Sequence[float],
    start: int,
    preemptions_at: Mapping[float, Sequence[int]],
    shares: Sequence[float],
    plan_gpus: Mapping[GpuZone, int] | None,
    planned_on: Mapping[GpuZone, int] | None,
    available: Mapping[GpuZone, int],
    config: ControllerConfig,
    num_decisions: int,
) -> list[dict[GpuZone, int]]:
    """The planner requests of the next ``num_decisions`` re-plans after ``times[start - 1]``,
    in order (each: all allowed pools, then each GPU type alone when the controller asks for
    per-type options).  Empty for the ``failover`` and ``static`` strategies: their requests
    depend on the plan a decision picks, so they cannot be guessed past one decision."""
    if config.strategy != "replan" or num_decisions <= 0:
        return []
    out: list[dict[GpuZone, int]] = []
    gpus = dict(plan_gpus) if plan_gpus else None
    current = dict(available)
    decisions = 0
    for t in times[start:]:
        counts = trace.counts_at(t)
        lost = gpus_lost(trace, preemptions_at.get(t, ()), shares, held=gpus, before=current,
                         after=counts) if gpus else {}
        changed = counts != current
        current = counts
        avail = restrict(counts, config.gpu_types)
        if gpus:
            broken = bool(lost) or any(counts.get(k, 0) < n for k, n in gpus.items())
            if not broken and not grew(avail, planned_on, config.min_growth):
                continue
        elif not changed and decisions:
            continue
        out.append(avail)
        types = sorted({g for g, _ in avail})
        if config.per_type_options and len(types) > 1:
            out.extend(restrict(avail, (g,)) for g in types)
        # Guess: the new plan keeps what the loss left of the old one.
        if gpus:
            gpus = {k: min(n - lost.get(k, 0), counts.get(k, 0)) for k, n in gpus.items()}
            gpus = {k: n for k, n in gpus.items() if n > 0} or None
        planned_on = avail
        decisions += 1
        if decisions >= num_decisions:
            break
    return out


def first_requests(trace: AvailabilityTrace, config: ControllerConfig) -> list[dict[GpuZone, int]]:
    """The planner requests of a ``replan`` controller's first decision (on the first row)."""
    return upcoming_requests(trace=trace, times=[trace.rows[0][0]], start=0, preemptions_at={}, shares=(),
                             plan_gpus=None, planned_on=None, available={}, config=config, num_decisions=1)
