"""The controller's decisions: what to do when capacity, progress or time changes.

``decide(state, event, config=..., plan_fn=...)`` is pure: the train-job flow
and the replay both call it and carry out its Decision (launch the new plan,
keep going, release everything and wait, or stop).  Three strategies:

* ``replan`` (Sailor): re-plan over every allowed GPU type and zone whenever
  something changes; switch when the new plan finishes the remaining work
  sooner by ``min_gain`` after paying ``change_cost_s`` (with ``gpu_types`` set
  this is "our planner restricted to one GPU type");
* ``failover`` (SkyPilot-style managed job): one fixed GPU request in one zone;
  on preemption restart it in the next cheapest zone with room for it, never
  resized;
* ``static``: the plan chosen at the start; after a loss it re-plans on the GPUs
  it still holds and never grows back.

Budget: a plan that cannot finish within the budget left gives way to one that
can (``shrink``); if none can, the one that trains the most per USD runs until
``stop_in_s``, when the caller must ask again and gets ``stop`` -- before the
budget would be crossed, with the shutdown still to pay set aside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from sailor_core.controller.options import GpuZone, PlanFn, PlanOption, describe_gpus, restrict
from sailor_core.errors import InputError

_S_PER_HR = 3600.0
STRATEGIES = ("replan", "failover", "static")


class Action(str, Enum):
    CONTINUE = "continue"  # keep the current plan
    REPLAN = "replan"      # switch to ``plan`` (checkpoint, reprovision, resume)
    SHRINK = "shrink"      # switch to the cheaper ``plan`` so the budget lasts
    WAIT = "wait"          # nothing can run now: hold no instances, wait for capacity
    STOP = "stop"          # the job ends (done, budget, or nothing will ever run)


class EventKind(str, Enum):
    START = "start"
    PREEMPTION = "preemption"
    CAPACITY = "capacity"   # availability changed without taking our GPUs
    PROGRESS = "progress"
    TIMER = "timer"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: EventKind
    lost: Mapping[GpuZone, int] = field(default_factory=dict)  # our GPUs taken away
    zone_hint: str | None = None  # failover: the zone just preempted


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerConfig:
    strategy: str = "replan"
    gpu_types: tuple[str, ...] | None = None   # None: every type
    shutdown_s: float = 120.0     # paid after deciding to stop: final checkpoint + terminate
    change_cost_s: float = 300.0  # time a plan change loses (provision, start-up, checkpoint, lost work)
    min_gain: float = 0.05        # re-plan on new capacity only when it finishes this much sooner
    # Ask the planner about new capacity only once the GPUs beyond what the
    # current plan was chosen from reach this fraction of them (or a new pool
    # appears): small returns cannot pay for a restart, and each call costs.
    min_growth: float = 0.10
    # Also ask the planner for each GPU type alone: a plan over fewer, calmer pools
    # can finish sooner once restarts are counted (and a capped search may miss it).
    per_type_options: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InputError(f"unknown controller strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.strategy == "failover" and not self.gpu_types:
            raise InputError("the failover strategy needs exactly one GPU type")
        if self.shutdown_s < 0 or self.change_cost_s < 0 or self.min_gain < 0 or self.min_growth < 0:
            raise InputError("controller times and gain must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerState:
    plan: PlanOption | None                 # running now (None: nothing runs)
    available: Mapping[GpuZone, int]        # GPUs obtainable now, counting those we hold
    budget_left_usd: float = math.inf
    samples_done: float = 0.0
    samples_target: float = math.inf
    last_plan: PlanOption | None = None     # the last plan that ran (failover keeps its request)
    planned_on: Mapping[GpuZone, int] | None = None  # availability the current plan was chosen from
    # Preemption events per second seen so far on each pool (empty: unknown, treated as 0).
    preemption_rate_per_s: Mapping[GpuZone, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    action: Action
    reason: str
    plan: PlanOption | None = None  # what runs after this decision
    stop_in_s: float = math.inf     # ask again (TIMER) at the latest after this long
    planned_on: Mapping[GpuZone, int] | None = None  # keep it for the next ControllerState

    @property
    def changes_plan(self) -> bool:
        return self.action in (Action.REPLAN, Action.SHRINK)


def observed_preemption_rates_per_s(num_events: Mapping[GpuZone, int], observed_s: float) -> dict[GpuZone, float]:
    """Preemption events per second on each pool from what was seen so far, for
    ``ControllerState.preemption_rate_per_s``: at least an hour in the denominator, so the
    first event does not read as a storm.  The replay and the train-job flow both use it."""
    return {k: n / max(observed_s, _S_PER_HR) for k, n in num_events.items() if n > 0}


def decide(state: ControllerState, event: Event, *, config: ControllerConfig, plan_fn: PlanFn) -> Decision:
    remaining = max(0.0, state.samples_target - state.samples_done)
    if remaining <= 0:
        return Decision(action=Action.STOP, reason="done: target reached")
    current = state.plan
    lost = {k: n for k, n in event.lost.items() if n > 0 and current is not None and current.gpus.get(k, 0) > 0}
    broken = current is not None and (bool(lost) or not current.fits_in(state.available))
    if current is not None and not broken:
        deadline = _stop_in_s(current, state, config)
        if deadline <= 1e-3:  # seconds; rounding must not keep a spent job alive
            return Decision(action=Action.STOP, reason="budget: only the shutdown is left to pay")
    elif state.budget_left_usd <= 0:
        return Decision(action=Action.STOP, reason="budget: spent")

    if config.strategy == "failover":
        return _decide_failover(state, event, lost, broken, config, plan_fn, remaining)
    if config.strategy == "static":
        return _decide_static(state, event, lost, broken, config, plan_fn, remaining)
    return _decide_replan(state, event, lost, broken, config, plan_fn, remaining)


# ---- strategies ---------------------------------------------------------------


def _decide_replan(state, event, lost, broken, config, plan_fn, remaining) -> Decision:
    current = state.plan
    avail = restrict(state.available, config.gpu_types)
    if current is not None and not broken and not grew(avail, state.planned_on, config.min_growth):
        return _keep(current, state, config)
    options = list(plan_fn(avail))
    types = sorted({g for g, _ in avail})
    if config.per_type_options and len(types) > 1:
        for gpu in types:
            options += list(plan_fn(restrict(avail, (gpu,))))[:1]
    options.sort(key=lambda o: _expected_s(o, remaining, state, config))
    if current is None or broken:
        choice = _choose(options, state, config, remaining)
        why = _why_new(current, lost, event)
        if choice is None:
            return _nothing_runs(why, options, state, config)
        return _run(Action.REPLAN, f"{why}: {choice.label or describe_gpus(choice.gpus)}", choice, state, config,
                    planned_on=avail)
    choice = _choose(options, state, config, remaining)
    if choice is None or choice.gpus == current.gpus:
        return _keep(current, state, config, planned_on=avail)
    if not _finishes(current, state, config, remaining) and _finishes(choice, state, config, remaining):
        return _run(Action.SHRINK, f"budget: switch to a plan that finishes within it ({choice.label})",
                    choice, state, config, planned_on=avail)
    if _switch_pays(current, choice, remaining, state, config):
        t_now = _expected_s(current, remaining, state, config)
        t_new = config.change_cost_s + _expected_s(choice, remaining, state, config)
        return _run(Action.REPLAN, f"capacity: {choice.label} finishes in {t_new / _S_PER_HR:.2f} h "
                    f"instead of {t_now / _S_PER_HR:.2f} h", choice, state, config, planned_on=avail)
    return _keep(current, state, config, planned_on=avail)


def _decide_failover(state, event, lost, broken, config, plan_fn, remaining) -> Decision:
    current = state.plan
    if current is not None and not broken:
        return _keep(current, state, config)
    gpu = config.gpu_types[0]
    request = state.last_plan
    avail = restrict(state.available, (gpu,))
    zones = sorted({z for (_, z) in avail})
    if request is None:  # first launch: the best single-zone plan of this GPU type
        candidates = [o for z in zones for o in plan_fn({(gpu, z): avail[(gpu, z)]})[:1]]
        choice = _choose(sorted(candidates, key=lambda o: -o.throughput_samples_per_s), state, config, remaining)
        if choice is None:
            return _nothing_runs("start", candidates, state, config)
        return _run(Action.REPLAN, f"start: {choice.label}", choice, state, config)
    # Same request, moved: cheapest zone with room first, the zone just lost last.
    size = request.num_gpus
    lost_zone = event.zone_hint or (next(iter(lost))[1] if lost else None)
    moved = []
    for z in zones:
        if avail.get((gpu, z), 0) >= size:
            opts = plan_fn({(gpu, z): size})
            if opts:
                moved.append(opts[0])
    moved.sort(key=lambda o: (next(iter(o.gpus))[1] == lost_zone, o.usd_per_hr))
    why = _why_new(current, lost, event)
    if not moved:
        return Decision(action=Action.WAIT, reason=f"{why}: no zone has {size}x{gpu} free; waiting")
    choice = moved[0]
    if not _affordable_at_all(choice, state, config):
        return Decision(action=Action.STOP, reason="budget: not enough left to restart")
    return _run(Action.REPLAN, f"{why}: restart {choice.label}", choice, state, config)


def _decide_static(state, event, lost, broken, config, plan_fn, remaining) -> Decision:
    current = state.plan
    if current is None and state.last_plan is None:
        return _decide_replan(state, event, lost, broken, config, plan_fn, remaining)
    if current is None:
        return Decision(action=Action.STOP, reason="static: the plan lost all its GPUs and never grows back")
    if not broken:
        return _keep(current, state, config)
    held = {k: min(n - lost.get(k, 0), state.available.get(k, 0)) for k, n in current.gpus.items()}
    held = {k: n for k, n in held.items() if n > 0}
    options = plan_fn(held) if held else ()
    choice = _choose(options, state, config, remaining)
    why = _why_new(current, lost, event)
    if choice is None:
        return Decision(action=Action.STOP,
                        reason=f"static: {why}; the GPUs left run no plan and a static plan never grows back")
    return _run(Action.REPLAN, f"{why}: shrink to {choice.label}", choice, state, config)


# ---- helpers --------------------------------------------------------------------


def _time_to_finish_s(option: PlanOption, remaining: float) -> float:
    x = option.throughput_samples_per_s
    return remaining / x if x > 0 else math.inf


def _expected_s(option: PlanOption, remaining: float, state: ControllerState, config: ControllerConfig) -> float:
    """Time to finish counting restarts: each preemption of a pool the plan uses costs
    about one change (``change_cost_s``) of downtime, at the rate seen on that pool."""
    rate = sum(state.preemption_rate_per_s.get(k, 0.0) for k, n in option.gpus.items() if n > 0)
    return _time_to_finish_s(option, remaining) * (1.0 + rate * config.change_cost_s)


def _switch_pays(current: PlanOption, choice: PlanOption, remaining: float, state: ControllerState,
                 config: ControllerConfig) -> bool:
    """A voluntary switch gains only until the work ends or the next preemption forces
    a re-plan anyway; it pays when that gain beats the work the switch itself stops.

    Gain: (x_new - x_now) over min(time to finish, 1 / preemption rate of the new
    plan), with x the throughput after expected restarts.  Cost: ``change_cost_s``
    of the current throughput.  Without preemption rates this is the plain test
    "finishes sooner after paying the change"; ``min_gain`` is the margin.
    """
    x_now = remaining / _expected_s(current, remaining, state, config) if remaining > 0 else 0.0
    t_new = _expected_s(choice, remaining, state, config)
    x_new = remaining / t_new if t_new > 0 else 0.0
    if x_new <= x_now:
        return False
    rate = sum(state.preemption_rate_per_s.get(k, 0.0) for k, n in choice.gpus.items() if n > 0)
    horizon_s = min(t_new, 1.0 / rate) if rate > 0 else t_new
    gain = (x_new - x_now) * horizon_s
    cost = x_now * config.change_cost_s
    return gain > cost * (1.0 + config.min_gain) + config.min_gain * x_now * horizon_s


def _finishes(option: PlanOption, state: ControllerState, config: ControllerConfig, remaining: float) -> bool:
    if math.isinf(state.budget_left_usd):
        return True
    need_s = config.change_cost_s + _time_to_finish_s(option, remaining) + config.shutdown_s
    return option.usd_per_hr * need_s / _S_PER_HR <= state.budget_left_usd


def _affordable_at_all(option: PlanOption, state: ControllerState, config: ControllerConfig) -> bool:
    """Can it run long enough to get past its start-up and still pay its shutdown?"""
    if math.isinf(state.budget_left_usd):
        return True
    return option.usd_per_hr * (config.change_cost_s + config.shutdown_s) / _S_PER_HR < state.budget_left_usd


def _choose(options, state: ControllerState, config: ControllerConfig, remaining: float) -> PlanOption | None:
    """The planner's best that finishes within budget; else the most samples per USD."""
    usable = [o for o in options if o.throughput_samples_per_s > 0 and _affordable_at_all(o, state, config)]
    if not usable:
        return None
    for o in usable:
        if _finishes(o, state, config, remaining):
            return o
    return max(usable, key=lambda o: o.samples_per_usd())


