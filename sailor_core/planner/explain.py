"""Explaining an answer: why no plan meets the request (memory, a floor above the best
achievable throughput, a cap below the cheapest plan), found by searching the request again
with some of its limits dropped (``relaxed``); why a simpler plan comes before a slightly
better one (``why_simpler``); and which stages of a plan mix GPU types outside what the search
proves (``why_mixed``)."""

from __future__ import annotations

import dataclasses

from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.ranking import CHEAPEST, FASTEST, PlanRanking
from sailor_core.planner.search import Evaluated, Searcher, run_search
from sailor_core.planner.simpler import simplicity
from sailor_core.simulator.memory import stage_memory


def why_infeasible(searcher: Searcher) -> str:
    """One line saying why ``searcher``'s request has no plan (see docs/planner.md)."""
    req = searcher.req
    st = searcher.stats
    if not st.any_fits:
        # The limits may have ruled out every shape before one was simulated: check that
        # something fits at all before blaming memory.
        limited = req.has_cost_caps or req.min_throughput_samples_per_s is not None
        if not limited or relaxed(searcher, FASTEST, keep_caps=False, keep_floor=False) is None:
            return _memory_reason(searcher)
    reasons = []
    if req.min_throughput_samples_per_s is not None:
        reasons += _floor_reasons(searcher)
    if req.has_cost_caps:
        reasons += _cap_reasons(searcher)
    if not reasons and (st.best_throughput is None or st.cheapest is None):
        reasons.append(f"the search found no plan meeting {_limits_words(req)} within its budget "
                       f"({st.num_evaluated} plans evaluated)")
    if not reasons:
        best, cheap = st.best_throughput, st.cheapest
        reasons.append(
            f"the search found no plan meeting {_limits_words(req)} within its budget "
            f"({st.num_evaluated} plans; the fastest reached {best.res.throughput_samples_per_s:.4g} samples/s "
            f"at {best.res.usd_per_iteration:.4g} USD/iteration, the cheapest cost "
            f"{cheap.res.usd_per_iteration:.4g} USD/iteration at {cheap.res.throughput_samples_per_s:.4g} samples/s)"
        )
    return "no feasible plan: " + "; ".join(reasons)


def _limits_words(req) -> str:
    """The limits the request sets, as the messages name them."""
    caps = [req.max_usd_per_iteration, req.max_usd_per_hour]
    words = ["the cost caps" if all(c is not None for c in caps) else "the cost cap"] if req.has_cost_caps else []
    if req.min_throughput_samples_per_s is not None:
        words.append("the throughput floor")
    return " and ".join(words) + (" together" if len(words) > 1 else "")


def _floor_reasons(searcher: Searcher) -> list[str]:
    """The floor against the fastest plan there is (within the caps when something meets them)."""
    req = searcher.req
    caps_too = relaxed(searcher, FASTEST, keep_caps=True, keep_floor=False) is None  # the caps alone rule all out
    best = relaxed(searcher, FASTEST, keep_caps=not caps_too, keep_floor=False)
    if best is None or best.res.throughput_samples_per_s >= req.min_throughput_samples_per_s:
        return []
    within = " within the cost caps" if not caps_too and req.has_cost_caps else ""
    # "achievable" only where that search was exhausted; else what a budgeted search found
    proven = relaxed_proven(searcher, FASTEST, keep_caps=not caps_too, keep_floor=False)
    return [
        f"the throughput floor {req.min_throughput_samples_per_s:.4g} samples/s is above the best "
        f"{'achievable' if proven else 'found (the search stopped before proving it the best)'}{within}, "
        f"{best.res.throughput_samples_per_s:.4g} samples/s "
        f"({best.num_gpus} GPUs, {best.res.usd_per_iteration:.4g} USD/iteration)"
    ]


def _cap_reasons(searcher: Searcher) -> list[str]:
    """The caps against the cheapest plan there is (meeting the floor when something does)."""
    req = searcher.req
    with_floor = relaxed(searcher, CHEAPEST, keep_caps=False, keep_floor=True) is not None
    cheapest = relaxed(searcher, CHEAPEST, keep_caps=False, keep_floor=with_floor)
    if cheapest is None:
        return []
    out = []
    floor = " meeting the throughput floor" if with_floor and req.min_throughput_samples_per_s else ""
    # "the cheapest plan" only where that search was exhausted; else what a budgeted search found
    if not relaxed_proven(searcher, CHEAPEST, keep_caps=False, keep_floor=with_floor):
        floor = f" found{floor} (the search stopped before proving it the cheapest)"
    if req.max_usd_per_iteration is not None and cheapest.res.usd_per_iteration > req.max_usd_per_iteration:
        out.append(
            f"the cap {req.max_usd_per_iteration:.4g} USD/iteration is below the cheapest plan{floor}, "
            f"which costs {cheapest.res.usd_per_iteration:.4g} USD/iteration "
            f"({cheapest.res.usd_per_hour:.4g} USD/hour, {cheapest.num_gpus} GPUs)"
        )
    # Nothing the search evaluated may have met the cap (it can prune every shape on its bound):
    # then the cheapest plan there is says what the cap is below.
    per_hour = searcher.stats.cheapest_per_hour or cheapest
    if req.max_usd_per_hour is not None and per_hour is not None and per_hour.res.usd_per_hour > req.max_usd_per_hour:
        out.append(
            f"the cap {req.max_usd_per_hour:.4g} USD/hour is below the cheapest plan that fits, "
            f"which rents {per_hour.res.usd_per_hour:.4g} USD/hour ({per_hour.num_gpus} GPUs)"
        )
    return out


