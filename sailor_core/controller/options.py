"""Plan options as the controller sees them, and the planner behind an injectable function."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.errors import InfeasibleError, InputError
from sailor_core.plan.types import with_on_demand as mark_on_demand

if TYPE_CHECKING:  # the planner loads when a search runs (see PlannerPlanFn.__call__)
    from sailor_core.planner.request import PlanQuery

GpuZone = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOption:
    """One runnable plan: what it uses, how fast it trains, what it costs.

    ``gpus`` are the GPUs of the job's market (spot, for a spot job): what the pools'
    availability must hold and what preemptions take.  ``on_demand`` are GPUs a mixed plan
    rents on demand instead (never preempted), priced in ``usd_per_hr``.
    ``on_demand_premium_usd_per_hr`` says what moving one GPU of a pool from spot to on
    demand adds per hour (empty: the option cannot be moved).  ``usd_per_hr`` is the rent;
    ``egress_usd_per_hr`` what its bytes across zones and clouds cost per hour of training
    (the simulator's egress per iteration x iterations per hour; the flow adds its saves to a
    checkpoint bucket in another region: ``checkpoint_egress.py``); every ranking and budget
    test weighs both (``cost_usd_per_hr``).
    """

    gpus: Mapping[GpuZone, int]          # GPUs the plan holds per (type, zone), on the job's market
    throughput_samples_per_s: float
    usd_per_hr: float
    plan: Any = None                     # sailor_core.plan.types.Plan (None for test planners)
    label: str = ""
    on_demand: Mapping[GpuZone, int] = field(default_factory=dict)
    on_demand_premium_usd_per_hr: Mapping[GpuZone, float] = field(default_factory=dict)
    egress_usd_per_hr: float = 0.0

    @property
    def cost_usd_per_hr(self) -> float:
        """What training on it costs per hour: rent plus egress."""
        return self.usd_per_hr + self.egress_usd_per_hr

    def usd_for(self, held_s: float, training_s: float) -> float:
        """What holding it ``held_s`` costs, ``training_s`` of them training: the rent for all of
        them, the egress for the training (none while it starts, saves or shuts down)."""
        return self.usd_per_hr * held_s / 3600.0 + self.egress_usd_per_hr * training_s / 3600.0

    @property
    def num_gpus(self) -> int:
        return sum(self.gpus.values()) + sum(self.on_demand.values())

    def all_gpus(self) -> dict[GpuZone, int]:
        """GPUs per (type, zone) on either market."""
        out = dict(self.gpus)
        for k, n in self.on_demand.items():
            out[k] = out.get(k, 0) + n
        return {k: n for k, n in out.items() if n > 0}

    def fits_in(self, available: Mapping[GpuZone, int], on_demand: Mapping[GpuZone, int] | None = None) -> bool:
        """Whether its spot GPUs fit ``available`` and its on-demand GPUs ``on_demand``."""
        return _covers(available, self.gpus) and (not self.on_demand or _covers(on_demand or {}, self.on_demand))

    def samples_per_usd(self) -> float:
        cost = self.cost_usd_per_hr
        return self.throughput_samples_per_s * 3600.0 / cost if cost > 0 else float("inf")


def _covers(big: Mapping[GpuZone, int], small: Mapping[GpuZone, int]) -> bool:
    """Whether ``big`` holds at least ``small``'s count of every pool.  A loop rather than
    ``all()`` over a generator: a cold replay asks this about every earlier answer on every
    guess of its lookahead (~0.5 s in all otherwise)."""
    for k, n in small.items():
        if big.get(k, 0) < n:
            return False
    return True


# A planning function: availability -> options, best first; empty when nothing runs.
PlanFn = Callable[[Mapping[GpuZone, int]], Sequence[PlanOption]]


def gpus_of_plan(plan: Any) -> dict[GpuZone, int]:
    """GPUs per (type, zone) a ``Plan`` holds on the job's market (each replica is ``tp`` GPUs;
    replicas marked on demand are ``on_demand_of_plan``'s)."""
    out: dict[GpuZone, int] = {}
    for stage in plan.stages:
        for r in stage.replicas:
            if getattr(r, "market", None) != "on_demand":
                out[(r.gpu, r.zone)] = out.get((r.gpu, r.zone), 0) + r.tp_degree
    return out