def _stop_in_s(option: PlanOption, state: ControllerState, config: ControllerConfig) -> float:
    if math.isinf(state.budget_left_usd) or option.usd_per_hr <= 0:
        return math.inf
    return state.budget_left_usd * _S_PER_HR / option.usd_per_hr - config.shutdown_s


def grew(avail: Mapping[GpuZone, int], planned_on: Mapping[GpuZone, int] | None, min_growth: float) -> bool:
    """Whether ``avail`` has grown enough past the availability the plan in use was made on to re-plan
    (a new pool, or ``min_growth`` more GPUs); the replay's lookahead asks the same question."""
    if planned_on is None:
        return True
    extra = sum(max(0, n - planned_on.get(k, 0)) for k, n in avail.items())
    if any(n > 0 and planned_on.get(k, 0) == 0 for k, n in avail.items()):
        return True
    return extra > 0 and extra >= min_growth * sum(planned_on.values())


def _run(action: Action, reason: str, option: PlanOption, state, config, planned_on=None) -> Decision:
    return Decision(action=action, reason=reason, plan=option, stop_in_s=_stop_in_s(option, state, config),
                    planned_on=planned_on)


def _keep(current: PlanOption, state, config, planned_on=None) -> Decision:
    return Decision(action=Action.CONTINUE, reason="no better plan", plan=current,
                    stop_in_s=_stop_in_s(current, state, config),
                    planned_on=planned_on if planned_on is not None else state.planned_on)


def _nothing_runs(why: str, options, state, config) -> Decision:
    if options and not any(_affordable_at_all(o, state, config) for o in options):
        return Decision(action=Action.STOP, reason="budget: not enough left to start any plan")
    return Decision(action=Action.WAIT, reason=f"{why}: no plan fits the GPUs available; waiting for capacity")


def _why_new(current: PlanOption | None, lost: Mapping[GpuZone, int], event: Event) -> str:
    if current is None:
        return "start" if event.kind == EventKind.START else "capacity returned"
    if lost:
        return "preemption: lost " + describe_gpus(lost)
    return "capacity: the plan no longer fits"
