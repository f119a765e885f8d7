"""The instance agent as a real process: assignment -> worker processes -> status; generations; SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sailor_core.runtime.agent import read_status, write_assignment

TINY_PLAN = {"model": "tiny", "global_batch_size": 2, "micro_batch_size": 1,
             "stages": [{"layers": [0, 4], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local"}]}]}


def _wait_status(job_url: str, iid: str, pred, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = read_status(job_url, iid)
        if st and pred(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"status never matched; last: {read_status(job_url, iid)}")


def test_agent_runs_generations_and_reports_exit_codes_then_stops_on_sigterm(tmp_path: Path):
    job_url, iid = str(tmp_path / "job"), "i-test"
    agent = subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                              "--instance-id", iid, "--work-dir", str(tmp_path / "work")],
                             env={**os.environ, "SAILOR_NOTICE_S": "5"}, start_new_session=True)
    try:
        _wait_status(job_url, iid, lambda st: st["state"] == "idle", timeout_s=60)
        # Generation 2: a world size the plan does not have -> the worker refuses with its bad-input code.
        write_assignment(job_url, iid, {
            "generation": 2, "action": "run", "plan": TINY_PLAN, "ranks": [0], "world_size": 2,
            "master_addr": "127.0.0.1", "master_port": 29999, "steps": 3, "data": str(tmp_path / "none.npy"),
            "ckpt_url": str(tmp_path / "ckpt"), "ckpt_every": 1})
        st = _wait_status(job_url, iid, lambda st: st["generation"] == 2 and st["state"] == "failed")
        assert st["exit_codes"] == {"0": 2}
        log = Path(st["log_dir"]) / "rank0.log"
        assert "WORLD_SIZE" in log.read_text()
        # Generation 3 stops: the previous generation's last report is kept under "previous".
        write_assignment(job_url, iid, {"generation": 3, "action": "stop"})
        st = _wait_status(job_url, iid, lambda st: st["generation"] == 3)
        assert st["state"] == "idle" and st["previous"]["generation"] == 2
        # A preemption's SIGTERM: the agent reports its last word and exits 128 + SIGTERM.
        os.killpg(agent.pid, signal.SIGTERM)
        assert agent.wait(timeout=30) == 128 + signal.SIGTERM
        assert read_status(job_url, iid)["state"] == "preempted"
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    assert json.loads((tmp_path / "job" / "agents" / iid / "assignment.json").read_text())["generation"] == 3