def on_demand_of_plan(plan: Any) -> dict[GpuZone, int]:
    """GPUs per (type, zone) of the replicas a mixed ``Plan`` rents on demand."""
    out: dict[GpuZone, int] = {}
    for stage in plan.stages:
        for r in stage.replicas:
            if getattr(r, "market", None) == "on_demand":
                out[(r.gpu, r.zone)] = out.get((r.gpu, r.zone), 0) + r.tp_degree
    return out


def restrict(available: Mapping[GpuZone, int], gpu_types: Sequence[str] | None) -> dict[GpuZone, int]:
    return {k: n for k, n in available.items() if n > 0 and (gpu_types is None or k[0] in gpu_types)}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerCall:
    """One call that reached the planner (a cache miss) and how long it took."""

    available: Mapping[GpuZone, int]
    seconds: float
    num_options: int

    @property
    def num_gpu_types(self) -> int:
        return len({g for g, _ in self.available})


@dataclass(slots=True, kw_only=True)
class CachedPlanner:
    """Memoises a PlanFn per distinct availability, and answers from earlier calls
    whenever monotonicity makes them the answer.

    The best throughput on a subset of an availability is at most the best on
    the availability itself.  So for a new availability A', any plan known from
    an earlier answer that fits A' and is as fast as the best found on some
    earlier A that contains A' is a best plan on A' too.  The common case: the
    best plan on A still fits A' (the answer is then A's plans that fit A'); else
    a plan from another answer may match A's best (then it comes first).  Nothing
    runs on A' if nothing ran on A.  Exact for an exhaustive planner; for a
    heuristic one it is the answer it gave on the larger set.  Each miss costs a
    planner search: nearly all of a cold replay's time (``calls`` lists them).
    """

    plan_fn: PlanFn
    # Whether the planner ranks by throughput; else (its cheapest plans) only exact answers and a
    # superset's best that still fits are reused (the throughput bound below does not apply).
    fastest_first: bool = True
    num_calls: int = 0
    num_hits: int = 0
    planner_time_s: float = 0.0
    calls: list[PlannerCall] = field(default_factory=list)
    _exact: dict[frozenset, tuple[PlanOption, ...]] = field(default_factory=dict)
    _answers: list[tuple[dict[GpuZone, int], tuple[PlanOption, ...]]] = field(default_factory=list)

    def __call__(self, available: Mapping[GpuZone, int]) -> tuple[PlanOption, ...]:
        avail = {k: n for k, n in available.items() if n > 0}
        key = frozenset(avail.items())
        hit = self._exact.get(key)
        if hit is None:
            hit = self._implied(avail)
        if hit is not None:
            self.num_hits += 1
            self._exact[key] = hit
            return hit
        t0 = time.perf_counter()
        options = tuple(self.plan_fn(avail)) if avail else ()
        seconds = time.perf_counter() - t0
        self.planner_time_s += seconds
        self.num_calls += 1
        self.calls.append(PlannerCall(available=avail, seconds=seconds, num_options=len(options)))
        self._exact[key] = options
        self._answers.append((avail, options))
        return options

    def knows(self, available: Mapping[GpuZone, int]) -> bool:
        """Whether a call on ``available`` would be answered without a planner search."""
        avail = {k: n for k, n in available.items() if n > 0}
        return frozenset(avail.items()) in self._exact or self._implied(avail) is not None

    def _implied(self, avail: Mapping[GpuZone, int]) -> tuple[PlanOption, ...] | None:
        """The answer on ``avail`` that earlier answers imply, or None."""
        supersets = [(big, options) for big, options in self._answers if _covers(big, avail)]
        if not supersets:
            return None
        for _, options in reversed(supersets):
            if options and options[0].fits_in(avail):  # the best on a superset still fits
                return tuple(o for o in options if o.fits_in(avail))
        if any(not options for _, options in supersets):
            return ()  # nothing runs on a superset, so nothing runs here
        if not self.fastest_first:
            return None
        bound = min(options[0].throughput_samples_per_s for _, options in supersets)
        best = max((o for _, options in self._answers for o in options if o.fits_in(avail)),
                   key=lambda o: o.throughput_samples_per_s, default=None)
        if best is None or best.throughput_samples_per_s < bound:
            return None
        _, options = min(supersets, key=lambda s: s[1][0].throughput_samples_per_s)
        return (best, *(o for o in options if o is not best and o.fits_in(avail)))


