"""The closed-form 1F1B time against an exact event-driven 1F1B schedule of the same pipeline."""

import random
import statistics

import pytest

from sailor_core.simulator import one_f_one_b, stage_timing


def exact_1f1b(f, b, link_one_way, num_mb):
    """Makespan of one 1F1B pipeline, op by op.  Stage i runs min(P-i-1, M) warm-up forwards,
    then alternates forward/backward, then drains; a forward needs the previous stage's forward of
    that micro-batch (+ link), a backward the next stage's backward (+ link)."""
    p = len(f)
    f_end = [[None] * num_mb for _ in range(p)]
    b_end = [[None] * num_mb for _ in range(p)]
    orders = []
    for i in range(p):
        warm = min(p - i - 1, num_mb)
        ops = [("F", m) for m in range(warm)]
        nf, nb = warm, 0
        while nf < num_mb:
            ops += [("F", nf), ("B", nb)]
            nf, nb = nf + 1, nb + 1
        ops += [("B", m) for m in range(nb, num_mb)]
        orders.append(ops)
    pos, free = [0] * p, [0.0] * p
    remaining = 2 * p * num_mb
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, m = orders[i][pos[i]]
                if kind == "F":
                    if i > 0 and f_end[i - 1][m] is None:
                        break
                    ready = 0.0 if i == 0 else f_end[i - 1][m] + link_one_way[i - 1]
                    f_end[i][m] = max(free[i], ready) + f[i]
                    free[i] = f_end[i][m]
                else:
                    if i < p - 1 and b_end[i + 1][m] is None:
                        break
                    ready = f_end[i][m] if i == p - 1 else b_end[i + 1][m] + link_one_way[i]
                    b_end[i][m] = max(free[i], ready) + b[i]
                    free[i] = b_end[i][m]
                pos[i] += 1
                remaining -= 1
                progressed = True
        assert progressed, "deadlock in the reference schedule"
    return max(free)


def closed_form(f, b, link_one_way, num_mb):
    stages = [stage_timing([fi + bi], [num_mb], [fi]) for fi, bi in zip(f, b)]
    return one_f_one_b(stages, [2 * l for l in link_one_way], [num_mb] * len(link_one_way)).total_s


def test_uniform_pipeline_is_exact():
    # (M + P - 1) (f + b): the textbook 1F1B time
    f, b = [1.0] * 4, [2.0] * 4
    assert closed_form(f, b, [0.0] * 3, 8) == pytest.approx(exact_1f1b(f, b, [0.0] * 3, 8)) == pytest.approx(33.0)


def test_one_slow_stage_hides_the_fast_ones():
    # stage 0 takes 10 per micro-batch, stage 1 takes 1: stage 1's round trip hides behind stage 0's
    # warm-up forward, so the time is stage 0's work alone, 2 x 10.
    assert closed_form([5.0, 0.5], [5.0, 0.5], [0.0], 2) == pytest.approx(20.0)
    assert exact_1f1b([5.0, 0.5], [5.0, 0.5], [0.0], 2) == pytest.approx(20.0)


def test_closed_form_tracks_the_exact_schedule_on_random_pipelines():
    rng = random.Random(7)
    errors = []
    for _ in range(300):
        p, m = rng.randint(1, 6), rng.randint(1, 32)
        f = [rng.uniform(0.5, 2.0) for _ in range(p)]
        b = [x * rng.uniform(1.5, 2.5) for x in f]
        links = [rng.choice([0.0, rng.uniform(0.0, 0.5)]) for _ in range(p - 1)]
        errors.append(closed_form(f, b, links, m) / exact_1f1b(f, b, links, m) - 1)
    errors.sort()
    assert statistics.median(abs(e) for e in errors) < 0.005
    assert errors[int(0.95 * len(errors))] < 0.03
    assert -0.07 < errors[0] and errors[-1] < 0.10
