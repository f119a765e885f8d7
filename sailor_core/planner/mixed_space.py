"""Stages of several GPU types searched with a bound, where the pools are small enough for a proof.

The best-first search (``planner/search``) proves its top N over stages of one GPU type; the
leftover step (``planner/mixing.py``) then mixes types greedily.  Here every plan of the whole
mixed space (``exhaustive.enumerate_mixed_best``'s: up to ``max_stages`` stages, each any ordered
groups of (GPU type, TP degree, zone) replicas the pools hold, every contiguous split, every
micro-batch size) whose bound could still enter the top N is evaluated and offered, so that the
top N is proven over that space, one-type stages and every DP degree included.

The bound: a replica runs its micro-batches one after another, so an iteration takes at least
the busiest replica's micro-batches (micro-batch m goes to replica m mod D: the first
``num_mb mod D`` replicas of a stage get one more) times its forward and backward time on its
stage's layers (``Kind.time_s``), whatever the links, bubbles and rings add; the rent of the
stages' GPUs over that time bounds the cost.  Splits are walked stage by stage: a stage's end
stops growing once its bound passes the limit (its time only grows with its layers), and an end
that leaves the later stages more than the limit on average (``_rest_bounds``) is skipped.

The space grows like the ordered groupings of the pools times the splits, so it is searched only
where the pools hold at most ``MAX_MIXED_GPUS`` GPUs, and the proof is given up (the leftover
step's plans stand, unproven) after ``MAX_MIXED_CHECKS`` partial splits bounded or
``MAX_MIXED_EVALUATIONS`` plans evaluated (or the request's ``max_evaluations``, if smaller):
the bound leaves out links, bubbles and rings, so where they are a tenth of the iteration every
near-equal grouping and split must be evaluated.  Plans with
memory levers (``planner/levers.py``) are outside it, so a search that needed them is not
extended.
"""

from __future__ import annotations

from sailor_core.plan.routing import microbatches_per_replica
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.search import Searcher
from sailor_core.simulator.compose import SECONDS_PER_HOUR

MAX_MIXED_GPUS = 8  # pools of more GPUs: the leftover step only (its orderings outgrow any budget)
MAX_MIXED_CHECKS = 20_000  # partial splits bounded before the proof is given up (about 0.1 s)
MAX_MIXED_EVALUATIONS = 2_500  # plans evaluated before it is given up (where the bound is weak)
_SLACK = 1 + 1e-9  # the bound is a sum of the same per-layer times the simulator adds: rounding

# What a stage may hold in the space ``exhausted`` speaks for, by what ``plan_job`` searched: the
# search's segments put one GPU type in a stage; the leftover step after it (``planner/mixing.py``)
# mixes types greedily, unproven; on small pools this module walks the whole mixed
# space (``planner/exhaustive.enumerate_mixed_best``'s) with a bound and proves the top N over it.
STAGE_SPACES = {
    # ``PlanRequest.mixed_stages`` off
    "one-type": "stages of one GPU type each; no stage mixes GPU types",
    # mixed stages asked for, pools beyond the bounded walk's reach (``MAX_MIXED_GPUS``) or its
    # budget (the words the planner goldens hold since before the walk)
    "leftover": "stages of one GPU type each; a stage mixes GPU types only where leftover GPUs joined the "
                "busiest stages after the search, one at a time while the plan improved, which `exhausted` "
                "does not cover",
    # the bounded walk covered the mixed space
    "mixed": "stages of any GPU types, TP degrees and zones, their replica groups in any order, every DP "
             "degree and layer split (without memory levers): proven by a bound over the whole mixed space, "
             f"the pools holding at most {MAX_MIXED_GPUS} GPUs",
}


class _OutOfChecks(Exception):
    pass


def stage_options(searcher: Searcher, mbs: int) -> list:
    """The (kind, zone) a replica of the mixed space may be at micro-batch size ``mbs``."""
    req = searcher.req
    return [(k, zone) for (gpu, zone) in sorted(req.availability)
            for tp in valid_tp_degrees(req.model, gpu, req.max_tp_degree)
            if (k := searcher.kinds.get(gpu, tp, mbs)) is not None]


