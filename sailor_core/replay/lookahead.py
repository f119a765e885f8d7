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
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEvents:
    """What a replay knows ahead: the trace, its external event times in order, the preemptions
    at each time (indices into ``trace.preemptions``) and one draw per preemption of which of
    our GPUs it takes (``hits.gpus_lost``)."""

    trace: AvailabilityTrace
    times: Sequence[float]
    preemptions_at: Mapping[float, Sequence[int]]
    shares: Sequence[float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Position:
    """Where a replay stands: the next event (an index into ``TraceEvents.times``), the GPUs of
    the plan held (None: none), the availability it was planned on and the current one, the
    preemptions seen so far per pool (and their shares of the pool, summed) and the job's
    fraction done."""

    next_event: int
    plan_gpus: Mapping[GpuZone, int] | None
    planned_on: Mapping[GpuZone, int] | None
    available: Mapping[GpuZone, int]
    seen_events: Mapping[GpuZone, int] | None = None
    seen_share: Mapping[GpuZone, float] | None = None
    fraction_done: float = 0.0


def upcoming_requests(events: TraceEvents, now: Position, *, config: ControllerConfig, num_decisions: int,
                      on_demand_available: Mapping[GpuZone, int] | None = None) -> list[dict[GpuZone, int]]:
    """The planner requests of the next ``num_decisions`` re-plans after ``now`` (the event
    before ``now.next_event``), in order (each: ``policy.planner_requests``, with the preemption
    rates the replay will have seen by then, from those seen so far, over the window the job's
    fraction done now gives).  Empty for the ``failover``
    and ``static`` strategies: their requests depend on the plan a decision picks, so they
    cannot be guessed past one decision."""
    if config.strategy != "replan" or num_decisions <= 0:
        return []
    trace, planned_on, fraction_done = events.trace, now.planned_on, now.fraction_done
    out: list[dict[GpuZone, int]] = []
    gpus = dict(now.plan_gpus) if now.plan_gpus else None
    current = dict(now.available)
    seen, share = dict(now.seen_events or {}), dict(now.seen_share or {})
    decisions = 0
    for t in events.times[now.next_event:]:
        counts = trace.counts_at(t)
        here = events.preemptions_at.get(t, ())
        lost = gpus_lost(trace, here, events.shares, held=gpus, before=current, after=counts) if gpus else {}
        for i in here:  # as the replay counts them (_Replay.on_trace_event)
            e = trace.preemptions[i]
            key = (e.gpu, e.zone)
            seen[key] = seen.get(key, 0) + 1
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
                                    seen, t, window_s=rate_window_s(t, fraction_done)),
                                preemption_share={k: v / seen[k] for k, v in share.items()},
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
    return upcoming_requests(TraceEvents(trace=trace, times=(trace.rows[0][0],), preemptions_at={}, shares=()),
                             Position(next_event=0, plan_gpus=None, planned_on=None, available={}),
                             config=config, num_decisions=1, on_demand_available=on_demand_available)
