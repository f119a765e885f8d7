"""The controller's decisions: what to do when capacity, progress or time changes.

``decide(state, event, config=..., plan_fn=...)`` is pure: the train-job flow
and the replay both call it and carry out its Decision (launch the new plan,
keep going, release everything and wait, or stop).  Three strategies:

* ``replan`` (Sailor): re-plan over every allowed GPU type and zone whenever the plan
  is broken, the capacity grew, or the plan in use no longer meets the job's
  constraints; the job's objective ranks the options by their expected time or cost
  to finish under each pool's preemption rate (``economics``), and a running plan is
  left only when the switch pays for itself before the next preemption would force a
  re-plan anyway (with ``gpu_types`` set this is "our planner restricted to one GPU type");
* ``failover`` (SkyPilot-style managed job): one fixed GPU request in one zone;
  on preemption restart it in the next cheapest zone with room for it, never
  resized;
* ``static``: the plan chosen at the start; after a loss it re-plans on the GPUs
  it still holds and never grows back.

The job's objective and constraints (``ControllerConfig.objective``, the throughput
floor, ``ControllerState.budget_left_usd`` and ``time_left_s``): ``throughput`` finishes
soonest, ``cost`` for the fewest USD; options that would cross the budget, miss the
deadline or fall below the floor give way to those that do not (when none meets the
deadline or the floor, the fastest runs).  Budget: if no option finishes within it, the
one that trains the most per USD runs until ``stop_in_s``, when the caller must ask again
and gets ``stop`` -- before the budget would be crossed, with the shutdown still to pay
set aside.

Every decision says why in plain words (``Decision.reason``), a declined switch too
(``Decision.declined``: the better plan left alone, and why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from sailor_core.controller.economics import Costs, Outlook, change_s, outlook, switch_pays, switch_window
from sailor_core.controller.options import (
    CostPlanFn,
    GpuZone,
    PlanFn,
    PlanOption,
    describe_gpus,
    floors_on_grid,
    restrict,
    with_on_demand,
)
from sailor_core.errors import InputError

_S_PER_HR = 3600.0
STRATEGIES = ("replan", "failover", "static")
OBJECTIVES = ("throughput", "cost")


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
    objective: str = "throughput"  # throughput: finish soonest; cost: finish for the fewest USD
    min_throughput_samples_per_s: float | None = None  # floor on the expected (after restarts) throughput
    shutdown_s: float = 120.0     # paid after deciding to stop: final checkpoint + terminate
    # The costs of change (economics.Costs): a planned switch pays save + provisioning (for
    # instances not held) + start-up; a preemption that hits the plan costs provisioning +
    # start-up + the work redone.
    save_s: float = 0.0           # checkpoint before a planned switch
    provisioning_s: float = 150.0  # new instances up
    startup_s: float = 150.0      # workers started, rendezvous, checkpoint loaded
    work_lost_s: float = 0.0      # training redone per preemption (0 when the notice covers a save)
    min_gain: float = 0.05        # a voluntary switch must gain this much (samples, or USD per sample)
    # Ask the planner about new capacity only once the GPUs beyond what the
    # current plan was chosen from reach this fraction of them (or a new pool
    # appears): small returns cannot pay for a restart, and each call costs.
    min_growth: float = 0.10
    # Also ask the planner for each GPU type alone: a plan over fewer, calmer pools
    # can finish sooner once restarts are counted (and a capped search may miss it).
    per_type_options: bool = True
    # Also ask it without the stormiest pools, one more left out each time (pools with a
    # preemption rate, by the rate at which they take a GPU held there): a plan may leave a
    # stormy pool unused on purpose.
    calm_options: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InputError(f"unknown controller strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.strategy == "failover" and not self.gpu_types:
            raise InputError("the failover strategy needs exactly one GPU type")
        if self.objective not in OBJECTIVES:
            raise InputError(f"unknown objective {self.objective!r}; known: {', '.join(OBJECTIVES)}")
        times = (self.shutdown_s, self.save_s, self.provisioning_s, self.startup_s, self.work_lost_s)
        if min(times) < 0 or self.min_gain < 0 or self.min_growth < 0:
            raise InputError("controller times and gain must be >= 0")
        if self.min_throughput_samples_per_s is not None and not self.min_throughput_samples_per_s > 0:
            raise InputError(f"throughput floor must be positive, got {self.min_throughput_samples_per_s}")

    @property
    def costs(self) -> Costs:
        return Costs(save_s=self.save_s, provisioning_s=self.provisioning_s, startup_s=self.startup_s,
                     work_lost_s=self.work_lost_s)

    @property
    def change_cost_s(self) -> float:
        """Downtime of a planned switch to new instances."""
        return self.save_s + self.provisioning_s + self.startup_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerState:
    plan: PlanOption | None                 # running now (None: nothing runs)
    available: Mapping[GpuZone, int]        # spot GPUs obtainable now, counting those we hold
    budget_left_usd: float = math.inf
    time_left_s: float = math.inf           # until the job's deadline
    samples_done: float = 0.0
    samples_target: float = math.inf
    last_plan: PlanOption | None = None     # the last plan that ran (failover keeps its request)
    planned_on: Mapping[GpuZone, int] | None = None  # availability the current plan was chosen from
    # Preemption events per second seen so far on each pool (empty: unknown, treated as 0).
    preemption_rate_per_s: Mapping[GpuZone, float] = field(default_factory=dict)
    # Of each pool, the share of its GPUs one preemption event takes (empty: 1, every event hits).
    preemption_share: Mapping[GpuZone, float] = field(default_factory=dict)
    # On-demand GPUs obtainable per pool (empty: spot only); never preempted.
    on_demand_available: Mapping[GpuZone, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    action: Action
    reason: str
    plan: PlanOption | None = None  # what runs after this decision
    stop_in_s: float = math.inf     # ask again (TIMER) at the latest after this long
    planned_on: Mapping[GpuZone, int] | None = None  # keep it for the next ControllerState
    declined: PlanOption | None = None  # CONTINUE: a plan that ranked better, left alone (``reason`` says why)
    why: str = ""  # the economics of the choice (or of the switch declined) in plain words, for people

    @property
    def changes_plan(self) -> bool:
        return self.action in (Action.REPLAN, Action.SHRINK)


# One event alone must not read as a storm: a rate is counted over at least this long.
RATE_WINDOW_S = _S_PER_HR


def observed_preemption_rates_per_s(num_events: Mapping[GpuZone, int], observed_s: float, *,
                                    window_s: float = RATE_WINDOW_S) -> dict[GpuZone, float]:
    """Preemption events per second on each pool from what was seen so far, for
    ``ControllerState.preemption_rate_per_s``: at least ``window_s`` (an hour, or
    ``rate_window_s``) in the denominator, so the first event does not read as a storm.
    The replay and the train-job flow both use it."""
    return {k: n / max(observed_s, window_s) for k, n in num_events.items() if n > 0}


def rate_window_s(elapsed_s: float, fraction_done: float) -> float:
    """The least time a rate is counted over: an hour, or the job's expected length when that is
    shorter (elapsed / fraction done): what matters is how often a pool stops the job relative to
    the job itself, and a job of minutes learns from minutes."""
    if fraction_done <= 0 or elapsed_s <= 0:
        return RATE_WINDOW_S
    return min(RATE_WINDOW_S, elapsed_s / min(1.0, fraction_done))


def decide(state: ControllerState, event: Event, *, config: ControllerConfig, plan_fn: PlanFn,
           cost_plan_fn: CostPlanFn | None = None) -> Decision:
    """The controller's decision on ``event``; ``plan_fn`` is the planner (its best plans on an
    availability, best first).  ``cost_plan_fn``, when given, is the planner's cheapest plans
    above a throughput floor: with the cost objective (above its floor) or a deadline (above
    what finishing in time needs) they join the options on the whole availability."""
    remaining = max(0.0, state.samples_target - state.samples_done)
    if remaining <= 0:
        return Decision(action=Action.STOP, reason="done: target reached")
    current = state.plan
    lost = {k: n for k, n in event.lost.items() if n > 0 and current is not None and current.gpus.get(k, 0) > 0}
    broken = current is not None and (bool(lost) or not current.fits_in(state.available, state.on_demand_available))
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
    return _decide_replan(state, event, lost, broken, config, plan_fn, cost_plan_fn, remaining)


# ---- the job's objective over the options ---------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ranking:
    """Options' outlooks seen from one state: what still trains (``running``: a switch saves
    it first and it needs no change itself) and what is held (no provisioning needed)."""

    state: ControllerState
    config: ControllerConfig
    remaining: float
    running: PlanOption | None
    held: Mapping[GpuZone, int]
    held_on_demand: Mapping[GpuZone, int]

    def of(self, option: PlanOption) -> Outlook:
        change = change_s(option, running=self.running, held=self.held, held_on_demand=self.held_on_demand,
                          costs=self.config.costs)
        return outlook(option, remaining=self.remaining, change=change, rates=self.state.preemption_rate_per_s,
                       shares=self.state.preemption_share, costs=self.config.costs)

    def finishes(self, o: Outlook) -> bool:
        """Within the budget left: the expected cost to finish, then the shutdown."""
        if math.isinf(self.state.budget_left_usd):
            return True
        return o.option.usd_per_hr * (o.time_s + self.config.shutdown_s) / _S_PER_HR <= self.state.budget_left_usd

    def in_time(self, o: Outlook) -> bool:
        return o.time_s <= self.state.time_left_s

    def above_floor(self, o: Outlook) -> bool:
        floor = self.config.min_throughput_samples_per_s
        return floor is None or o.effective_samples_per_s >= floor

    def holds(self, o: Outlook) -> bool:
        """Every constraint: budget, deadline, floor."""
        return self.finishes(o) and self.in_time(o) and self.above_floor(o)

    def key(self, o: Outlook) -> tuple[float, float]:
        if self.config.objective == "cost":
            return (o.cost_usd, o.time_s)
        return (o.time_s, o.cost_usd)

    def best(self, outlooks: Sequence[Outlook]) -> tuple[Outlook | None, str]:
        """The option the objective picks among those that finish within the budget, and the
        constraint it had to give up ("" when none).  None when none finishes within it."""
        within = [o for o in outlooks if o.effective_samples_per_s > 0 and self.finishes(o)]
        if not within:
            return None, ""
        in_time = [o for o in within if self.in_time(o)]
        floor_ok = [o for o in in_time if self.above_floor(o)]
        if floor_ok:
            return min(floor_ok, key=self.key), ""
        why = ("no plan finishes by the deadline" if not in_time
               else "no plan keeps the throughput floor")
        return min(within, key=lambda o: (o.time_s, o.cost_usd)), f"{why}; the fastest runs"


def _ranking(state: ControllerState, config: ControllerConfig, remaining: float, *,
             lost: Mapping[GpuZone, int], broken: bool) -> _Ranking:
    current = state.plan
    held = {k: n - lost.get(k, 0) for k, n in current.gpus.items()} if current is not None else {}
    return _Ranking(state=state, config=config, remaining=remaining,
                    running=current if current is not None and not broken else None,
                    held={k: n for k, n in held.items() if n > 0},
                    held_on_demand=dict(current.on_demand) if current is not None else {})


def planner_requests(avail: Mapping[GpuZone, int], state: ControllerState, config: ControllerConfig
                     ) -> list[dict[GpuZone, int]]:
    """The availabilities a re-plan asks ``plan_fn`` about, in order: every allowed pool (spot
    and on-demand together when the job may rent on demand), each GPU type alone (its best
    plan), then without the stormiest pools, one more left out each time (its best plan).
    The replay's lookahead guesses the same."""
    od = restrict(state.on_demand_available, config.gpu_types)
    ask = _combined(avail, od)
    out = [ask]
    types = sorted({g for g, _ in ask})
    if config.per_type_options and len(types) > 1:
        out += [restrict(ask, (gpu,)) for gpu in types]
    if config.calm_options:  # a stormy pool's spot GPUs are left out, its on-demand ones stay
        out += [_combined(calmer, od) for calmer in _calmer_pools(avail, state, keep_one=not od)]
    return out