def stage_groups(options: list, left: dict, num_stages: int, max_replicas: int):
    """Every list of ``num_stages`` stages' groups ((kind, zone, replicas), distinct (kind, zone)
    per stage, in every order, at most ``max_replicas`` replicas a stage: a plan keeps every
    replica busy, ``plan.types.validate_plan``) whose GPUs the pools ``left`` hold."""
    if num_stages == 0:
        yield []
        return
    for groups in _one_stage(options, left, max_replicas):
        rest = dict(left)
        for k, z, n in groups:
            rest[(k.gpu, z)] -= n * k.tp_degree
        for later in stage_groups(options, rest, num_stages - 1, max_replicas):
            yield [groups, *later]


def _one_stage(options: list, left: dict, max_replicas: int, used: tuple = ()):
    """Every non-empty ordered tuple of groups one stage can take from ``left``."""
    for k, z in options:
        if any(k is uk and z == uz for uk, uz, _ in used):
            continue
        for n in range(1, min(left[(k.gpu, z)] // k.tp_degree, max_replicas) + 1):
            groups = (*used, (k, z, n))
            yield groups
            yield from _one_stage(options, {**left, (k.gpu, z): left[(k.gpu, z)] - n * k.tp_degree},
                                  max_replicas - n, groups)


def in_plan_regime(searcher: Searcher, groups: list) -> tuple:
    """Each stage's groups with its kinds as ``simulate`` takes them under the plan's first replica."""
    first = groups[0][0][0]
    return tuple(tuple((searcher.kinds.in_regime_of(k, first), z, n) for k, z, n in g) for g in groups)


def busiest_counts(groups: tuple, num_mb: int) -> tuple:
    """(kind, the most micro-batches one of its replicas runs) per group of one stage."""
    counts = microbatches_per_replica(num_mb, sum(n for _, _, n in groups))
    out, pos = [], 0
    for k, _, n in groups:
        out.append((k, max(counts[pos:pos + n])))
        pos += n
    return tuple(out)


def search_mixed(searcher: Searcher, *, max_checks: int = MAX_MIXED_CHECKS,
                 max_evaluations: int | None = None) -> bool:
    """Offer every plan of the mixed space whose bound may enter the top N; True when the whole
    space was covered (the top N is then proven over it), False when not tried or given up.
    ``max_evaluations``: default the smaller of ``MAX_MIXED_EVALUATIONS`` and the request's own
    budget (the replay's searches are short)."""
    req = searcher.req
    if sum(req.availability.values()) > MAX_MIXED_GPUS:
        return False
    if max_evaluations is None:
        max_evaluations = min(MAX_MIXED_EVALUATIONS, req.max_evaluations)
    checks = [max_checks, max_evaluations]  # what is left of each budget
    try:
        for mbs in searcher.micro_batch_sizes():
            options = stage_options(searcher, mbs)
            num_mb = req.global_batch_size // mbs
            for num_stages in range(1, searcher.max_stages + 1):
                for groups in stage_groups(options, dict(req.availability), num_stages, num_mb):
                    _search_splits(searcher, mbs, in_plan_regime(searcher, groups), num_mb, checks)
    except _OutOfChecks:
        return False
    return True


def _time_limit_s(searcher: Searcher, rent_usd_per_s: float) -> float:
    """The iteration time a plan of this rent must beat to enter the top N and meet the limits."""
    req = searcher.req
    limit = float("inf")
    thr = searcher.threshold()
    if thr != float("inf"):
        if req.ranking.by_cost:
            limit = thr / rent_usd_per_s if rent_usd_per_s > 0 else limit
        elif thr < 0:
            limit = req.global_batch_size / -thr
    if req.min_throughput_samples_per_s:
        limit = min(limit, req.global_batch_size / req.min_throughput_samples_per_s)
    if req.max_usd_per_iteration is not None and rent_usd_per_s > 0:
        limit = min(limit, req.max_usd_per_iteration / rent_usd_per_s)
    return limit * _SLACK


def _search_splits(searcher: Searcher, mbs: int, groups: tuple, num_mb: int, checks: list) -> None:
    """Evaluate and offer every split of ``groups``' stages whose bound beats the limit."""
    req = searcher.req
    rent_usd_per_s = rent_s(searcher, groups)
    if req.max_usd_per_hour is not None and rent_usd_per_s * SECONDS_PER_HOUR > req.max_usd_per_hour:
        return
    busiest = [busiest_counts(g, num_mb) for g in groups]
    L = searcher.num_layers
    P = len(groups)
    if P > L:
        return
    rest = _rest_bounds(busiest, L)
    ends: list[int] = []

    def walk(i: int, start: int) -> None:
        limit = _time_limit_s(searcher, rent_usd_per_s)
        for end in (range(start + 1, L - (P - i - 1) + 1) if i < P - 1 else (L,)):
            checks[0] -= 1
            if checks[0] < 0:
                raise _OutOfChecks
            if max(n * k.time_s(start, end) for k, n in busiest[i]) > limit:
                return  # a later end only adds layers to this stage
            if i < P - 1 and rest[i][end] > limit:
                continue  # too much left to the later stages; a later end leaves less
            ends.append(end)
            if i < P - 1:
                walk(i + 1, end)
            else:
                bounds = zip((0, *ends[:-1]), ends)
                stages = tuple(FastStage(a, b, g) for (a, b), g in zip(bounds, groups))
                checks[1] -= 1
                if checks[1] < 0:
                    raise _OutOfChecks
                searcher.offer(searcher.evaluate(mbs, stages))
            ends.pop()
            limit = _time_limit_s(searcher, rent_usd_per_s)

    walk(0, 0)


def _rest_bounds(busiest: list, num_layers: int) -> list[list[float]]:
    """Per stage i (but the last) and first layer e after it: a bound on the busiest of stages
    i+1.. holding layers [e, L).  Each such stage's bound is at least its cheapest group's time on
    its layers, so theirs add up to at least the cheapest of them on each layer, summed, and the
    busiest holds at least their mean."""
    P = len(busiest)
    out: list[list[float]] = [[] for _ in range(P - 1)]
    rate: list[float] | None = None
    for j in range(P - 1, 0, -1):
        cums = [(k.comp_cum, n) for k, n in busiest[j]]
        mine = [min(n * (c[layer + 1] - c[layer]) for c, n in cums) for layer in range(num_layers)]
        rate = mine if rate is None else [min(a, b) for a, b in zip(rate, mine)]
        suffix = [0.0] * (num_layers + 1)
        acc = 0.0
        for layer in range(num_layers - 1, -1, -1):
            acc += rate[layer]
            suffix[layer] = acc / (P - j)
        out[j - 1] = suffix
    return out


def rent_s(searcher: Searcher, groups: tuple) -> float:
    """USD per second the stages' GPUs rent for (egress, the rest of a plan's cost, is >= 0)."""
    fast = searcher.fast
    return sum(fast.price(k.gpu, z) * k.tp_degree * n for g in groups for k, z, n in g) / SECONDS_PER_HOUR


def bound_s(groups: tuple, ends: list[int], num_mb: int) -> float:
    """The iteration-time bound of one plan of the mixed space (its stages' groups in the plan's
    regime, each stage's end layer): the busiest replica's compute."""
    return max(n * k.time_s(a, b) for g, a, b in zip(groups, (0, *ends[:-1]), ends)
               for k, n in busiest_counts(g, num_mb))


__all__ = ["MAX_MIXED_CHECKS", "MAX_MIXED_EVALUATIONS", "MAX_MIXED_GPUS", "STAGE_SPACES", "bound_s", "busiest_counts",
           "in_plan_regime", "rent_s", "search_mixed", "stage_groups", "stage_options"]
