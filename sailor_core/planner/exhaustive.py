"""Exhaustive enumeration of the planner's search space, for tests and the optimality benchmark.

Same space as ``search``: the same per-type segment lists (or, with ``every_degree``,
every data-parallel degree the pools allow instead of the search's ``dp_space``), the same
segment orders and placements, but *every* contiguous layer split instead of the min-max
split plus polish, and no pruning.  Scored with the same evaluator.  Only for small
cases: the count grows like the product of the segment lists times C(L-1, P-1).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.request import PlanRequest
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