def _candidates(avail: Mapping[GpuZone, int], state: ControllerState, config: ControllerConfig, plan_fn: PlanFn,
                cost_plan_fn: CostPlanFn | None, *, useful: float) -> list[PlanOption]:
    """What the planner offers (``planner_requests``; the first request's plans all, the others'
    best), the cheapest plans with the cost objective or a deadline (``cheap_floor``), each on
    its markets."""
    asks = planner_requests(avail, state, config)
    options = list(plan_fn(asks[0]))
    for ask in asks[1:]:
        options += list(plan_fn(ask))[:1]
    if cost_plan_fn is not None and (config.objective == "cost" or math.isfinite(state.time_left_s)):
        for floor in cheap_floors(state, config, useful=useful):
            options += list(cost_plan_fn(asks[0], floor))
    options = _distinct(options)
    od_avail = restrict(state.on_demand_available, config.gpu_types)
    if od_avail:
        options = [v for o in options for v in _market_variants(o, avail, od_avail, state)]
    return options


def cheap_floors(state: ControllerState, config: ControllerConfig, *, useful: float) -> tuple[float | None, ...]:
    """The throughput floors of the planner's cheapest plans: the job's floor and, with a deadline,
    what finishing in time needs (the samples left over the time left after a change, divided
    by the share of the time the plan in use trains, ``useful``), on ``floors_on_grid``
    (the grid's floors just below and above it); (None,): no floor."""
    floor = config.min_throughput_samples_per_s or 0.0
    if math.isfinite(state.time_left_s):
        remaining = max(0.0, state.samples_target - state.samples_done)
        window_s = state.time_left_s - config.change_cost_s
        if window_s > 0 and remaining > 0:
            need = remaining / window_s / max(useful, 1e-3)
            if need > floor:
                return floors_on_grid(need)
    return (floor,) if floor > 0 else (None,)


