"""A job's record of its checkpoints, a person's request to stop it, and the settings a continued job keeps."""

from __future__ import annotations

import dataclasses

import pytest

from sailor_core.job import state as js
from sailor_core.job.protocol import AgentState, AgentStatus, CheckpointReport
from sailor_core.job.spec import JobSpec, JobSpecError, continued_spec, raised_limits, raised_words


def _state(**kw) -> js.JobState:
    return js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=200, **kw), "job-1")


def test_the_newest_checkpoint_is_kept_with_its_url_and_time_through_the_store(tmp_path):
    store = js.JobStore(str(tmp_path))
    record = js.CheckpointRecord(step=40, url="s3://b/job-1/checkpoints/step_00000040", at_unix_s=1234.5)
    state = js.with_checkpoint(js.with_progress(_state(), steps_done=43), record)
    store.save(state)
    loaded = store.load("job-1")
    assert loaded.last_checkpoint == record and loaded.last_checkpoint_step == 40
    assert js.with_checkpoint(loaded, record) is loaded  # the same news changes nothing


def test_a_checkpoint_in_an_agents_status_survives_its_json():
    report = CheckpointReport(step=50, url="file:///x/step_00000050", unix_s=99.0)
    status = AgentStatus(instance_id="i-1", generation=2, state=AgentState.RUNNING, checkpoint=report,
                         previous=AgentStatus(instance_id="i-1", generation=0, state=AgentState.PREEMPTED))
    back = AgentStatus.from_dict(status.to_dict())
    assert back.checkpoint == report and back.previous.checkpoint is None


def test_a_stop_request_is_read_until_a_new_flow_run_clears_it(tmp_path):
    store = js.JobStore(str(tmp_path))
    assert store.stop_request("job-1") is None
    store.request_stop("job-1", js.StopRequest(by="Ctrl-C", at_unix_s=5.0))
    assert store.stop_request("job-1") == js.StopRequest(by="Ctrl-C", at_unix_s=5.0)
    store.clear_stop("job-1")
    assert store.stop_request("job-1") is None
    store.clear_stop("job-1")  # nothing to clear is no error


def test_a_stopped_job_says_where_it_stopped_what_it_kept_and_how_to_go_on():
    state = js.with_checkpoint(js.with_progress(_state(), steps_done=547),
                               js.CheckpointRecord(step=545, url="u"))
    assert js.stopped_reason(state, "Ctrl-C") == ("stopped by the user (Ctrl-C) at step 547; checkpoint 545 saved; "
                                                  "continue with `sailor train --job-id job-1`")
    assert "no checkpoint yet" in js.stopped_reason(_state(), "`sailor stop`")


def test_a_continued_job_keeps_its_settings_and_may_only_raise_budget_and_steps():
    recorded = _state(checkpoint_every_steps=10).spec
    assert continued_spec(recorded, {}) is recorded
    assert continued_spec(recorded, {"model": "tiny", "checkpoint_every_steps": 10}) is recorded  # the same: fine
    raised = continued_spec(recorded, {"budget_usd": 1.0, "steps": 400})
    assert (raised.budget_usd, raised.steps, raised.checkpoint_every_steps) == (1.0, 400, 10)
    assert raised_words(recorded, raised) == "budget 0.5 -> 1 USD, steps 200 -> 400"
    with pytest.raises(JobSpecError) as lower:
        continued_spec(recorded, {"steps": 100})
    assert lower.value.field == "steps" and "below the job's 200" in lower.value.problem
    with pytest.raises(JobSpecError) as other:
        continued_spec(recorded, {"checkpoint_every_steps": 5})
    assert other.value.field == "checkpoint_every_steps" and "may only raise" in other.value.problem


def test_a_flow_run_takes_raised_limits_and_nothing_else():
    recorded = _state().spec
    asked = dataclasses.replace(recorded, steps=300)
    assert raised_limits(recorded, asked) == asked
    assert raised_limits(recorded, dataclasses.replace(recorded, steps=100)) is None
    assert raised_limits(recorded, dataclasses.replace(asked, learning_rate=0.5)) is None
