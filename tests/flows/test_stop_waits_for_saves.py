"""The flow's wait for a stop's confirmation: past its timeout it keeps waiting for an agent that
still beats (its workers' stop saves make progress on a slow store), not for one that went quiet."""

from __future__ import annotations

import threading
import time

from sailor_core.job.protocol import AgentState, AgentStatus, write_status
from tasks.workers import _await_stop

RUN_GEN, STOP_GEN = 3, 4


def _report(job_url: str, iid: str, generation: int) -> None:
    write_status(job_url, iid, AgentStatus(instance_id=iid, generation=generation, state=AgentState.RUNNING,
                                           heartbeat_unix_s=time.time()))


def test_an_agent_still_beating_is_waited_for_past_the_timeout(tmp_path):
    job_url = str(tmp_path)
    _report(job_url, "i-a", RUN_GEN)
    done = threading.Event()

    def agent():  # beats for a while (its workers saving), then confirms the stop
        for _ in range(8):
            _report(job_url, "i-a", RUN_GEN)
            time.sleep(0.1)
        _report(job_url, "i-a", STOP_GEN)
        done.set()

    t = threading.Thread(target=agent)
    t.start()
    pending, saving = _await_stop(job_url, ["i-a"], STOP_GEN, timeout_s=0.05)
    t.join()
    assert done.is_set()
    assert pending == set() and saving == {"i-a"}


def test_an_agent_gone_quiet_is_given_up_at_the_timeout(tmp_path):
    job_url = str(tmp_path)
    write_status(job_url, "i-b", AgentStatus(instance_id="i-b", generation=RUN_GEN, state=AgentState.RUNNING,
                                             heartbeat_unix_s=time.time() - 60))
    _report(job_url, "i-c", STOP_GEN)
    pending, saving = _await_stop(job_url, ["i-b", "i-c"], STOP_GEN, timeout_s=0.05)
    assert pending == {"i-b"} and saving == set()
