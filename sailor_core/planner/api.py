"""``plan_job``: run the search, mix leftover GPUs into stages, rank, explain infeasibility."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import time

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.errors import InfeasibleError
from sailor_core.plan.types import validate_plan
from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.request import Objective, PlanRequest
from sailor_core.planner.result import ParetoPoint, PlannedCandidate, PlanResult, pareto_front
from sailor_core.planner.search import Evaluated, Searcher, _better, run_search
from sailor_core.planner.fastsim import FastStage
from sailor_core.simulator.memory import inflight_microbatches
from sailor_core.simulator.simulate import simulate


def _agrees(ev: Evaluated, sim) -> bool:
    """The search's figures must be simulate's (to rounding); a difference is a fastsim bug."""
    fast = ev.res
    for name in ("iteration_time_s", "usd_per_iteration", "usd_per_hour"):
        a, b = getattr(fast, name), getattr(sim, name)
        if abs(a - b) > 1e-9 * max(abs(b), 1e-12):
            return False
    return fast.fits == sim.fits and fast.peak_memory_bytes == sim.peak_memory_bytes


@contextlib.contextmanager
def _cyclic_gc_paused():
    """A search makes millions of short-lived, acyclic tuples (freed by reference counting)
    next to long-lived memos; each full pass of the cyclic collector walks all the memos and
    took 20-35 % of a search's time.  Whatever cycles a search leaves are collected after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def plan_job(request: PlanRequest, *, profiles=None, network=None) -> PlanResult:
    """The top ``request.top_n`` plans, best first; InfeasibleError saying why if there are none."""
    with _cyclic_gc_paused():
        return _plan_job(request, profiles=profiles, network=network)


def _plan_job(request: PlanRequest, *, profiles, network) -> PlanResult:
    if profiles is None:
        from sailor_core.profiles import default_profile_db

        profiles = default_profile_db()
    if network is None:
        from sailor_core.network.model import default_network

        network = default_network()
    t0 = time.perf_counter()
    searcher = Searcher(request, profiles=profiles, network=network)
    _search_each_type(searcher)
    _search(searcher)
    searcher.done_searching()
    if not any(e.feasible for e in searcher.top) and not searcher.stats.exhausted and (
            _has_caps(request) or request.min_throughput_samples_per_s is not None):
        # The bounds under-estimate cost (or over-estimate speed) several-fold on large shapes,
        # so a search ordered by one objective can spend its budget on shapes that miss the
        # other's limit: before declaring the request infeasible, search by the other objective
        # (which reaches the cheap, or the fast, plans first) under the same limits, unless
        # the search proved that no plan meets them.
        if request.objective is Objective.COST and not _has_caps(request):
            # A floor alone: the fastest plan there is decides.  It meets the floor (then it is
            # a plan, if not the cheapest) or it is the "best achievable" the error reports.
            fastest = relaxed(searcher, Objective.THROUGHPUT, keep_caps=False, keep_floor=False)
            if fastest is not None:
                searcher.offer(searcher.evaluate(fastest.mbs, fastest.stages))
        else:
            other = Objective.COST if request.objective is Objective.THROUGHPUT else Objective.THROUGHPUT
            _adopt(searcher, _sub_search(searcher, objective=other))
    searcher.polish_top(request.top_n + 5)
    if request.mixed_stages:
        for ev in list(searcher.top[: request.top_n]):
            mixed = _mix_leftovers(searcher, ev)
            if mixed is not ev:
                searcher.offer(mixed)
    top = [e for e in searcher.top if e.feasible][: request.top_n]
    if not top:
        raise InfeasibleError(_why_infeasible(searcher))
    candidates = []
    for ev in top:
        plan = searcher.to_plan(ev)
        validate_plan(plan)  # the search builds valid plans; this keeps it honest
        sim = simulate(plan, profiles=profiles, network=network, spot=request.spot, validate=False)
        if not _agrees(ev, sim):
            # fastsim lags a change in simulate: simulate's figures decide (tests flag the lag).
            searcher.stats.num_disagreements += 1
            if not (sim.fits and searcher.meets_limits(sim)):
                continue
        candidates.append(PlannedCandidate(plan=plan, sim=sim))
    if not candidates:
        raise InfeasibleError(_why_infeasible(searcher))
    key = (lambda c: -c.sim.throughput_samples_per_s) if request.objective is Objective.THROUGHPUT \
        else (lambda c: c.sim.usd_per_iteration)
    candidates.sort(key=key)
    elapsed = time.perf_counter() - t0
    points = [
        ParetoPoint(usd_per_iteration=e.res.usd_per_iteration,
                    throughput_samples_per_s=e.res.throughput_samples_per_s, num_gpus=e.num_gpus)
        for e in searcher.stats.fitting
    ]
    return PlanResult(
        candidates=tuple(candidates),
        search_time_s=elapsed,
        pareto=pareto_front(points),
        num_evaluated=searcher.stats.num_evaluated,
        exhausted=searcher.stats.exhausted,
        objective=request.objective.value,
        num_disagreements=searcher.stats.num_disagreements,
    )