# The planner's cheapest plans on an availability above a throughput floor (None: no floor), best first.
CostPlanFn = Callable[[Mapping[GpuZone, int], "float | None"], Sequence[PlanOption]]


def floors_on_grid(samples_per_s: float) -> tuple[float, float]:
    """The floors of a grid of 8 steps per doubling just below and just above ``samples_per_s``
    (within 9 % of it), so that the floors a deadline asks for over a job share the planner's
    answers: the cheapest plans above the lower one may still make the deadline, those above
    the upper one surely do (as far as the throughput goes)."""
    step = 8.0 * math.log2(samples_per_s)
    return 2.0 ** (math.floor(step + 1e-9) / 8.0), 2.0 ** (math.ceil(step - 1e-9) / 8.0)


@dataclass(slots=True, kw_only=True)
class CheapestPlanner:
    """``decide``'s ``cost_plan_fn``: the planner's cheapest plans (its cost objective) above a
    throughput floor, one memoised planner per floor; ``make(floor)`` builds a floor's PlanFn."""

    make: Callable[[float | None], PlanFn]
    planners: dict = field(default_factory=dict)  # floor -> CachedPlanner

    def __call__(self, available: Mapping[GpuZone, int], min_throughput_samples_per_s: float | None = None
                 ) -> tuple[PlanOption, ...]:
        floor = min_throughput_samples_per_s
        fn = self.planners.get(floor)
        if fn is None:
            fn = self.planners[floor] = CachedPlanner(plan_fn=self.make(floor), fastest_first=False)
        return fn(available)

    @property
    def num_calls(self) -> int:
        return sum(p.num_calls for p in self.planners.values())


# What renting a plan costs, in USD per hour (the train-job flow prices the whole instances
# a plan is placed on: what its ledger will be charged).
PlanPricing = Callable[[Any], float]


@dataclass(slots=True, kw_only=True)
class PlannerPlanFn:
    """The controller's PlanFn backed by ``sailor_core.planner.plan_job``; build it with
    ``planner_plan_fn``, the one way the controller's callers reach the planner.

    Each call plans on an availability what ``query`` asks.  Options are priced by
    ``pricing`` when given, else as the planner priced them (its GPUs, per hour).  An
    infeasible request answers no options, and a candidate ``pricing`` cannot place on the
    instances offered (a TP group wider than any node of its zone) is left out; ``on_infeasible``
    hears why.  The last feasible search stays in ``last_result`` for reports (its Pareto
    front, its candidates as scored).
    """

    query: PlanQuery
    pricing: PlanPricing | None = None
    on_infeasible: Callable[[InfeasibleError], None] | None = None
    last_result: Any = None           # sailor_core.planner.PlanResult

    def __call__(self, available: Mapping[GpuZone, int]) -> list[PlanOption]:
        # lazy: importing the planner takes ~0.25 s (its search modules), ten times the controller
        from sailor_core.planner import plan_job

        if not any(available.values()):
            return []
        try:
            result = plan_job(self.query.on(available))
        except InfeasibleError as exc:
            if self.on_infeasible is not None:
                self.on_infeasible(exc)
            return []
        self.last_result = result
        options = []
        for c in result.candidates:
            try:
                options.append(self._option(c))
            except InfeasibleError as exc:
                if self.on_infeasible is not None:
                    self.on_infeasible(exc)
        return options

    def _option(self, candidate: Any) -> PlanOption:
        """A candidate (``.plan`` and ``.sim``, the simulator's SimResult) as the controller sees it."""
        sim = candidate.sim
        usd_per_hr = self.pricing(candidate.plan) if self.pricing is not None else sim.usd_per_hour
        x = float(sim.throughput_samples_per_s)
        return plan_option(candidate.plan, throughput_samples_per_s=x, usd_per_hr=float(usd_per_hr),
                           egress_usd_per_hr=egress_rate_usd_per_hr(sim.egress_usd_per_iteration, x,
                                                               candidate.plan.global_batch_size))


def planner_plan_fn(query: PlanQuery, *, pricing: PlanPricing | None = None,
                    on_infeasible: Callable[[InfeasibleError], None] | None = None) -> PlannerPlanFn:
    """The planner as the controller's PlanFn (``PlannerPlanFn``), asked ``query`` (``planner.PlanQuery``:
    the request less the availability, its search settings included)."""
    return PlannerPlanFn(query=query, pricing=pricing, on_infeasible=on_infeasible)


