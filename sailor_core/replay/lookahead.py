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

from sailor_core.controller import (
    ControllerConfig,
    ControllerState,
    observed_preemption_rates_per_s,
    rate_window_s,
    restrict,
)
from sailor_core.controller.candidates import planner_requests
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
    seen_events: Mapping[GpuZone, int] | None = None,
    seen_share: Mapping[GpuZone, float] | None = None,
    on_demand_available: Mapping[GpuZone, int] | None = None,
    fraction_done: float = 0.0,
) -> list[dict[GpuZone, int]]:
    """The planner requests of the next ``num_decisions`` re-plans after ``times[start - 1]``,
    in order (each: ``policy.planner_requests``, with the preemption rates the replay will have
    seen by then, from ``seen_events`` and ``seen_share`` so far, over the window the job's
    ``fraction_done`` now gives).  Empty for the ``failover``
    and ``static`` strategies: their requests depend on the plan a decision picks, so they
    cannot be guessed past one decision."""
    if config.strategy != "replan" or num_decisions <= 0:
        return []
    out: list[dict[GpuZone, int]] = []
    gpus = dict(plan_gpus) if plan_gpus else None
    current = dict(available)
    events, share = dict(seen_events or {}), dict(seen_share or {})
    decisions = 0
    for t in times[start:]:
        counts = trace.counts_at(t)
        here = preemptions_at.get(t, ())
        lost = gpus_lost(trace, here, shares, held=gpus, before=current, after=counts) if gpus else {}
        for i in here:  # as the replay counts them (_Replay.on_trace_event)
            e = trace.preemptions[i]
            key = (e.gpu, e.zone)
            events[key] = events.get(key, 0) + 1
            pool = max(current.get(key, 0), e.num_gpus)
            share[key] = share.get(key, 0.0) + (min(1.0, e.num_gpus / pool) if pool else 1.0)
        changed = counts != current
        current = counts
        avail = restrict(counts, config.gpu_types)
        if gpus:
            broken = bool(lost) or any(counts.get(k, 0) < n for k, n in gpus.items())
            if not broken and not grew(avail, planned_on, config.min_growth):
                continue
        elif not changed and decisions:
            continue
        state = ControllerState(plan=None, available=avail,
                                preemption_rate_per_s=observed_preemption_rates_per_s(
                                    events, t, window_s=rate_window_s(t, fraction_done)),
                                preemption_share={k: v / events[k] for k, v in share.items()},
                                on_demand_available=on_demand_available or {})
        out.extend(planner_requests(avail, state, config))
        # Guess: the new plan keeps what the loss left of the old one.
        if gpus:
            gpus = {k: min(n - lost.get(k, 0), counts.get(k, 0)) for k, n in gpus.items()}
            gpus = {k: n for k, n in gpus.items() if n > 0} or None
            if lost and gpus:  # a restart after a loss also weighs the GPUs still held alone
                out.append(dict(gpus))
        planned_on = avail
        decisions += 1
        if decisions >= num_decisions:
            break
    return out


def first_requests(trace: AvailabilityTrace, config: ControllerConfig,
                   on_demand_available: Mapping[GpuZone, int] | None = None) -> list[dict[GpuZone, int]]:
    """The planner requests of a ``replan`` controller's first decision (on the first row)."""
    return upcoming_requests(trace=trace, times=[trace.rows[0][0]], start=0, preemptions_at={}, shares=(),
                             plan_gpus=None, planned_on=None, available={}, config=config, num_decisions=1,
                             on_demand_available=on_demand_available)
