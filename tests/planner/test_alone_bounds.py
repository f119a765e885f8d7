"""The bound of a one-segment shape under blocking sends (``search/alone.py``) must never exceed
the pipeline it bounds, on any split: a pruned shape is gone for good."""

import random

from sailor_core.planner import make_request
from sailor_core.planner.search import Searcher
from sailor_core.planner.search.alone import blocked_pipeline_s
from sailor_core.planner.search.shapes import fast_stages
from sailor_core.simulator.pipeline_time import StageTiming, one_f_one_b_time

A = "A100-40"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-west1-b")


def _blocking_time(steps, links, n):
    stages = [StageTiming(t, n * t, (n - 1) * t, t * f, n) for t, f in steps]
    return one_f_one_b_time(stages, links, [n] * len(links), "blocking", split=False).total_s


def test_blocked_bound_never_exceeds_the_blocking_1f1b_schedule():
    # Random one-segment pipelines: uneven steps and forward shares, each link at least its bound.
    rng = random.Random(35)
    tight = 0
    for _ in range(600):
        s, n = rng.randint(2, 16), rng.choice([1, 2, 3, 4, 8, 16, 32, 128])
        steps = [(rng.uniform(0.001, 0.1) * rng.choice([1.0, 0.3, 3.0]), rng.uniform(0.2, 0.5)) for _ in range(s)]
        floor_links = [rng.choice([0.0, rng.uniform(0.0, 0.01), rng.uniform(0.01, 0.2)]) for _ in range(s - 1)]
        links = [l + rng.choice([0.0, rng.uniform(0.0, 0.02)]) for l in floor_links]
        total = _blocking_time(steps, links, n)
        bound = blocked_pipeline_s(sum(t for t, _ in steps), n, floor_links)
        assert bound <= total * (1 + 1e-9)
        tight += bound >= 0.5 * total
    assert tight > 80  # and not vacuous (random uneven steps: a median of 0.35 of the time)


def test_blocked_bound_on_a_hand_computed_pipeline():
    # Two stages, n = 3, a link of 1 s: stage 0 costs 2 x 1 + 1/2, stage 1 costs 1 + 2 x 1; 9 s of
    # steps x 3 poured over 2.5 and 3: T = (27 + 5.5) / 2 = 16.25 (both stages filled).
    assert blocked_pipeline_s(9.0, 3, [1.0]) == 16.25
    # With 0.1 s of steps only the cheaper stage is filled: 2.5 + 3 x 0.1 = 2.8 <= 3.
    assert abs(blocked_pipeline_s(0.1, 3, [1.0]) - 2.8) < 1e-12
    # No links: the steps of the busiest replica over the stages (the capacity bound).
    assert blocked_pipeline_s(8.0, 4, [0.0, 0.0, 0.0]) == 8.0


def test_one_segment_bounds_hold_for_their_splits_across_zones(profiles, network):
    # Every one-segment shape on four zones (stages whole in different zones cross them on every
    # micro-batch): the bound the search queues it with is at most the simulated time of its
    # min-max split, and on many the blocked bound is well above the capacity bound.
    req = make_request(model="opt-350m", availability={(A, z): 16 for z in ZONES}, global_batch_size=256)
    searcher = Searcher(req, profiles=profiles, network=network)
    from sailor_core.planner.search.shape_bound import ShapeBounds
    from sailor_core.planner.search.spaces import build_spaces

    bounds = ShapeBounds(searcher)
    checked = raised = 0
    for space in build_spaces(searcher):
        for seg in space.present[0]:
            if seg.num_stages < 2:
                continue
            t = bounds.tight(space, (seg,))
            prep = searcher.prepare(space.mbs, (seg,), 0.0)
            if t is None or prep is None:
                continue
            res = searcher.fast.evaluate(space.mbs, fast_stages(prep[0], prep[1]))
            assert t[2][0] <= res.iteration_time_s * (1 + 1e-9)
            checked += 1
            blocked = searcher.parts.blocked_s(seg, space.ref_total_s * seg.slowness)
            raised += blocked > 1.5 * bounds.time_lb(space, (seg,), 0.0, None)[0]
    assert checked > 100 and raised > 20


def _blocked_by_definition(steps_s, n, links):
    """``blocked_pipeline_s`` as its docstring states it: every stage's link part, sorted, the
    steps poured over them, one stage at a time."""
    costs, before, l_in = [], 0.0, 0.0
    for l_out in (*links, 0.0):
        costs.append(before + (n - 1) * (l_in + l_out) + l_out / 2)
        before += l_out
        l_in = l_out
    costs.sort()
    total = 0.0
    for i, c in enumerate(costs):
        total += c
        level = (steps_s * n + total) / (i + 1)
        if i + 1 == len(costs) or level <= costs[i + 1]:
            return level


def test_blocked_bound_is_its_definition_bit_for_bit():
    rng = random.Random(36)
    for _ in range(20000):
        s, n = rng.randint(1, 26), rng.choice([1, 2, 3, 4, 8, 16, 32, 64, 1024])
        link = rng.choice([0.0, rng.uniform(0.0, 0.01), rng.uniform(0.01, 0.5)])
        links = [link] * (s - 1) if rng.random() < 0.5 else \
            [rng.choice([0.0, rng.uniform(0.0, 0.3)]) for _ in range(s - 1)]
        steps = rng.choice([0.0, rng.uniform(0.0, 1e-3), rng.uniform(0.0, 10.0), rng.uniform(0.0, 1000.0)])
        assert blocked_pipeline_s(steps, n, links) == _blocked_by_definition(steps, n, links)
