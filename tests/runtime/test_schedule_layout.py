"""1F1B order and rank layout: pure functions, no processes."""

from __future__ import annotations

import itertools
import subprocess
import sys

from sailor_core.plan.layout import rank_layout, replica_ranks, stage_ranks, world_size
from sailor_core.runtime.pipeline_order import local_microbatches, one_f_one_b_order, stage_lookahead

from .conftest import make_plan


def test_homogeneous_schedule_is_1f1b():
    # stage 0 of 4, one replica, 6 micro-batches: 3 warm-up forwards, then alternate, then drain
    ops = one_f_one_b_order(local_microbatches(6, 1, 0), stage_lookahead(0, [1, 1, 1, 1]))
    assert ops[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    assert ops[4:8] == [("B", 0), ("F", 4), ("B", 1), ("F", 5)]
    assert [op for op in ops if op[0] == "B"] == [("B", m) for m in range(6)]
    last = one_f_one_b_order(local_microbatches(6, 1, 0), stage_lookahead(3, [1, 1, 1, 1]))
    assert last == [op for m in range(6) for op in (("F", m), ("B", m))]


def _runs_to_completion(dps: list[int], num_mb: int) -> bool:
    """Play every rank's op list with blocking receives and non-blocking sends."""
    S = len(dps)
    progs = {(s, r): one_f_one_b_order(local_microbatches(num_mb, dps[s], r), stage_lookahead(s, dps))
             for s in range(S) for r in range(dps[s])}
    pc = {k: 0 for k in progs}
    fwd_done, bwd_done = set(), set()  # (stage, m)
    while True:
        moved = False
        for (s, r), ops in progs.items():
            while pc[(s, r)] < len(ops):
                kind, m = ops[pc[(s, r)]]
                if kind == "F" and s > 0 and (s - 1, m) not in fwd_done:
                    break
                if kind == "B" and s < S - 1 and (s + 1, m) not in bwd_done:
                    break
                (fwd_done if kind == "F" else bwd_done).add((s, m))
                pc[(s, r)] += 1
                moved = True
        if all(pc[k] == len(progs[k]) for k in progs):
            return True
        if not moved:
            return False


def test_heterogeneous_replica_counts_never_deadlock():
    for dps in itertools.product([1, 2, 3, 4], repeat=3):
        for num_mb in (max(dps), 8, 12):
            assert _runs_to_completion(list(dps), num_mb), (dps, num_mb)


def test_rank_layout_is_stage_major_and_replicas_are_contiguous():
    plan = make_plan("tiny", [(0, 2, [2, 1]), (2, 4, [1, 1])])
    roles = rank_layout(plan)
    assert world_size(plan) == len(roles) == 5
    assert [(r.stage, r.replica, r.tp_rank) for r in roles] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert replica_ranks(plan, 0, 0) == [0, 1] and stage_ranks(plan, 1) == [3, 4]
    assert roles[1].replica_first_rank == 0 and roles[1].tp_degree == 2


def test_layout_imports_no_torch():
    code = ("import sys, sailor_core.plan.layout, sailor_core.runtime; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_gradient_sent_upstream_is_known_arrived_at_a_forward_sent_after_its_backward():
    from sailor_core.plan.routing import local_microbatches, replica_of
    from sailor_core.runtime.pipeline_order import gradients_known_arrived, one_f_one_b_order, stage_lookahead

    assert gradients_known_arrived(8, [1, 1], 0, 0) == {}  # the first stage sends no gradient
    # 2 stages: stage 0 runs F0 F1 B0 F2 B1 F3 ...: the input of 2 comes after the backward of 0
    assert gradients_known_arrived(8, [1, 1], 1, 0) == {m + 2: [m] for m in range(6)}
    for dps in ([1, 1, 1], [2, 1], [1, 2], [2, 3, 1], [3, 2]):
        for stage in range(1, len(dps)):
            for replica in range(dps[stage]):
                got = gradients_known_arrived(12, dps, stage, replica)
                mine = set(local_microbatches(12, dps[stage], replica))
                for m2, ms in got.items():
                    assert m2 in mine and all(m in mine for m in ms)
                    for m in ms:  # upstream, m's backward comes before m2's forward
                        up = one_f_one_b_order(local_microbatches(12, dps[stage - 1], replica_of(m, dps[stage - 1])),
                                         stage_lookahead(stage - 1, dps))
                        assert up.index(("B", m)) < up.index(("F", m2))
                flat = [m for ms in got.values() for m in ms]
                assert len(flat) == len(set(flat))  # each gradient retired once