def _search_each_type(searcher: Searcher) -> None:
    """Every plan on one GPU type is also a plan when more types are available, but the
    estimates and the patience stop of the larger search can miss it: search each type on
    its own first (a much smaller space); its best plans then prune the larger search.  The
    most promising type goes first, and each later search starts from the plans found so far:
    a type that cannot beat them is done in a few bounds.  With three types or more, each pair
    of types is searched next the same way: a pair's shapes are all scored at once (numpy),
    whereas the search over every type generates them lazily in order of a loose bound and
    reaches only part of them (opt-350m on three types of 256: 933.7 samples/s without the
    pairs, 1057.8 with them)."""
    request = searcher.req
    if len(searcher.gpu_types) < 2:
        return
    promising = _by_promise(searcher)
    for gpu in promising:
        if not request.collect_pareto and searcher.ideal_score([gpu]) >= searcher.threshold():
            # Even perfect scaling on it alone cannot enter the top N found so far.
            searcher.settled_types.add(gpu)
            continue
        only = {k: n for k, n in request.availability.items() if k[0] == gpu}
        sub = _sub_search(searcher, seeded=True, availability=only, top_n=1)
        _adopt(searcher, sub)
        # Its simulated-over-bounded times by depth start the mixed search's queue estimate.
        searcher.learn_excess_from(sub)
        if sub.stats.exhausted and not request.collect_pareto and request.top_n == 1:
            # Proven: no other one-type shape of it beats the N-th plan the sub-search had,
            # which is at least as good as this search's N-th now.
            searcher.settled_types.add(gpu)
    if len(searcher.gpu_types) < 3:
        return
    for pair in itertools.combinations(promising, 2):
        if not request.collect_pareto and searcher.ideal_score(list(pair)) >= searcher.threshold():
            continue
        only = {k: n for k, n in request.availability.items() if k[0] in pair}
        # (Its excess is not learnt: the pairs' deep pipelines would reorder the mixed search's
        # queue, which then lost 6 % on gpt-neo-2.7b over three types of 64 in two zones.)
        _adopt(searcher, _sub_search(searcher, seeded=True, availability=only, top_n=1))


