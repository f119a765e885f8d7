"""A stop that arrives while a checkpoint is written in the background, on a slow store (every
upload waits: ``faults.arm_upload(every=True)``): a real agent and its workers.  The stop must
cost at most one checkpoint interval: the write in flight commits, the stop's own save follows,
and the agent waits for the workers while their saves make progress instead of killing them after
a fixed grace.  The resumed run ends with the uninterrupted run's parameters, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sailor_core import settings
from sailor_core.job.protocol import EXIT_PREEMPTED, AgentAction, AgentAssignment, AgentState, write_assignment
from sailor_core.ports import free_port
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime import faults
from sailor_core.runtime.agent import STOP_GRACE_S
from sailor_core.runtime.launch import launch_local
from tests.flows.test_agent import _wait_status

from .conftest import make_plan

TOTAL_STEPS = 16
EVERY = 4  # the checkpoint interval, in steps
# Each rank writes two layer files per checkpoint: a write takes twice this, longer than the agent's
# grace for a worker that makes no progress, so a fixed grace would kill the stop's saves.
UPLOAD_DELAY_S = STOP_GRACE_S * 0.7
WORKER_ARGS = ("--threads", "1", "--timeout-s", "60", "--validate-every", "0")


def _run(generation: int, plan, port: int, corpus, url: str, *, resume: bool) -> AgentAssignment:
    return AgentAssignment(generation=generation, action=AgentAction.RUN, plan=plan.to_dict(), ranks=(0, 1),
                           world_size=2, master_addr="127.0.0.1", master_port=port, steps=TOTAL_STEPS,
                           data=str(corpus), ckpt_url=url, ckpt_every=EVERY, resume=resume,
                           extra_worker_args=WORKER_ARGS)


def _layer_hashes(url: str, step: int) -> dict[str, str]:
    """The layer files' checksums of the checkpoint of ``step``: parameters and AdamW moments."""
    info = ckpt.read_checkpoint(ckpt.open_storage(url), ckpt.step_dirname(step))
    return {name: f["sha256"] for name, f in info.files.items() if name != ckpt.META}


def _started_step(log_dir: str) -> int:
    lines = (Path(log_dir) / "metrics.jsonl").read_text().splitlines()
    return next(json.loads(line)["step"] for line in lines if '"started"' in line)


@pytest.mark.slow  # two agent generations on a store that takes seconds per file, and a reference run
def test_a_stop_during_a_slow_background_write_loses_at_most_one_interval(corpus, tmp_path: Path):
    plan = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])])
    job_url, url, port, slow = str(tmp_path / "job"), str(tmp_path / "ckpt"), free_port(), tmp_path / "slow.json"
    faults.arm_upload(slow, delay_s=UPLOAD_DELAY_S, every=True)
    agent = subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                              "--instance-id", "i-a", "--work-dir", str(tmp_path / "work"), "--standby", "0"],
                             env={**os.environ, settings.NOTICE_S_ENV: "10", settings.FAULT_UPLOAD_ENV: str(slow)},
                             start_new_session=True)
    try:
        write_assignment(job_url, "i-a", _run(1, plan, port, corpus, url, resume=False))
        # The first periodic save is staged and its write under way: stop (a plan change's park).
        _wait_status(job_url, "i-a", lambda st: st.step is not None and st.step > EVERY)
        write_assignment(job_url, "i-a", AgentAssignment(generation=2, action=AgentAction.STOP))
        gen1 = _wait_status(job_url, "i-a", lambda st: st.generation == 2, timeout_s=300).previous
        stop_step, committed = gen1.step, ckpt.latest_valid_checkpoint(url)
        lost = stop_step - (committed.step if committed is not None else 0)
        assert lost <= EVERY, f"stopped at step {stop_step}, resumes from {committed and committed.step}"
        assert gen1.exit_codes == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}  # parked, none killed
        assert committed.step == stop_step  # the agent waited: the stop's own save is committed too

        slow.unlink()  # the store is fast again: the resumed run goes on to the end
        write_assignment(job_url, "i-a", _run(3, plan, port, corpus, url, resume=True))
        gen3 = _wait_status(job_url, "i-a", lambda st: st.generation == 3 and st.state == AgentState.EXITED,
                            timeout_s=300)
        assert gen3.exit_codes == {0: 0, 1: 0}
        assert stop_step - _started_step(gen3.log_dir) <= EVERY
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()

    ref_url = str(tmp_path / "ref")
    res = launch_local(plan, TOTAL_STEPS, data=corpus, ckpt_dir=ref_url, ckpt_every=EVERY, workdir=tmp_path / "ref-run",
                       timeout_s=240, worker_args=WORKER_ARGS)
    assert res.status == "ok", (res.message, res.stderr_tails)
    assert _layer_hashes(url, TOTAL_STEPS) == _layer_hashes(ref_url, TOTAL_STEPS)
