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
