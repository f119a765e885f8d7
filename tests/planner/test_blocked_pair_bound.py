"""The bound of a two-segment shape under blocking sends (``search/alone.blocked_pair_many``) must
never exceed the pipeline it bounds, on any split, whatever the links above their bounds: the
scoring prunes on it (``scored._with_blocked_pair``), so a shape it overestimates is gone for good.

Checked against the 1F1B schedule itself (``simulator.pipeline_time``) on random two-segment
pipelines, and against every pipeline fastsim times during the search on the AE rows whose
shapes pair two GPU types (floor, cap, heterogeneous) and the completeness scenarios of two types:
each plan evaluated for a two-segment shape (its min-max split and every polished neighbour)."""

import math
import random

import numpy as np
import pytest

import sailor_core.planner.fastsim as fastsim
from sailor_core.planner import make_request, plan_job
from sailor_core.planner.search.alone import blocked_pair_many
from sailor_core.simulator.pipeline_time import StageTiming, one_f_one_b_time
from tests.planner.test_completeness import MIXED, SCENARIOS
from tests.planner.test_link_bound import _ae_request


def _bound(work_s, first, second, link_between):
    return float(blocked_pair_many(work_s, tuple(np.array([x]) for x in first), tuple(np.array([x]) for x in second),
                                   np.array([link_between]))[0])


def _random_pipeline(rng):
    """Two segments in one order: (stages, micro-batches, slowness, own link) each, the link where
    they meet, and a random split of the work with links at or above their bounds."""
    segs = [(rng.randint(1, 8), rng.choice([1, 2, 3, 8, 22, 43, 128, 171]), rng.uniform(0.3, 3.0),
             rng.choice([0.0, rng.uniform(0.0, 0.01), rng.uniform(0.01, 0.08)])) for _ in range(2)]
    between = rng.choice([0.0, rng.uniform(0.0, 0.1)])
    work = rng.uniform(0.01, 0.5)
    # near the balanced split (each stage's share against its micro-batches and slowness) or anywhere
    balanced = rng.random() < 0.5
    of = [segs[0] if k < segs[0][0] else segs[1] for k in range(segs[0][0] + segs[1][0])]
    shares = [rng.uniform(0.9, 1.1) / (n * slow) if balanced else rng.uniform(0.05, 1.0) * rng.choice([1.0, 0.2])
              for _, n, slow, _ in of]
    stages, links = [], []
    for k, share in enumerate(shares):
        s, n, slow, own = of[k]
        t = work * share / sum(shares) * slow
        stages.append(StageTiming(t, n * t, (n - 1) * t, t * rng.uniform(0.2, 0.5), n))
        if k < len(shares) - 1:
            floor = between if k == segs[0][0] - 1 else own
            links.append(floor + rng.choice([0.0, rng.uniform(0.0, 0.02)]))
    counts = [min(a.num_microbatches, b.num_microbatches) for a, b in zip(stages, stages[1:])]
    total = one_f_one_b_time(stages, links, counts, "blocking", split=False).total_s
    return segs, between, work, total


def test_blocked_pair_bound_never_exceeds_the_blocking_1f1b_schedule():
    rng = random.Random(35)
    tight = 0
    for _ in range(800):
        segs, between, work, total = _random_pipeline(rng)
        bound = _bound(work, *segs, between)
        assert bound <= total * (1 + 1e-9), (segs, between, work, bound, total)
        tight += bound >= 0.5 * total
    # not vacuous (1F1B where counts differ, the bubbles and the links above their bounds are
    # left out: a median of 0.14 of the time here; the AE rows' plans below are 0.7-0.9)
    assert tight > 15


def test_blocked_pair_bound_by_hand():
    # V100 stage (1 stage, 171 micro-batches per replica, slowness 2) first, then 5 A100 stages of
    # 43 (slowness 1), links 0.02 inside, 0.03 where they meet, 1 s of reference work.  The V100
    # stage's link part alone is 170 x 0.03 + 0.015 = 5.115 s: the level is at least that.
    got = _bound(1.0, (1, 171, 2.0, 0.0), (5, 43, 1.0, 0.02), 0.03)
    assert got >= 5.115
    # Without links: the work over the busiest replicas' capacity, n x slowness per stage:
    # T / (171 x 2) + 5 T / 43 = 1.
    assert math.isclose(_bound(1.0, (1, 171, 2.0, 0.0), (5, 43, 1.0, 0.0), 0.0), 1 / (1 / 342 + 5 / 43))


TWO_TYPES = {
    **{label: label for label in ("floor", "cap", "hetero 0")},
    **{name: kw for name, (_, kw) in SCENARIOS.items() if len({g for g, _ in kw["availability"]}) > 1},
    **{name: kw for name, kw in MIXED.items()},
}


@pytest.mark.parametrize("name", sorted(TWO_TYPES))
def test_blocked_pair_bound_holds_for_every_pipeline_fastsim_times(name, profiles, network, monkeypatch, search_spies):
    spec = TWO_TYPES[name]
    req = _ae_request(spec) if isinstance(spec, str) else make_request(
        max_stages=2, **({"mixed_stages": False} if name in SCENARIOS else {}), **spec)
    (current, works), checked = search_spies, []
    evaluate, pipe = fastsim.FastSim._evaluate, fastsim.one_f_one_b_time

    def spy_pipe(*args, **kwargs):
        out = pipe(*args, **kwargs)
        if "shape" in current and args[3] == "blocking":
            current["pipes"].append(out.total_s)
        return out

    def spy_evaluate(self, mbs, stages):
        current["pipes"] = []
        res = evaluate(self, mbs, stages)
        if "shape" in current and len(current["shape"][2]) == 2:
            checked.append((current["shape"], current["pipes"][-1] if current["pipes"] else None))
        return res

    monkeypatch.setattr(fastsim.FastSim, "_evaluate", spy_evaluate)
    monkeypatch.setattr(fastsim, "one_f_one_b_time", spy_pipe)
    try:
        plan_job(req, profiles=profiles, network=network)
    except Exception as err:  # an infeasible request still times its plans
        assert type(err).__name__ == "InfeasibleError", err
    blocked, closest = 0, 0.0
    for (searcher, mbs, (a, b)), total in checked:
        if total is None or not (searcher.parts.blocks_sends(a) and searcher.parts.blocks_sends(b)):
            continue  # (a prefetching regime: the bound is not taken)
        parts, work_s = searcher.parts, works[(id(searcher), mbs)]
        between = min(parts.link_s(a, b), parts.link_s(b, a))
        bound = _bound(work_s, *((s.num_stages, s.num_microbatches, s.slowness, parts.link_s(s, s)) for s in (a, b)),
                       between)
        assert bound <= total * (1 + 1e-9), (name, mbs, a, b, bound, total)
        blocked += 1
        closest = max(closest, bound / total)
    if isinstance(spec, str):
        assert blocked > 20  # the AE rows run DeepSpeed's regime: their two-type plans all block
        assert closest > 0.6  # and the bound is near some of them