def _combined(spot: Mapping[GpuZone, int], on_demand: Mapping[GpuZone, int]) -> dict[GpuZone, int]:
    out = dict(spot)
    for k, n in on_demand.items():
        out[k] = out.get(k, 0) + n
    return {k: n for k, n in out.items() if n > 0}


def _storminess(state: ControllerState, k: GpuZone) -> float:
    """How often a pool takes one given GPU of ours: its event rate times an event's share."""
    return state.preemption_rate_per_s.get(k, 0.0) * state.preemption_share.get(k, 1.0)


def _calmer_pools(avail: Mapping[GpuZone, int], state: ControllerState, *, keep_one: bool = True
                  ) -> list[dict[GpuZone, int]]:
    """``avail`` without its stormiest pool, then without the two stormiest, ... (pools with
    a preemption rate only; with ``keep_one``, at least one pool is always left)."""
    stormy = sorted((k for k in avail if _storminess(state, k) > 0), key=lambda k: (-_storminess(state, k), k))
    out, left = [], dict(avail)
    for k in stormy:
        del left[k]
        if not left and keep_one:
            break
        out.append(dict(left))
    return out


def _distinct(options: Sequence[PlanOption]) -> list[PlanOption]:
    """The options, each plan once (the first time it is offered)."""
    seen, out = set(), []
    for o in options:
        key = (tuple(sorted(o.gpus.items())), tuple(sorted(o.on_demand.items())),
               o.throughput_samples_per_s, o.usd_per_hr)
        if key not in seen:
            seen.add(key)
            out.append(o)
    return out


