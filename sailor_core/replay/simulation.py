"""Trace-driven replay in simulated time: the real controller decides, nothing trains.

Between events a running plan progresses at its simulated throughput (the
planner scores every plan with ``sailor_core.simulator.simulate``, which stands
in for the engine).  Events: the trace's capacity changes and preemptions, the
end of a start-up, periodic checkpoints, the budget deadline and the end of
the work.  Every change pays the same costs for every policy (``ChangeCosts``).

Which of our GPUs a preemption takes: ``sailor_core.replay.hits`` (the same
rule in the lookahead), with one draw per event from the seed for every policy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sailor_core.controller import (
    Action,
    ControllerConfig,
    ControllerState,
    CostLedger,
    Decision,
    Event,
    EventKind,
    PlanFn,
    PlanOption,
    decide,
    observed_preemption_rates_per_s,
)
from sailor_core.replay.costs import ChangeCosts
from sailor_core.replay.hits import gpus_taken
from sailor_core.replay.lookahead import first_requests, upcoming_requests
from sailor_core.traces import AvailabilityTrace, GpuZone

PriceFn = Callable[[str, str, float], float]  # (gpu, zone, time_s) -> USD per GPU-hour
_S_PER_HR = 3600.0
_EPS_S = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelinePoint:
    time_s: float
    gpus_by_type: Mapping[str, int]
    throughput_samples_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord:
    time_s: float
    action: str
    reason: str
    num_gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    policy: str
    finished: bool
    stop_reason: str
    time_to_train_s: float | None     # when the target was reached (None: not reached)
    end_s: float                      # when the last instance was released
    samples_done: float
    samples_target: float
    usd_spent: float
    budget_usd: float | None
    useful_work_fraction: float       # GPU-seconds of kept progress / GPU-seconds paid
    num_replans: int                  # plan changes after the first launch
    num_restarts: int                 # of which forced by a preemption
    num_preemptions_hit: int          # events that took GPUs of ours
    work_lost_samples: float
    wait_s: float                     # time holding nothing while waiting for capacity
    usd_by_gpu_zone: Mapping[str, float]
    timeline: tuple[TimelinePoint, ...]
    decisions: tuple[DecisionRecord, ...]
    planner_calls: int = 0

    def to_dict(self, *, with_timeline: bool = False) -> dict:
        out = {
            "policy": self.policy, "finished": self.finished, "stop_reason": self.stop_reason,
            "time_to_train_s": self.time_to_train_s, "end_s": self.end_s,
            "samples_done": self.samples_done, "samples_target": self.samples_target,
            "usd_spent": self.usd_spent, "budget_usd": self.budget_usd,
            "useful_work_fraction": self.useful_work_fraction, "num_replans": self.num_replans,
            "num_restarts": self.num_restarts, "num_preemptions_hit": self.num_preemptions_hit,
            "work_lost_samples": self.work_lost_samples, "wait_s": self.wait_s,
            "usd_by_gpu_zone": dict(self.usd_by_gpu_zone), "planner_calls": self.planner_calls,
        }
        if with_timeline:
            out["timeline"] = [
                {"time_s": p.time_s, "gpus_by_type": dict(p.gpus_by_type),
                 "throughput_samples_per_s": p.throughput_samples_per_s} for p in self.timeline
            ]
            out["decisions"] = [
                {"time_s": d.time_s, "action": d.action, "reason": d.reason, "num_gpus": d.num_gpus}
                for d in self.decisions
            ]
        return out


@dataclass(slots=True, kw_only=True)
class _Sim:
    """Mutable state of one replay (internal)."""

    t: float = 0.0
    phase: str = "idle"            # idle | starting | running | ended
    plan: PlanOption | None = None
    last_plan: PlanOption | None = None
    planned_on: dict | None = None
    pending_restart: bool = False   # the next launch follows a preemption
    ready_at: float = 0.0           # starting: when training resumes
    paused_until: float = 0.0       # running: periodic checkpoint in progress
    next_ckpt_at: float = math.inf
    done: float = 0.0
    ckpt_done: float = 0.0
    leases: dict = field(default_factory=dict)   # (gpu, zone) -> ledger id
    num_leases: int = 0
    avail: dict = field(default_factory=dict)
    productive_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    lost_samples: float = 0.0
    wait_s: float = 0.0
    num_replans: int = 0
    num_restarts: int = 0
    num_hits: int = 0
    launched: bool = False
    finished_at: float | None = None
    stop_reason: str = ""
    timeline: list = field(default_factory=list)
    decisions: list = field(default_factory=list)
    next_event: int = 0             # index of the next external event time (for the lookahead)


def replay(
    trace: AvailabilityTrace,
    *,
    plan_fn: PlanFn,
    config: ControllerConfig,
    costs: ChangeCosts,
    samples_target: float,
    price_fn: PriceFn,
    budget_usd: float | None = None,
    policy: str = "",
    seed: int = 0,
    max_time_s: float | None = None,
    price_change_times: tuple[float, ...] = (),
    prefetch: Callable[[list[dict[GpuZone, int]]], None] | None = None,
    prefetch_decisions: int = 2,
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Replay ``trace`` under one controller configuration; see the module doc.

    ``progress``, when given, is called with the simulated time at every external event.

    ``prefetch``, when given, is told after every decision which availabilities the
    controller will likely ask ``plan_fn`` about in its next ``prefetch_decisions``
    re-plans (``lookahead.upcoming_requests``), so that they can be answered ahead.
    """
    ledger = CostLedger(budget_usd=budget_usd)
    s = _Sim(avail=dict(trace.rows[0][1]))
    horizon = max_time_s if max_time_s is not None else trace.duration_s + 30 * 24 * _S_PER_HR
    draws = random.Random(seed)
    shares = [draws.random() for _ in trace.preemptions]

    def record() -> None:
        running = s.phase == "running" and s.t >= s.paused_until
        by_type: dict[str, int] = {}
        if s.phase in ("starting", "running") and s.plan is not None:
            for (g, _), n in s.plan.gpus.items():
                by_type[g] = by_type.get(g, 0) + n
        x = s.plan.throughput_samples_per_s if running and s.plan else 0.0
        point = TimelinePoint(time_s=s.t, gpus_by_type=by_type, throughput_samples_per_s=x)
        if s.timeline and s.timeline[-1].time_s == s.t:
            s.timeline[-1] = point
        else:
            s.timeline.append(point)

    def release(at_s: float, reason: str) -> None:
        for lease in s.leases.values():
            ledger.close(lease, at_s, reason)
        s.leases = {}

    def acquire(option: PlanOption, at_s: float) -> None:
        for (g, z), n in option.gpus.items():
            s.num_leases += 1
            lease = f"{g}@{z}#{s.num_leases}"
            ledger.open(lease, gpu=g, zone=z, num_gpus=n, usd_per_hr=n * price_fn(g, z, at_s), start_s=at_s)
            s.leases[(g, z)] = lease

    seen_events: dict[GpuZone, int] = {}

    def rates() -> dict[GpuZone, float]:
        return observed_preemption_rates_per_s(seen_events, s.t)

    def ask(event: Event) -> None:
        holding = s.plan if s.phase in ("starting", "running") else None
        state = ControllerState(
            plan=holding, available=dict(s.avail), budget_left_usd=ledger.budget_left_usd(s.t),
            samples_done=s.done, samples_target=samples_target, last_plan=s.last_plan,
            planned_on=s.planned_on if holding is not None else None,
            preemption_rate_per_s=rates(),
        )
        d = decide(state, event, config=config, plan_fn=plan_fn)
        plan_before, planned_on_before = s.plan, s.planned_on
        apply(d, event)
        if prefetch is not None and (s.plan is not plan_before or s.planned_on is not planned_on_before):
            look_ahead()

    def look_ahead() -> None:
        holding = s.plan.gpus if s.plan is not None and s.phase in ("starting", "running") else None
        prefetch(upcoming_requests(
            trace=trace, times=times, start=s.next_event, preemptions_at=by_time, shares=shares,
            plan_gpus=holding, planned_on=s.planned_on, available=s.avail, config=config,
            num_decisions=prefetch_decisions))

    def apply(d: Decision, event: Event) -> None:
        if d.action == Action.CONTINUE:
            s.planned_on = d.planned_on
            return
        s.planned_on = d.planned_on
        s.decisions.append(DecisionRecord(time_s=s.t, action=d.action.value, reason=d.reason,
                                          num_gpus=d.plan.num_gpus if d.plan else 0))
        if d.action in (Action.REPLAN, Action.SHRINK):
            old = s.plan if s.phase in ("starting", "running") else None
            planned = s.phase == "running" and not event.lost
            switch_at = s.t
            if planned:  # save first, on the old instances
                s.ckpt_done = s.done
                switch_at = s.t + costs.save_s
            release(switch_at, "replanned")
            acquire(d.plan, switch_at)
            held = old.gpus if old is not None else {}
            needs_vms = any(n > held.get(k, 0) for k, n in d.plan.gpus.items())
            s.ready_at = (switch_at + (costs.provisioning_s if needs_vms else 0.0) + costs.startup_s
                          + (costs.load_s if s.ckpt_done > 0 else 0.0))
            s.done = s.ckpt_done
            if s.launched:
                s.num_replans += 1
                s.num_restarts += bool(event.lost) or s.pending_restart
            s.launched = True
            s.pending_restart = False
            s.plan = s.last_plan = d.plan
            s.phase = "starting"
        elif d.action == Action.WAIT:
            s.pending_restart = s.pending_restart or bool(event.lost)
            release(s.t, "released")
            s.plan, s.phase = None, "idle"
        else:  # STOP
            running = s.phase in ("starting", "running")
            if d.reason.startswith("done"):
                s.finished_at = s.t
            release(s.t + (costs.shutdown_s if running else 0.0), "stopped")
            s.plan, s.phase, s.stop_reason = None, "ended", d.reason
        record()

    def lose_work(lost: Mapping[GpuZone, int]) -> None:
        """A preemption hit us: an emergency save if the notice allows it, else back to the last checkpoint."""
        if s.phase != "running":
            return
        notice = min(costs.notice_s(z) for (_, z) in lost)
        if costs.save_s <= notice:
            s.ckpt_done = s.done
            return
        gone = s.done - s.ckpt_done
        if gone > 0 and s.plan is not None and s.plan.throughput_samples_per_s > 0:
            s.lost_samples += gone
            s.lost_gpu_s += gone / s.plan.throughput_samples_per_s * s.plan.num_gpus
        s.done = s.ckpt_done

    def at_deadline() -> None:
        ask(Event(kind=EventKind.TIMER))
        # Rounding can leave a sliver of budget that decide() does not see as gone.
        if s.phase != "ended" and s.leases and \
                ledger.affordable_s(ledger.usd_per_hr(), costs.shutdown_s, now_s=s.t) <= _EPS_S:
            apply(Decision(action=Action.STOP, reason="budget: only the shutdown is left to pay"),
                  Event(kind=EventKind.TIMER))

    def advance(until: float) -> None:
        while s.phase != "ended" and s.t < until:
            deadline = s.t + ledger.affordable_s(ledger.usd_per_hr(), costs.shutdown_s, now_s=s.t) \
                if s.leases else math.inf
            if s.phase == "idle":
                s.wait_s += until - s.t if s.launched else 0.0
                s.t = until
                return
            if s.phase == "starting":
                tn = min(until, s.ready_at, deadline)
                s.t = tn
                if tn == deadline and tn < s.ready_at:
                    at_deadline()
                    continue
                if tn == s.ready_at:
                    s.phase = "running"
                    s.next_ckpt_at = s.t + costs.checkpoint_interval_s
                    s.paused_until = s.t
                    record()
                continue
            # running
            plan = s.plan
            if s.t < s.paused_until:  # a periodic checkpoint is being written: no progress
                tn = min(until, s.paused_until, deadline)
                s.t = tn
                if tn == deadline:
                    at_deadline()
                elif tn == s.paused_until:
                    record()
                continue
            x = plan.throughput_samples_per_s
            t_done = s.t + (samples_target - s.done) / x if x > 0 else math.inf
            tn = min(until, t_done, s.next_ckpt_at, deadline)
            if tn > s.t:
                s.done += x * (tn - s.t)
                s.productive_gpu_s += plan.num_gpus * (tn - s.t)
            s.t = tn
            if tn == t_done:
                s.done = samples_target
                ask(Event(kind=EventKind.PROGRESS))
            elif tn == deadline:
                at_deadline()
            elif tn == s.next_ckpt_at:
                s.ckpt_done = s.done
                s.paused_until = s.t + costs.save_s
                s.next_ckpt_at = s.paused_until + costs.checkpoint_interval_s
                record()

    # External events, in time order: preemptions before the new counts of the same instant.
    times = sorted({t for t, _ in trace.rows[1:]} | {e.time_s for e in trace.preemptions}
                   | {t for t in price_change_times if t > 0})
    by_time: dict[float, list[int]] = {}
    for i, e in enumerate(trace.preemptions):
        by_time.setdefault(e.time_s, []).append(i)

    record()
    if prefetch is not None:
        prefetch(first_requests(trace, config))
    ask(Event(kind=EventKind.START))
    for j, t in enumerate(times):
        if s.phase == "ended" or t > horizon:
            break
        s.next_event = j + 1
        if progress is not None:
            progress(t)
        advance(t)
        if s.phase == "ended":
            break
        new_counts = trace.counts_at(t)
        for i in by_time.get(t, []):
            e = trace.preemptions[i]
            seen_events[(e.gpu, e.zone)] = seen_events.get((e.gpu, e.zone), 0) + 1
        lost: dict[GpuZone, int] = {}
        if s.phase in ("starting", "running") and s.plan is not None:
            for i in by_time.get(t, []):
                e = trace.preemptions[i]
                key = (e.gpu, e.zone)
                take = gpus_taken(held=s.plan.gpus.get(key, 0) - lost.get(key, 0), before=s.avail.get(key, 0),
                                  after=new_counts.get(key, 0), num_taken=e.num_gpus, share=shares[i])
                if take > 0:
                    lost[key] = lost.get(key, 0) + take
        for lease_key in s.leases:
            price = price_fn(lease_key[0], lease_key[1], t)
            ledger.set_price(s.leases[lease_key], price * s.plan.gpus[lease_key], t)
        changed = dict(new_counts) != s.avail
        s.avail = dict(new_counts)
        if lost:
            s.num_hits += 1
            lose_work(lost)
            ask(Event(kind=EventKind.PREEMPTION, lost=lost, zone_hint=next(iter(lost))[1]))
        elif changed or s.phase == "idle":
            ask(Event(kind=EventKind.CAPACITY))
    if s.phase != "ended":
        advance(horizon)
    if s.phase != "ended":
        release(s.t + (costs.shutdown_s if s.leases else 0.0), "horizon")
        s.stop_reason = s.stop_reason or "horizon: the trace ended before the work did"
        s.phase = "ended"
        record()
    end_s = max([s.t] + [e.end_s for e in ledger.entries() if e.end_s is not None])
    paid_gpu_s = ledger.gpu_seconds(end_s)
    return ReplayResult(
        policy=policy,
        finished=s.finished_at is not None,
        stop_reason=s.stop_reason,
        time_to_train_s=s.finished_at,
        end_s=end_s,
        samples_done=s.done,
        samples_target=samples_target,
        usd_spent=ledger.spent_usd(end_s),
        budget_usd=budget_usd,
        useful_work_fraction=(s.productive_gpu_s - s.lost_gpu_s) / paid_gpu_s if paid_gpu_s > 0 else 0.0,
        num_replans=s.num_replans,
        num_restarts=s.num_restarts,
        num_preemptions_hit=s.num_hits,
        work_lost_samples=s.lost_samples,
        wait_s=s.wait_s,
        usd_by_gpu_zone={f"{g}@{z}": v for (g, z), v in sorted(ledger.by_gpu_zone(end_s).items())},
        timeline=tuple(s.timeline),
        decisions=tuple(s.decisions),
    )
