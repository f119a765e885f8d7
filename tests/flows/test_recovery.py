"""The train-job flow's rules between attempts (sailor_core.job.recovery), without a flow run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sailor_core.controller import Action, Decision, EventKind, PlanOption
from sailor_core.job import recovery
from sailor_core.job import state as js
from sailor_core.job.attempts import INSTANCE_PREEMPTED, LOST, WORKER_FAILED, AttemptOutcome
from sailor_core.job.spec import JobSpec
from sailor_core.plan.types import load_plan

OPTION = PlanOption(gpus={("T4", "us-east-1a"): 2}, throughput_samples_per_s=5.0, usd_per_hr=0.4,
                    label="2xT4@us-east-1a")


def _job(*ids: str, steps: int = 20) -> js.JobState:
    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=steps), job_id="j")
    return js.with_instances_launched(s, tuple(
        js.InstanceRecord(instance_id=i, cloud="gcp", zone="us-east-1a", instance_type="n1-t4", gpu="T4", num_gpus=1,
                          usd_per_hr=0.2, spot=True, attempt=1, launched_unix_s=0.0) for i in ids))


def test_instances_an_attempt_lost_to_a_preemption_are_closed_as_preemptions_at_once():
    # The cloud may still call them "stopping" (their notice window); closing them now keeps the
    # re-provisioning that follows from closing them as merely terminated.
    s = _job("a", "b", "c")
    outcome = AttemptOutcome(kind=INSTANCE_PREEMPTED, instance_ids=("a", "b"), reason="preempted: a, b")
    s = recovery.close_preempted(s, outcome)
    assert {i.instance_id: i.end_reason for i in s.instances} == {"a": "preempted", "b": "preempted", "c": None}
    assert s.num_preemptions == 2
    s = js.with_instances_ended(s, {"a", "b", "c"}, "terminated")  # what re-provisioning does later
    assert [i.end_reason for i in s.instances] == ["preempted", "preempted", "terminated"]
    assert s.num_preemptions == 2


@pytest.mark.parametrize("kind", [LOST, WORKER_FAILED])
def test_other_endings_leave_the_instance_records_to_the_cloud(kind):
    s = _job("a")
    assert recovery.close_preempted(s, AttemptOutcome(kind=kind, instance_ids=("a",))) is s


def test_a_stop_is_success_only_when_the_checkpoints_reach_the_target():
    s = _job(steps=10)
    assert recovery.status_when_stopped(s) == js.STOPPED_BUDGET
    assert recovery.status_when_stopped(js.with_progress(s, last_checkpoint_step=5)) == js.STOPPED_BUDGET
    assert recovery.status_when_stopped(js.with_progress(s, last_checkpoint_step=10)) == js.SUCCEEDED


def test_reasons_say_in_words_why_the_plan_was_needed_once():
    rec = recovery.start(_job())
    assert rec.event.kind == EventKind.START and rec.cause == ""
    rec, reason = recovery.choose(rec, Decision(action=Action.REPLAN, reason="start: 2xT4@us-east-1a", plan=OPTION))
    assert reason == "planned on 2 T4 in us-east-1a"
    resumed = js.with_plan(_job(), plan={"model": "tiny"}, reason="start", usd_per_hr=0.4, throughput_samples_per_s=5.0)
    rec = recovery.start(js.with_progress(resumed, last_checkpoint_step=5))
    rec, reason = recovery.choose(rec, Decision(action=Action.REPLAN, reason="best plan", plan=OPTION))
    assert reason == "a new flow run picked the job up at step 5; re-planned on 2 T4 in us-east-1a"
    assert rec.cause == ""
    rec = recovery.Recovery(event=rec.event, current=OPTION, cause="worker exited non-zero at step 7")
    rec, reason = recovery.choose(rec, Decision(action=Action.CONTINUE, reason="keep going", plan=OPTION))
    assert reason == "worker exited non-zero at step 7; restarted the same plan on 2 T4 in us-east-1a"


def test_a_preemption_is_told_in_plain_words():
    # The example: "preemption: lost 4xT4@us-central1-a: 2xT4@us-central1-a" said less than this.
    s = js.with_progress(_job("a", "b", "c"), steps_done=12)
    s = js.with_instances_ended(s, {"c"}, "terminated", now_unix_s=-1.0)  # ended before this attempt
    s = js.with_plan(s, plan={}, reason="x", usd_per_hr=0.4, throughput_samples_per_s=5.0, now_unix_s=0.0)
    s = recovery.close_preempted(s, AttemptOutcome(kind=INSTANCE_PREEMPTED, instance_ids=("a", "b")))
    rec = recovery.after_attempt(recovery.start(s), s, AttemptOutcome(kind=INSTANCE_PREEMPTED, instance_ids=("a", "b")),
                                 ran=OPTION, checkpoint_before=None)
    assert rec.cause == "spot preemption took 2 of 2 T4s in us-east-1a at step 12"
    moved = dataclasses.replace(OPTION, gpus={("T4", "us-east-1b"): 2})
    _, reason = recovery.choose(rec, Decision(action=Action.REPLAN, reason="preemption: lost 2xT4", plan=moved))
    assert reason == "spot preemption took 2 of 2 T4s in us-east-1a at step 12; re-planned on 2 T4 in us-east-1b"


def test_an_attempt_starts_running_and_later_ones_recover():
    plan = load_plan(Path(__file__).resolve().parents[2] / "examples" / "plan_tiny.json")
    option = dataclasses.replace(OPTION, plan=plan)
    s = recovery.start_attempt(_job(), option, "first")
    assert s.plan == plan.to_dict() and s.replans[-1].usd_per_hr == 0.4
    assert (s.attempt, s.status) == (1, js.RUNNING)
    s = recovery.start_attempt(s, option, "again")
    assert (s.attempt, s.status, s.replans[-1].reason) == (2, js.RECOVERING, "again")


def test_waits_run_out_unless_a_launch_works():
    rec = recovery.start(_job())
    for _ in range(recovery.MAX_WAITS):
        rec = recovery.waited(rec)
    assert not rec.out_of_waits
    rec = recovery.no_capacity(rec)
    assert rec.out_of_waits and rec.event.kind == EventKind.CAPACITY and rec.current is None
    assert rec.cause == "no capacity for the last plan"
    assert recovery.no_capacity(rec, "no T4 in us-east-1a").cause == "no capacity for the last plan (no T4 in us-east-1a)"
    assert recovery.launched(rec).num_waits == 0


def test_after_a_preemption_the_controller_hears_which_gpus_were_lost():
    s = _job("a", "b")
    outcome = AttemptOutcome(kind=INSTANCE_PREEMPTED, instance_ids=("a",), reason="preempted: a")
    rec = recovery.after_attempt(recovery.start(s), s, outcome, ran=OPTION, checkpoint_before=None)
    assert rec.event.kind == EventKind.PREEMPTION and rec.event.lost == {("T4", "us-east-1a"): 1}
    assert rec.event.zone_hint == "us-east-1a" and rec.current is OPTION
    assert rec.cause == "spot preemption took 1 of 2 T4s in us-east-1a at step 0"


def test_attempts_without_a_new_checkpoint_stall_the_job():
    s = js.with_progress(_job("a"), last_checkpoint_step=5)
    crash = AttemptOutcome(kind=WORKER_FAILED, instance_ids=("a",), reason="worker exited non-zero")
    rec = recovery.start(s)
    for _ in range(recovery.MAX_ATTEMPTS_WITHOUT_PROGRESS - 1):
        rec = recovery.after_attempt(rec, s, crash, ran=OPTION, checkpoint_before=5)
        assert rec.event.kind == EventKind.CAPACITY and not rec.stalled
    assert recovery.after_attempt(rec, js.with_progress(s, last_checkpoint_step=10), crash, ran=OPTION,
                                  checkpoint_before=5).num_without_progress == 0
    rec = recovery.after_attempt(rec, s, crash, ran=OPTION, checkpoint_before=5)
    assert rec.stalled
    assert recovery.stalled_reason(rec, crash) == "3 attempts without a new checkpoint; last: worker exited non-zero"


def test_gpus_a_failover_placed_elsewhere_count_as_available():
    available = {("T4", "us-east-1a"): 1, ("T4", "us-east-1b"): 2}
    placed = {("T4", "us-east-1a"): 2, ("T4", "us-west-1a"): 1}
    assert recovery.available_with(available, placed) == {
        ("T4", "us-east-1a"): 2, ("T4", "us-east-1b"): 2, ("T4", "us-west-1a"): 1}


def test_a_body_that_raised_ends_from_the_newest_state():
    older = _job()
    newer = js.with_progress(older, steps_done=4)
    ended = recovery.ended_by_exception(older, newer, KeyboardInterrupt(), cancelled=True)
    assert (ended.status, ended.steps_done) == (js.CANCELLED, 4)
    assert ended.status_reason == (f"stopped at once (Ctrl-C) at step 4; no checkpoint yet; continue with "
                                   f"`sailor train --job-id {older.job_id}`")
    ended = recovery.ended_by_exception(newer, older, RuntimeError("boom\nmore"), cancelled=False)
    assert (ended.status, ended.steps_done, ended.status_reason) == (js.FAILED, 4, "RuntimeError: boom")