def _market_variants(option: PlanOption, spot: Mapping[GpuZone, int], od_avail: Mapping[GpuZone, int],
                     state: ControllerState) -> list[PlanOption]:
    """``option`` (planned on spot and on-demand pools together) on its markets: spot first
    (on demand only what spot cannot hold), then with its stormiest pools wholly on demand, one
    more each time, until every GPU is (as far as the on-demand capacity allows)."""
    if not option.on_demand_premium_usd_per_hr:
        return [option] if option.fits_in(spot) else []
    over = {k: n - spot.get(k, 0) for k, n in option.gpus.items() if n > spot.get(k, 0)}
    if any(n > od_avail.get(k, 0) or k not in option.on_demand_premium_usd_per_hr for k, n in over.items()):
        return []
    base = with_on_demand(option, over) if over else option
    variants, moved = [base], dict(over)
    for k in sorted(base.gpus, key=lambda k: (-_storminess(state, k), k)):
        n = option.gpus[k]
        if k not in option.on_demand_premium_usd_per_hr or n > od_avail.get(k, 0):
            continue
        moved[k] = n
        variants.append(with_on_demand(option, moved))
    return variants


# ---- strategies ---------------------------------------------------------------


def _decide_replan(state, event, lost, broken, config, plan_fn, cost_plan_fn, remaining) -> Decision:
    current = state.plan
    avail = restrict(state.available, config.gpu_types)
    rank = _ranking(state, config, remaining, lost=lost, broken=broken)
    now = rank.of(current) if current is not None and not broken else None
    ask = avail
    if now is not None and not grew(avail, state.planned_on, config.min_growth):
        if rank.holds(now):
            return _keep(current, state, config)
        # The plan in use no longer keeps a constraint, yet nothing grew: the options are those it
        # was chosen from (answers the planner has), ranked again on what is known now.
        ask = dict(state.planned_on)
    useful = rank.of(current).useful_fraction if current is not None else 1.0
    outlooks = [rank.of(o) for o in _candidates(ask, state, config, plan_fn, cost_plan_fn, useful=useful)
                if o.fits_in(state.available, state.on_demand_available)]
    outlooks = [o for o in outlooks if _affordable_at_all(o.option, state, config)]
    if now is None:
        why = _why_new(current, lost, event)
        choice, gave_up = rank.best(outlooks)
        if choice is None:
            choice = _most_per_usd(outlooks)
            if choice is None:
                return _nothing_runs(why, outlooks, state, config)
            gave_up = "no plan finishes within the budget; the one training the most per USD runs"
        offered = planner_requests(avail, state, config)[0]
        return _run(Action.REPLAN, f"{why}: {_explain(choice, offered, state, gave_up)}", choice.option, state,
                    config, planned_on=avail, why=_why(choice, offered, state, gave_up))
    choice, _ = rank.best([now, *outlooks])
    objective = config.objective
    if choice is None:  # none finishes within the budget: the most per USD, as long as it lasts
        choice, objective = _most_per_usd([now, *outlooks]), "cost"
    if choice is None or _same(choice.option, current):
        return _keep(current, state, config, planned_on=ask)
    if not rank.holds(now) and rank.holds(choice):
        what = ("budget" if not rank.finishes(now) else "deadline" if not rank.in_time(now) else "throughput floor")
        action = Action.SHRINK if what == "budget" else Action.REPLAN
        offered = planner_requests(avail, state, config)[0]
        return _run(action, f"{what}: switch to a plan that keeps it: {_explain(choice, offered, state, '')}",
                    choice.option, state, config, planned_on=ask,
                    why=f"the plan in use would not keep the {what}"
                        + (f"; {w}" if (w := _why(choice, offered, state, "")) else ""))
    if switch_pays(now, choice, objective=objective, remaining=remaining, min_gain=config.min_gain):
        return _run(Action.REPLAN, f"capacity: {choice.option.label} {_versus(choice, now)}",
                    choice.option, state, config, planned_on=ask,
                    why=f"switched to a better plan: {_plain_versus(choice, now, config)}")
    tau, until = switch_window(now, choice)
    return _keep(current, state, config, planned_on=ask, declined=choice,
                 reason=f"declined {choice.option.label}: {_versus(choice, now)}, but the switch "
                        f"({choice.change_s:.0f} s) does not pay for itself within {tau / 60:.0f} min "
                        f"(until {until}, expected then)",
                 why=f"kept the plan rather than move to {_gpus_words(choice.option.all_gpus())}: "
                     f"{_plain_versus(choice, now, config)}, but the {choice.change_s:.0f} s change would not "
                     f"pay for itself before {until}")


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
            return _nothing_runs("start", [], state, config, options=candidates)
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
        return _decide_replan(state, event, lost, broken, config, plan_fn, None, remaining)
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


