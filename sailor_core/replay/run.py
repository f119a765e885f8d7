"""Replay one trace under several policies with the real planner (the CLI and the flow call this)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sailor_core.catalog import ModelSpec, get_model, normalize_gpu_name
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.controller import (
    POLICIES,
    CachedPlanner,
    CheapestPlanner,
    PlanFn,
    PlanOption,
    controller_config,
    option_ranking,
    planner_plan_fn,
    restrict,
)
from sailor_core.controller.options import PlannerCall
from sailor_core.errors import InputError
from sailor_core.controller.state_load import checkpoint_bytes_for
from sailor_core.network.storage_egress import BucketPlace, place_named
from sailor_core.replay.costs import ChangeCosts
from sailor_core.replay.lookahead import first_requests
from sailor_core.replay.plan_cache import PersistentPlanner, _key, persistent
from sailor_core.objective import JobTerms
from sailor_core.planner.ranking import CHEAPEST
from sailor_core.planner.request import PlanQuery, SearchSettings
from sailor_core.replay.policies import controller_costs, pick_single_type, single_type_requests
from sailor_core.replay.prefetch import PrefetchingPlanner, PrefetchStats, default_workers
from sailor_core.replay.prices import PriceSeries, load_price_series
from sailor_core.replay.result import ReplayResult
from sailor_core.replay.scenario import Goal, Lookahead, Market, PriceFn, ReplayPolicy
from sailor_core.replay.simulation import replay
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import AvailabilityTrace, GpuZone

# The planner's search settings for re-planning inside a replay: a smaller budget of simulate()
# calls than `sailor plan` (4000) keeps one planner call short.
# run_policies(probe_micro_batches=True) also narrows the micro-batch sizes to what
# the trace's GPU types use (probed_micro_batch_sizes): faster, but it moves results.
REPLAY_SEARCH = SearchSettings(max_evaluations=200, top_n=3)


def grid_floor(n: int, *, fine_below: int = 8) -> int:
    """``n`` rounded down to a grid that is exact below ``fine_below`` GPUs and
    then has 4 steps per doubling (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...).
    The planner in a replay sees pools on this grid, so the many availabilities
    of a trace that differ by a node or two share one planner call; preemptions
    are still counted on the exact counts, and every policy sees the same grid."""
    if n < fine_below:
        return max(n, 0)
    step = 1 << (n.bit_length() - 3)
    return n - n % step


def gridded(available: Mapping[GpuZone, int]) -> dict[GpuZone, int]:
    return {k: grid_floor(n) for k, n in available.items() if grid_floor(n) > 0}


def on_grid(plan_fn: PlanFn) -> PlanFn:
    def fn(available, *args):
        return plan_fn(gridded(available), *args)

    fn.__wrapped_cached__ = plan_fn
    return fn


# The planner's default micro-batch sizes: the powers of two up to this (that divide the batch).
_PLANNER_MAX_MICRO_BATCH = 64


def probed_micro_batch_sizes(trace: AvailabilityTrace, plan_fn: PlanFn) -> tuple[int, ...] | None:
    """The micro-batch sizes a replay's searches need: from half the smallest to twice the
    largest that the planner's best plans use on each GPU type's peak pools of the trace.

    Which micro-batch runs fastest depends on the model and the GPU (OPT-350M: 1-4; a
    tiny model: 16-64), much less on how many GPUs a pool has, and each size is one more
    space for every search to bound and walk.  None (search them all) when the planner's
    options carry no plan (test planners) or nothing runs.
    """
    peak = {k: max(c.get(k, 0) for _, c in trace.rows) for k in trace.keys}
    used: set[int] = set()
    for gpu in sorted({g for (g, _), n in peak.items() if n > 0}):
        for option in plan_fn(restrict(peak, (gpu,))):
            if option.plan is None:
                return None
            used.add(option.plan.micro_batch_size)
    if not used:
        return None
    lo, hi = max(1, min(used) // 2), min(2 * max(used), max(_PLANNER_MAX_MICRO_BATCH, max(used)))
    sizes, b = [], 1
    while b <= hi:
        if b >= lo:
            sizes.append(b)
        b *= 2
    return tuple(sizes)


def _planner(query: PlanQuery, plan_cache_path: str | None, *, workers: int = 0) -> PlanFn:
    fn = PrefetchingPlanner(query, workers=workers) if workers > 0 else planner_plan_fn(query)
    if not plan_cache_path:
        return fn
    return persistent(fn, plan_cache_path, prefix=cache_prefix(query))


# Keyed whatever their value: the replay always set them (REPLAY_SEARCH).
_ALWAYS_KEYED = ("max_evaluations", "top_n")


def cache_prefix(query: PlanQuery) -> str:
    """The plan cache's key of ``query``'s answers: the model and batch, then ``name=value`` in
    name order for the search's evaluations and top N and every other setting or term that
    differs from the planner's default (the keys of the caches written before the query was typed)."""
    search, default = query.search, SearchSettings()
    items = {f.name: getattr(search, f.name) for f in dataclasses.fields(SearchSettings)
             if f.name in _ALWAYS_KEYED or getattr(search, f.name) != getattr(default, f.name)}
    plain = PlanQuery(model=query.model)
    for name in ("objective", "max_usd_per_hour", "min_throughput_samples_per_s", "spot"):
        if getattr(query, name) != getattr(plain, name):
            items[name] = getattr(query, name)
    text = ",".join(f"{k}={v}" for k, v in sorted(items.items()))
    return f"{query.model}|gbs={query.global_batch_size}|{text}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySuite:
    results: dict[str, ReplayResult]
    single_gpu_type: str | None
    samples_target: float
    wall_s: float
    planner_calls: int
    planner_time_s: float
    trace_source: str
    trace_notes: tuple[str, ...]
    planner_call_log: tuple[PlannerCall, ...] = ()  # the calls that reached the planner, in order
    micro_batch_sizes: tuple[int, ...] | None = None  # what the planner searched (None: its default)
    prefetch: PrefetchStats | None = None  # the worker processes' share of the planning (None: none ran)
    terms: JobTerms | None = None  # the job's objective and constraints (None: fastest, no deadline)

    def to_dict(self, *, with_timeline: bool = False) -> dict[str, Any]:
        ours = self.results.get("ours")
        out: dict[str, Any] = {
            "trace": self.trace_source, "trace_notes": list(self.trace_notes),
            "samples_target": self.samples_target, "single_gpu_type": self.single_gpu_type,
            "wall_s": self.wall_s, "planner_calls": self.planner_calls, "planner_time_s": self.planner_time_s,
            "micro_batch_sizes": list(self.micro_batch_sizes) if self.micro_batch_sizes else None,
            "prefetch": dataclasses.asdict(self.prefetch) if self.prefetch is not None else None,
            "terms": dataclasses.asdict(self.terms) if self.terms is not None else None,
            "policies": {},
        }
        for name, r in self.results.items():
            row = r.to_dict(with_timeline=with_timeline)
            if ours is not None and name != "ours":
                row["cost_ratio_to_ours"] = _ratio(r.usd_spent, ours.usd_spent)
                row["time_ratio_to_ours"] = (
                    _ratio(r.time_to_train_s, ours.time_to_train_s)
                    if r.time_to_train_s is not None and ours.time_to_train_s is not None else None
                )
            out["policies"][name] = row
        return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else None