def _search(searcher: Searcher) -> None:
    request = searcher.req
    floor_binds = request.min_throughput_samples_per_s is not None and request.objective is Objective.COST
    caps_bind = _has_caps(request) and request.objective is Objective.THROUGHPUT
    if floor_binds or caps_bind:
        # The bound leaves out part of the bubbles, links and sync, so shapes that meet a floor
        # or a cap on paper by a narrow margin mostly miss it in simulation.  First search with
        # the limits checked on an estimate (the bound times the excess seen on pipelines as
        # deep), which keeps the budget for shapes that may meet them; then, with the plans
        # found pruning it, once more with the limits checked on the bound alone, for the
        # shapes just under a cap that the estimate ruled out.
        searcher.estimate_limits = True
        run_search(searcher, budget=request.max_evaluations // 2)
        searcher.estimate_limits = False
        run_search(searcher, budget=request.max_evaluations // 4, by_bound_only=True)
    else:
        run_search(searcher)


def _sub_search(searcher: Searcher, *, seeded: bool = False, **changes) -> Searcher:
    """A search of part of the request's space (same model, limits and profiles); ``seeded``:
    it only looks for plans that beat the top N ``searcher`` has (same objective)."""
    req = dataclasses.replace(searcher.req, mixed_stages=False, collect_pareto=False, **changes)
    sub = _sharing(searcher, req)
    if seeded:
        sub.top = list(searcher.top)
        sub._seen_plans = set(searcher._seen_plans)
    _search(sub)
    sub.done_searching()
    return sub


def _by_promise(searcher: Searcher) -> list[str]:
    """GPU types, the likeliest to hold the best plan first: the most peak FLOP/s available, or
    per USD for the cost objective."""
    req = searcher.req

    def promise(gpu: str) -> float:
        pools = {z: n for (g, z), n in req.availability.items() if g == gpu and n > 0}
        flops = get_gpu(gpu).peak_bf16_flops
        if req.objective is Objective.COST:
            return flops / min(gpu_price_usd_per_hr(gpu, z, spot=req.spot) for z in pools)
        return flops * sum(pools.values())

    return sorted(searcher.gpu_types, key=lambda g: (-promise(g), g))


def _sharing(searcher: Searcher, req: PlanRequest) -> Searcher:
    """A Searcher for ``req`` (same model) that reuses what ``searcher`` worked out."""
    sub = Searcher(req, profiles=searcher.profiles, network=searcher.network)
    sub.kinds = searcher.kinds  # same model and regime: share the kinds (and their memo)
    # Same kinds and zones per GPU type: a shape's split, placement and rent are the same here.
    sub.prepared_memo = searcher.prepared_memo
    sub.placed_memo = searcher.placed_memo
    sub.placed_costs_memo = searcher.placed_costs_memo
    sub.fewest_crossings_memo = searcher.fewest_crossings_memo
    if req.availability == searcher.req.availability:
        # Same GPU types too: the same regime variants, so the same bound parts.
        sub.bound_memos = searcher.bound_memos
        sub._variants = searcher._variants
        sub._block_head = searcher._block_head
        sub._granular = searcher._granular
    return sub


def _adopt(searcher: Searcher, sub: Searcher) -> None:
    """Offer a sub-search's plans to the main search, scored by the main request: its top and,
    as it may rank by the other objective, the best by the main one of all it evaluated (the
    limits are the same, so its feasible plans are feasible here)."""
    seen = [e for e in (*sub.top, *sub.stats.fitting) if e.feasible and e.key not in searcher._seen_plans]
    seen.sort(key=lambda e: searcher.score_of(e.res))
    for ev in seen[: searcher.req.top_n + 20]:
        searcher.offer(searcher.evaluate(ev.mbs, ev.stages))


# ---- mixing GPU types inside a stage ------------------------------------------------


def _leftover(searcher: Searcher, ev: Evaluated) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = {}
    for stage in ev.stages:
        for k, z, n in stage.groups:
            used[(k.gpu, z)] = used.get((k.gpu, z), 0) + n * k.tp_degree
    return {k: n - used.get(k, 0) for k, n in searcher.req.availability.items() if n - used.get(k, 0) > 0}


def _mix_leftovers(searcher: Searcher, ev: Evaluated, max_added: int = 64) -> Evaluated:
    """Add leftover GPUs as extra replicas of the busiest stage while the objective improves.

    A replica only joins a stage if it is not slower than the stage's straggler on that
    stage's layers and fits its memory, so it takes micro-batches off the others.
    """
    best = ev
    added = 0
    tried: set = set()
    num_mb = searcher.req.global_batch_size // ev.mbs
    while added < max_added and searcher.stats.num_evaluated < searcher.req.max_evaluations:
        left = _leftover(searcher, best)
        if not left:
            break
        res = best.res
        order = sorted(range(len(best.stages)), key=lambda i: -res.busy_s[i])
        improved = False
        for si in order[:2]:
            stage = best.stages[si]
            straggler_s = res.compute_s[si]
            options = []
            for (gpu, zone), count in sorted(left.items()):
                for tp in valid_tp_degrees(searcher.req.model, gpu, searcher.req.max_tp_degree):
                    if tp > count:
                        continue
                    kind = searcher.kinds.get(gpu, tp, ev.mbs)
                    if kind is None:
                        continue
                    kind = searcher.kinds.in_regime_of(kind, best.stages[0].groups[0][0])
                    t = kind.time_s(stage.layer_start, stage.layer_end)
                    if t > straggler_s * (1 + 1e-9):
                        continue
                    d_new = stage.dp_degree + 1
                    if d_new > num_mb:
                        continue
                    # The new replica comes last, so it gets the fewest micro-batches: check the most.
                    k = inflight_microbatches(si, len(best.stages), -(-num_mb // d_new))
                    if not kind.fits(stage.layer_start, stage.layer_end, k):
                        continue
                    zone_match = any(z == zone for _, z, _ in stage.groups)
                    options.append((not zone_match, tp, t, gpu, zone, kind))
            for _, tp, _, gpu, zone, kind in sorted(options, key=lambda o: o[:5])[:3]:
                key = (si, gpu, zone, tp, stage.dp_degree)
                if key in tried:
                    continue
                tried.add(key)
                groups = list(stage.groups)
                if groups[-1][0] is kind and groups[-1][1] == zone:
                    groups[-1] = (kind, zone, groups[-1][2] + 1)
                else:
                    groups.append((kind, zone, 1))
                stages = list(best.stages)
                stages[si] = FastStage(stage.layer_start, stage.layer_end, tuple(groups))
                trial = searcher.evaluate(ev.mbs, tuple(stages))
                if _better(trial, best):
                    best, improved = trial, True
                    added += 1
                    break
            if improved:
                break
        if not improved:
            break
    return best


# ---- explaining an empty answer ------------------------------------------------------


def _why_infeasible(searcher: Searcher) -> str:
    req = searcher.req
    st = searcher.stats

    if not st.any_fits:
        # The limits may have ruled out every shape before one was simulated: check that
        # something fits at all before blaming memory.
        limited = _has_caps(req) or req.min_throughput_samples_per_s is not None
        if not limited or relaxed(searcher, Objective.THROUGHPUT, keep_caps=False, keep_floor=False) is None:
            return _memory_reason(searcher)
    reasons = []
    relaxed_cost = None
    if req.min_throughput_samples_per_s is not None:
        best = relaxed(searcher, Objective.THROUGHPUT, keep_caps=True, keep_floor=False)
        if best is None:  # the caps alone already rule everything out
            best = relaxed(searcher, Objective.THROUGHPUT, keep_caps=False, keep_floor=False)
            caps_too = True
        else:
            caps_too = False
        if best is not None and best.res.throughput_samples_per_s < req.min_throughput_samples_per_s:
            within = " within the cost caps" if not caps_too and _has_caps(req) else ""
            reasons.append(
                f"the throughput floor {req.min_throughput_samples_per_s:.4g} samples/s is above the best "
                f"achievable{within}, {best.res.throughput_samples_per_s:.4g} samples/s "
                f"({best.num_gpus} GPUs, {best.res.usd_per_iteration:.4g} USD/iteration)"
            )
    if _has_caps(req):
        relaxed_cost = relaxed(searcher, Objective.COST, keep_caps=False, keep_floor=True)
        if relaxed_cost is None:
            relaxed_cost = relaxed(searcher, Objective.COST, keep_caps=False, keep_floor=False)
        cheapest = relaxed_cost
        if cheapest is not None:
            floor = " meeting the throughput floor" if req.min_throughput_samples_per_s else ""
            if req.max_usd_per_iteration is not None and cheapest.res.usd_per_iteration > req.max_usd_per_iteration:
                reasons.append(
                    f"the cap {req.max_usd_per_iteration:.4g} USD/iteration is below the cheapest plan{floor}, "
                    f"which costs {cheapest.res.usd_per_iteration:.4g} USD/iteration "
                    f"({cheapest.res.usd_per_hour:.4g} USD/hour, {cheapest.num_gpus} GPUs)"
                )
            per_hour = searcher.stats.cheapest_per_hour
            if req.max_usd_per_hour is not None and per_hour is not None and per_hour.res.usd_per_hour > req.max_usd_per_hour:
                reasons.append(
                    f"the cap {req.max_usd_per_hour:.4g} USD/hour is below the cheapest plan that fits, "
                    f"which rents {per_hour.res.usd_per_hour:.4g} USD/hour ({per_hour.num_gpus} GPUs)"
                )
    if not reasons:
        best, cheap = st.best_throughput, st.cheapest
        reasons.append(
            "the search found no plan meeting the caps and the floor together within its budget "
            f"({st.num_evaluated} plans; the fastest reached {best.res.throughput_samples_per_s:.4g} samples/s "
            f"at {best.res.usd_per_iteration:.4g} USD/iteration, the cheapest cost "
            f"{cheap.res.usd_per_iteration:.4g} USD/iteration at {cheap.res.throughput_samples_per_s:.4g} samples/s)"
        )
    return "no feasible plan: " + "; ".join(reasons)


def _has_caps(req: PlanRequest) -> bool:
    return req.max_usd_per_iteration is not None or req.max_usd_per_hour is not None


def relaxed(searcher: Searcher, objective: Objective, *, keep_caps: bool, keep_floor: bool) -> Evaluated | None:
    """The best plan of the request with some of its limits dropped (memoised on the searcher:
    keeping limits the request does not set changes nothing, so each variant is searched once)."""
    req = searcher.req
    key = (objective, keep_caps and _has_caps(req), keep_floor and req.min_throughput_samples_per_s is not None)
    if key not in searcher.relaxed_memo:
        searcher.relaxed_memo[key] = _relaxed_search(searcher, objective=objective,
                                                     keep_caps=keep_caps, keep_floor=keep_floor)
    return searcher.relaxed_memo[key]


def _relaxed_search(searcher: Searcher, *, objective: Objective, keep_caps: bool,
                    keep_floor: bool) -> Evaluated | None:
    req = searcher.req
    relaxed = dataclasses.replace(
        req,
        objective=objective,
        top_n=1,
        max_usd_per_iteration=req.max_usd_per_iteration if keep_caps else None,
        max_usd_per_hour=req.max_usd_per_hour if keep_caps else None,
        min_throughput_samples_per_s=req.min_throughput_samples_per_s if keep_floor else None,
        mixed_stages=False,
    )
    s = _sharing(searcher, relaxed)
    # Start from the best plan the request's own search simulated that meets what is kept: the
    # relaxed search then only looks at shapes that may beat it.
    seeds = [e for e in searcher.stats.fitting if s.meets_limits(e.res)]
    if seeds:
        best = min(seeds, key=lambda e: s.score_of(e.res))
        s.offer(s.evaluate(best.mbs, best.stages))
    run_search(s)
    s.done_searching()
    top = [e for e in s.top if e.feasible]
    return top[0] if top else None


def _memory_reason(searcher: Searcher) -> str:
    req = searcher.req
    from sailor_core.simulator.memory import stage_memory

    best = None
    for gpu in searcher.gpu_types:
        for tp in valid_tp_degrees(req.model, gpu, req.max_tp_degree):
            if tp > max(searcher.zone_gpus[gpu].values()):
                continue
            for mbs in searcher.micro_batch_sizes()[:1]:
                kind = searcher.kinds.get(gpu, tp, mbs)
                if kind is None:
                    continue
                # One layer per stage, one micro-batch in flight: no split needs less.
                fits_all = [
                    stage_memory(kind.profile, i, i + 1, 1, kind.regime, kind.capacity_bytes)
                    for i in range(searcher.num_layers)
                ]
                worst = max(fits_all, key=lambda m: m.peak_bytes)
                cand = (worst.peak_bytes / worst.capacity_bytes, gpu, tp, mbs, worst)
                if best is None or cand[0] < best[0]:
                    best = cand
    if best is None:
        errs = "; ".join(dict.fromkeys(searcher.kinds.errors_for(searcher.gpu_types))) \
            or "no profile or estimate for any GPU"
        return f"no plan: {errs}"
    _, gpu, tp, mbs, mem = best
    total = sum(req.availability.values())
    if mem.peak_bytes > mem.capacity_bytes:
        return (
            f"no plan fits in GPU memory: even one layer of {req.model} per stage at micro-batch {mbs} "
            f"needs {mem.peak_bytes / 1e9:.2f} GB on {gpu} (TP {tp}) but it has {mem.capacity_bytes / 1e9:.2f} GB"
        )
    return (
        f"no plan fits in GPU memory: {req.model} at micro-batch {mbs} does not fit on the "
        f"{total} GPUs available with up to {searcher.max_stages} pipeline stages and TP up to "
        f"{req.max_tp_degree} (1F1B keeps up to P - i micro-batches in flight on stage i)"
    )
