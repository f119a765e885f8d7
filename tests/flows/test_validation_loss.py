"""The validation loss on its way from rank 0's metrics line to the job state (no processes here)."""

from __future__ import annotations

import json

from sailor_core.job import state as js
from sailor_core.job.protocol import PROTOCOL_VERSION, AgentState, AgentStatus, StepReport, read_metrics_line
from sailor_core.job.spec import JobSpec


def test_a_step_line_may_carry_val_loss():
    assert read_metrics_line('{"step": 10, "loss": 5.5, "samples_per_s": 3.0, "val_loss": 5.75}') == StepReport(
        step=10, loss=5.5, samples_per_s=3.0, val_loss=5.75)
    assert read_metrics_line('{"step": 9, "loss": 5.5}').val_loss is None


def test_agent_status_carries_val_losses_and_reads_documents_without_them():
    st = AgentStatus(instance_id="i-1", generation=2, state=AgentState.RUNNING, step=10,
                     losses=((9, 5.6), (10, 5.5)), val_losses=((10, 5.75),))
    data = json.loads(json.dumps(st.to_dict()))
    assert data["version"] == PROTOCOL_VERSION and data["val_losses"] == [[10, 5.75]]
    assert AgentStatus.from_dict(data) == st
    del data["val_losses"]  # an agent written before the field: same protocol version
    assert AgentStatus.from_dict(data).val_losses == ()


def test_the_agent_forwards_rank_0s_validation_losses(tmp_path):
    from sailor_core.runtime.agent import Agent, _Generation

    gen = _Generation(number=2, log_dir=tmp_path)
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 6.0}\n{"step": 2, "loss": 5.9, "val_loss": 6.1}\n{"step": 3, "loss": 5.8}\n')
    Agent._read_metrics(gen)
    assert gen.losses == [(1, 6.0), (2, 5.9), (3, 5.8)] and gen.val_losses == [(2, 6.1)]


def test_the_job_state_keeps_validation_losses_beside_the_losses(tmp_path):
    from tasks.workers import _merge_progress

    state = js.new_job(JobSpec(budget_usd=1, steps=20), job_id="j")
    old = AgentStatus(instance_id="i-1", generation=2, state=AgentState.PREEMPTED, step=12,
                      losses=((10, 5.5), (12, 5.4)), val_losses=((10, 5.8),))
    new = AgentStatus(instance_id="i-1", generation=4, state=AgentState.RUNNING, step=20,
                      losses=((11, 5.45), (20, 5.0)), val_losses=((10, 5.79), (20, 5.2)), previous=old)
    state = _merge_progress(state, {"i-1": new}, generation=4)
    assert state.val_losses == ((10, 5.79), (20, 5.2)) and state.last_val_loss == 5.2  # a redone step's newer value
    store = js.JobStore(str(tmp_path))
    store.save(state)
    assert store.load("j").val_losses == state.val_losses
    data = js.state_to_dict(state)
    del data["val_losses"]  # a state saved before validation losses existed
    assert js.state_from_dict(data).val_losses == () and js.state_from_dict(data).last_val_loss is None

    from tasks.reporting import progress_description

    assert progress_description(state) == "step 20/20, loss 5.0, val loss 5.2000, attempt 0"
