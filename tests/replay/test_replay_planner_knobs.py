"""The replay's planner requests: which micro-batch sizes the optional probe picks, and
that it leaves a small replay's answer alone."""

from types import SimpleNamespace

from sailor_core.controller import PlanOption
from sailor_core.replay import run_policies
from sailor_core.replay.run import probed_micro_batch_sizes
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import build_trace

A = ("A100-40", "us-central1-a")
B = ("A100-40", "us-east1-b")
V = ("V100-16", "us-central1-a")


def fake_planner(mbs_by_gpu, seen):
    def plan(avail):
        seen.append(dict(avail))
        gpu = next(iter(avail))[0]
        return [PlanOption(gpus=dict(avail), throughput_samples_per_s=1.0, usd_per_hr=1.0,
                           plan=SimpleNamespace(micro_batch_size=b)) for b in mbs_by_gpu[gpu]]
    return plan


def test_sizes_span_half_the_smallest_to_twice_the_largest_on_each_types_peak_pools():
    trace = build_trace([(0.0, {A: 4, B: 2, V: 8}), (60.0, {A: 8, B: 1, V: 2})])
    seen = []
    sizes = probed_micro_batch_sizes(trace, fake_planner({"A100-40": [4, 2], "V100-16": [1]}, seen))
    assert sizes == (1, 2, 4, 8)
    assert seen == [{A: 8, B: 2}, {V: 8}]  # each type alone, every pool at its peak


def test_sizes_stop_at_the_planners_largest_default():
    trace = build_trace([(0.0, {A: 4})])
    assert probed_micro_batch_sizes(trace, fake_planner({"A100-40": [64, 32]}, [])) == (16, 32, 64)


def test_no_restriction_without_plans():
    trace = build_trace([(0.0, {A: 4})])
    assert probed_micro_batch_sizes(trace, lambda avail: []) is None
    no_plan = lambda avail: [PlanOption(gpus=dict(avail), throughput_samples_per_s=1.0, usd_per_hr=1.0)]  # noqa: E731
    assert probed_micro_batch_sizes(trace, no_plan) is None


def test_probed_sizes_leave_a_small_real_replay_unchanged():
    # One A100 pool that dips and returns, one V100 pool: real planner, both ways.
    trace = build_trace([(0.0, {A: 8, V: 4}), (3600.0, {A: 4, V: 4}), (7200.0, {A: 8, V: 4})])
    spec = ReplaySpec(trace="-", model="opt-350m", tokens=2e8, policy="ours,static")
    probed = run_policies(trace, spec, probe_micro_batches=True)
    everything = run_policies(trace, spec)  # the default: every size
    assert probed.micro_batch_sizes and 1 in probed.micro_batch_sizes and everything.micro_batch_sizes is None
    # The probe's own calls (one per GPU type) count as planner calls.
    assert len(probed.planner_call_log) == probed.planner_calls
    for name, r in everything.results.items():
        assert (probed.results[name].time_to_train_s, probed.results[name].usd_spent) == (r.time_to_train_s, r.usd_spent)