def _finishes(option: PlanOption, state: ControllerState, config: ControllerConfig, remaining: float) -> bool:
    """Without preemptions: a change, the work, then the shutdown, within the budget left."""
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
    """The failover and static strategies: the planner's best that finishes within budget; else
    the most samples per USD."""
    usable = [o for o in options if o.throughput_samples_per_s > 0 and _affordable_at_all(o, state, config)]
    if not usable:
        return None
    for o in usable:
        if _finishes(o, state, config, remaining):
            return o
    return max(usable, key=lambda o: o.samples_per_usd())


def _most_per_usd(outlooks: Sequence[Outlook]) -> Outlook | None:
    usable = [o for o in outlooks if o.effective_samples_per_s > 0]
    if not usable:
        return None
    return max(usable, key=lambda o: o.effective_samples_per_s / o.option.usd_per_hr
               if o.option.usd_per_hr > 0 else math.inf)


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


def _run(action: Action, reason: str, option: PlanOption, state, config, planned_on=None, why: str = "") -> Decision:
    return Decision(action=action, reason=reason, plan=option, stop_in_s=_stop_in_s(option, state, config),
                    planned_on=planned_on, why=why)


def _keep(current: PlanOption, state, config, planned_on=None, declined: Outlook | None = None,
          reason: str = "no better plan", why: str = "") -> Decision:
    return Decision(action=Action.CONTINUE, reason=reason, plan=current,
                    stop_in_s=_stop_in_s(current, state, config),
                    planned_on=planned_on if planned_on is not None else state.planned_on,
                    declined=declined.option if declined is not None else None, why=why)


