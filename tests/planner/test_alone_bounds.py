"""The bound of a one-segment shape under blocking sends (``search/alone.py``) must never exceed
the pipeline it bounds, on any split: a pruned shape is gone for good."""

import itertools
import math
import random

import pytest

import sailor_core.planner.fastsim as fastsim
import sailor_core.planner.search as search
import sailor_core.planner.search.spaces as spaces
from sailor_core.planner import kinds, make_request, plan_job
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


def test_whole_blocks_bound_never_exceeds_the_blocking_1f1b_schedule():
    # Random splits of whole blocks (a heavier last layer on the last stage, an embedding on the
    # first the bound leaves out, each stage slower than the fastest variant's blocks at random),
    # links at or above their bounds.
    rng = random.Random(37)
    tight = raised = 0
    for _ in range(800):
        s, n = rng.randint(2, 12), rng.choice([1, 2, 3, 4, 8, 16, 32, 128])
        num = rng.randint(s, 40)  # (every stage holds a layer, as every split does)
        block, head = rng.uniform(0.001, 0.02), rng.choice([0.0, rng.uniform(0.0, 0.05)])
        cut = sorted(rng.sample(range(1, num), s - 1)) if rng.random() < 0.5 else [k * num // s for k in range(1, s)]
        held = [b - a for a, b in zip((0, *cut), (*cut, num))]
        steps = [(k * block + (head if i == s - 1 else 0.0) + (block / 3 if i == 0 else 0.0)) * rng.uniform(1.0, 1.2)
                 for i, k in enumerate(held)]
        floor_links = [rng.choice([0.0, rng.uniform(0.0, 0.01), rng.uniform(0.01, 0.2)]) for _ in range(s - 1)]
        links = [l + rng.choice([0.0, rng.uniform(0.0, 0.02)]) for l in floor_links]
        total = _blocking_time([(t, rng.uniform(0.2, 0.5)) for t in steps], links, n)
        fractional = blocked_pipeline_s(sum(steps), n, floor_links)
        bound = blocked_pipeline_s(sum(steps), n, floor_links, (n * block, n * head, num))
        assert bound <= total * (1 + 1e-9)
        tight += bound >= 0.8 * total
        raised += bound > 1.05 * fractional
    assert tight > 150 and raised > 60  # and not vacuous


def test_blocked_bound_on_a_hand_computed_pipeline():
    # Two stages, n = 3, a link of 1 s: stage 0 costs 2 x 1 + 1/2, stage 1 costs 1 + 2 x 1; 9 s of
    # steps x 3 poured over 2.5 and 3: T = (27 + 5.5) / 2 = 16.25 (both stages filled).
    assert blocked_pipeline_s(9.0, 3, [1.0]) == 16.25
    # With 0.1 s of steps the level (27 x 0.1 / 9 ... (0.3 + 5.5) / 2 = 2.9) is under the last
    # stage's own link part, 3: a stage of no work still pays its links.
    assert blocked_pipeline_s(0.1, 3, [1.0]) == 3.0
    # Whole blocks: 3 blocks of 2 s busy (the last stage's last layer 1 s more), link parts 2.5
    # and 3 (+ 1): a level of 6.5 holds 2 blocks on stage 0 and 1 on stage 1 (6.5 - 4 = 2.5), where
    # fractions of blocks (9 s of steps x 3 poured) would stop at 16.25; with 1 s of steps, 6.5.
    assert blocked_pipeline_s(1.0, 3, [1.0], (2.0, 1.0, 3)) == 6.5
    assert blocked_pipeline_s(9.0, 3, [1.0], (2.0, 1.0, 3)) == 16.25
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


def _best_whole_split(costs, block_s, head_s, num_blocks):
    """The least pipeline bound of every split of whole blocks over the stages, by enumeration."""
    best = math.inf
    for cut in itertools.combinations(range(num_blocks + len(costs) - 1), len(costs) - 1):
        held = [b - a - 1 for a, b in zip((-1, *cut), (*cut, num_blocks + len(costs) - 1))]
        worst = max(c + k * block_s for c, k in zip(costs, held))
        best = min(best, max(worst, costs[-1] + held[-1] * block_s + head_s))
    return best


def test_blocked_bound_is_its_definition():
    # Fractions of blocks: the steps poured over every stage's link part, at least the largest;
    # whole blocks: also the best split of whole blocks (enumerated), no more.
    rng = random.Random(36)
    for _ in range(4000):
        s, n = rng.randint(1, 5), rng.choice([1, 2, 3, 4, 8, 16, 32, 64, 1024])
        link = rng.choice([0.0, rng.uniform(0.0, 0.01), rng.uniform(0.01, 0.5)])
        links = [link] * (s - 1) if rng.random() < 0.5 else \
            [rng.choice([0.0, rng.uniform(0.0, 0.3)]) for _ in range(s - 1)]
        steps = rng.choice([0.0, rng.uniform(0.0, 1e-3), rng.uniform(0.0, 10.0), rng.uniform(0.0, 1000.0)])
        costs = _costs(n, links)
        assert math.isclose(blocked_pipeline_s(steps, n, links), _poured(steps, n, costs), rel_tol=1e-12)
        block, head, num = rng.uniform(1e-3, 2.0) * n, rng.choice([0.0, rng.uniform(0.0, 3.0)]) * n, rng.randint(1, 9)
        got = blocked_pipeline_s(steps, n, links, (block, head, num))
        want = max(_poured(steps, n, costs), _best_whole_split(costs, block, head, num))
        assert math.isclose(got, want, rel_tol=1e-9), (steps, n, links, block, head, num, got, want)


@pytest.mark.parametrize("label", ["homog 0", "geo 0", "floor", "cap"])
def test_one_segment_blocked_bound_holds_for_every_pipeline_fastsim_times(label, profiles, network, monkeypatch):
    # Every blocking pipeline fastsim times for a one-segment shape during the search of an AE row
    # (its min-max split and each polished neighbour) is at least the shape's blocked bound (with
    # whole blocks on the floor and cap rows, every stage's link part on all).
    timed, current, works = [], {}, {}
    evaluate_shape, evaluate, pipe, score = (search.Searcher.evaluate_shape, fastsim.FastSim._evaluate,
                                             fastsim.one_f_one_b_time, spaces.score_shapes)

    def spy_shape(self, mbs, shape, tau_lb, prepared=None):
        current["shape"] = (self, mbs, shape)
        try:
            return evaluate_shape(self, mbs, shape, tau_lb, prepared)
        finally:
            current.pop("shape")

    def spy_pipe(*args, **kwargs):
        out = pipe(*args, **kwargs)
        if "shape" in current and args[3] == "blocking" and len(current["shape"][2]) == 1:
            timed.append((current["shape"], out.total_s))
        return out

    def spy_score(searcher, present, **kw):  # the reference work of each micro-batch size's shapes
        works[(id(searcher), kw["mbs"])] = kw["work_s"]
        return score(searcher, present, **kw)

    monkeypatch.setattr(spaces, "score_shapes", spy_score)
    monkeypatch.setattr(kinds, "_SHARED", {})  # a fresh process's memos: every plan timed anew
    monkeypatch.setattr(search.Searcher, "evaluate_shape", spy_shape)
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
    assert checked > 10 and closest > 0.9  # the AE rows block on their sends, and the bound comes near
    # whole blocks where a floor, a cap or the cost objective binds (``SegmentParts.whole_blocks``)
    assert searcher.parts.whole_blocks == (label in ("floor", "cap"))
