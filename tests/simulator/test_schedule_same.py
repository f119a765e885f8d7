"""``stage_timing`` was rewritten for speed: on random stages it must give exactly the figures of
the implementation it replaced (kept here only for this comparison; since then a replica without
micro-batches is no straggler).  ``one_f_one_b_time`` has its own reference since the link model
changed: an exact event-driven schedule (``tests/simulator/test_schedule_exact.py``)."""

import random

from sailor_core.simulator.pipeline_time import StageTiming, stage_timing

DEFAULT_FORWARD_SHARE = 1.0 / 3.0


def _old_stage_timing(replica_step_s, replica_counts, replica_fwd_s=None):
    step = busy = repeat = 0.0
    straggler = 0
    most = 0
    for r, (t, n) in enumerate(zip(replica_step_s, replica_counts)):
        if t > step and n > 0:
            step, straggler = t, r
        busy = n * t if n * t > busy else busy
        rep = (n - 1) * t if n > 0 else 0.0
        repeat = rep if rep > repeat else repeat
        most = n if n > most else most
    fwd = replica_fwd_s[straggler] if replica_fwd_s is not None else step * DEFAULT_FORWARD_SHARE
    return StageTiming(step, busy, repeat, fwd, max(1, most))


def _random_time(rng):
    # ties and zeros matter for the comparisons: draw from a few values as well
    return rng.choice([0.0, 0.25, 0.5, 1.0, rng.random(), rng.random() * 1e-3, rng.uniform(0.1, 3.0)])


def test_stage_timing_matches_the_replaced_implementation():
    rng = random.Random(11)
    for _ in range(8000):
        p = rng.randint(1, 8)
        for _ in range(p):
            r = rng.randint(1, 4)
            steps = [_random_time(rng) for _ in range(r)]
            counts = [rng.randint(0, 40) for _ in range(r)]
            fwds = [t / 3 for t in steps] if rng.random() < 0.7 else None
            got, want = stage_timing(steps, counts, fwds), _old_stage_timing(steps, counts, fwds)
            assert got == want
