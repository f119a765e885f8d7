"""The closed-form 1F1B time against exact event-driven schedules of the same pipeline
(``simulator/schedule_reference``): the engine's (prefetched receives, sends that never block, rendezvous
transfers, per-message latency, one FIFO link per direction) and DeepSpeed's (blocking)."""

import random
import statistics

import pytest

from sailor_core.plan.routing import link_microbatches, microbatches_per_replica
from sailor_core.simulator import one_f_one_b_time, stage_timing
from sailor_core.simulator.schedule_reference import blocking_makespan, deepspeed_commands, engine_makespan


def closed_form(f, b, links, num_mb, schedule="prefetch"):
    """``links``: (latency, wire) one way per boundary, as the event schedules take them."""
    stages = [stage_timing([fi + bi], [num_mb], [fi]) for fi, bi in zip(f, b)]
    round_trip = [2 * (lat + wire) for lat, wire in links]
    return one_f_one_b_time(stages, round_trip, [num_mb] * len(links), schedule).total_s


def _random_pipeline(rng, link_max):
    p, m = rng.randint(1, 8), rng.randint(1, 32)
    f = [rng.uniform(0.5, 2.0) for _ in range(p)]
    b = [x * rng.uniform(1.5, 2.5) for x in f]
    links = [(rng.choice([0.0, rng.uniform(0, link_max)]), rng.choice([0.0, rng.uniform(0, link_max)]))
             for _ in range(p - 1)]
    return f, b, links, m


def _errors(exact, schedule, link_max, cases=150, seed=7):
    rng = random.Random(seed)
    errors = []
    for _ in range(cases):
        f, b, links, m = _random_pipeline(rng, link_max)
        errors.append(closed_form(f, b, links, m, schedule) / exact(f, b, links, m) - 1)
    return sorted(errors)


def _engine(f, b, links, m):
    return engine_makespan([[x] for x in zip(f, b)], m, links)


def _deepspeed(f, b, links, m):
    return blocking_makespan(list(zip(f, b)), m, links)


def test_uniform_pipeline_is_exact():
    # (M + P - 1) (f + b): the textbook 1F1B time, whatever the p2p semantics
    f, b = [1.0] * 4, [2.0] * 4
    for schedule in ("prefetch", "blocking"):
        assert closed_form(f, b, [(0.0, 0.0)] * 3, 8, schedule) == pytest.approx(33.0)
    assert _engine(f, b, [(0.0, 0.0)] * 3, 8) == pytest.approx(33.0)
    assert _deepspeed(f, b, [(0.0, 0.0)] * 3, 8) == pytest.approx(33.0)


def test_one_slow_stage_hides_the_fast_ones():
    # stage 0 takes 10 per micro-batch, stage 1 takes 1: stage 1's round trip hides behind stage 0's
    # warm-up forward, so the time is stage 0's work alone, 2 x 10.
    assert closed_form([5.0, 0.5], [5.0, 0.5], [(0.0, 0.0)], 2) == pytest.approx(20.0)
    assert _engine([5.0, 0.5], [5.0, 0.5], [(0.0, 0.0)], 2) == pytest.approx(20.0)


def test_deepspeed_schedule_is_1f1b():
    # every stage forwards and backwards every micro-batch once, warm-up P - i - 1 forwards
    for p in (1, 2, 3, 5):
        for s in range(p):
            cmds = deepspeed_commands(p, s, 6)
            compute = [c for c in cmds if c[0] in ("F", "B")]
            assert sorted(compute) == sorted([("F", m) for m in range(6)] + [("B", m) for m in range(6)])
            assert compute[: p - s] == [("F", m) for m in range(min(p - s, 6))]


def test_a_slow_link_costs_every_stage_on_deep_uniform_pipelines():
    # 8 stages (f 1, b 2), links of 2 each way: the old pair-period model said 208 for 32
    # micro-batches; the engine takes 253: the cycle through all stages and links sets the pace.
    f, b, links = [1.0] * 8, [2.0] * 8, [(1.0, 1.0)] * 7
    exact = _engine(f, b, links, 32)
    assert exact == pytest.approx(253.0)
    assert closed_form(f, b, links, 32) == pytest.approx(exact, rel=0.01)
    # DeepSpeed pays each transfer on both ends: much slower, and modelled so
    blocking = _deepspeed(f, b, links, 32)
    assert blocking > 1.5 * exact
    assert closed_form(f, b, links, 32, "blocking") == pytest.approx(blocking, rel=0.01)


def test_prefetching_the_next_receive_beats_the_blocking_receive():
    rng = random.Random(3)
    gains = []
    for _ in range(100):
        f, b, links, m = _random_pipeline(rng, 1.0)
        steps = [[x] for x in zip(f, b)]
        gains.append(engine_makespan(steps, m, links, prefetch=False) / engine_makespan(steps, m, links) - 1)
    assert min(gains) >= -1e-12 and statistics.mean(gains) > 0.01


@pytest.mark.parametrize("schedule,exact", [("prefetch", _engine), ("blocking", _deepspeed)])
@pytest.mark.parametrize("link_max", [0.0, 0.25, 1.0, 3.0])
def test_closed_form_tracks_the_exact_schedule_on_random_pipelines(schedule, exact, link_max):
    # links up to 3x a stage's forward each way, latency and bandwidth apart
    errors = _errors(exact, schedule, link_max)
    assert abs(statistics.median(errors)) < 0.01
    assert errors[int(0.05 * len(errors))] > -0.06 and errors[int(0.95 * len(errors))] < 0.03
    assert errors[0] > -0.12 and errors[-1] < 0.12


def test_closed_form_with_replicas_of_different_speeds():
    # D replicas per stage (equal or not across stages), micro-batch m on replica m mod D
    rng = random.Random(5)
    errors = []
    for _ in range(120):
        p, m = rng.randint(1, 4), rng.randint(1, 16)
        dps = [rng.choice([1, 1, 2, 3]) for _ in range(p)]
        steps = []
        for d in dps:
            base = rng.uniform(0.5, 2.0)
            fs = [base * rng.choice([1.0, rng.uniform(1.0, 1.6)]) for _ in range(d)]
            steps.append([(f, f * rng.uniform(1.5, 2.5)) for f in fs])
        links = [(rng.uniform(0, 0.25), rng.uniform(0, 0.25)) for _ in range(p - 1)]
        stages = [stage_timing([f + b for f, b in reps], microbatches_per_replica(m, len(reps)),
                               [f for f, _ in reps]) for reps in steps]
        counts = [link_microbatches(m, dps[i], dps[i + 1]) for i in range(p - 1)]
        got = one_f_one_b_time(stages, [2 * (a + w) for a, w in links], counts).total_s
        errors.append(got / engine_makespan(steps, m, links) - 1)
    errors.sort()
    # the straggler's step stands for every replica: rarely much too fast, sometimes slow
    assert abs(statistics.median(errors)) < 0.02
    assert errors[0] > -0.15 and errors[int(0.9 * len(errors))] < 0.1
