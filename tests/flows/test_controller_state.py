"""The train-job flow's controller sees the preemptions its job has seen, as the replay's does."""

from __future__ import annotations

import pytest

from sailor_core.job import state as js

from sailor_core.job.spec import JobSpec
from tasks.control import controller_state


def test_the_flows_controller_state_carries_the_jobs_preemption_rates():
    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=20), job_id="j1")
    rec = dict(cloud="aws", instance_type="g4dn.xlarge", gpu="T4", num_gpus=1, usd_per_hr=0.5, spot=True,
               attempt=1, launched_unix_s=0.0)
    s = js.with_instances_launched(s, (js.InstanceRecord(instance_id="a", zone="us-east-1a", **rec),
                                       js.InstanceRecord(instance_id="b", zone="us-east-1b", **rec)))
    s = js.with_instances_ended(s, {"a"}, "preempted", now_unix_s=600.0)
    state = controller_state(s, available={("T4", "us-east-1a"): 1, ("T4", "us-east-1b"): 1}, current=None,
                             now_unix_s=7200.0)
    assert state.preemption_rate_per_s == {("T4", "us-east-1a"): pytest.approx(1 / 7200)}


def _job(**spec):
    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=20, **spec), job_id="j2")
    rec = dict(cloud="gcp", instance_type="n1-standard-4-t4", gpu="T4", num_gpus=1, usd_per_hr=0.15, spot=True,
               attempt=1, launched_unix_s=s.created_unix_s)
    s = js.with_instances_launched(s, (js.InstanceRecord(instance_id="a", zone="us-central1-a", **rec),))
    return js.with_instances_ended(s, {"a"}, "preempted", now_unix_s=s.created_unix_s + 20)


def test_the_jobs_deadline_objective_and_floor_reach_the_controller():
    from tasks.control import controller_config

    s = _job(objective="cost", deadline_h=2.0, min_throughput_samples_per_s=10.0)
    state = controller_state(s, available={}, current=None, now_unix_s=s.created_unix_s + 1800)
    assert state.time_left_s == pytest.approx(1.5 * 3600)
    config = controller_config(5.0, s.spec)
    assert (config.objective, config.min_throughput_samples_per_s, config.shutdown_s) == ("cost", 10.0, 5.0)
    assert controller_config(5.0).objective == "throughput"
    no_deadline = _job()
    assert controller_state(no_deadline, available={}, current=None, now_unix_s=0.0).time_left_s == float("inf")


def test_a_short_job_counts_its_preemptions_over_its_own_length():
    # 1 preemption, 40 s in, half done: the job's expected length (80 s) is the rate's window, not an hour.
    s = js.with_progress(_job(), steps_done=10, losses=[], val_losses=[])
    state = controller_state(s, available={}, current=None, now_unix_s=s.created_unix_s + 40)
    assert state.preemption_rate_per_s == {("T4", "us-central1-a"): pytest.approx(1 / 80)}


def test_the_recorded_reason_carries_the_controllers_economics_in_words():
    from sailor_core.controller import Action, Decision, Event, EventKind, PlanOption
    from sailor_core.job import recovery

    option = PlanOption(gpus={("T4", "us-central1-b"): 1}, throughput_samples_per_s=1.0, usd_per_hr=0.15)
    rec = recovery.Recovery(event=Event(kind=EventKind.PREEMPTION), cause="spot preemption took 1 of 1 T4s")
    decision = Decision(action=Action.REPLAN, reason="technical", plan=option,
                        why="left T4 in us-central1-a unused (preempted 45 times an hour)")
    _, reason = recovery.choose(rec, decision)
    assert reason == ("spot preemption took 1 of 1 T4s; re-planned on 1 T4 in us-central1-b; "
                      "left T4 in us-central1-a unused (preempted 45 times an hour)")