def catalog_price_fn(*, spot: bool = True) -> PriceFn:
    @lru_cache(maxsize=None)
    def per_gpu(gpu: str, zone: str) -> float:
        return gpu_price_usd_per_hr(gpu, zone, spot=spot)

    return lambda gpu, zone, _t: per_gpu(gpu, zone)


def run_policies(
    trace: AvailabilityTrace,
    spec: ReplaySpec,
    *,
    plan_fn: PlanFn | None = None,
    costs: ChangeCosts | None = None,
    search: SearchSettings | None = None,
    probe_micro_batches: bool = False,
    progress: Callable[[str, float, int], None] | None = None,
) -> ReplaySuite:
    """Replay ``trace`` under each policy of ``spec`` (in turn, sharing one planner cache).

    The job's objective and constraints (``JobTerms`` of ``spec``: default: finish soonest, on
    spot only) are what every policy but skypilot's managed job re-plans by.  ``costs``: the
    costs of a change (default: ``spec``'s); ``plan_fn``: a planner in place of the real one;
    ``search``: the planner's search settings (default: ``REPLAY_SEARCH``).

    ``progress``, when given, is called as the replay goes with the policy, its simulated
    time and the planner searches made so far.

    With the real planner (no ``plan_fn``), ``workers`` processes (default: one per idle
    CPU, none if fewer than two are idle: ``prefetch.default_workers``; 0: none) search
    the availabilities the policies will likely ask about next while the replay runs;
    the results are those of a replay without them.
    """
    policies = spec.policy_names or POLICIES
    budget_usd, global_batch_size, plan_cache_path = spec.budget_usd, spec.global_batch_size, spec.plan_cache
    model = _checked_model(spec.model, tokens=spec.tokens, budget_usd=budget_usd, policies=policies)
    terms = spec.terms
    t0 = time.perf_counter()
    samples_target = float(spec.tokens) / float(model.seq_len)
    costs = costs or _change_costs(spec, model.name)
    prices = load_price_series(spec.prices) if spec.prices else None
    planning = _planning(trace, plan_fn, model=model.name, global_batch_size=global_batch_size,
                         search=search, probe_micro_batches=probe_micro_batches,
                         exact_availability=spec.exact_availability, plan_cache_path=plan_cache_path,
                         workers=spec.workers)
    single = _single_type(trace, planning, policies=policies, gpu_type=spec.gpu, costs=costs)
    goal = Goal(samples_target=samples_target, budget_usd=budget_usd,
                deadline_s=terms.deadline_s)
    replay_args = dict(trace=trace, costs=costs, goal=goal, seed=spec.seed)
    cheap = _cheap_planner(planning, model=model.name, global_batch_size=global_batch_size,
                           search=search, terms=terms, plan_cache_path=plan_cache_path,
                           plan_fn=plan_fn, budget_usd=budget_usd)
    results = _replay_each(planning, policies, single=single, prices=prices, replay_args=replay_args,
                           progress=progress, terms=terms, cheap=cheap)
    probe, cached, prefetcher = planning.probe, planning.cached, planning.prefetcher
    return ReplaySuite(
        results=results, single_gpu_type=single, samples_target=samples_target,
        wall_s=time.perf_counter() - t0, planner_calls=probe.num_calls + cached.num_calls,
        planner_time_s=probe.planner_time_s + cached.planner_time_s,
        trace_source=trace.source, trace_notes=trace.notes, planner_call_log=(*probe.calls, *cached.calls),
        micro_batch_sizes=planning.micro_batch_sizes,
        prefetch=prefetcher.stats() if prefetcher is not None else None, terms=terms,
    )


