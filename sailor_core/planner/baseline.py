"""A Sailor-rule baseline: what the published planner's rules allow, scored by the same evaluator.

Rules: layers split equally over stages (the remainder to the first stages); TP fixed
per GPU type as the smallest degree at which an equal stage fits in memory; one
data-parallel degree for every stage; each GPU type holds a run of consecutive stages.
The best such plan over micro-batch sizes, stage counts, DP degrees and per-type stage
counts is returned.  Used by ``benchmarks/bench_planner.py`` for the throughput ratio.
"""

from __future__ import annotations

import itertools

from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.placement import place_stages
from sailor_core.planner.request import PlanRequest
from sailor_core.planner.search import Evaluated, Searcher
from sailor_core.simulator.memory import inflight_microbatches


def equal_split(num_layers: int, num_stages: int) -> list[int]:
    base, extra = divmod(num_layers, num_stages)
    ends, end = [], 0
    for i in range(num_stages):
        end += base + (1 if i < extra else 0)
        ends.append(end)
    return ends


def sailor_rule_best(request: PlanRequest, *, profiles, network) -> Evaluated | None:
    s = Searcher(request, profiles=profiles, network=network)
    L = s.num_layers
    best: Evaluated | None = None
    types = s.gpu_types
    for mbs in s.micro_batch_sizes():
        num_mb = request.global_batch_size // mbs
        for num_stages in range(1, s.max_stages + 1):
            ends = equal_split(L, num_stages)
            starts = [0, *ends[:-1]]
            # Per-type stage counts summing to num_stages (types keep their catalog order).
            for counts in itertools.product(range(num_stages + 1), repeat=len(types)):
                if sum(counts) != num_stages:
                    continue
                tp_of: dict[str, int] = {}
                ok = True
                idx = 0
                for gpu, c in zip(types, counts):
                    if not c:
                        continue
                    for tp in valid_tp_degrees(request.model, gpu, request.max_tp_degree):
                        kind = s.kinds.get(gpu, tp, mbs)
                        if kind is None:
                            continue
                        fits = all(
                            kind.fits(starts[i], ends[i], inflight_microbatches(i, num_stages, 1))
                            for i in range(idx, idx + c)
                        )
                        if fits:
                            tp_of[gpu] = tp
                            break
                    else:
                        ok = False
                    idx += c
                if not ok:
                    continue
                d_max = min(
                    sum(n // tp_of[g] for n in s.zone_gpus[g].values()) // c
                    for g, c in zip(types, counts) if c
                )
                d_top = min(d_max, num_mb)
                # Sailor's rule takes the largest DP degree; the largest dividing the micro-batch
                # count avoids an idle round, so both are tried.
                divisor = next(d for d in range(d_top, 0, -1) if num_mb % d == 0) if d_top else 0
                for dp in sorted({d_top, divisor} - {0}):
                    stages = []
                    for gpu, c in zip(types, counts):
                        if not c:
                            continue
                        placed = place_stages({z: n for z, n in s.zone_gpus[gpu].items() if n},
                                              tp_of[gpu], dp, c)
                        if placed is None:
                            break
                        kind = s.kinds.get(gpu, tp_of[gpu], mbs)
                        stages += [(kind, p) for p in placed]
                    else:
                        ev = s.evaluate(mbs, s.fast_stages(stages, ends))
                        if ev.feasible and (best is None or ev.score < best.score):
                            best = ev
    return best
