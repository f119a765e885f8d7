"""The memory levers in the planner: ZeRO and activation recomputation per stage, where they pay.

The search itself (``search/``) runs on kinds of one lever setting: ``KindCache`` builds every
kind of a search with one (recomputation, ZeRO stage), so its bounds, splits and ``fastsim``
figures are those of that setting, and a bound stays admissible (a lever only adds time to what
the bound reads, or, for ZeRO's sharded step, to what it does not read).  ``plan_job`` first
searches without levers; then, under ``memory_levers``:

* ``off``: nothing more;
* ``when-needed``: only when no plan fitted in memory, it searches again on the ladder of
  settings, cheapest first (``kinds.LEVER_LADDER``: ZeRO-1, selective recomputation with
  ZeRO-1, selective with ZeRO-2, full with ZeRO-2), every rung in full (a stronger lever can
  allow a shallower pipeline), its plans competing;
* ``pays`` (the default): as ``when-needed`` when nothing fits; when plans fit, the levers
  compete where they can pay, within about the plain search's time: ZeRO on the stages of the
  plain search's best plans (``strengthen``: ZeRO's optimizer step on 1/D of the parameters is
  the one thing a lever can make faster on a shape that fits), and a short search on two rungs
  (``PAYS_RUNGS``: selective recomputation with ZeRO-2, full with ZeRO-2; ``rung_request``:
  ``PAYS_BUDGET`` work, ``PAYS_PATIENCE``, no per-type sub-searches), seeded with those plans,
  for the shapes that only fit with a lever (a larger micro-batch, fewer stages, narrower TP)
  and whose bound beats them (not under a cap or a floor: ZeRO on the best plans only).  A
  shape the search without levers fitted with memory limiting neither its split (no pass of
  ``split.min_max_split`` with a time budget ended a stage for memory) nor its polish is not
  one: there recomputation only adds time to the split time alone gives, and what ZeRO gains
  is ``strengthen``'s.  That search notes such shapes (``Searcher.fit_freely``) and the rung
  searches skip them, each counted as the fruitless evaluation it would have been, with its
  simulated over bounded time (``loop.SearchLoop._fits_without_levers``): on the AE rows they
  were most of what the rungs evaluated (all 72 on geo rows 0 and 1), and the patience they
  spent there now reaches lever-only shapes (docs/benchmarks/planner.md, "lever-only shapes").
  A rung search is not run at all where it cannot pay (``cannot_pay``): where the search without
  levers proved its top N, every plan a rung search could offer is on a shape that search split
  and did not fit freely, and none of those, with its busiest stage the least that any split
  fitting in the rung's memory allows (each stage timed without levers), has a bound that beats
  the N-th plan or comes within ``simpler.SIMPLER_WITHIN`` of the best.  It holds on memory to
  spare (a small model's shapes all fit freely) and on geo AE row 2; on the other AE rows the
  bound of some shape that only a lever fits (or that memory limited) still beats the top N by
  16-38 % (docs/benchmarks/planner.md, "fifth pass"), so their rung searches run.  Where that
  argument holds and few shapes can pay (``DIRECT_MAX_SHAPES``), the rung's search is replaced by
  a walk over exactly those shapes (``search_rung_directly``): bounded on the rung's kinds, split
  and evaluated as the rung's search would, best bound first, until none left can beat the N-th
  plan; complete over the shapes the rung's search could use, where it stopped at its patience.
  The walk is tried first, ``cannot_pay`` where it does not apply; both also bound a shape by
  the sync its placed stages end on at the least (``lever_bounds.least_sync_s``), the walk a
  two-stage shape by its pipeline and sync at one boundary together (``lever_bounds.two_stage_s``);
* ``always``: every rung is searched in full and its plans compete with those without levers
  (search time grows 1.2-11x: docs/benchmarks/planner.md).

Each plan found on a rung is then relaxed stage by stage (``relax``): every stage takes the
setting, of those no stronger than its rung (no more recomputation, no higher ZeRO stage), that
scores best while the plan fits, the weakest of those within ``MIN_GAIN`` of it; ``strengthen``
adds ZeRO where it pays by more; neither tries the settings that provably cannot pay
(``lever_bounds.zero_cannot_pay``, ``stronger_cannot_pay``).  ``notes`` says, for the stages that keep a lever, what they
would need without it, or what it gains.
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from sailor_core.catalog.gpus import get_gpu
from sailor_core.plan.types import RECOMPUTE_FULL, RECOMPUTE_MODES, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, Plan
from sailor_core.planner.explain import relaxed
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.kinds import LEVER_LADDER, KindCache, shared_kind_cache
from sailor_core.planner.lever_bounds import (MIN_GAIN, least_sync_s, stage_levers, stronger_cannot_pay,
                                              synced_tight, two_stage_s, zero_cannot_pay)
from sailor_core.planner.ranking import FASTEST
from sailor_core.planner.search import Evaluated, Searcher, better
from sailor_core.planner.search.shape_bound import ShapeBounds
from sailor_core.planner.search.shapes import Segment, placed_key
from sailor_core.planner.simpler import SIMPLER_WITHIN
from sailor_core.planner.split import StageSlot, busiest_s, min_max_split
from sailor_core.simulator.levers import lever_label
from sailor_core.simulator.memory import inflight_microbatches
from sailor_core.simulator.simulate import simulate
from sailor_core.specs.plan import MEMORY_LEVER_MODES

LEVERS_OFF, LEVERS_WHEN_NEEDED, LEVERS_PAYS, LEVERS_ALWAYS = MEMORY_LEVER_MODES
_NO_LEVERS = (RECOMPUTE_NONE, 0)
# A ``pays`` rung's search where plans fit without levers: its work budget (evaluations; a split
# counts a quarter) and patience.  Seeded with the best plans, most of a rung's shapes are pruned
# by their bound; these cover the few lever-only shapes the estimate puts first
# (docs/benchmarks/planner.md: the gains of ``always`` they find, and the time they take).
PAYS_BUDGET, PAYS_PATIENCE = 60, 12
# The rungs ``pays`` searches where plans fit: ``relax`` weakens a rung's plan stage by stage, so a
# rung covers the settings below it, and selective recomputation costs little time, so its rung's
# bounds prune nearly as the plain ones do; full recomputation's rung, slower on paper, finds the
# shapes only it fits.  On the 22 requests of bench_memory_levers with a plan either way these two
# alone found plans as fast as the four (faster on 7, seeded with the earlier rungs' plans the
# later rungs' short searches stopped sooner), but one (opt-2.7b on V100-16 + A100-40: 5.733
# instead of 5.774 samples/s), in about half the time.
PAYS_RUNGS: tuple[tuple[str, int], ...] = ((RECOMPUTE_SELECTIVE, 2), (RECOMPUTE_FULL, 2))


def rungs_to_search(searcher: Searcher) -> tuple[tuple[tuple[str, int], ...], bool]:
    """The lever settings ``plan_job`` searches after the plain search, and whether in full
    (see the module doc)."""
    req = searcher.req
    if req.memory_levers == LEVERS_OFF:
        return (), True
    if req.memory_levers == LEVERS_ALWAYS:
        return LEVER_LADDER, True
    if _plain_plans_fit(searcher):
        # a plan fits (or a cap or a floor, not memory, rules plans out)
        if req.memory_levers != LEVERS_PAYS:
            return (), True
        # Under a cap or a floor the rungs' short searches took the AE rows past 1 s (0.9 -> 1.5 s
        # CPU on gpt-neo-2.7b's cost cap) for no better plan: ZeRO on the best plans only.
        return (() if _limited(req) else PAYS_RUNGS), False
    return LEVER_LADDER, True


def cannot_pay(searcher: Searcher, rung: tuple[str, int]) -> bool:
    """Whether a ``pays`` rung search (``rung``, where plans fit) can offer no plan that changes the
    answer, proven from what the search without levers did, so that it need not run.

    Every plan the rung search offers is on a shape of the search's own space (the same
    segments, on the rung's kinds), split so that it fits under the rung (``relax`` and
    ``strengthen`` only weaken recomputation or move ZeRO within it, and a stage that fits under
    weaker levers fits under stronger ones); polishing moves its split.  Levers only add time to
    what the bound reads (the module doc), so no such plan beats the shape's bound with, as its
    busiest stage, the least busiest of any split that fits in the rung's memory, each stage
    timed without levers (``_least_busiest``).  A plan matters when it beats the N-th best found
    or comes within ``SIMPLER_WITHIN`` of the best (``prefer_simpler``).  When the search without
    levers proved its top N (``exhausted``, by its own pass or the widening pass over every
    efficient degree), every shape whose bound beats that was split there (``Searcher.split_orders``,
    both passes'); those it fitted freely the rung search skips (module doc).  If
    none of the rest, on the rung's memory, beats it, the rung search cannot pay.  One GPU type
    only (with more, types settled by their own searches are not split in the search's loop).
    A shape's bound here and in ``search_rung_directly`` also counts the sync its placed stages
    cannot avoid after the pipeline (``least_sync_s``)."""
    if not _proof_applies(searcher):
        return False
    limit = _limit(searcher)
    if limit == math.inf:
        return False
    orders = searcher.split_orders
    kinds, bounds, freely = lever_kinds(searcher, rung), ShapeBounds(searcher), searcher.fit_freely or {}
    for score, t_lb, space, shape, order in sorted(orders, key=lambda o: o[0]):
        if score >= limit:
            return True
        placed = searcher.build_stages(order)
        if placed is None or placed_key(space.mbs, placed) in freely:
            continue
        sync_s = least_sync_s(searcher, placed, rung[1])
        t = synced_tight(bounds, space, shape, 0.0, t_lb, sync_s)
        if t is None or t[0] >= limit:
            continue  # (before the split below, which costs more)
        busiest = _least_busiest(searcher, kinds, space.mbs, placed)
        if busiest is None:
            continue  # nothing fits even under the rung
        t = synced_tight(bounds, space, shape, busiest, t_lb, sync_s)
        if t is not None and t[0] < limit:
            return False
    return True


def _proof_applies(searcher: Searcher) -> bool:
    """``cannot_pay``'s argument holds: the search without levers proved its top N over the shapes
    it split, on one GPU type."""
    return (searcher.split_orders is not None and searcher.stats.exhausted and len(searcher.gpu_types) == 1
            and bool(searcher.top))


def _limit(searcher: Searcher) -> float:
    """The score a plan must beat to matter: the N-th plan's, or within ``SIMPLER_WITHIN`` of the best."""
    best = searcher.top[0].score
    return max(searcher.threshold(), best + SIMPLER_WITHIN * abs(best))


# A ``pays`` rung whose shapes that can pay (``search_rung_directly``) are at most this many is
# walked over those alone, else searched by its short search.  A shape walked costs a split and
# an evaluation with its polish (1.5-2.5 evaluations a shape on the AE rows), so the walk does
# about the work of the rung search's budget at most, without its set-up (the rung's spaces and
# scoring: 6-7 ms of CPU where it evaluates nothing, 0.3-0.7 ms a shape walked); geo AE row 0's
# selective rung, with 85, costs more to walk (49 ms) than the short search that stops at its
# patience (15 ms).
DIRECT_MAX_SHAPES = PAYS_BUDGET // 2


def search_rung_directly(searcher: Searcher, rung: tuple[str, int], req) -> Searcher | None:
    """A ``pays`` rung's search (``req``: ``rung_request``'s) over the only shapes where it can find
    a plan (``cannot_pay``'s argument), or None where that argument does not apply or they are many.

    The rung's search looks for plans on its kinds that beat the N-th plan found (its threshold);
    every such plan is on a shape the search without levers split and did not fit freely whose
    bound on the rung's kinds (``_on_rung``) beats the threshold (``_rung_candidates``).  Those are
    taken by that bound, best first: each is split on the rung's kinds (the min-max split, as the
    rung's search splits it; its bisection's last failing budget bounds the busiest stage of every
    split that fits), queued again on the bound with that busiest stage, and evaluated (and
    polished) as the rung's search would when it comes first again, until the next bound cannot
    beat the threshold (which falls as plans are found).  Complete over the rung's plans that can
    enter the top N, where the rung's search was a heuristic with a budget and patience; its plans
    are in the returned search's top."""
    if not _proof_applies(searcher) or searcher.threshold() == math.inf:
        return None
    kinds, bounds = lever_kinds(searcher, rung), ShapeBounds(searcher)
    queue = _rung_candidates(searcher, kinds, bounds, rung)
    if queue is None:
        return None
    sub = Searcher(req, profiles=searcher.profiles, network=searcher.network, kinds=kinds)
    sub.seed_from(searcher)
    count = len(queue)
    while queue and queue[0][0] < sub.threshold():
        _, _, g, prep, (t_lb, space, shape, placed, sync_s) = heapq.heappop(queue)
        if prep is not None:
            sub.evaluate_shape(space.mbs, shape, g, prep)
            continue
        stages = [(kinds.get(k.gpu, k.tp_degree, k.micro_batch_size, req.regime), p) for k, p in placed]
        sub.stats.num_splits += 1
        prep = sub.split_placed(space.mbs, stages, g)
        t = None if prep is None else synced_tight(bounds, space, shape, prep[2] * (1 - _RUNG_SPLIT_TOL), t_lb, sync_s)
        if t is not None:
            count += 1
            heapq.heappush(queue, (t[0], count, g, prep, (t_lb, space, shape, placed, sync_s)))
    sub.done_searching()
    return sub


def _rung_candidates(searcher: Searcher, kinds: KindCache, bounds: ShapeBounds, rung: tuple[str, int]) -> list | None:
    """The shapes where the rung's search can find a plan (``search_rung_directly``), as a heap of
    (score bound on the rung's kinds with their granular bound on the busiest stage, tie, that
    granular bound, None, (iteration time bound without levers, space, the shape on the rung's
    figures, placed stages, their least sync: ``least_sync_s``)); None when more than
    ``DIRECT_MAX_SHAPES``.  Shapes a faster rung's scan ruled out are not bounded again
    (``_ruled_out_by_faster``); those this one rules out are noted for slower rungs."""
    limit, freely, seen, ratios = searcher.threshold(), searcher.fit_freely or {}, set(), {}
    loose = limit + _COVER_MARGIN * abs(limit)
    faster = _ruled_out_by_faster(searcher, rung)
    ruled_out = searcher.memos.model.rung_scans[rung] = set()
    out: list = []
    for i, (score, t_lb, space, shape, order) in enumerate(searcher.split_orders):
        placed = searcher.build_stages(order) if score < limit else None
        if placed is None or (key := placed_key(space.mbs, placed)) in freely or key in seen:
            continue
        seen.add(key)
        if i in faster:
            ruled_out.add(i)
            continue
        rung_shape = _on_rung(searcher, kinds, shape, ratios)
        g = searcher.parts.granular_busiest_s(rung_shape)
        t = bounds.tight(space, rung_shape, g, known=(t_lb, 0.0))
        if t is None or t[0] >= limit:
            if t is not None and t[0] >= loose:
                ruled_out.add(i)
            continue
        sync_s = least_sync_s(searcher, placed, rung[1])
        stages = _rung_stages(searcher, kinds, placed)
        if stages is not None:
            t_lb = max(t_lb, two_stage_s(searcher, space.mbs, stages, rung[1]) * (1 - _ROUNDING))
        t = synced_tight(bounds, space, rung_shape, g, t_lb, sync_s)
        if t is not None and t[0] < limit:
            if len(out) == DIRECT_MAX_SHAPES:
                return None
            out.append((t[0], len(out), g, None, (t_lb, space, rung_shape, placed, sync_s)))
        elif t is not None and t[0] >= loose:
            ruled_out.add(i)
    heapq.heapify(out)
    return out


# How far past its limit a rung's bound of a shape must be for the shape to be ruled out on every
# slower rung (``_ruled_out_by_faster``): room for the rounding of sums taken over other layer
# times and the granular bound's 1e-9 (``bounds.granular_busiest_s``), many orders below it.
_COVER_MARGIN = 1e-6


def _ruled_out_by_faster(searcher: Searcher, rung: tuple[str, int]) -> set:
    """The entries of ``Searcher.split_orders`` a scan of a faster rung (``_rung_candidates``: less
    recomputation, the same ZeRO stage; the ``pays`` rungs selective, then full) bounded past its
    limit by ``_COVER_MARGIN``: on this rung they cannot beat the limit, which has not risen since.

    Recomputation only adds backward time, and full recomputation adds each block's whole forward
    where selective adds a share of it (``simulator.levers``); the embedding and the LM head are
    the same under both.  So every block is at least as slow on the slower rung and nothing else
    the scan reads changes: ``_on_rung``'s block ratio is at least as large (its head ratio equal
    but for rounding), and with it the slowness, capacity and busy times of the rung's shape;
    ``two_stage_s``' stage steps (its forwards equal); the sync (``least_sync_s``, ``two_stage_s``'
    rings) at the same ZeRO stage is the same.  Each bound of the scan is a sum, product, quotient,
    maximum or minimum of those, none falling as a step grows, so the slower rung's bound of a
    shape is at least the faster one's less rounding; and the threshold only falls."""
    order = RECOMPUTE_MODES.index(rung[0])
    out: set = set()
    for (mode, zero_stage), ruled_out in searcher.memos.model.rung_scans.items():
        if zero_stage == rung[1] and RECOMPUTE_MODES.index(mode) < order:
            out |= ruled_out
    return out


def _rung_stages(searcher: Searcher, kinds: KindCache, placed) -> list | None:
    """``placed`` (stages of plain kinds) on the rung's kinds; None where one has no profile."""
    out = [(kinds.get(k.gpu, k.tp_degree, k.micro_batch_size, searcher.req.regime), p) for k, p in placed]
    return None if any(kind is None for kind, _ in out) else out


def _on_rung(searcher: Searcher, kinds: KindCache, shape, ratios: dict) -> tuple:
    """``shape``'s segments with the compute figures the bound reads (``ShapeBounds.tight``:
    slowness and capacity, the granular bound's fastest block and last layer) scaled to the rung's
    kinds by the least ratio of the rung's to the plain kind's times over the blocks, and the last
    layer's (1 where the plain figures take the fastest of several regimes:
    ``KindFigures.variants``); its bounds bound every plan of the rung on the shape."""
    out = []
    for seg in shape:
        key = (seg.gpu, seg.tp_degree, seg.kind.micro_batch_size)
        r = ratios.get(key)
        if r is None:
            r = ratios[key] = _time_ratios(searcher, kinds, seg.kind)
        # (the constructor, not dataclasses.replace, which inspects the fields on every call)
        out.append(Segment(seg.gpu, seg.kind, seg.tp_degree, seg.dp_degree, seg.num_stages, seg.rule,
                           seg.capacity / r[0], seg.slowness * r[0], seg.num_microbatches, seg.min_usd_per_hr,
                           seg.block_busy_s * r[0], seg.head_busy_s * r[1], seg.egress_usd))
    return tuple(out)


def _time_ratios(searcher: Searcher, kinds: KindCache, kind) -> tuple[float, float]:
    """(least block ratio, last layer's ratio) of the rung's times to ``kind``'s, each at least 1."""
    L = searcher.num_layers
    rung = kinds.get(kind.gpu, kind.tp_degree, kind.micro_batch_size, searcher.req.regime)
    if L < 3 or rung is None or searcher.figures.variants(kind) != [kind]:
        return 1.0, 1.0
    rc, kc = rung.comp_cum, kind.comp_cum  # (``Kind.time_s``'s differences, read directly)
    block = min([(rc[i + 1] - rc[i]) / (kc[i + 1] - kc[i]) for i in range(1, L - 1)])
    return max(1.0, block), max(1.0, (rc[L] - rc[L - 1]) / (kc[L] - kc[L - 1]))


# A margin on ``lever_bounds.two_stage_s`` against the rounding of sums taken in other orders.
_ROUNDING = 1e-9


# ``split.min_max_split``'s default tolerance (the rung's splits'): its busiest stage, less this
# share, bounds every split that fits (the bisection's last failing budget is above it).
_RUNG_SPLIT_TOL = 5e-3


# The min-max split's tolerance where ``cannot_pay`` reads it as a bound (``split.min_max_split``):
# its bound is the split's busiest less this share, and the search's 5e-3 left geo AE row 2's last
# shape 0.1 % over the N-th plan, where a few more bisection steps prove it cannot pay.
_SPLIT_TOL = 1e-4


@dataclasses.dataclass(frozen=True, slots=True)
class _PlainTimes:
    """A kind as ``split`` reads it: the times of one kind (without levers) and the memory of
    another (under a rung)."""

    comp_cum: list[float]
    zero_stage: int
    max_end_memo: dict
    max_end: object


def _least_busiest(searcher: Searcher, kinds: KindCache, mbs: int, placed) -> float | None:
    """A lower bound on the busiest stage (micro-batches x forward and backward without levers) of
    every split of ``placed`` (kinds without levers) that fits in the memory of ``kinds``; None
    when none fits.  Greedy splitting decides feasibility exactly (``split``), so the min-max
    split's bisection ends above a budget no split meets and within its tolerance of it."""
    num_mb = searcher.req.global_batch_size // mbs
    slots = []
    for i, (kind, replicas) in enumerate(placed):
        rung = kinds.get(kind.gpu, kind.tp_degree, kind.micro_batch_size, searcher.req.regime)
        if rung is None:
            return None
        d = sum(n for _, n in replicas)
        n = -(-num_mb // d)
        hybrid = _PlainTimes(comp_cum=kind.comp_cum, zero_stage=rung.zero_stage, max_end_memo=rung.max_end_memo,
                             max_end=rung.max_end)
        slots.append(StageSlot(kind=hybrid, num_microbatches=n, num_inflight=inflight_microbatches(i, len(placed), n),
                               dp_degree=d))
    ends = min_max_split(slots, searcher.num_layers, rel_tol=_SPLIT_TOL)
    return None if ends is None else busiest_s(slots, ends) * (1 - _SPLIT_TOL)


def may_search_pays_rungs(req) -> bool:
    """Whether ``pays``' short rung searches can follow the search without levers (where plans
    fit): then that search notes the shapes it fitted freely, which they skip (module doc)."""
    return req.memory_levers == LEVERS_PAYS and not _limited(req)


def _plain_plans_fit(searcher: Searcher) -> bool:
    if searcher.stats.any_fits:
        return True
    # the limits may have pruned every shape before one was simulated: the search without
    # them says whether anything fits (memoised: why_infeasible asks it too)
    return _limited(searcher.req) and relaxed(searcher, FASTEST, keep_caps=False, keep_floor=False) is not None


def rung_request(searcher: Searcher, thorough: bool):
    """The request a rung's search runs: the searcher's, without mixing or a front, and, where
    plans fit without levers under ``pays``, with the short budget of the module doc."""
    changes = {} if thorough else {"max_evaluations": PAYS_BUDGET, "patience": PAYS_PATIENCE}
    return dataclasses.replace(searcher.req, mixed_stages=False, collect_pareto=False, **changes)


def num_to_strengthen(req) -> int:
    """How many of the best plans ``strengthen`` tries: the top N and 5 more, or under a cap or a
    floor the top N alone (the AE cost-cap row's 1 s: 0.92 s CPU before, 1.03 with 5 more)."""
    return req.top_n + (0 if _limited(req) else 5)


def _limited(req) -> bool:
    """A cap or a floor on the request."""
    return req.has_cost_caps or req.min_throughput_samples_per_s is not None


def strengthen(searcher: Searcher, ev: Evaluated) -> Evaluated:
    """``ev`` with ZeRO-1 or ZeRO-2 added to each stage of replicas without ZeRO where the plan
    then scores better (stage by stage; the weaker of equals): a sharded optimizer step can make
    a plan that fits faster or cheaper, whereas recomputation only adds time to a stage that fits.
    Not tried where it provably cannot pay (``lever_bounds.zero_cannot_pay``)."""
    best = ev
    if zero_cannot_pay(searcher, ev):
        return ev
    for i, stage in enumerate(ev.stages):
        recompute, zero = stage_levers(stage)
        if stage.dp_degree < 2 or zero:
            continue
        for levers in ((recompute, 1), (recompute, 2)):
            trial = _with_stage_levers(searcher, best, i, levers)
            if trial is not None and _pays(trial, best):
                best = trial
    return best


def _with_stage_levers(searcher: Searcher, ev: Evaluated, i: int, levers: tuple[str, int]) -> Evaluated | None:
    """``ev`` evaluated with stage ``i`` under ``levers``; None when a kind has no profile or it
    does not fit."""
    moved = _with_levers(searcher, ev.stages[i], levers)
    if moved is None:
        return None
    stages = list(ev.stages)
    stages[i] = moved
    trial = searcher.evaluate(ev.mbs, tuple(stages))
    return trial if trial.feasible else None


def _pays(trial: Evaluated, than: Evaluated) -> bool:
    """``trial`` (stronger levers) beats ``than``: it fits where ``than`` does not, or scores
    better by more than ``MIN_GAIN``."""
    if not (than.feasible and than.res.fits):
        return better(trial, than)
    return trial.score < than.score - MIN_GAIN * abs(than.score)


def lever_kinds(searcher: Searcher, levers: tuple[str, int]) -> KindCache:
    """The kinds of ``levers`` for this search and its sub-searches: fetched from the process once,
    then held.  Kinds compare by identity (the evaluations' memo, the splits' keys), so a second
    fetch after the process's shared dict was emptied (``kinds.shared_kind_cache``: by whatever
    earlier requests left in it) would count plans already evaluated again."""
    held = searcher.memos.model.lever_kinds
    hit = held.get(levers)
    if hit is None:
        req = searcher.req
        hit = held[levers] = shared_kind_cache(req.model, req.seq_len, req.regime, searcher.profiles, levers)
    return hit


def relax(searcher: Searcher, ev: Evaluated) -> Evaluated:
    """``ev`` with each stage on the weakest lever setting that keeps the plan fitting, unless a
    stronger one up to its own scores better (see the module doc; the stronger ones are not tried
    where they provably cannot: ``lever_bounds.stronger_cannot_pay``)."""
    settings = [stage_levers(s) for s in ev.stages]
    if all(lv == _NO_LEVERS for lv in settings):
        return ev
    best = ev
    for i, stage in enumerate(ev.stages):
        top = settings[i]
        options = _weaker_or_equal(top) if top != _NO_LEVERS else []
        chosen = None
        for levers in options:
            trial = _with_stage_levers(searcher, best, i, levers)
            if trial is not None and (chosen is None or _pays(trial, chosen)):
                chosen = trial
                if stronger_cannot_pay(searcher, chosen, i, top):
                    break
        if chosen is not None:
            best = chosen
    return best


def _weaker_or_equal(levers: tuple[str, int]) -> list[tuple[str, int]]:
    """Every setting with no more recomputation and no higher ZeRO stage than ``levers``,
    weakest first."""
    recompute, zero = levers
    modes = RECOMPUTE_MODES[: RECOMPUTE_MODES.index(recompute) + 1]
    return [(mode, z) for mode in modes for z in range(zero + 1)]


def _with_levers(searcher: Searcher, stage: FastStage, levers: tuple[str, int]) -> FastStage | None:
    """``stage`` with its kinds under ``levers`` (None when a kind has no profile)."""
    kinds = searcher.kinds if levers == _NO_LEVERS else lever_kinds(searcher, levers)
    groups = []
    for kind, zone, n in stage.groups:
        other = kinds.get(kind.gpu, kind.tp_degree, kind.micro_batch_size, searcher.req.regime)
        if other is None:
            return None
        groups.append((other, zone, n))
    return FastStage(stage.layer_start, stage.layer_end, tuple(groups))


def notes(plan: Plan, *, profiles, network, spot: bool, sim=None) -> tuple[str, ...]:
    """One line per lever a stage keeps: what the stage would need without it (memory), or, where
    it fits without it, what the lever gains (``sim``: the plan's own figures, else simulated)."""
    if sim is None:
        sim = simulate(plan, profiles=profiles, network=network, spot=spot, validate=False)
    out = []
    for i, stage in enumerate(plan.stages):
        dropped = []
        if stage.recompute != RECOMPUTE_NONE:
            what = "recomputes attention" if stage.recompute == RECOMPUTE_SELECTIVE else "recomputes every block"
            dropped.append((what, _replace_stage(plan, i, recompute=RECOMPUTE_NONE)))
        if stage.zero_stage:
            what = (f"shards its optimizer states over {stage.dp_degree} replicas (ZeRO-1)" if stage.zero_stage == 1
                    else f"shards its optimizer states and gradients over {stage.dp_degree} replicas (ZeRO-2)")
            dropped.append((what, _replace_stage(plan, i, zero_stage=0)))
        for what, without in dropped:
            out.append(f"stage {i} {what}: without it, {_need(without, i, sim, profiles, network, spot)}")
    return tuple(out)


def _replace_stage(plan: Plan, index: int, **changes) -> Plan:
    stages = list(plan.stages)
    stages[index] = dataclasses.replace(stages[index], **changes)
    return dataclasses.replace(plan, stages=tuple(stages))


def _need(plan: Plan, index: int, chosen, profiles, network, spot: bool) -> str:
    """What stage ``index`` of ``plan`` needs on its fullest GPU, against that GPU's memory; where
    it fits, what the plan without the lever loses against ``chosen`` (the plan with it)."""
    sim = simulate(plan, profiles=profiles, network=network, spot=spot, validate=False)
    stage = sim.stages[index]
    worst = max(stage.replicas, key=lambda r: r.memory.peak_bytes - r.memory.capacity_bytes)
    mem = worst.memory
    if not mem.fits:
        return f"{mem.peak_bytes / 1e9:.1f} GB > {mem.capacity_bytes / 1e9:.1f} GB on {worst.gpu}"
    speed = chosen.throughput_samples_per_s / sim.throughput_samples_per_s - 1
    saving = 1 - chosen.usd_per_iteration / sim.usd_per_iteration
    return (f"it fits ({mem.peak_bytes / 1e9:.1f} GB of {get_gpu(worst.gpu).memory_bytes / 1e9:.1f} GB on "
            f"{worst.gpu}), but the plan runs {sim.throughput_samples_per_s:.4g} samples/s at "
            f"{sim.usd_per_iteration:.4g} USD/iteration: with it {speed:+.2%} faster, {saving:+.2%} cheaper")


__all__ = ["LEVERS_ALWAYS", "LEVERS_OFF", "LEVERS_PAYS", "LEVERS_WHEN_NEEDED", "MEMORY_LEVER_MODES",
           "DIRECT_MAX_SHAPES", "PAYS_BUDGET", "PAYS_PATIENCE", "PAYS_RUNGS", "lever_kinds", "lever_label",
           "may_search_pays_rungs", "notes", "num_to_strengthen", "relax", "rung_request", "rungs_to_search",
           "search_rung_directly", "strengthen"]