def egress_rate_usd_per_hr(egress_usd_per_iteration: float, throughput_samples_per_s: float,
                      global_batch_size: int) -> float:
    """Egress per hour of training: per iteration x iterations per hour at that throughput."""
    if egress_usd_per_iteration <= 0 or global_batch_size <= 0:
        return 0.0
    return egress_usd_per_iteration * throughput_samples_per_s * 3600.0 / global_batch_size


def with_measured_egress(option: PlanOption, samples_per_s: float | None) -> PlanOption:
    """``option`` (the plan running) with its egress per hour at the rate it is measured to train:
    the simulator prices an iteration's bytes as the engine sends them, but its iterations per hour
    are the model's (on the embedded cloud's CPU processes, far more than they run)."""
    if not samples_per_s or option.egress_usd_per_hr <= 0 or option.throughput_samples_per_s <= 0:
        return option
    return dataclasses.replace(option, egress_usd_per_hr=option.egress_usd_per_hr * samples_per_s
                               / option.throughput_samples_per_s)


def plan_option(plan: Any, *, throughput_samples_per_s: float, usd_per_hr: float,
                on_demand_premium_usd_per_hr: Mapping[GpuZone, float] | None = None,
                egress_usd_per_hr: float = 0.0) -> PlanOption:
    """``plan`` (a ``Plan``) as an option: the GPUs it holds on each market, labelled.  The
    premium of renting its GPUs on demand is the catalog's unless given."""
    gpus, on_demand = gpus_of_plan(plan), on_demand_of_plan(plan)
    if on_demand_premium_usd_per_hr is None:
        on_demand_premium_usd_per_hr = catalog_on_demand_premium({**gpus, **on_demand})
    return PlanOption(gpus=gpus, throughput_samples_per_s=throughput_samples_per_s, usd_per_hr=usd_per_hr,
                      plan=plan, label=describe_gpus(gpus, on_demand), on_demand=on_demand,
                      on_demand_premium_usd_per_hr=on_demand_premium_usd_per_hr,
                      egress_usd_per_hr=egress_usd_per_hr)


def catalog_on_demand_premium(pools: Iterable[GpuZone]) -> dict[GpuZone, float]:
    """Per pool, what one GPU costs more per hour on demand than on spot (catalog prices)."""
    out = {}
    for gpu, zone in pools:
        try:
            out[(gpu, zone)] = (gpu_price_usd_per_hr(gpu, zone, spot=False)
                                - gpu_price_usd_per_hr(gpu, zone, spot=True))
        except InputError:  # a test GPU or zone with no price: not movable
            continue
    return out


def with_on_demand(option: PlanOption, on_demand: Mapping[GpuZone, int]) -> PlanOption:
    """``option`` with ``on_demand`` of its GPUs per pool moved from spot to on-demand nodes,
    priced by its premiums (the plan's replicas are marked: ``plan.types.with_on_demand``)."""
    moved = {k: min(n, option.gpus.get(k, 0)) for k, n in on_demand.items() if n > 0}
    plan = option.plan
    if plan is not None and hasattr(plan, "stages"):
        plan = mark_on_demand(plan, {k: option.on_demand.get(k, 0) + n for k, n in moved.items()}
                              | {k: n for k, n in option.on_demand.items() if k not in moved})
        gpus, od = gpus_of_plan(plan), on_demand_of_plan(plan)
    else:
        gpus = {k: n - moved.get(k, 0) for k, n in option.gpus.items() if n - moved.get(k, 0) > 0}
        od = dict(option.on_demand)
        for k, n in moved.items():
            od[k] = od.get(k, 0) + n
    extra = 0.0
    for k, n in od.items():
        extra += (n - option.on_demand.get(k, 0)) * option.on_demand_premium_usd_per_hr[k]
    return dataclasses.replace(option, gpus=gpus, on_demand=od, usd_per_hr=option.usd_per_hr + extra, plan=plan,
                               label=describe_gpus(gpus, od))


def describe_gpus(gpus: Mapping[GpuZone, int], on_demand: Mapping[GpuZone, int] | None = None) -> str:
    text = ", ".join(f"{n}x{g}@{z}" for (g, z), n in sorted(gpus.items()) if n)
    od = ", ".join(f"{n}x{g}@{z}" for (g, z), n in sorted((on_demand or {}).items()) if n)
    if not od:
        return text
    return f"{text} + on demand {od}" if text else f"on demand {od}"
