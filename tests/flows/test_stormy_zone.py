"""The controller's decisions in the train-job flow: a job preempted in a stormy zone settles on a stable one.

The same ``decide`` as the replay (tests/controller/test_economics.py covers its rule fast): the job's
own preemptions per zone, counted over the job's expected length when that is short, make a plan
in the zone that keeps preempting it expect restarts, so the re-plan moves to a zone that holds and
says so in the job's re-plan record (the ``replanned`` event's reason).  The embedded cloud keeps
preempting every instance the job might start again in the stormy zone.
"""

from __future__ import annotations

import threading

import pytest

from sailor_core.job import state as js
from tasks.reporting import JobEvent, add_event_listener, remove_event_listener
from tests.flows.test_train_job import _live_instances

# ~45 s (a Prefect flow, two attempts on the embedded cloud): the rule has fast tests in
# tests/controller/test_economics.py, the flow's state, terms and reasons in tests/flows/test_controller_state.py.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_job_preempted_in_a_stormy_zone_settles_on_a_stable_one(prefect_api):
    from flows.train_job import train_job
    from infra.config import in_process_cloud

    # Two zones with a T4 each (max_gpus_per_zone=1, max_gpus=2); tiny trains fastest on one.
    cloud = in_process_cloud()
    seen = len(cloud.preemptions)
    stop = threading.Event()
    stormy: list[str] = []

    def storm() -> None:
        """After the injected preemption, every instance that comes up in its zone is preempted too."""
        while not stop.wait(0.2):
            if not stormy and len(cloud.preemptions) > seen:
                stormy.append(cloud.preemptions[seen]["zone"])
            if stormy:
                for inst in cloud.live_instances():
                    if inst.zone == stormy[0]:
                        cloud.preempt(inst.instance_id, reason="storm")

    events: list[str] = []  # what the job tells its user as it goes (sailor train's terminal)

    def heard(event: JobEvent) -> None:
        if event.kind == "event":
            events.append(event.text)

    thread = threading.Thread(target=storm, daemon=True)
    thread.start()
    add_event_listener(heard)
    try:
        summary = train_job(model="tiny", budget_usd=0.05, steps=30, preempt_at_steps=[5],
                            checkpoint_every_steps=5, global_batch_size=64, cloud="embedded", max_gpus=2,
                            max_gpus_per_zone=1)
    finally:
        remove_event_listener(heard)
        stop.set()
        thread.join()
    state = js.JobStore().load(summary["job_id"])
    assert summary["status"] == "succeeded", summary
    assert summary["steps"] == 30 and summary["instances_left_running"] == 0
    (zone,) = stormy
    # One preemption, and the job never went back to the zone that took it.
    assert summary["preemptions"] == 1
    assert [r.end_reason for r in state.instances if r.zone == zone] == ["preempted"]
    # It settled on the stable zone: the plan that finished uses none of the stormy one.
    assert zone not in {rep["zone"] for stage in state.plan["stages"] for rep in stage["replicas"]}
    replan = state.replans[-1]
    assert replan.at_step > 0
    # The record and the job's events say why, in words: the zone left unused and how often it
    # preempted the job.
    assert f"left T4 in {zone} unused (preempted " in replan.reason, replan.reason
    said = [text for text in events if f"left T4 in {zone} unused (preempted " in text]
    assert said and said[-1].startswith("spot preemption took "), events
    assert not state.running_instances() and _live_instances(state.job_id) == []
