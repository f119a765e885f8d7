"""The bound of a one-segment shape under blocking sends (``search/alone.py``) must never exceed
the pipeline it bounds, on any split: a pruned shape is gone for good."""

import math
import random

import pytest

import sailor_core.planner.fastsim as fastsim
from sailor_core.planner import make_request, plan_job
from sailor_core.planner.search import Searcher
from sailor_core.planner.search.alone import blocked_pipeline_s
from sailor_core.planner.search.shapes import fast_stages
from sailor_core.simulator.pipeline_time import StageTiming, one_f_one_b_time
from tests.planner.test_link_bound import _ae_request

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
    # With 0.1 s of steps the level over both stages, (3 x 0.1 + 2.5 + 3) / 2 = 2.9, is under the last
    # stage's own link part, 3: a stage pays its links whatever its share of the steps.
    assert blocked_pipeline_s(0.1, 3, [1.0]) == 3.0
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


def _costs(n, links):
    costs, before, l_in = [], 0.0, 0.0
    for l_out in (*links, 0.0):
        costs.append(before + (n - 1) * (l_in + l_out) + l_out / 2)
        before += l_out
        l_in = l_out
    return costs


def _poured(steps_s, n, costs):
    """The least T at or above every stage's link part with the steps poured over them, one
    stage at a time from the cheapest (``blocked_pipeline_s`` in closed form)."""
    ordered, total = sorted(costs), 0.0
    for i, c in enumerate(ordered):
        total += c
        level = (steps_s * n + total) / (i + 1)
        if i + 1 == len(ordered) or level <= ordered[i + 1]:
            return max(level, ordered[-1])


def test_blocked_bound_is_its_definition():
    # The steps poured over every stage's link part, at least the largest (the closed form).
    rng = random.Random(36)
    for _ in range(20000):
        s, n = rng.randint(1, 26), rng.choice([1, 2, 3, 4, 8, 16, 32, 64, 1024])
        link = rng.choice([0.0, rng.uniform(0.0, 0.01), rng.uniform(0.01, 0.5)])
        links = [link] * (s - 1) if rng.random() < 0.5 else \
            [rng.choice([0.0, rng.uniform(0.0, 0.3)]) for _ in range(s - 1)]
        steps = rng.choice([0.0, rng.uniform(0.0, 1e-3), rng.uniform(0.0, 10.0), rng.uniform(0.0, 1000.0)])
        assert math.isclose(blocked_pipeline_s(steps, n, links), _poured(steps, n, _costs(n, links)), rel_tol=1e-12)


@pytest.mark.parametrize("label", ["homog 0", "homog 1", "geo 0", "floor"])
def test_one_segment_blocked_bound_holds_for_every_pipeline_fastsim_times(label, profiles, network, monkeypatch,
                                                                          search_spies):
    # Every blocking pipeline fastsim times for a one-segment shape during the search of an AE row
    # (its min-max split and each polished neighbour) is at least the shape's blocked bound.
    (current, works), timed, pipe = search_spies, [], fastsim.one_f_one_b_time

    def spy_pipe(*args, **kwargs):
        out = pipe(*args, **kwargs)
        if "shape" in current and args[3] == "blocking" and len(current["shape"][2]) == 1:
            timed.append((current["shape"], out.total_s))
        return out

    monkeypatch.setattr(fastsim, "one_f_one_b_time", spy_pipe)
    plan_job(_ae_request(label), profiles=profiles, network=network)
    checked, closest = 0, 0.0
    for (searcher, mbs, (seg,)), total in timed:
        work_s = works.get((id(searcher), mbs))  # (None: a lever rung's search, scored its own way)
        if seg.num_stages < 2 or not searcher.parts.blocks_sends(seg) or work_s is None:
            continue
        bound = searcher.parts.blocked_s(seg, work_s * seg.slowness)
        assert bound <= total * (1 + 1e-9), (label, mbs, seg, bound, total)
        checked += 1
        closest = max(closest, bound / total)
    assert checked > 10 and closest > 0.85  # the AE rows block on their sends, and the bound comes near
