"""Regression (2840e8c): a preempted instance still in its notice window when the flow re-provisions.

The embedded cloud keeps a preempted GCE instance STOPPING for ``notice_s`` before it ends it.
With the default 2 s notice the flow re-provisioned inside that window only now and then, and
when it did, provisioning saw "stopping" (not "preempted") and closed the record as merely
terminated: the job counted one preemption too few.  Here the notice outlasts the whole
re-plan, so the flow always re-provisions while the instance is still stopping.

Slow (~25 s): the rule itself (``sailor_core.job.recovery.close_preempted``) has a fast test
in tests/flows/test_recovery.py, and the flow's preemption path runs in the default
tests/flows/test_train_job.py.
"""

from __future__ import annotations

import pytest

from sailor_core.job import state as js
from tests.flows.test_train_job import _assert_nothing_left

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Longer than detecting the preemption, stopping the attempt and re-provisioning take together
# (a few seconds here), far shorter than the rest of the job: the race is forced every time.
NOTICE_S = 30.0


@pytest.fixture
def long_notice(prefect_api):
    """The flow's in-process embedded cloud (cloud="embedded"), with a long preemption notice."""
    from infra.config import in_process_cloud

    cloud = in_process_cloud()
    saved = cloud.notice_s
    cloud.notice_s = NOTICE_S
    yield cloud
    cloud.notice_s = saved


def test_a_preemption_still_in_its_notice_at_re_provisioning_counts_as_a_preemption(long_notice):
    from flows.train_job import train_job

    steps, budget = 10, 0.05
    num_preemptions_before = len(long_notice.preemptions)
    # GCE shows a preempted instance STOPPING through its notice: the state the flow must not
    # take for an ordinary termination.
    summary = train_job(model="tiny", budget_usd=budget, steps=steps, preempt_at_steps=[5],
                        checkpoint_every_steps=5, global_batch_size=64, cloud="embedded", clouds=["gcp"], max_gpus=1,
                        max_gpus_per_zone=1)
    state = js.JobStore().load(summary["job_id"])

    (preemption,) = long_notice.preemptions[num_preemptions_before:]
    preempted = next(r for r in state.instances if r.instance_id == preemption["instance_id"])
    relaunched = [r for r in state.instances if r.attempt == 2]
    assert relaunched, "the job re-provisioned after the preemption"
    # The timing this test is about: the new instance was rented inside the old one's notice.
    assert min(r.launched_unix_s for r in relaunched) < preemption["time"] + NOTICE_S

    assert summary["status"] == "succeeded", summary
    assert summary["steps"] == steps
    assert preempted.end_reason == "preempted"
    assert summary["preemptions"] == 1 and state.num_preemptions == 1
    assert 0 < summary["usd_spent"] <= budget
    assert summary["instances_left_running"] == 0
    _assert_nothing_left(state)
