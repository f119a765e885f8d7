"""Exhaustive enumeration of the planner's search space, for tests and the optimality benchmark.

Same space as ``search``: the same per-type segment lists (or, with ``every_degree``,
every data-parallel degree the pools allow instead of the search's ``dp_space``), the same
segment orders and placements, but *every* contiguous layer split instead of the min-max
split plus polish, and no pruning.  Scored with the same evaluator.  Only for small
cases: the count grows like the product of the segment lists times C(L-1, P-1).

``enumerate_mixed_best`` goes beyond the search's space: stages whose replicas are of several
GPU types (and TP degrees), their groups in every order, which the search reaches only through
its leftover step (``planner/mixing.py``) and, on small pools, its bounded walk of the same
space (``planner/mixed_space.py``); tiny cases only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.request import PlanRequest
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.mixed_space import in_plan_regime, stage_groups, stage_options
from sailor_core.planner.search import Evaluated, Searcher, orders


@dataclass(frozen=True, slots=True)
class ExhaustiveResult:
    best: Evaluated | None
    num_plans: int  # plans evaluated


def enumerate_best(request: PlanRequest, *, profiles, network, every_degree: bool = False) -> ExhaustiveResult:
    s = Searcher(request, profiles=profiles, network=network)
    best: Evaluated | None = None
    count = 0
    L = s.num_layers
    for mbs in s.micro_batch_sizes():
        num_mb = request.global_batch_size // mbs
        kinds = [k for g in s.gpu_types for tp in valid_tp_degrees(request.model, g, request.max_tp_degree)
                 if (k := s.kinds.get(g, tp, mbs)) is not None]
        if not kinds:
            continue
        ref = [min(k.time_s(i, i + 1) for k in kinds) for i in range(L)]
        lists = [[None, *s.segments_for(g, mbs, num_mb, ref, every_degree=every_degree)] for g in s.gpu_types]
        for combo in itertools.product(*lists):
            shape = tuple(x for x in combo if x is not None)
            if not shape:
                continue
            num_stages = sum(x.num_stages for x in shape)
            if num_stages > s.max_stages or num_stages > L:
                continue
            for order in orders(shape):
                stages = s.build_stages(order)
                if stages is None:
                    continue
                for cuts in itertools.combinations(range(1, L), num_stages - 1):
                    ends = [*cuts, L]
                    ev = s.evaluate(mbs, s.fast_stages(stages, ends))
                    count += 1
                    if ev.feasible and (best is None or ev.score < best.score):
                        best = ev
    return ExhaustiveResult(best=best, num_plans=count)


def enumerate_mixed_best(request: PlanRequest, *, profiles, network) -> ExhaustiveResult:
    """The best of every plan of up to ``request.max_stages`` stages, each stage any ordered
    groups of (GPU type, TP degree, zone) replicas the pools hold, no more than the micro-batches
    (micro-batch m goes to replica m mod D, so the order decides which group gets the most),
    every contiguous split."""
    s = Searcher(request, profiles=profiles, network=network)
    best: Evaluated | None = None
    count = 0
    L = s.num_layers
    for mbs in s.micro_batch_sizes():
        options = stage_options(s, mbs)
        num_mb = request.global_batch_size // mbs
        for num_stages in range(1, min(s.max_stages, L) + 1):
            for cuts in itertools.combinations(range(1, L), num_stages - 1):
                bounds = list(zip((0, *cuts), (*cuts, L)))
                for groups in stage_groups(options, dict(request.availability), num_stages, num_mb):
                    stages = tuple(FastStage(a, b, g) for (a, b), g in zip(bounds, in_plan_regime(s, groups)))
                    ev = s.evaluate(mbs, stages)
                    count += 1
                    if ev.feasible and (best is None or ev.score < best.score):
                        best = ev
    return ExhaustiveResult(best=best, num_plans=count)