def _change_costs(spec: ReplaySpec, model: str) -> ChangeCosts:
    """What a change costs, as ``spec`` says, with the model's checkpoint."""
    return ChangeCosts(provisioning_s=spec.provisioning_s, startup_s=spec.startup_s, rejoin_s=spec.rejoin_s,
                       standby_workers=spec.standby_workers, handover=spec.handover,
                       checkpoint_interval_s=spec.checkpoint_interval_s, checkpoint_bytes=checkpoint_bytes_for(model),
                       storage_bw_bytes_per_s=spec.storage_gb_per_s * 1e9,
                       bucket=_bucket(spec.checkpoint_bucket))


def _bucket(text: str) -> BucketPlace | None:
    """The replay's checkpoint bucket (None: beside every zone, as a local one)."""
    place = place_named(text)
    return place if place.metered else None


def _checked_model(model: str, *, tokens: float, budget_usd: float | None, policies: Sequence[str]) -> ModelSpec:
    """The model's spec, once the other arguments of ``run_policies`` are known to be valid."""
    spec = get_model(model)
    if not (tokens > 0 and math.isfinite(tokens)):
        raise InputError(f"tokens to train must be a positive number, got {tokens!r}")
    if budget_usd is not None and not budget_usd > 0:
        raise InputError(f"budget must be positive, got {budget_usd} USD")
    for p in policies:
        if p not in POLICIES:
            raise InputError(f"unknown policy {p!r}; known: {', '.join(POLICIES)} or all")
    return spec


