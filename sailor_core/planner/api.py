"""``plan_job``: run the searches (each GPU type alone, the pairs, the whole request, the
other objective before "infeasible"), mix leftover GPUs into stages, check every plan with
``simulate`` and rank them.  Explaining an empty answer is ``explain``'s; mixing ``mixing``'s."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import math
import time
from collections.abc import Mapping

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.errors import InfeasibleError
from sailor_core.network.model import default_network
from sailor_core.plan.types import validate_plan
from sailor_core.plan.types import RECOMPUTE_NONE
from sailor_core.planner import levers
from sailor_core.planner.explain import relaxed, why_infeasible, why_mixed, why_simpler
from sailor_core.planner.mixed_space import STAGE_SPACES, search_mixed
from sailor_core.planner.mixing import mix_leftovers
from sailor_core.planner.ranking import FASTEST
from sailor_core.planner.request import GpuZone, PlanRequest
from sailor_core.planner.result import ParetoPoint, PlannedCandidate, PlanResult, pareto_front
from sailor_core.planner.search import Evaluated, Searcher, proof_in_reach, run_search
from sailor_core.planner.search.bounds import ideal_iteration
from sailor_core.planner.search.shapes import DP_SPACES
from sailor_core.planner.simpler import SIMPLER_WITHIN, prefer_simpler
from sailor_core.profiles import default_profile_db
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
        profiles = default_profile_db()
    if network is None:
        network = default_network()
    t0 = time.perf_counter()
    searcher = Searcher(request, profiles=profiles, network=network)
    if levers.may_search_pays_rungs(request):
        searcher.fit_freely, searcher.split_orders = {}, []
    _search_each_type(searcher)
    _search(searcher)
    _widen_degrees(searcher)
    searcher.done_searching()
    if not any(e.feasible for e in searcher.top) and not searcher.stats.exhausted and (
            request.has_cost_caps or request.min_throughput_samples_per_s is not None):
        _search_other_objective(searcher)
    levers_searched = _search_levers(searcher)
    searcher.polish_top(request.top_n + 5)
    stage_space = "one-type"
    if request.mixed_stages:
        for ev in list(searcher.top[: request.top_n]):
            mixed = mix_leftovers(searcher, ev)
            if mixed is not ev:
                searcher.offer(mixed)
        stage_space = "mixed" if not levers_searched and search_mixed(searcher) else "leftover"
        if stage_space == "mixed":
            # the walk covered a space holding the search's (every DP degree included)
            searcher.stats.exhausted, searcher.stats.wider_proof = True, "every"
    preferred = prefer_simpler(searcher)
    try:
        candidates = _simulated(searcher, profiles=profiles, network=network)
    except InfeasibleError as exc:
        if not levers_searched:
            raise
        raise InfeasibleError(f"{exc}; nor with ZeRO and activation recomputation per stage") from None
    candidates.sort(key=lambda c: request.ranking.score(throughput_samples_per_s=c.sim.throughput_samples_per_s,
                                                         usd_per_iteration=c.sim.usd_per_iteration))
    explanation = ""
    if preferred is not None:
        chosen = searcher.to_plan(preferred[0])
        first = next((c for c in candidates if c.plan == chosen), None)
        if first is not None:
            candidates.remove(first)
            candidates.insert(0, first)
            explanation = why_simpler(*preferred, num_layers=searcher.num_layers, tolerance=SIMPLER_WITHIN,
                                      by_cost=request.ranking.by_cost)
    explanation = "; ".join(x for x in (explanation, why_mixed(candidates[0].plan, proven=stage_space == "mixed")) if x)
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
        searched_dp_degrees=DP_SPACES[searcher.stats.wider_proof or searcher.dp_space],
        searched_stages=STAGE_SPACES[stage_space],
        explanation=explanation,
    )


def _search_other_objective(searcher: Searcher) -> None:
    """The bounds under-estimate cost (or over-estimate speed) several-fold on large shapes, so a
    search ordered by one objective can spend its budget on shapes that miss the other's limit:
    before declaring the request infeasible, search by the other objective (which reaches the
    cheap, or the fast, plans first) under the same limits, unless the search proved that no
    plan meets them."""
    request = searcher.req
    if request.ranking.by_cost and not request.has_cost_caps:
        # A floor alone: the fastest plan there is decides.  It meets the floor (then it is
        # a plan, if not the cheapest) or it is the "best achievable" the error reports.
        fastest = relaxed(searcher, FASTEST, keep_caps=False, keep_floor=False)
        if fastest is not None:
            searcher.offer(searcher.evaluate(fastest.mbs, fastest.stages))
    else:
        _adopt(searcher, _sub_search(searcher, objective=request.ranking.other.objective))


def _simulated(searcher: Searcher, *, profiles, network) -> list[PlannedCandidate]:
    """The top N, each run through ``simulate``, whose figures are the ones reported;
    InfeasibleError saying why if none is left."""
    request = searcher.req
    top = [e for e in searcher.top if e.feasible][: request.top_n]
    if not top:
        raise InfeasibleError(why_infeasible(searcher))
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
        notes = levers.notes(plan, profiles=profiles, network=network, spot=request.spot, sim=sim) if any(
            s.recompute != RECOMPUTE_NONE or s.zero_stage for s in plan.stages) else ()
        candidates.append(PlannedCandidate(plan=plan, sim=sim, notes=notes))
    if not candidates:
        raise InfeasibleError(why_infeasible(searcher))
    return candidates


def _search_levers(searcher: Searcher) -> bool:
    """The searches with memory levers (``levers``: on which rungs, when and how far), each a search
    of the request on kinds of one setting; their plans, relaxed stage by stage, join the main
    search's.  Every rung is searched (a ``pays`` one over the shapes that can pay where they are
    few, ``levers.search_rung_directly``, else not at all where it provably cannot change the
    answer, ``levers.cannot_pay``): a stronger lever can allow a shallower, faster pipeline
    (llama-3.2-3b on 16 V100-16: 1.130 samples/s on the first rung that fits, 1.27-1.31 with the
    later ones, docs/benchmarks/planner.md).  Whether they ran in full (an empty answer then says
    that not even the levers help)."""
    rungs, thorough = levers.rungs_to_search(searcher)
    if not thorough:
        for ev in [e for e in searcher.top if e.feasible][: levers.num_to_strengthen(searcher.req)]:
            searcher.offer(levers.strengthen(searcher, ev))
    for rung in rungs:
        req = levers.rung_request(searcher, thorough)
        # The direct walk first: where it applies it costs about what cannot_pay's scan does, and
        # a plan it finds where cannot_pay holds is one that proof bounds out of the answer.
        sub = None if thorough else levers.search_rung_directly(searcher, rung, req)
        if sub is None and not thorough and levers.cannot_pay(searcher, rung):
            continue
        if sub is None:
            sub = _search_rung(searcher, rung, req, thorough)
        found = [e for e in sub.top if e.feasible and e.key not in searcher.seen_plans]
        for ev in found[: req.top_n + (5 if thorough else 0)]:
            searcher.offer(levers.strengthen(searcher, levers.relax(searcher, searcher.evaluate(ev.mbs, ev.stages))))
    searcher.split_orders = None  # (they hold the search's spaces)
    return bool(rungs) and thorough


def _search_rung(searcher: Searcher, rung: tuple[str, int], req: PlanRequest, thorough: bool) -> Searcher:
    """A search of ``req`` on the kinds of ``rung``, seeded with ``searcher``'s plans."""
    sub = Searcher(req, profiles=searcher.profiles, network=searcher.network, kinds=levers.lever_kinds(searcher, rung))
    sub.seed_from(searcher)
    if not thorough:
        sub.skip_shapes = searcher.fit_freely
    if thorough:
        _search_each_type(sub)
    _search(sub)
    sub.done_searching()
    return sub


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
        # Under a floor or a cap its proof would take a pass in bound order over the one-type
        # shapes just inside the limits on paper (the floor row: 325 evaluations, 315 missing
        # the floor) to settle shapes the mixed search bounds anyway: its first pass only (the
        # same plans on every floor or cap request measured, top 1 or 5; a Pareto front asked
        # for keeps both passes' plans).
        sub = _sub_search(searcher, seeded=True, prove=request.collect_pareto, availability=only, top_n=1)
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


