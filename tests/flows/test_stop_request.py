"""Ctrl-C's graceful stop (``flows.cli.stop.GracefulStop``) and the watch's record of the checkpoints agents report."""

from __future__ import annotations

import time

import pytest

from flows.cli.stop import GracefulStop
from sailor_core.job import state as js
from sailor_core.job.protocol import AgentState, AgentStatus, CheckpointReport
from sailor_core.job.spec import JobSpec
from tasks.workers import _merge_progress


def _status(generation: int, step: int, checkpoint: int | None, previous=None) -> AgentStatus:
    report = None if checkpoint is None else CheckpointReport(step=checkpoint, url=f"s3://b/step_{checkpoint}",
                                                              unix_s=float(checkpoint))
    return AgentStatus(instance_id="i-1", generation=generation, state=AgentState.RUNNING, step=step,
                       losses=((step, 1.0),), checkpoint=report, previous=previous)


def test_the_watch_records_the_newest_checkpoint_the_agents_report():
    state = js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=200), "job-1")
    state = _merge_progress(state, {"i-1": _status(2, 23, 20)}, generation=2)
    assert (state.steps_done, state.last_checkpoint_step, state.last_checkpoint.url) == (23, 20, "s3://b/step_20")
    assert state.last_checkpoint.at_unix_s == 20.0
    # a newer generation resumed from 20 and saved 30; its predecessor's last report (10) is older news
    state = _merge_progress(state, {"i-1": _status(4, 31, 30, previous=_status(2, 25, 10))}, generation=4)
    assert (state.steps_done, state.last_checkpoint_step) == (31, 30)
    # a later generation than the watched one (a stop's) is not the attempt's
    assert _merge_progress(state, {"i-1": _status(6, 40, 40)}, generation=4).last_checkpoint_step == 30


def test_the_first_ctrl_c_asks_for_a_stop_the_second_stops_at_once_further_ones_wait(tmp_path):
    store = js.JobStore(str(tmp_path))
    said: list[str] = []
    stop = GracefulStop(store, "job-1", say=said.append, grace_s=60.0)
    try:
        stop._on_sigint(2, None)
        deadline = time.monotonic() + 10
        while store.stop_request("job-1") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.stop_request("job-1").by == "Ctrl-C"
        assert stop.requested and not stop.at_once
        assert "final checkpoint" in said[0] and "Ctrl-C again to stop at once" in said[0]
        with pytest.raises(KeyboardInterrupt):
            stop._on_sigint(2, None)
        assert stop.at_once and "at once" in said[-1]
        stop._on_sigint(2, None)  # the instances are being terminated: no second interrupt of that
    finally:
        stop.uninstall()


def test_a_new_flow_run_drops_the_request_that_stopped_the_last_one_but_not_a_newer_one(tmp_path):
    from tasks.jobs import start_or_resume

    store = js.JobStore(str(tmp_path))
    spec = JobSpec(model="tiny", budget_usd=0.5, steps=200)
    store.request_stop("job-1", js.StopRequest(by="Ctrl-C", at_unix_s=time.time() - 60))
    store.save(js.with_status(js.new_job(spec, "job-1"), js.CANCELLED, "stopped by the user"))
    start_or_resume(store, spec, "job-1")
    assert store.stop_request("job-1") is None  # handled by the run that ended after it

    store.request_stop("job-1", js.StopRequest(by="Ctrl-C", at_unix_s=time.time() + 1))  # while this run starts
    start_or_resume(store, spec, "job-1")
    assert store.stop_request("job-1") is not None
