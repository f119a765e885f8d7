"""The planner's leaf functions give, bit for bit, the figures of the implementation they
replaced: calls recorded while ``plan_job`` planned six requests (with their outputs from
commit 1b9065a's FastSim.evaluate, FastSim.rent_and_egress and split.min_max_split) are
replayed through the current code.  The recording and the replay live in
``benchmarks/bench_planner_leaves.py`` (which also times them)."""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_planner_leaves as leaves  # noqa: E402


def test_leaf_functions_replay_the_recorded_figures_bit_for_bit(profiles, network):
    data = leaves.load()
    replay = leaves.Replay(data, profiles, network)
    assert len(replay.evaluate) > 1000 and len(replay.rent) > 1000 and len(replay.split) > 1000
    # Plans of several stages, several groups per stage and several zones are all in the record.
    assert any(len(stages) > 4 for _, _, stages, _ in replay.evaluate)
    assert any(len(s.groups) > 1 for _, _, stages, _ in replay.evaluate for s in stages)
    assert any(want[1] > 0 for *_, want in replay.rent)  # cross-zone egress
    assert not leaves.mismatches(replay)


def test_replay_check_notices_a_changed_figure(profiles, network):
    data = leaves.load()
    data = {**data, "evaluate": [list(c) for c in data["evaluate"][:3]],
            "rent_and_egress": [list(c) for c in data["rent_and_egress"][:3]],
            "min_max_split": [list(c) for c in data["min_max_split"][:3]]}
    # one float off by its last bit, one split end moved
    first = data["evaluate"][0][3]
    data["evaluate"][0][3] = [math.nextafter(first[0], math.inf), *first[1:]]
    usd_per_hr, egress = data["rent_and_egress"][1][3]
    data["rent_and_egress"][1][3] = [math.nextafter(usd_per_hr, 0.0), egress]
    data["min_max_split"][2][4] = None
    bad = leaves.mismatches(leaves.Replay(data, profiles, network))
    assert [line.split(":")[0] for line in bad] == ["evaluate #0", "rent_and_egress #1", "min_max_split #2"]


def test_group_pairs_are_replica_pairs_summed_per_group():
    import random

    from sailor_core.simulator.stage import group_p2p_pairs, p2p_pairs

    rng = random.Random(3)
    for _ in range(3000):
        src = [rng.randint(1, 12) for _ in range(rng.randint(1, 4))]
        dst = [rng.randint(1, 12) for _ in range(rng.randint(1, 4))]
        num_mb = rng.randint(1, 400)
        src_of = [g for g, n in enumerate(src) for _ in range(n)]
        dst_of = [g for g, n in enumerate(dst) for _ in range(n)]
        want: dict = {}
        for (a, b), carried in p2p_pairs(num_mb, len(src_of), len(dst_of)).items():
            key = (src_of[a], dst_of[b])
            want[key] = want.get(key, 0) + carried
        got = group_p2p_pairs(num_mb, src, dst)
        assert list(got.items()) == list(want.items())  # same pairs, counts and order