@dataclass(frozen=True, slots=True, kw_only=True)
class _Prefetch:
    """Hands the lookahead's guesses to the workers, on the grid the planner sees."""

    prefetcher: PrefetchingPlanner
    exact_availability: bool

    def __call__(self, requests: Iterable[Mapping[GpuZone, int]]) -> None:
        self.prefetcher.prefetch(requests if self.exact_availability else (gridded(a) for a in requests))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Planning:
    """The planners of one suite: ``probe`` (the micro-batch probe's searches) and ``cached``,
    which every policy's replay shares, through ``plan_fn`` (on the grid unless exact)."""

    probe: CachedPlanner
    cached: CachedPlanner
    plan_fn: PlanFn
    micro_batch_sizes: tuple[int, ...] | None   # what the planner searches (None: its default)
    prefetcher: PrefetchingPlanner | None       # worker processes searching ahead (None: none)
    prefetch: _Prefetch | None
    exact_availability: bool


def _planning(trace: AvailabilityTrace, plan_fn: PlanFn | None, *, model: str, global_batch_size: int | None,
              search: SearchSettings | None, probe_micro_batches: bool, exact_availability: bool,
              plan_cache_path: str | None, workers: int | None) -> _Planning:
    """The real planner with the replay's search settings (unless ``plan_fn`` is given), memoised, and its workers."""
    base = plan_fn
    probe = CachedPlanner(plan_fn=lambda _avail: ())
    mbs = None
    if base is None:
        query = PlanQuery(model=model, global_batch_size=global_batch_size, search=search or REPLAY_SEARCH)
        if probe_micro_batches and query.search.micro_batch_sizes is None:
            probe = CachedPlanner(plan_fn=_planner(query, plan_cache_path))
            sizes = probed_micro_batch_sizes(trace, probe if exact_availability else on_grid(probe))
            _flush(probe.plan_fn)  # before the main planner reads the same file
            if sizes:
                query = dataclasses.replace(query, search=dataclasses.replace(query.search, micro_batch_sizes=sizes))
        base = _planner(query, plan_cache_path, workers=default_workers() if workers is None else workers)
        mbs = query.search.micro_batch_sizes
    cached = base if isinstance(base, CachedPlanner) else CachedPlanner(plan_fn=base)
    prefetcher = _prefetcher(cached.plan_fn)
    if prefetcher is not None:
        prefetcher.known = _KnownTo(cached)
    return _Planning(
        probe=probe, cached=cached, plan_fn=cached if exact_availability else on_grid(cached),
        micro_batch_sizes=tuple(mbs) if mbs else None, prefetcher=prefetcher,
        prefetch=(_Prefetch(prefetcher=prefetcher, exact_availability=exact_availability)
                  if prefetcher is not None else None),
        exact_availability=exact_availability)


def _single_type(trace: AvailabilityTrace, planning: _Planning, *, policies: Sequence[str], gpu_type: str | None,
                 costs: ChangeCosts) -> str | None:
    """The GPU type of the single-type policies (given, or picked as a user would); None without them."""
    if not any(p in ("skypilot", "single-type") for p in policies):
        return None
    if gpu_type is None and planning.prefetch is not None:
        # The replay's first searches, started together in the workers: the first plan of
        # `ours` (the largest of them) and what pick_single_type asks here.
        lead = (first_requests(trace, controller_config("ours", costs=controller_costs(costs),
                                                         shutdown_s=costs.shutdown_s))
                if policies[0] == "ours" else [])
        planning.prefetch([*lead, *single_type_requests(trace)])
    return normalize_gpu_name(gpu_type) if gpu_type else pick_single_type(trace, planning.plan_fn)


