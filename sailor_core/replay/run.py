"""Replay one trace under several policies with the real planner (the CLI and the flow call this)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sailor_core.catalog import get_model, normalize_gpu_name
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.controller import CachedPlanner, PlanFn, PlanOption, planner_plan_fn, restrict
from sailor_core.controller.options import PlannerCall
from sailor_core.errors import InputError
from sailor_core.replay.costs import ChangeCosts, checkpoint_bytes_for
from sailor_core.replay.lookahead import first_requests
from sailor_core.replay.plan_cache import PersistentPlanner, _key, persistent
from sailor_core.replay.policies import POLICIES, controller_config, pick_single_type, single_type_requests
from sailor_core.replay.prefetch import PrefetchingPlanner, PrefetchStats, default_workers
from sailor_core.replay.prices import PriceSeries
from sailor_core.replay.simulation import PriceFn, ReplayResult, replay
from sailor_core.traces import AvailabilityTrace, GpuZone

# Search knobs for re-planning inside a replay: a smaller budget of simulate()
# calls than `sailor plan` (4000) keeps one planner call short.
# run_policies(probe_micro_batches=True) also narrows the micro-batch sizes to what
# the trace's GPU types use (probed_micro_batch_sizes): faster, but it moves results.
REPLAY_PLANNER_KNOBS: dict[str, Any] = {"max_evaluations": 200, "top_n": 3}


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
    def fn(available):
        return plan_fn(gridded(available))

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


def _planner(model: str, global_batch_size: int | None, knobs: dict[str, Any], plan_cache_path: str | None,
             *, workers: int = 0) -> PlanFn:
    args = dict(model=model, global_batch_size=global_batch_size, **knobs)
    fn = PrefetchingPlanner(args, workers=workers) if workers > 0 else planner_plan_fn(**args)
    if not plan_cache_path:
        return fn
    text = ",".join(f"{k}={v}" for k, v in sorted(knobs.items()))
    return persistent(fn, plan_cache_path, prefix=f"{model}|gbs={global_batch_size}|{text}")


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

    def to_dict(self, *, with_timeline: bool = False) -> dict[str, Any]:
        ours = self.results.get("ours")
        out: dict[str, Any] = {
            "trace": self.trace_source, "trace_notes": list(self.trace_notes),
            "samples_target": self.samples_target, "single_gpu_type": self.single_gpu_type,
            "wall_s": self.wall_s, "planner_calls": self.planner_calls, "planner_time_s": self.planner_time_s,
            "micro_batch_sizes": list(self.micro_batch_sizes) if self.micro_batch_sizes else None,
            "prefetch": dataclasses.asdict(self.prefetch) if self.prefetch is not None else None,
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


def catalog_price_fn() -> PriceFn:
    @lru_cache(maxsize=None)
    def per_gpu(gpu: str, zone: str) -> float:
        return gpu_price_usd_per_hr(gpu, zone, spot=True)

    return lambda gpu, zone, _t: per_gpu(gpu, zone)


def run_policies(
    trace: AvailabilityTrace,
    *,
    model: str,
    tokens: float,
    policies: Sequence[str] = POLICIES,
    global_batch_size: int | None = None,
    budget_usd: float | None = None,
    costs: ChangeCosts | None = None,
    gpu_type: str | None = None,
    prices: PriceSeries | None = None,
    plan_fn: PlanFn | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    max_time_s: float | None = None,
    exact_availability: bool = False,
    plan_cache_path: str | None = None,
    planner_knobs: dict[str, Any] | None = None,
    probe_micro_batches: bool = False,
    workers: int | None = None,
    progress: Callable[[str, float, int], None] | None = None,
) -> ReplaySuite:
    """Replay ``trace`` under each policy (in turn, sharing one planner cache).

    ``progress``, when given, is called as the replay goes with the policy, its simulated
    time and the planner searches made so far.

    With the real planner (no ``plan_fn``), ``workers`` processes (default: one per idle
    CPU, none if fewer than two are idle: ``prefetch.default_workers``; 0: none) search
    the availabilities the policies will likely ask about next while the replay runs;
    the results are those of a replay without them.
    """
    spec = get_model(model)
    if not (tokens > 0 and math.isfinite(tokens)):
        raise InputError(f"tokens to train must be a positive number, got {tokens!r}")
    if budget_usd is not None and not budget_usd > 0:
        raise InputError(f"budget must be positive, got {budget_usd} USD")
    for p in policies:
        if p not in POLICIES:
            raise InputError(f"unknown policy {p!r}; known: {', '.join(POLICIES)} or all")
    t0 = time.perf_counter()
    samples_target = float(tokens) / float(seq_len or spec.seq_len)
    if costs is None:
        costs = ChangeCosts(checkpoint_bytes=checkpoint_bytes_for(spec.name))
    base = plan_fn
    probe = CachedPlanner(plan_fn=lambda _avail: ())
    mbs = None
    if base is None:
        knobs_used = {**REPLAY_PLANNER_KNOBS, **(planner_knobs or {})}
        if probe_micro_batches and "micro_batch_sizes" not in knobs_used:
            probe = CachedPlanner(plan_fn=_planner(spec.name, global_batch_size, knobs_used, plan_cache_path))
            sizes = probed_micro_batch_sizes(trace, probe if exact_availability else on_grid(probe))
            _flush(probe.plan_fn)  # before the main planner reads the same file
            if sizes:
                knobs_used["micro_batch_sizes"] = sizes
        base = _planner(spec.name, global_batch_size, knobs_used, plan_cache_path,
                        workers=default_workers() if workers is None else workers)
        mbs = knobs_used.get("micro_batch_sizes")
    cached = base if isinstance(base, CachedPlanner) else CachedPlanner(plan_fn=base)
    planner = cached if exact_availability else on_grid(cached)
    prefetcher, prefetch = _prefetcher(cached.plan_fn), None
    if prefetcher is not None:
        prefetcher.known = _known_to(cached)
        to_planner = (lambda a: a) if exact_availability else gridded
        prefetch = lambda requests: prefetcher.prefetch(to_planner(a) for a in requests)  # noqa: E731
    price_fn = _price_fn(prices)
    change_times = prices.change_times() if prices is not None else ()
    single = None
    if any(p in ("skypilot", "single-type") for p in policies):
        if gpu_type is None and prefetch is not None:
            # The replay's first searches, started together in the workers: the first plan of
            # `ours` (the largest of them) and what pick_single_type asks here.
            lead = first_requests(trace, controller_config("ours", costs=costs)) if policies[0] == "ours" else []
            prefetch([*lead, *single_type_requests(trace)])
        single = normalize_gpu_name(gpu_type) if gpu_type else pick_single_type(trace, planner)
    results: dict[str, ReplayResult] = {}
    threads: ThreadPoolExecutor | None = None
    try:
        shadows: dict[str, Future] = {}
        if prefetcher is not None:
            # The requests of a static or failover policy depend on the plans it picks, so
            # they cannot be guessed from the trace; a thread replays it meanwhile with a
            # cache of its own, its searches made by the workers (which share every answer,
            # so none is searched twice).  Its cache lacks the earlier policies' answers, so
            # a few of its decisions (and then requests) may differ: those are searched when
            # the policy's own replay gets to them.
            prefetcher.start()
            for p in policies[1:]:
                config = controller_config(p, costs=costs, gpu_type=single)
                if config.strategy in ("static", "failover"):
                    threads = threads or ThreadPoolExecutor(max_workers=len(policies) - 1)
                    shadows[p] = threads.submit(_shadow_replay, prefetcher, exact_availability, prices, dict(
                        trace=trace, config=config, costs=costs, samples_target=samples_target,
                        budget_usd=budget_usd, policy=p, seed=seed, max_time_s=max_time_s,
                        price_change_times=change_times))
        for p in policies:
            calls_before = cached.num_calls
            config = controller_config(p, costs=costs, gpu_type=single)
            if p in shadows:
                shadows[p].result()  # what it searched is with the workers' answers now
            r = replay(trace, plan_fn=planner, config=config, costs=costs, samples_target=samples_target,
                       price_fn=price_fn, budget_usd=budget_usd, policy=p, seed=seed, max_time_s=max_time_s,
                       price_change_times=change_times, prefetch=prefetch,
                       prefetch_decisions=prefetcher.lookahead_decisions if prefetcher is not None else 0,
                       progress=(lambda t, p=p: progress(p, t, cached.num_calls)) if progress is not None else None)
            results[p] = _with_calls(r, cached.num_calls - calls_before)
    finally:
        _flush(cached.plan_fn)
        if prefetcher is not None:
            prefetcher.close()  # (a shadow thread still waiting on a search then stops)
        if threads is not None:
            threads.shutdown(wait=True)
    return ReplaySuite(
        results=results, single_gpu_type=single, samples_target=samples_target,
        wall_s=time.perf_counter() - t0, planner_calls=probe.num_calls + cached.num_calls,
        planner_time_s=probe.planner_time_s + cached.planner_time_s,
        trace_source=trace.source, trace_notes=trace.notes, planner_call_log=(*probe.calls, *cached.calls),
        micro_batch_sizes=tuple(mbs) if mbs else None,
        prefetch=prefetcher.stats() if prefetcher is not None else None,
    )


def _price_fn(prices: PriceSeries | None) -> PriceFn:
    return prices.price_fn(fallback=catalog_price_fn()) if prices is not None else catalog_price_fn()


class _WorkersStopped(Exception):
    pass


def _shadow_replay(prefetcher: PrefetchingPlanner, exact_availability: bool, prices: PriceSeries | None,
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
        replay(plan_fn=cached if exact_availability else on_grid(cached), price_fn=_price_fn(prices), **replay_args)
    except _WorkersStopped:
        pass


def _prefetcher(plan_fn: PlanFn) -> PrefetchingPlanner | None:
    if isinstance(plan_fn, PersistentPlanner):
        plan_fn = plan_fn.plan_fn
    return plan_fn if isinstance(plan_fn, PrefetchingPlanner) and plan_fn.workers > 0 else None


def _known_to(cached: CachedPlanner) -> Callable[[Mapping[GpuZone, int]], bool]:
    """Whether ``cached`` answers an availability without a search: seen before, implied by
    earlier answers (as it stands now), or stored in its plan cache on disk."""
    disk = cached.plan_fn if isinstance(cached.plan_fn, PersistentPlanner) else None
    # What earlier answers imply only changes when an answer is added, so a "no" holds
    # until the planner's next search (guesses are checked again after every decision).
    unknown_at: dict[frozenset, int] = {}

    def known(available: Mapping[GpuZone, int]) -> bool:
        key = frozenset(available.items())
        if unknown_at.get(key) == cached.num_calls:
            return False
        if disk is not None and _key(disk.prefix, available) in disk.store:
            return True
        if cached.knows(available):
            return True
        unknown_at[key] = cached.num_calls
        return False

    return known


def _flush(plan_fn: PlanFn) -> None:
    if isinstance(plan_fn, PersistentPlanner):
        plan_fn.flush()


def _with_calls(r: ReplayResult, calls: int) -> ReplayResult:
    return dataclasses.replace(r, planner_calls=calls)