def _search(searcher: Searcher, *, prove: bool = True) -> None:
    """``prove``: under a floor or a cap, the pass that checks the limits on the bound alone
    (what a proof needs); without it the search finds plans and proves nothing."""
    request = searcher.req
    floor_binds = request.min_throughput_samples_per_s is not None and request.ranking.by_cost
    caps_bind = request.has_cost_caps and not request.ranking.by_cost
    if floor_binds or caps_bind:
        # The bound leaves out part of the bubbles, links and sync, so shapes that meet a floor
        # or a cap on paper by a narrow margin mostly miss it in simulation.  First search with
        # the limits checked on an estimate (the bound times the excess seen on pipelines as
        # deep), which keeps the budget for shapes that may meet them; then, with the plans
        # found pruning it, once more with the limits checked on the bound alone, for the
        # shapes just under a cap that the estimate ruled out.  That pass walks in order of the
        # bound to prove the top N; where the first pass's scored shapes already left out some
        # that beat the threshold no proof can come of it, and on every request with a floor or
        # a cap measured (the AE floor and cap rows, bench_planner's opt-350m floor and cap and
        # gpt-neo-2.7b cap) it then found no plan for the top N either: it is skipped
        # (docs/benchmarks/planner.md, floor row).
        searcher.estimate_limits = True
        run_search(searcher, budget=request.max_evaluations // 2)
        searcher.estimate_limits = False
        if not prove or not (request.collect_pareto or proof_in_reach(searcher)):
            searcher.stats.exhausted = False  # shapes the estimate ruled out were never bounded
            return
        run_search(searcher, budget=request.max_evaluations // 4, by_bound_only=True)
    else:
        run_search(searcher)


# Work (evaluations) of the pass over every efficient DP degree after a throughput search.
WIDEN_BUDGET = 24


def _widen_degrees(searcher: Searcher) -> None:
    """A throughput search covers, per number of zones, the most replicas they hold (``zones``):
    that is where the best plan nearly always is, and the estimate-ordered search over every
    degree loses its way among near-equal shapes (geo row 0: 317.6 samples/s instead of 406.7).
    Then every efficient degree is searched, seeded with the plans found: their bound prunes
    almost every smaller degree at once, and the proof (``exhausted``) covers every degree
    that can be best.  Small models whose gradient ring costs more than it saves want fewer
    replicas than the pools hold (tests/planner/test_completeness.py)."""
    if searcher.dp_space != "zones" or len(searcher.gpu_types) > 1:
        return
    sub = searcher.sub_searcher(searcher.req)
    sub.dp_space_override = "efficient"
    sub.lazy_alone_bound = True
    # (its proof may stand for the search's: what it splits counts as split, levers.cannot_pay)
    sub.split_orders = searcher.split_orders
    sub.seed_from(searcher)
    sub.learn_excess_from(searcher)
    run_search(sub, budget=WIDEN_BUDGET, by_bound_only=True)
    sub.done_searching()
    _adopt(searcher, sub)
    searcher.stats.num_evaluated += sub.stats.num_evaluated
    if sub.stats.exhausted:
        searcher.stats.exhausted = True
        searcher.stats.wider_proof = "efficient"


def _sub_search(searcher: Searcher, *, seeded: bool = False, prove: bool = True, **changes) -> Searcher:
    """A search of part of the request's space (same model, limits and profiles); ``seeded``:
    it only looks for plans that beat the top N ``searcher`` has (same objective)."""
    req = dataclasses.replace(searcher.req, mixed_stages=False, collect_pareto=False, **changes)
    sub = searcher.sub_searcher(req)
    if seeded:
        sub.seed_from(searcher)
    _search(sub, prove=prove)
    sub.done_searching()
    return sub


def _by_promise(searcher: Searcher) -> list[str]:
    """GPU types, the likeliest to hold the best plan first: the most peak FLOP/s available, or
    per USD for the cost objective."""
    return sorted(searcher.gpu_types, key=lambda g: (-_promise(searcher.req, g), g))


def _promise(req: PlanRequest, gpu: str) -> float:
    pools = {z: n for (g, z), n in req.availability.items() if g == gpu and n > 0}
    flops = get_gpu(gpu).peak_bf16_flops
    if req.ranking.by_cost:
        return flops / min(gpu_price_usd_per_hr(gpu, z, spot=req.spot) for z in pools)
    return flops * sum(pools.values())


def _adopt(searcher: Searcher, sub: Searcher) -> None:
    """Offer a sub-search's plans to the main search, scored by the main request: its top and,
    as it may rank by the other objective, the best by the main one of all it evaluated (the
    limits are the same, so its feasible plans are feasible here)."""
    seen = [e for e in (*sub.top, *sub.stats.fitting) if e.feasible and e.key not in searcher.seen_plans]
    seen.sort(key=lambda e: searcher.score_of(e.res))
    for ev in seen[: searcher.req.top_n + 20]:
        searcher.offer(searcher.evaluate(ev.mbs, ev.stages))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IdealBounds:
    """What no plan of a request beats: every GPU busy the whole iteration with no bubble, link or
    sync (``bounds.ideal_iteration``), each layer on its fastest GPU type, at the cheapest price."""

    throughput_samples_per_s: float  # no plan is faster
    usd_per_iteration: float  # no plan is cheaper per iteration
    num_gpus: int  # the GPUs counted


def ideal_bounds(request: PlanRequest, *, max_gpus: int | None = None, profiles=None,
                 usd_per_gpu_hr: Mapping[GpuZone, float] | None = None) -> IdealBounds | None:
    """The bounds of the search's pruning (``Searcher.ideal_score``) on the whole request, without
    searching: on at most ``max_gpus`` of the GPUs available, at ``usd_per_gpu_hr`` per pool (else
    the catalog's).  None when no GPU type offered holds a layer of the model."""
    searcher = Searcher(request, profiles=profiles or default_profile_db(), network=default_network())
    gpu_s = searcher.figures.ideal_gpu_s(searcher.gpu_types, searcher.micro_batch_sizes(),
                                         request.global_batch_size)
    pools = [k for k, n in request.availability.items() if n > 0]
    num_gpus = sum(request.availability[k] for k in pools)
    num_gpus = num_gpus if max_gpus is None else min(num_gpus, max_gpus)
    if gpu_s == math.inf or num_gpus < 1:
        return None
    price = min((usd_per_gpu_hr or {}).get(k) or gpu_price_usd_per_hr(k[0], k[1], spot=request.spot) for k in pools)
    iteration_s, usd = ideal_iteration(gpu_s, num_gpus, price)
    return IdealBounds(throughput_samples_per_s=request.global_batch_size / iteration_s, usd_per_iteration=usd,
                       num_gpus=num_gpus)