def _cheap_planner(planning: _Planning, *, model: str, global_batch_size: int | None,
                   search: SearchSettings | None, terms: JobTerms, plan_cache_path: str | None,
                   plan_fn: PlanFn | None, budget_usd: float | None) -> CheapestPlanner | None:
    """The planner's cheapest plans (its cost objective) above a floor, for a job that minimises
    cost, has a deadline or a budget (``decide``'s ``cost_plan_fn``: with a budget only asked
    once no fast plan finishes within it); in this process, memoised per floor, on the grid
    unless exact, kept in the plan cache beside the fastest plans."""
    if not option_ranking(terms.objective).asks_cheapest(deadline=terms.deadline_h is not None) \
            and budget_usd is None:
        return None
    search = search or REPLAY_SEARCH
    if planning.micro_batch_sizes:
        search = dataclasses.replace(search, micro_batch_sizes=planning.micro_batch_sizes)
    cheapest = PlanQuery(model=model, global_batch_size=global_batch_size, objective=CHEAPEST.objective, search=search)
    disk = planning.cached.plan_fn if isinstance(planning.cached.plan_fn, PersistentPlanner) else None

    def make(floor: float | None) -> PlanFn:
        if plan_fn is not None:  # a test planner: its plans, those above the floor
            return lambda a: [o for o in plan_fn(a) if floor is None or o.throughput_samples_per_s >= floor]
        query = dataclasses.replace(cheapest, min_throughput_samples_per_s=floor)
        if disk is None and plan_cache_path:
            return _planner(query, plan_cache_path)
        if disk is None:
            return planner_plan_fn(query)
        return disk.sibling(planner_plan_fn(query), prefix=cache_prefix(query))

    planner = CheapestPlanner(make=make)
    return planner if planning.exact_availability else on_grid(planner)


def _replay_each(planning: _Planning, policies: Sequence[str], *, single: str | None, prices: PriceSeries | None,
                 replay_args: dict[str, Any], progress: Callable[[str, float, int], None] | None,
                 terms: JobTerms, cheap: CheapestPlanner | None) -> dict[str, ReplayResult]:
    """Each policy's replay, in turn, with the suite's planner; the workers stopped and the
    plan cache written at the end."""
    cached, prefetcher, costs = planning.cached, planning.prefetcher, replay_args["costs"]
    zones = sorted({z for _, z in replay_args["trace"].keys})
    results: dict[str, ReplayResult] = {}
    threads: ThreadPoolExecutor | None = None
    try:
        threads, shadows = _start_shadows(planning, policies, single=single, prices=prices, replay_args=replay_args,
                                          terms=terms, cheap=cheap)
        for p in policies:
            calls_before = cached.num_calls
            config = _config(p, costs=costs, single=single, terms=terms, zones=zones)
            if p in shadows:
                shadows[p].result()  # what it searched is with the workers' answers now
            policy = ReplayPolicy(config=config, plan_fn=planning.plan_fn, name=p,
                                  cost_plan_fn=cheap if config.strategy != "failover" else None)
            r = replay(policy=policy, market=_market(prices, replay_args["trace"], terms, config),
                       lookahead=(Lookahead(prefetch=planning.prefetch, num_decisions=prefetcher.lookahead_decisions)
                                  if planning.prefetch is not None and prefetcher is not None else None),
                       progress=(lambda t, p=p: progress(p, t, cached.num_calls)) if progress is not None else None,
                       **replay_args)
            results[p] = _with_calls(r, cached.num_calls - calls_before)
    finally:
        _flush(cached.plan_fn)
        if cheap is not None:
            for fn in _unwrapped(cheap).planners.values():
                _flush(fn.plan_fn)
        if prefetcher is not None:
            prefetcher.close()  # (a shadow thread still waiting on a search then stops)
        if threads is not None:
            threads.shutdown(wait=True)
    return results


def _config(policy: str, *, costs: ChangeCosts, single: str | None, terms: JobTerms, zones: Sequence[str]):
    return controller_config(policy, costs=controller_costs(costs, zones), shutdown_s=costs.shutdown_s, terms=terms,
                             gpu_type=single)


def _market(prices: PriceSeries | None, trace: AvailabilityTrace, terms: JobTerms, config) -> Market:
    """The spot prices (the series', else the catalog's) and the on-demand GPUs ``config``'s policy may rent."""
    return Market(price_fn=_price_fn(prices), price_change_times=prices.change_times() if prices is not None else (),
                  on_demand_available=_on_demand(trace, terms, config), on_demand_price_fn=catalog_price_fn(spot=False))


def _on_demand(trace: AvailabilityTrace, terms: JobTerms, config) -> dict[GpuZone, int]:
    """On-demand GPUs per pool of the trace the policy may rent (none for the managed job)."""
    if terms.on_demand_gpus <= 0 or config.strategy == "failover":
        return {}
    return {k: terms.on_demand_gpus for k in trace.keys}


