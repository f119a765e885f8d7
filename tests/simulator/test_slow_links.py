"""The engine over its test-only slow link (``runtime/links.py``) against the simulator fed the
same link figures (``benchmarks/bench_slow_links.py`` does 2-8 stages; this is its smallest case)."""

import statistics
import sys
from pathlib import Path

import pytest

from sailor_core.errors import InputError
from sailor_core.runtime import links
from sailor_core.runtime.links import ComputePace, LinkShim
from sailor_core.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_slow_links as bench  # noqa: E402


def test_the_shim_travels_in_the_environment():
    shim = LinkShim(latency_s=0.025, bandwidth_bytes_per_s=3e6)
    env = shim.to_env()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert LinkShim.from_env() == shim
        mp.setenv(next(iter(env)), "fast")
        with pytest.raises(InputError):
            LinkShim.from_env()
    # a ring of 4 ranks: 6 steps of a quarter of the bytes
    assert shim.ring_s(4_000_000, 4) == pytest.approx(6 * (0.025 + 1e6 / 3e6))
    with pytest.raises(InputError):
        LinkShim(latency_s=0.01, bandwidth_bytes_per_s=0)


def test_the_compute_pace_travels_in_the_environment_and_sleeps_out_each_op(monkeypatch):
    pace = ComputePace(fwd_s_per_layer=0.02, bwd_s_per_layer=0.04)
    for k, v in pace.to_env().items():
        monkeypatch.setenv(k, v)
    assert ComputePace.from_env() == pace
    assert pace.op_s("F", 3) == pytest.approx(0.06) and pace.op_s("B", 3) == pytest.approx(0.12)
    slept = []
    monkeypatch.setattr(links.time, "time", lambda: 100.05)
    monkeypatch.setattr(links.time, "sleep", slept.append)
    pace.hold("B", 3, started_s=100.0)  # 50 ms of the op's 120 ms done: the rest is slept
    pace.hold("F", 2, started_s=99.0)   # already longer than its pace: no sleep
    assert slept == [pytest.approx(0.07)]
    monkeypatch.setenv(next(iter(pace.to_env())), "slow")
    with pytest.raises(InputError):
        ComputePace.from_env()
    with pytest.raises(InputError):
        ComputePace(fwd_s_per_layer=-1.0, bwd_s_per_layer=0.0)


def test_each_stage_takes_its_own_ranks_measured_time():
    from sailor_core.profiles import default_profile_db

    plan = bench.plan_for("small", 2, 4)
    profile = default_profile_db().get("small", "cpu", 1, 1)
    work = [bench.stage_work_s(plan, profile, st) for st in plan.stages]
    # rank 0 spent twice its profile's work per step (on a CPU or waiting for one), rank 1 three times
    per_rank = {"0": [2 * work[0] * 3 - 0.1, 0.1, 3], "1": [3 * work[1] * 5, 0.0, 5]}
    factors = bench.stage_factors(plan, profile, per_rank)
    assert factors == pytest.approx([2.0, 3.0])
    scaled = bench.stage_scaled_profile(plan, profile, factors)
    for stage, k in zip(plan.stages, factors):
        for i in range(stage.layer_start, stage.layer_end):
            assert scaled.layers[i].fwd_s == pytest.approx(k * profile.layers[i].fwd_s)
            assert scaled.layers[i].bwd_s == pytest.approx(k * profile.layers[i].bwd_s)
    # the optimizer step, one rate for the whole model, by the stages' median
    assert scaled.update_s_per_param == pytest.approx(2.5 * profile.update_s_per_param)


@pytest.mark.slow  # an engine launch of two workers, ~20 s on the shared 2-core VM
def test_a_slow_links_latency_costs_what_the_simulator_charges(tmp_path):
    # 2 stages of tiny, 4 micro-batches, 50 ms each way: the links, not the compute, make the step:
    # five one-way latencies of 1F1B plus the embedding group's ring (tiny ties its embeddings:
    # the first and the last stage sum the matrix's gradient, 2 more latencies), 0.36 s.
    latency, bandwidth = 0.05, 1e9
    plan = bench.plan_for("tiny", 2, 4)
    predicted = simulate(plan, network=bench.shim_network(latency, bandwidth)).iteration_time_s
    free = simulate(plan, network=bench.shim_network(0.0, 1e18)).iteration_time_s
    assert free < 0.1 * predicted
    measured = statistics.median(bench.measure(plan, latency, bandwidth, 3, tmp_path, timeout_s=120))
    # other jobs on the machine only lengthen steps; a model without the links' latency is 10x off
    assert 0.8 * predicted < measured < 1.6 * predicted
