"""``--preempt-at`` on the embedded cloud: which preemption an attempt injects, who posts
it, and what a failed injection does.

Regression: with the tiny model (~30 steps a second) the workers ran on through the first
preemption's notice past the second ``--preempt-at`` step; the flow injected again at the
instance already being preempted, the embedded cloud answered 404 and the whole flow
failed.  Now each attempt carries one injection, posted by rank 0's agent as soon as its
workers reach the step, and a refused or failed one is a log line.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from infra.errors import CloudConfigError
from infra.records import PREEMPTED, job_labels
from sailor_core.job import state as js
from sailor_core.job.protocol import InjectionReport
from sailor_core.job.spec import JobSpec
from tasks.cloud_session import CloudSession
from tasks.workers import note_injection, preemption_for_attempt

LOG = logging.getLogger("test-preempt-injection")


def _state(*, steps_done: int, injected: tuple[int, ...] = ()) -> js.JobState:
    spec = JobSpec(model="tiny", budget_usd=0.05, steps=30, preempt_at_steps=(10, 20))
    state = js.with_progress(js.new_job(spec, job_id="inject"), steps_done=steps_done)
    for step in injected:
        state = js.with_injected_preemption(state, step)
    return state


def test_each_attempt_carries_the_next_injection_and_reports_are_noted_once():
    assert preemption_for_attempt(_state(steps_done=0)) == 10
    # The first attempt's workers ran on through the notice past step 20: the next attempt
    # carries the step-20 preemption (its agent posts it at its first own step).
    late = _state(steps_done=21, injected=(10,))
    assert preemption_for_attempt(late) == 20
    assert preemption_for_attempt(_state(steps_done=25, injected=(10, 20))) is None

    ok = InjectionReport(at_step=20, step=22, instance_id="i-1", ok=True)
    assert note_injection(late, ok, LOG).injected_preemption_steps == (10, 20)
    refused = InjectionReport(at_step=20, step=22, instance_id="i-1", ok=False, http_status=404, error="HTTP 404")
    assert note_injection(late, refused, LOG) is late, "refused: left for the next attempt"
    unreachable = InjectionReport(at_step=20, step=22, instance_id="i-1", ok=False, error="did not answer")
    assert note_injection(late, unreachable, LOG).injected_preemption_steps == (10, 20), "skipped, not retried"


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/sailor"


_RANK0_AGENT = """
import json, sys
from pathlib import Path
from sailor_core.job.protocol import InjectPreemption
from sailor_core.runtime.agent import Agent, _Generation
work, victim, control_url = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
agent = Agent(str(work / "job"), "rank0-host", work / "work")
gen = _Generation(number=2, losses=[[9, 5.0]],
                  inject=InjectPreemption(at_step=10, instance_id=victim, control_url=control_url))
agent._maybe_inject(gen)
before = gen.injected
gen.losses.append([11, 4.9])
agent._maybe_inject(gen)
agent.current = gen
agent._report(force=True)
print(json.dumps([before is None, gen.injected.step, gen.injected.ok, gen.injected.error]))
"""


def test_the_agent_posts_the_preemption_at_its_step_and_a_second_one_is_refused(tmp_path):
    """Rank 0's agent asks its own metadata server (it holds no control secret), which lets it
    preempt an instance of its own job; the controller's session asks the control API with the secret."""
    import sys

    from infra.config import in_process_cloud
    from tests.instance_calls import run_as

    cloud = in_process_cloud()
    provider = cloud.providers()["gcp"]
    labels = job_labels("inject-twice", 1)
    (inst, rank0) = provider.run_instances(zone="us-central1-a", instance_type="n1-standard-4-t4x1", count=2,
                                           labels=labels, startup_script="#!/bin/bash\nwhile true; do sleep 0.1; done\n")
    provider.wait_instances(labels, timeout_s=20)
    control_url = f"{cloud.gce_endpoint}/sailor"
    try:
        # Rank 0's agent (on the second instance, its workers' steps fed by hand) waits for step 10.
        ran = run_as(cloud, rank0.instance_id, [sys.executable, "-c", _RANK0_AGENT, str(tmp_path),
                                                inst.instance_id, control_url])
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout) == [True, 11, True, None]
        assert inst.instance_id in {p["instance_id"] for p in cloud.preemptions}
        status = json.loads((tmp_path / "job/agents/rank0-host/status.json").read_text())
        assert status["injected_preemption"]["ok"] is True

        # A second injection at the instance being preempted (what failed the flow) is an answer.
        secret = cloud.control_secret
        session = CloudSession(mode="embedded", job_id="x", jobs_url="", providers={}, control_url=control_url,
                               control_secret=secret)
        assert session.preempt(inst.instance_id) is False
        assert session.preempt("no-such-instance") is False
        with pytest.raises(CloudConfigError, match="HTTP 401"):  # the control API without its secret
            CloudSession(mode="embedded", job_id="x", jobs_url="", providers={},
                         control_url=control_url).preempt(rank0.instance_id)
        with pytest.raises(CloudConfigError, match="did not answer"):
            CloudSession(mode="embedded", job_id="x", jobs_url="", providers={},
                         control_url=_dead_url(), control_secret=secret).preempt(inst.instance_id)

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and PREEMPTED not in [i.state for i in provider.query_instances(labels)]:
            time.sleep(0.1)
        assert PREEMPTED in [i.state for i in provider.query_instances(labels)]
    finally:
        provider.terminate_instances(labels)