def _unwrapped(plan_fn):
    """The planner behind ``on_grid``."""
    return getattr(plan_fn, "__wrapped_cached__", plan_fn)


def _start_shadows(planning: _Planning, policies: Sequence[str], *, single: str | None, prices: PriceSeries | None,
                   replay_args: dict[str, Any], terms: JobTerms,
                   cheap: CheapestPlanner | None) -> tuple[ThreadPoolExecutor | None, dict[str, Future]]:
    """Start the workers, and a shadow replay (``_shadow_replay``) of each later static or failover policy.

    The requests of a static or failover policy depend on the plans it picks, so they
    cannot be guessed from the trace; a thread replays it meanwhile with a cache of its
    own, its searches made by the workers (which share every answer, so none is searched
    twice).  Its cache lacks the earlier policies' answers, so a few of its decisions (and
    then requests) may differ: those are searched when the policy's own replay gets to them.
    """
    prefetcher = planning.prefetcher
    if prefetcher is None:
        return None, {}
    prefetcher.start()
    threads: ThreadPoolExecutor | None = None
    shadows: dict[str, Future] = {}
    zones = sorted({z for _, z in replay_args["trace"].keys})
    for p in policies[1:]:
        config = _config(p, costs=replay_args["costs"], single=single, terms=terms, zones=zones)
        if config.strategy in ("static", "failover"):
            threads = threads or ThreadPoolExecutor(max_workers=len(policies) - 1)
            shadows[p] = threads.submit(_shadow_replay, prefetcher, planning.exact_availability, config, p,
                                        dict(market=_market(prices, replay_args["trace"], terms, config),
                                             **replay_args))
    return threads, shadows


def _price_fn(prices: PriceSeries | None) -> PriceFn:
    return prices.price_fn(fallback=catalog_price_fn()) if prices is not None else catalog_price_fn()


class _WorkersStopped(Exception):
    pass


def _shadow_replay(prefetcher: PrefetchingPlanner, exact_availability: bool, config, name: str,
                   replay_args: dict[str, Any]) -> None:
    """In a thread: one policy's replay with a planner cache of its own, searching in the
    workers; its answers stay with them for the policy's own replay.  It stops early if the
    workers stop (that replay then searches what is left itself)."""

    def search(available: Mapping[GpuZone, int]) -> tuple[PlanOption, ...]:
        options = prefetcher.search_in_worker(available)
        if options is None:
            raise _WorkersStopped
        return options

    cached = CachedPlanner(plan_fn=search)
    try:
        plan_fn = cached if exact_availability else on_grid(cached)
        replay(policy=ReplayPolicy(config=config, plan_fn=plan_fn, name=name), **replay_args)
    except _WorkersStopped:
        pass


def _prefetcher(plan_fn: PlanFn) -> PrefetchingPlanner | None:
    if isinstance(plan_fn, PersistentPlanner):
        plan_fn = plan_fn.plan_fn
    return plan_fn if isinstance(plan_fn, PrefetchingPlanner) and plan_fn.workers > 0 else None


class _KnownTo:
    """Whether ``cached`` answers an availability without a search: seen before, implied by
    earlier answers (as it stands now), or stored in its plan cache on disk."""

    def __init__(self, cached: CachedPlanner) -> None:
        self.cached = cached
        self.disk = cached.plan_fn if isinstance(cached.plan_fn, PersistentPlanner) else None
        # What earlier answers imply only changes when an answer is added, so a "no" holds
        # until the planner's next search (guesses are checked again after every decision).
        self.unknown_at: dict[frozenset, int] = {}

    def __call__(self, available: Mapping[GpuZone, int]) -> bool:
        key = frozenset(available.items())
        if self.unknown_at.get(key) == self.cached.num_calls:
            return False
        if self.disk is not None and _key(self.disk.prefix, available) in self.disk.store:
            return True
        if self.cached.knows(available):
            return True
        self.unknown_at[key] = self.cached.num_calls
        return False


def _flush(plan_fn: PlanFn) -> None:
    if isinstance(plan_fn, PersistentPlanner):
        plan_fn.flush()


def _with_calls(r: ReplayResult, calls: int) -> ReplayResult:
    return dataclasses.replace(r, planner_calls=calls)
