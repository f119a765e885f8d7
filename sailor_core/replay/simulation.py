"""Trace-driven replay in simulated time: the real controller decides, nothing trains.

Between events a running plan progresses at its simulated throughput (the
planner scores every plan with ``sailor_core.simulator.simulate``, which stands
in for the engine).  Events: the trace's capacity changes and preemptions, the
end of a start-up, periodic checkpoints, the budget deadline and the end of
the work.  Every change pays the same costs for every policy (``ChangeCosts``).

Which of our GPUs a preemption takes: ``sailor_core.replay.hits`` (the same
rule in the lookahead), with one draw per event from the seed for every policy.
Preemptions take spot GPUs only: a mixed plan's on-demand GPUs (``on_demand_available``
per pool, at the on-demand price) are never taken.
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
    rate_window_s,
)
from sailor_core.controller.ledger import SIMULATED_PAIR
from sailor_core.controller.interim import interim_option, interim_pays, kept_gpus
from sailor_core.replay.costs import ChangeCosts
from sailor_core.replay.hits import gpus_lost
from sailor_core.replay.lookahead import Position, TraceEvents, first_requests, upcoming_requests
from sailor_core.replay.result import GPU_TIME_KINDS, DecisionRecord, ReplayResult, TimelinePoint, load_egress_fields
from sailor_core.replay.scenario import Goal, Lookahead, Market, PriceFn, ReplayPolicy
from sailor_core.traces import AvailabilityTrace, GpuZone

_S_PER_HR = 3600.0
_EPS_S = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class _Setup:
    """What one replay runs on; fixed for its whole length."""

    trace: AvailabilityTrace
    plan_fn: PlanFn
    cost_plan_fn: PlanFn | None                # the planner's cheapest plans (cost objective or deadline)
    config: ControllerConfig
    costs: ChangeCosts
    samples_target: float
    price_fn: PriceFn
    on_demand_price_fn: PriceFn
    on_demand_available: Mapping[GpuZone, int]  # per pool, never preempted
    deadline_s: float                          # the job's deadline (inf: none)
    horizon_s: float
    events: TraceEvents                        # the same draws for every policy
    lookahead: Lookahead | None


def _setup(trace: AvailabilityTrace, *, seed: int, max_time_s: float | None,
           price_change_times: tuple[float, ...], **fixed) -> _Setup:
    draws = random.Random(seed)
    shares = tuple(draws.random() for _ in trace.preemptions)
    # Preemptions come before the new counts of the same instant (see _Replay.on_trace_event).
    times = sorted({t for t, _ in trace.rows[1:]} | {e.time_s for e in trace.preemptions}
                   | {t for t in price_change_times if t > 0})
    preemptions_at: dict[float, list[int]] = {}
    for i, e in enumerate(trace.preemptions):
        preemptions_at.setdefault(e.time_s, []).append(i)
    horizon_s = max_time_s if max_time_s is not None else trace.duration_s + 30 * 24 * _S_PER_HR
    events = TraceEvents(trace=trace, times=tuple(times), preemptions_at=preemptions_at, shares=shares)
    return _Setup(trace=trace, horizon_s=horizon_s, events=events, **fixed)


@dataclass(slots=True, kw_only=True)
class _Replay:
    """One replay's state, and what each kind of event does to it."""

    setup: _Setup
    ledger: CostLedger
    avail: dict[GpuZone, int]
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
    # ledger id -> (gpu, zone, spot, GPUs): per pool, the instances held on and those new to a plan
    leases: dict[str, tuple[str, str, bool, int]] = field(default_factory=dict)
    num_leases: int = 0
    seen_events: dict[GpuZone, int] = field(default_factory=dict)  # preemptions seen per pool
    seen_share: dict[GpuZone, float] = field(default_factory=dict)  # their shares of the pool, summed
    productive_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    checkpoint_gpu_s: float = 0.0   # paid while saving (periodic, or before a switch)
    provisioning_gpu_s: float = 0.0  # GPUs kept, paid while new instances boot
    starting_gpu_s: float = 0.0     # paid during start-up and reload
    # the change under way (``starting``): a save until ``saving_until`` on ``saving_gpus``, the
    # ``kept_gpus`` waiting until ``vms_at`` for new instances, then start-up
    saving_until: float = 0.0
    saving_gpus: int = 0
    kept_gpus: int = 0
    vms_at: float = 0.0
    # the survivors' interim plan (controller/interim.py) while new instances boot: it trains
    # from ``interim_from`` until ``vms_at``, then saves until ``resume_at``; None: no interim
    interim: PlanOption | None = None
    # the plan whose layout the workers held keep in memory (the last that trained): what a
    # change's ranks may take their state from (ChangeCosts.load_for_s)
    trained: PlanOption | None = None
    interim_from: float = 0.0
    resume_at: float = 0.0
    num_interims: int = 0
    lost_samples: float = 0.0
    wait_s: float = 0.0
    num_replans: int = 0
    num_restarts: int = 0
    num_hits: int = 0
    num_declined: int = 0
    last_declined: str = ""
    launched: bool = False
    finished_at: float | None = None
    stop_reason: str = ""
    timeline: list[TimelinePoint] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)
    next_event: int = 0             # index of the next external event time (for the lookahead)

    @property
    def holding(self) -> PlanOption | None:
        """The plan whose instances are rented (starting or running)."""
        return self.plan if self.phase in ("starting", "running") else None

    def in_interim(self) -> bool:
        return self.phase == "starting" and self.interim is not None and self.interim_from <= self.t < self.vms_at

    # ---- the record and the leases

    def record(self) -> None:
        running = self.phase == "running" and self.t >= self.paused_until
        by_type: dict[str, int] = {}
        if self.phase in ("starting", "running") and self.plan is not None:
            for (g, _), n in self.plan.all_gpus().items():
                by_type[g] = by_type.get(g, 0) + n
        x = self.plan.throughput_samples_per_s if running and self.plan else 0.0
        if self.in_interim():
            x = self.interim.throughput_samples_per_s
        point = TimelinePoint(time_s=self.t, gpus_by_type=by_type, throughput_samples_per_s=x)
        if self.timeline and self.timeline[-1].time_s == self.t:
            self.timeline[-1] = point
        else:
            self.timeline.append(point)

    def release(self, at_s: float, reason: str) -> None:
        for lease in self.leases:
            self.ledger.close(lease, at_s, reason)
        self.leases = {}

    def acquire(self, option: PlanOption, at_s: float, *, held: Mapping[GpuZone, int],
                held_on_demand: Mapping[GpuZone, int], running_at_s: float) -> int:
        """Lease ``option``'s GPUs: those already held from ``at_s``, new instances from
        ``running_at_s``, when they run (clouds bill a VM from its start, not from the request).
        Returns how many of its GPUs were held already."""
        total_kept = 0
        for spot, gpus, kept in ((True, option.gpus, held), (False, option.on_demand, held_on_demand)):
            price_fn = self.setup.price_fn if spot else self.setup.on_demand_price_fn
            for (g, z), n in gpus.items():
                num_kept = min(n, max(kept.get((g, z), 0), 0))
                total_kept += num_kept
                for num, start_s in ((num_kept, at_s), (n - num_kept, running_at_s)):
                    if num <= 0:
                        continue
                    self.num_leases += 1
                    lease = f"{g}@{z}#{self.num_leases}" + ("" if spot else "-od")
                    self.ledger.open(lease, gpu=g, zone=z, num_gpus=num, usd_per_hr=num * price_fn(g, z, at_s),
                                     start_s=start_s, spot=spot)
                    self.leases[lease] = (g, z, spot, num)
        return total_kept

    def affordable_s(self) -> float:
        """Seconds until the budget, less the shutdown, is spent at the current rate: the rent,
        plus the egress of the plan training now (none while it starts or saves)."""
        training, rent = self.training_now(), self.ledger.usd_per_hr()
        rate = rent + (training.egress_usd_per_hr if training is not None else 0.0)
        return self.ledger.affordable_s(rate, self.setup.costs.shutdown_s, now_s=self.t, shutdown_usd_per_hr=rent)

    def training_now(self) -> PlanOption | None:
        if self.in_interim():
            return self.interim
        if self.phase == "running" and self.t >= self.paused_until:
            return self.plan
        return None

    # ---- decisions

    def ask(self, event: Event) -> None:
        """The controller's decision on ``event``, carried out; the lookahead told what changed."""
        setup, holding = self.setup, self.holding
        state = ControllerState(
            plan=holding, available=dict(self.avail), budget_left_usd=self.ledger.budget_left_usd(self.t),
            time_left_s=setup.deadline_s - self.t,
            samples_done=self.done, samples_target=setup.samples_target, last_plan=self.last_plan,
            planned_on=self.planned_on if holding is not None else None,
            preemption_rate_per_s=observed_preemption_rates_per_s(
                self.seen_events, self.t, window_s=rate_window_s(self.t, self.done / setup.samples_target)),
            preemption_share={k: v / self.seen_events[k] for k, v in self.seen_share.items()},
            on_demand_available=setup.on_demand_available, state_holder=self.state_holder(),
        )
        d = decide(state, event, config=setup.config, plan_fn=setup.plan_fn, cost_plan_fn=setup.cost_plan_fn)
        plan_before, planned_on_before = self.plan, self.planned_on
        self.apply(d, event)
        if setup.lookahead is not None and (self.plan is not plan_before or self.planned_on is not planned_on_before):
            self.look_ahead()

    def look_ahead(self) -> None:
        setup, holding = self.setup, self.holding
        now = Position(next_event=self.next_event, plan_gpus=holding.gpus if holding is not None else None,
                       planned_on=self.planned_on, available=self.avail, seen_events=self.seen_events,
                       seen_share=self.seen_share, fraction_done=self.done / setup.samples_target)
        setup.lookahead.prefetch(upcoming_requests(setup.events, now, config=setup.config,
                                                   num_decisions=setup.lookahead.num_decisions,
                                                   on_demand_available=setup.on_demand_available))

    def apply(self, d: Decision, event: Event) -> None:
        self.planned_on = d.planned_on
        if d.action == Action.CONTINUE:
            if d.declined is not None:
                self.num_declined += 1
                if d.declined.label != self.last_declined:  # the same plan declined again is not news
                    self.last_declined = d.declined.label
                    self.decisions.append(DecisionRecord(time_s=self.t, action="decline", reason=d.reason,
                                                         num_gpus=d.plan.num_gpus if d.plan else 0))
            return
        self.last_declined = ""
        self.decisions.append(DecisionRecord(time_s=self.t, action=d.action.value, reason=d.reason,
                                             num_gpus=d.plan.num_gpus if d.plan else 0))
        if d.action in (Action.REPLAN, Action.SHRINK):
            self.switch_to(d.plan, lost=event.lost)
        elif d.action == Action.WAIT:
            self.pending_restart = self.pending_restart or bool(event.lost)
            self.release(self.t, "released")
            self.plan, self.phase = None, "idle"
        else:
            self.stop(d.reason)
        self.record()

    def switch_to(self, new: PlanOption, *, lost: Mapping[GpuZone, int]) -> None:
        """Rent ``new`` in place of what is held: a checkpoint first if the old plan still runs,
        then provisioning (for GPUs not held: the ones a preemption just took are gone, so a plan
        that needs them again waits for new instances, as the controller's ``change_s`` expects),
        start-up and reload; on GPUs all held, their parked workers rejoin instead of starting.
        While new instances boot, the GPUs held that the new plan keeps train on an interim plan
        of their own (``plan_interim``), as the train-job flow does (a planned switch saves first
        there too: the flow stops the attempt before it plans the next)."""
        costs, old = self.setup.costs, self.holding
        after_loss = any(n > 0 for n in lost.values())
        held = {k: n - lost.get(k, 0) for k, n in old.gpus.items()} if old is not None else {}
        held_od = old.on_demand if old is not None else {}
        needs_vms = (any(n > held.get(k, 0) for k, n in new.gpus.items())
                     or any(n > held_od.get(k, 0) for k, n in new.on_demand.items()))
        switch_at = self.t
        saving_gpus = old.num_gpus if old is not None else 0
        if self.in_interim():
            saving_gpus = self.kept_gpus  # (the old plan's new instances do not run yet)
        if (self.phase == "running" or self.in_interim()) and not after_loss:
            self.ckpt_done = self.done  # save first, on the old instances
            switch_at = self.t + costs.save_s
        running_at = switch_at + (costs.provisioning_s if needs_vms else 0.0)
        self.saving_until, self.saving_gpus = switch_at, saving_gpus
        self.vms_at = running_at
        self.release(switch_at, "replanned")
        self.kept_gpus = self.acquire(new, switch_at, held=held, held_on_demand=held_od, running_at_s=running_at)
        start_s = costs.new_instance_start_s if needs_vms else costs.rejoin_s
        holder = self.holder()
        self.ready_at = running_at + start_s + (self.load_s(new, holder=holder, lost=lost) if self.ckpt_done > 0 else 0.0)
        self.done = self.ckpt_done
        self.interim = None
        if needs_vms:
            self.plan_interim(new, held, switch_at, holder=holder, lost=lost)
        if self.interim is not None:  # the survivors load the interim's layout, then the new plan loads from it
            if self.ckpt_done > 0:
                self.charge_load(self.interim, holder=holder, lost=lost)
            self.charge_load(new, holder=self.interim, lost={})
        elif self.ckpt_done > 0:
            self.charge_load(new, holder=holder, lost=lost)
        if self.launched:
            self.num_replans += 1
            self.num_restarts += after_loss or self.pending_restart
        self.launched = True
        self.pending_restart = False
        self.plan = self.last_plan = new
        self.phase = "starting"

    def holder(self) -> PlanOption | None:
        """The plan whose ranks hold the state now: the interim once it trains and until the plan
        it stands in for reaches training (whose ranks then hold it in their own layout), else the
        last plan that reached training; None when nothing is held (released instances take their
        state with them)."""
        if self.holding is None:
            return None
        if self.interim is not None and self.phase == "starting" and self.t >= self.interim_from:
            return self.interim
        return self.trained

    def state_holder(self) -> PlanOption | None:
        """``holder`` for the controller (``ControllerState.state_holder``) when it is not the plan
        held: the controller then weighs a change's load from the ranks this replay charges it from."""
        holder, holding = self.holder(), self.holding
        return holder if holder is not None and holding is not None and holder is not holding else None

    def load_s(self, new: PlanOption, *, holder: PlanOption | None, lost: Mapping[GpuZone, int]) -> float:
        return self.setup.costs.load_for_s(new.plan, holder=holder.plan if holder is not None else None, lost=lost)

    def charge_load(self, new: PlanOption, *, holder: PlanOption | None, lost: Mapping[GpuZone, int]) -> None:
        """The egress of the state ``new``'s ranks receive across zones from ``holder``'s and read
        from a far checkpoint bucket, charged when the change is decided (as the controller's
        expected cost counts it)."""
        pairs = self.setup.costs.load_egress_for(new.plan, holder=holder.plan if holder is not None else None,
                                                 lost=lost)
        for (src, dst), (num_bytes, usd) in pairs.items():
            self.ledger.charge_egress(src, dst, num_bytes=num_bytes, usd=usd, at_s=self.t)

    def plan_interim(self, new: PlanOption, held: Mapping[GpuZone, int], switch_at: float, *,
                     holder: PlanOption | None, lost: Mapping[GpuZone, int]) -> None:
        """The survivors ``new`` keeps train on their own plan until its new instances run,
        when it pays (controller/interim.py): they rejoin and load first, save after."""
        costs = self.setup.costs
        kept = kept_gpus(new.gpus, held)
        load_s = costs.load_s if self.ckpt_done > 0 else 0.0
        # (first at the next plan's own speed and the least load, an interim's ceiling: no planner
        # call when even that fails; survivors that keep their shards load nothing)
        if not kept or not interim_pays(window_s=self.vms_at - switch_at, rejoin_s=costs.rejoin_s,
                                        load_s=0.0 if costs.handover else load_s,
                                        save_s=costs.save_s, interim_samples_per_s=new.throughput_samples_per_s,
                                        next_samples_per_s=new.throughput_samples_per_s):
            return
        q = interim_option(self.setup.plan_fn, kept)
        if q is not None and self.ckpt_done > 0:
            load_s = self.load_s(q, holder=holder, lost=lost)
        if q is None or not interim_pays(window_s=self.vms_at - switch_at, rejoin_s=costs.rejoin_s, load_s=load_s,
                                         save_s=costs.save_s, interim_samples_per_s=q.throughput_samples_per_s,
                                         next_samples_per_s=new.throughput_samples_per_s):
            return
        self.interim, self.num_interims = q, self.num_interims + 1
        self.interim_from = switch_at + costs.rejoin_s + load_s
        self.resume_at = self.vms_at + costs.save_s
        self.ready_at = self.resume_at + costs.new_instance_start_s + self.load_s(new, holder=q, lost={})

    def stop(self, reason: str) -> None:
        running = self.phase in ("starting", "running")
        if reason.startswith("done"):
            self.finished_at = self.t
        self.release(self.t + (self.setup.costs.shutdown_s if running else 0.0), "stopped")
        self.plan, self.phase, self.stop_reason = None, "ended", reason

    def at_deadline(self) -> None:
        """The budget runs out now (but for the shutdown)."""
        self.ask(Event(kind=EventKind.TIMER))
        # Rounding can leave a sliver of budget that decide() does not see as gone.
        if self.phase != "ended" and self.leases and self.affordable_s() <= _EPS_S:
            self.apply(Decision(action=Action.STOP, reason="budget: only the shutdown is left to pay"),
                       Event(kind=EventKind.TIMER))

    # ---- simulated time between external events

    def advance(self, until: float) -> None:
        """Progress up to ``until``: start-ups ending, training, periodic checkpoints, the budget deadline."""
        while self.phase != "ended" and self.t < until:
            deadline = self.t + self.affordable_s() if self.leases else math.inf
            if self.phase == "idle":
                self.wait_s += until - self.t if self.launched else 0.0
                self.t = until
                return
            if self.phase == "starting":
                self.advance_starting(until, deadline)
            elif self.t < self.paused_until:
                self.advance_checkpointing(until, deadline)
            else:
                self.advance_training(until, deadline)

    def advance_starting(self, until: float, deadline: float) -> None:
        if self.in_interim():
            self.advance_interim(until, deadline)
            return
        tn = min(until, self.ready_at, deadline)
        if self.interim is not None and self.t < self.interim_from:
            tn = min(tn, self.interim_from)
        self.account_change(self.t, tn)
        self.t = tn
        if tn == deadline and tn < self.ready_at:
            self.at_deadline()
        elif tn == self.ready_at:
            self.phase, self.trained = "running", self.plan
            self.next_ckpt_at = self.t + self.setup.costs.checkpoint_interval_s
            self.paused_until = self.t
            self.record()
        elif self.in_interim():
            self.record()

    def advance_interim(self, until: float, deadline: float) -> None:
        """The interim plan trains until the new instances run, then its progress is saved;
        the kept GPUs it leaves out wait as in any change."""
        t0 = self.t
        reached = self.train_on(self.interim, until, deadline, stop_at=self.vms_at)
        self.provisioning_gpu_s += (self.kept_gpus - self.interim.num_gpus) * (self.t - t0)
        if reached:
            self.ckpt_done = self.done
            self.record()

    def account_change(self, t0: float, t1: float) -> None:
        """The paid GPU-seconds of a change from ``t0`` to ``t1``: the save on the old plan's GPUs,
        the kept GPUs while new instances boot, then every GPU of the new plan while it starts."""
        def span(a: float, b: float) -> float:
            return max(0.0, min(b, t1) - max(a, t0))

        self.checkpoint_gpu_s += self.saving_gpus * span(-math.inf, self.saving_until)
        if self.interim is None:
            self.provisioning_gpu_s += self.kept_gpus * span(self.saving_until, self.vms_at)
            self.starting_gpu_s += self.plan.num_gpus * span(max(self.saving_until, self.vms_at), math.inf)
            return
        # (the interim's training, from interim_from to vms_at, is advance_interim's)
        self.starting_gpu_s += self.kept_gpus * span(self.saving_until, self.interim_from)
        self.checkpoint_gpu_s += self.plan.num_gpus * span(self.vms_at, self.resume_at)
        self.starting_gpu_s += self.plan.num_gpus * span(self.resume_at, math.inf)

    def advance_checkpointing(self, until: float, deadline: float) -> None:
        """A periodic checkpoint is being written: no progress."""
        tn = min(until, self.paused_until, deadline)
        self.checkpoint_gpu_s += self.plan.num_gpus * (tn - self.t)
        self.t = tn
        if tn == deadline:
            self.at_deadline()
        elif tn == self.paused_until:
            self.record()

    def advance_training(self, until: float, deadline: float) -> None:
        if self.train_on(self.plan, until, deadline, stop_at=self.next_ckpt_at):
            self.ckpt_done = self.done
            self.paused_until = self.t + self.setup.costs.save_s
            self.next_ckpt_at = self.paused_until + self.setup.costs.checkpoint_interval_s
            self.record()

    def train_on(self, plan: PlanOption, until: float, deadline: float, *, stop_at: float) -> bool:
        """``plan`` trains until the first of ``until``, the end of the work (then asked about),
        the budget deadline (then handled) and ``stop_at``; True when it stopped at ``stop_at``."""
        x = plan.throughput_samples_per_s
        t_done = self.t + (self.setup.samples_target - self.done) / x if x > 0 else math.inf
        tn = min(until, t_done, stop_at, deadline)
        if tn > self.t:
            self.done += x * (tn - self.t)
            self.productive_gpu_s += plan.num_gpus * (tn - self.t)
            if plan.egress_usd_per_hr > 0:  # the simulator's egress per iteration, for the iterations trained
                self.ledger.charge_egress(*SIMULATED_PAIR, num_bytes=0.0, at_s=tn,
                                          usd=plan.egress_usd_per_hr * (tn - self.t) / _S_PER_HR)
        self.t = tn
        if tn == t_done:
            self.done = self.setup.samples_target
            self.ask(Event(kind=EventKind.PROGRESS))
        elif tn == deadline:
            self.at_deadline()
        return tn == stop_at and tn != t_done and tn != deadline

    # ---- external events: the trace's counts, preemptions and prices

    def on_trace_event(self, t: float) -> None:
        """The trace at ``t``: preemptions first (against the counts before), new prices, new counts."""
        setup = self.setup
        new_counts = setup.trace.counts_at(t)
        indices = setup.events.preemptions_at.get(t, [])
        for i in indices:
            e = setup.trace.preemptions[i]
            key = (e.gpu, e.zone)
            self.seen_events[key] = self.seen_events.get(key, 0) + 1
            pool = max(self.avail.get(key, 0), e.num_gpus)
            self.seen_share[key] = self.seen_share.get(key, 0.0) + (min(1.0, e.num_gpus / pool) if pool else 1.0)
        holding = self.holding
        lost = gpus_lost(setup.trace, indices, setup.events.shares, held=holding.gpus, before=self.avail,
                         after=new_counts) if holding is not None else {}
        for lease, (g, z, spot, num) in self.leases.items():
            if spot:
                self.ledger.set_price(lease, setup.price_fn(g, z, t) * num, t)
        changed = dict(new_counts) != self.avail
        self.avail = dict(new_counts)
        if lost:
            self.num_hits += 1
            self.lose_work(lost)
            self.ask(Event(kind=EventKind.PREEMPTION, lost=lost, zone_hint=next(iter(lost))[1]))
        elif changed or self.phase == "idle":
            self.ask(Event(kind=EventKind.CAPACITY))

    def lose_work(self, lost: Mapping[GpuZone, int]) -> None:
        """A preemption hit us: an emergency save if the notice allows it, else back to the last checkpoint."""
        training = self.interim if self.in_interim() else self.plan if self.phase == "running" else None
        if training is None:
            return
        costs = self.setup.costs
        if costs.save_s <= min(costs.notice_s(z) for (_, z) in lost):
            self.ckpt_done = self.done
            return
        gone = self.done - self.ckpt_done
        if gone > 0 and training.throughput_samples_per_s > 0:
            self.lost_samples += gone
            self.lost_gpu_s += gone / training.throughput_samples_per_s * training.num_gpus
        self.done = self.ckpt_done

    def end_at_horizon(self) -> None:
        """The trace ran out before the work or the budget: release what is held."""
        self.release(self.t + (self.setup.costs.shutdown_s if self.leases else 0.0), "horizon")
        self.stop_reason = self.stop_reason or "horizon: the trace ended before the work did"
        self.phase = "ended"
        self.record()

    # ---- the result

    def result(self, *, policy: str, budget_usd: float | None) -> ReplayResult:
        ledger = self.ledger
        end_s = max([self.t] + [e.end_s for e in ledger.entries() if e.end_s is not None])
        paid_gpu_s = ledger.gpu_seconds(end_s)
        useful_gpu_s = self.productive_gpu_s - self.lost_gpu_s
        by_activity = {"training": useful_gpu_s, "redone": self.lost_gpu_s, "checkpointing": self.checkpoint_gpu_s,
                       "provisioning": self.provisioning_gpu_s, "starting": self.starting_gpu_s}
        by_activity["other"] = max(0.0, paid_gpu_s - sum(by_activity.values()))
        assert tuple(by_activity) == GPU_TIME_KINDS
        return ReplayResult(
            policy=policy, finished=self.finished_at is not None, stop_reason=self.stop_reason,
            time_to_train_s=self.finished_at, end_s=end_s,
            samples_done=self.done, samples_target=self.setup.samples_target,
            usd_spent=ledger.spent_usd(end_s), budget_usd=budget_usd, egress_usd=ledger.egress_usd(),
            **load_egress_fields({p: v for p, v in ledger.egress_by_pair().items() if p != SIMULATED_PAIR}),
            useful_work_fraction=useful_gpu_s / paid_gpu_s if paid_gpu_s > 0 else 0.0,
            num_replans=self.num_replans, num_restarts=self.num_restarts, num_preemptions_hit=self.num_hits,
            work_lost_samples=self.lost_samples, wait_s=self.wait_s,
            usd_by_gpu_zone={f"{g}@{z}": v for (g, z), v in sorted(ledger.by_gpu_zone(end_s).items())},
            timeline=tuple(self.timeline), decisions=tuple(self.decisions),
            usd_by_market=dict(sorted(ledger.by_market(end_s).items())), num_declined=self.num_declined,
            gpu_s_by_activity=by_activity, num_interims=self.num_interims,
        )


