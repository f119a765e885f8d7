"""The flow's wait for new instances' standby workers before their first assignment
(tasks/workers.wait_standby), against real agents' reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sailor_core import settings
from sailor_core.job.protocol import AgentState, AgentStatus, read_status, write_status
from tasks import agent_watch
from tasks.workers import wait_standby


class Cloud:
    """The cloud's side of a session (every instance running, no boot failure); the agents'
    documents are real, under ``jobs_url``."""

    def __init__(self, jobs_url: str) -> None:
        self.jobs_url = jobs_url

    def instance_states(self, ids):
        return {i: "running" for i in ids}

    def boot_failures(self, ids):
        return {}


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(agent_watch, "POLL_S", 0.05)


def _agent(tmp_path: Path, iid: str, standby: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", str(tmp_path / "job"),
                             "--instance-id", iid, "--work-dir", str(tmp_path / iid), "--standby", standby],
                            env={**os.environ, settings.NOTICE_S_ENV: "5"}, start_new_session=True)


def _end(agent: subprocess.Popen) -> None:
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()


def test_the_wait_ends_when_the_standby_workers_are_ready_and_skips_agents_without(tmp_path: Path, fast):
    job_url = str(tmp_path / "job")
    with_standby, without = _agent(tmp_path, "i-a", "1"), _agent(tmp_path, "i-b", "0")
    try:
        # Asked as the cloud says they run: neither agent has reported yet.
        words = wait_standby(Cloud(job_url), ["i-a", "i-b"], timeout_s=300.0)
        a, b = read_status(job_url, "i-a"), read_status(job_url, "i-b")
        assert (a.num_standby, a.num_standby_ready, a.generation) == (1, 1, -1)  # imported and parked
        assert (b.num_standby, b.num_standby_ready) == (0, 0)
        assert words.startswith("waited ") and words.endswith(
            " s for the standby workers of 2 new instances: 1 of 1 ready; 1 without standby workers (not waited for)")
    finally:
        _end(with_standby)
        _end(without)


def test_the_wait_is_bounded_and_says_what_it_did_not_get(tmp_path: Path, fast):
    job_url = str(tmp_path / "job")
    write_status(job_url, "i-slow", AgentStatus(instance_id="i-slow", generation=-1, state=AgentState.IDLE,
                                                num_standby=2, num_standby_ready=1))
    start = time.monotonic()
    words = wait_standby(Cloud(job_url), ["i-slow", "i-silent"], timeout_s=0.5)
    assert time.monotonic() - start >= 0.5
    assert words.endswith(": 1 of 2 ready; assigning without the rest after 0.5 s (1 agent not reporting yet)")


def test_the_wait_ends_when_the_interim_stops_training(tmp_path: Path, fast):
    job_url = str(tmp_path / "job")
    write_status(job_url, "i-new", AgentStatus(instance_id="i-new", generation=-1, state=AgentState.IDLE,
                                               num_standby=1, num_standby_ready=0))
    write_status(job_url, "i-old", AgentStatus(instance_id="i-old", generation=4, state=AgentState.FAILED))
    words = wait_standby(Cloud(job_url), ["i-new"], training=["i-old"], generation=4, timeout_s=300.0)
    assert words.endswith(": 0 of 1 ready; the interim stopped training")
    # A report of the interim's previous generation is not its stop.
    write_status(job_url, "i-old", AgentStatus(instance_id="i-old", generation=3, state=AgentState.EXITED))
    assert "assigning without the rest" in wait_standby(Cloud(job_url), ["i-new"], training=["i-old"],
                                                        generation=4, timeout_s=0.3)


def test_no_new_instance_no_wait():
    assert wait_standby(Cloud("unused"), []) is None
