"""``simulator.schedule`` was rewritten for speed: on random pipelines it must give exactly the
figures of the implementation it replaced (kept here, verbatim, only for this comparison)."""

import random

from sailor_core.simulator.pipeline_time import StageTiming, one_f_one_b, stage_timing

DEFAULT_FORWARD_SHARE = 1.0 / 3.0


def _old_stage_timing(replica_step_s, replica_counts, replica_fwd_s=None):
    step = busy = repeat = 0.0
    straggler = 0
    most = 0
    for r, (t, n) in enumerate(zip(replica_step_s, replica_counts)):
        if t > step:
            step, straggler = t, r
        busy = n * t if n * t > busy else busy
        rep = (n - 1) * t if n > 0 else 0.0
        repeat = rep if rep > repeat else repeat
        most = n if n > most else most
    fwd = replica_fwd_s[straggler] if replica_fwd_s is not None else step * DEFAULT_FORWARD_SHARE
    return StageTiming(step, busy, repeat, fwd, max(1, most))


def _old_longest(stages, link_s, link_counts):
    p = len(stages)
    steps = [s.step_s for s in stages]
    total_steps = sum(steps)
    total_links = sum(link_s)
    best, where = -1.0, "stage 0"
    before = 0.0
    after_steps = total_steps
    after_links = total_links
    for k, s in enumerate(stages):
        after_steps -= s.step_s
        pair = 0.0
        if k + 1 < p:
            pair = (s.step_s + steps[k + 1] + link_s[k]) / 2
        if k > 0:
            left = (steps[k - 1] + s.step_s + link_s[k - 1]) / 2
            pair = left if left > pair else pair
        n = s.num_microbatches
        steady = (n - 1) * pair if (n - 1) * pair > s.repeat_s else s.repeat_s
        warmup = min(p - k - 1, n - 1)
        exposed = after_steps + after_links - warmup * s.fwd_s
        t_k = before + s.step_s + steady + (exposed if exposed > 0 else 0.0)
        if t_k > best:
            best, where = t_k, f"stage {k}"
        if k + 1 < p:
            before += s.step_s + link_s[k]
            after_links -= link_s[k]
    for i, (l, n) in enumerate(zip(link_s, link_counts)):
        t_link = total_steps + total_links + (n - 1) * l / 2
        if t_link > best:
            best, where = t_link, f"link {i}->{i + 1}"
    return best, where


def _old_one_f_one_b(stages, link_s, link_counts):
    total, bottleneck = _old_longest(stages, link_s, link_counts)
    without_links, _ = _old_longest(stages, [0.0] * len(link_s), link_counts) if any(link_s) else (total, "")
    busiest = max(range(len(stages)), key=lambda k: stages[k].busy_s)
    compute = stages[busiest].busy_s
    return (compute, max(0.0, without_links - compute), max(0.0, total - without_links), busiest, bottleneck)


def _random_time(rng):
    # ties and zeros matter for the comparisons: draw from a few values as well
    return rng.choice([0.0, 0.25, 0.5, 1.0, rng.random(), rng.random() * 1e-3, rng.uniform(0.1, 3.0)])


def test_stage_timing_and_one_f_one_b_match_the_replaced_implementation():
    rng = random.Random(11)
    for _ in range(8000):
        p = rng.randint(1, 8)
        stages = []
        for _ in range(p):
            r = rng.randint(1, 4)
            steps = [_random_time(rng) for _ in range(r)]
            counts = [rng.randint(0, 40) for _ in range(r)]
            fwds = [t / 3 for t in steps] if rng.random() < 0.7 else None
            got, want = stage_timing(steps, counts, fwds), _old_stage_timing(steps, counts, fwds)
            assert got == want
            stages.append(got)
        links = [_random_time(rng) if rng.random() < 0.8 else 0.0 for _ in range(p - 1)]
        link_counts = [rng.randint(1, 40) for _ in range(p - 1)]
        pipe = one_f_one_b(stages, links, link_counts)
        got = (pipe.compute_s, pipe.bubble_s, pipe.p2p_s, pipe.busiest_stage, pipe.bottleneck)
        assert got == _old_one_f_one_b(stages, links, link_counts)