def replay(
    trace: AvailabilityTrace,
    *,
    policy: ReplayPolicy,
    market: Market,
    goal: Goal,
    costs: ChangeCosts,
    seed: int = 0,
    max_time_s: float | None = None,
    lookahead: Lookahead | None = None,
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Replay ``trace`` under one policy, in ``market``, working to ``goal``; see the module doc.

    ``max_time_s``: when to stop (default: 30 days after the trace's end).  ``progress``, when
    given, is called with the simulated time at every external event; ``lookahead``, when
    given, is told after every decision what the controller will likely ask the planner next.
    """
    config = policy.config
    setup = _setup(trace, seed=seed, max_time_s=max_time_s, price_change_times=market.price_change_times,
                   plan_fn=costs.with_saves(policy.plan_fn), cost_plan_fn=costs.with_saves(policy.cost_plan_fn),
                   config=config, costs=costs, samples_target=goal.samples_target, price_fn=market.price_fn,
                   on_demand_price_fn=market.on_demand_price_fn or market.price_fn,
                   on_demand_available=dict(market.on_demand_available),
                   deadline_s=math.inf if goal.deadline_s is None else float(goal.deadline_s), lookahead=lookahead)
    r = _Replay(setup=setup, ledger=CostLedger(budget_usd=goal.budget_usd), avail=dict(trace.rows[0][1]))
    r.record()
    if lookahead is not None:
        lookahead.prefetch(first_requests(trace, config, setup.on_demand_available))
    r.ask(Event(kind=EventKind.START))
    for j, t in enumerate(setup.events.times):
        if r.phase == "ended" or t > setup.horizon_s:
            break
        r.next_event = j + 1
        if progress is not None:
            progress(t)
        r.advance(t)
        if r.phase == "ended":
            break
        r.on_trace_event(t)
    if r.phase != "ended":
        r.advance(setup.horizon_s)
    if r.phase != "ended":
        r.end_at_horizon()
    return r.result(policy=policy.name, budget_usd=goal.budget_usd)