def _nothing_runs(why: str, outlooks, state, config, options=()) -> Decision:
    options = list(options) or [o.option for o in outlooks]
    if options and not any(_affordable_at_all(o, state, config) for o in options):
        return Decision(action=Action.STOP, reason="budget: not enough left to start any plan")
    return Decision(action=Action.WAIT, reason=f"{why}: no plan fits the GPUs available; waiting for capacity")


def _same(a: PlanOption, b: PlanOption) -> bool:
    return dict(a.gpus) == dict(b.gpus) and dict(a.on_demand) == dict(b.on_demand)


def _why_new(current: PlanOption | None, lost: Mapping[GpuZone, int], event: Event) -> str:
    if current is None:
        return "start" if event.kind == EventKind.START else "capacity returned"
    if lost:
        return "preemption: lost " + describe_gpus(lost)
    return "capacity: the plan no longer fits"


# ---- reasons in words -------------------------------------------------------------


def _hours(s: float) -> str:
    return f"{s / _S_PER_HR:.2f} h" if math.isfinite(s) else "never"


def _figures(o: Outlook) -> str:
    return f"{_hours(o.time_s)} and {o.cost_usd:,.2f} USD to finish"


def _plain_versus(new: Outlook, now: Outlook, config: ControllerConfig) -> str:
    if config.objective == "cost":
        return f"it would cost {new.cost_usd:,.2f} USD to finish instead of {now.cost_usd:,.2f}"
    return f"it would finish in {_hours(new.time_s)} instead of {_hours(now.time_s)}"


def _versus(new: Outlook, now: Outlook) -> str:
    return f"expects {_figures(new)} against {_figures(now)}"


def _left_unused(choice: Outlook, avail: Mapping[GpuZone, int], state: ControllerState) -> list[GpuZone]:
    """Pools offered with a preemption rate that the chosen plan does not use, stormiest first."""
    used = set(choice.option.all_gpus())
    return sorted((k for k in avail if k not in used and state.preemption_rate_per_s.get(k, 0) > 0),
                  key=lambda k: (-state.preemption_rate_per_s[k], k))


def _explain(choice: Outlook, avail: Mapping[GpuZone, int], state: ControllerState, gave_up: str) -> str:
    """What was chosen, its expected figures, and the stormy pools it leaves unused on purpose."""
    text = f"{choice.option.label}, {_figures(choice)}"
    if choice.hits_per_s > 0:
        text += f" ({choice.useful_fraction:.0%} of it training, {choice.hits_per_s * _S_PER_HR:.1f} preemptions/h)"
    left = _left_unused(choice, avail, state)
    if left:
        text += "; leaves unused " + ", ".join(
            f"{g}@{z} ({state.preemption_rate_per_s[(g, z)] * _S_PER_HR:.1f} preemptions/h)" for g, z in left)
    if choice.option.on_demand:
        text += "; on demand: never preempted"
    if gave_up:
        text += f"; {gave_up}"
    return text


def _gpus_words(gpus: Mapping[GpuZone, int]) -> str:
    return " + ".join(f"{n} {g} in {z}" for (g, z), n in sorted(gpus.items()) if n > 0)


def _why(choice: Outlook, avail: Mapping[GpuZone, int], state: ControllerState, gave_up: str) -> str:
    """The choice's economics in plain words, for people (the flow's re-plan records)."""
    parts = []
    left = _left_unused(choice, avail, state)
    if left:
        parts.append("left " + ", ".join(
            f"{g} in {z} unused (preempted {_per_hour(state.preemption_rate_per_s[(g, z)])})" for g, z in left))
    if choice.option.on_demand:
        parts.append(f"{_gpus_words(choice.option.on_demand)} on demand (never preempted)")
    if choice.hits_per_s > 0:
        parts.append(f"expects {_per_hour(choice.hits_per_s)} on this plan, training {choice.useful_fraction:.0%} "
                     "of the time")
    if gave_up:
        parts.append(gave_up)
    return "; ".join(parts)


def _per_hour(rate_per_s: float) -> str:
    per_hr = rate_per_s * _S_PER_HR
    return f"{per_hr:.1f} times an hour" if per_hr < 10 else f"{per_hr:.0f} times an hour"