def relaxed(searcher: Searcher, ranking: PlanRanking, *, keep_caps: bool, keep_floor: bool) -> Evaluated | None:
    """The best plan of the request with some of its limits dropped (memoised on the searcher:
    keeping limits the request does not set changes nothing, so each variant is searched once)."""
    return _relaxed_entry(searcher, ranking, keep_caps=keep_caps, keep_floor=keep_floor)[0]


def relaxed_proven(searcher: Searcher, ranking: PlanRanking, *, keep_caps: bool, keep_floor: bool) -> bool:
    """Whether ``relaxed``'s search was exhausted: its plan is the best there is, not the best found."""
    return _relaxed_entry(searcher, ranking, keep_caps=keep_caps, keep_floor=keep_floor)[1]


def _relaxed_entry(searcher: Searcher, ranking: PlanRanking, *, keep_caps: bool,
                   keep_floor: bool) -> tuple[Evaluated | None, bool]:
    req = searcher.req
    key = (ranking.objective, keep_caps and req.has_cost_caps, keep_floor and req.min_throughput_samples_per_s is not None)
    memo = searcher.memos.own.relaxed
    if key not in memo:
        memo[key] = _relaxed_search(searcher, ranking=ranking, keep_caps=keep_caps, keep_floor=keep_floor)
    return memo[key]


def _relaxed_search(searcher: Searcher, *, ranking: PlanRanking, keep_caps: bool,
                    keep_floor: bool) -> tuple[Evaluated | None, bool]:
    req = searcher.req
    request = dataclasses.replace(
        req,
        objective=ranking.objective,
        top_n=1,
        max_usd_per_iteration=req.max_usd_per_iteration if keep_caps else None,
        max_usd_per_hour=req.max_usd_per_hour if keep_caps else None,
        min_throughput_samples_per_s=req.min_throughput_samples_per_s if keep_floor else None,
        mixed_stages=False,
    )
    s = searcher.sub_searcher(request)
    # Start from the best plan the request's own search simulated that meets what is kept: the
    # relaxed search then only looks at shapes that may beat it.
    seeds = [e for e in searcher.stats.fitting if s.meets_limits(e.res)]
    if seeds:
        best = min(seeds, key=lambda e: s.score_of(e.res))
        s.offer(s.evaluate(best.mbs, best.stages))
    run_search(s)
    s.done_searching()
    top = [e for e in s.top if e.feasible]
    return (top[0] if top else None), s.stats.exhausted


def _memory_reason(searcher: Searcher) -> str:
    """Why nothing fits in memory: the least-loaded stage there could be, against its GPU."""
    req = searcher.req
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


def why_simpler(chosen: Evaluated, best: Evaluated, *, num_layers: int, tolerance: float,
                by_cost: bool) -> str:
    """One line saying why ``chosen`` is returned before the slightly better ``best``
    (``simpler.prefer_simpler``)."""
    (c_uneven, c_zones, c_egress), (b_uneven, b_zones, b_egress) = (simplicity(chosen, num_layers),
                                                                    simplicity(best, num_layers))
    why = []
    if b_uneven and not c_uneven:
        why.append("an even layer split")
    if c_zones < b_zones:
        why.append(f"{b_zones - c_zones} zone{'s' if b_zones - c_zones > 1 else ''} fewer")
    if c_egress < b_egress:
        why.append(f"{b_egress - c_egress:.4g} USD less egress per iteration")
    if by_cost:
        gap = f"{chosen.res.usd_per_iteration:.4g} USD/iteration against {best.res.usd_per_iteration:.4g}"
    else:
        gap = f"{chosen.res.throughput_samples_per_s:.4g} samples/s against {best.res.throughput_samples_per_s:.4g}"
    return (f"preferred the simpler plan ({', '.join(why)}): {gap} for the best found, a difference under "
            f"the simulator's tolerance of {tolerance:.0%}")


def why_mixed(plan, *, proven: bool = False) -> str:
    """One line naming the stages of ``plan`` whose replicas are of several GPU types: from the
    leftover step (``mixing``), which the search's proof does not cover, or (``proven``) from
    the bounded walk of the mixed space (``mixed_space.STAGE_SPACES``); "" when no stage mixes types."""
    mixed = [(i, sorted({r.gpu for r in st.replicas})) for i, st in enumerate(plan.stages)]
    mixed = [(i, gpus) for i, gpus in mixed if len(gpus) > 1]
    if not mixed:
        return ""
    names = ", ".join(f"stage {i} ({' + '.join(gpus)})" for i, gpus in mixed)
    verb = "mixes" if len(mixed) == 1 else "mix"
    if proven:
        return f"{names} {verb} GPU types, within the proof (`exhausted` covers mixed stages on these pools)"
    return (f"{names} {verb} GPU types: leftover GPUs joined after the search, "
            "whose proof (`exhausted`) covers stages of one GPU type only, so a better mixed stage may exist")
