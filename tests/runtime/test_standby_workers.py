"""Standby workers (runtime/agent.py, park.py): a real agent starts its workers at boot, parked
without state, and hands its first generation to them as it hands a later one to survivors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.local.image import NVIDIA_SMI
from sailor_core import settings
from sailor_core.job.protocol import AgentState, read_status, write_assignment
from sailor_core.runtime import agent as agent_mod
from sailor_core.runtime import park
from sailor_core.ports import free_port
from tests.flows.test_agent import _wait_status

from .conftest import make_plan
from .test_parked_workers import _run, _started


def _standby_notes(park_dir: Path, num: int, timeout_s: float = 120.0) -> dict[int, park.Parked]:
    """The standby workers' notes by local rank, once ``num`` have parked."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        notes = [park.read_parked(park_dir, int(p.name.split(".")[0])) for p in park_dir.glob("*.parked.json")]
        notes = [n for n in notes if n is not None]
        if len(notes) == num:
            return {n.local_rank: n for n in notes}
        time.sleep(0.1)
    raise AssertionError(f"{num} standby workers never parked in {park_dir}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_first_assignment_is_a_handover_to_the_standby_workers(corpus, tmp_path: Path):
    job_url, ckpt, port, work = str(tmp_path / "job"), str(tmp_path / "ckpt"), free_port(), tmp_path / "i-a"
    agent = subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                              "--instance-id", "i-a", "--work-dir", str(work), "--standby", "3"],
                             env={**os.environ, settings.NOTICE_S_ENV: "10"}, start_new_session=True)
    try:
        # Before any assignment: three workers, parked without state, the agent idle.
        notes = _standby_notes(work / "parked", 3)
        assert sorted(notes) == [0, 1, 2]
        assert all(n.rank == park.STANDBY_RANK and n.step == -1 and _alive(n.pid) for n in notes.values())
        idle = _wait_status(job_url, "i-a", lambda st: st.num_standby_ready == 3)
        assert (idle.state, idle.generation, idle.num_standby, idle.standby_starting) == (AgentState.IDLE, -1, 3, False)

        # The first generation (two ranks) goes to standby workers 0 and 1; the third exits.
        plan = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])])
        write_assignment(job_url, "i-a", _run(1, plan, (0, 1), 2, port, corpus, ckpt, 3))
        gen1 = _wait_status(job_url, "i-a", lambda st: st.generation == 1 and st.state == AgentState.EXITED)
        assert gen1.pids == {0: notes[0].pid, 1: notes[1].pid}
        assert gen1.standby == (0, 1) and gen1.rejoined == () and gen1.exit_codes == {0: 0, 1: 0}
        assert (gen1.num_standby, gen1.num_standby_ready) == (3, 3)
        assert [step for step, _ in gen1.losses] == [1, 2, 3]
        assert _started(gen1)["state_from"] == "init" and _started(gen1)["ready_s"] >= 0
        assert not _alive(notes[2].pid)  # released (and reaped) at the handover
        assert list((work / "parked").glob("*.parked.json")) == []  # no note outlives its answer
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def test_standby_workers_exit_with_their_agent_on_sigterm(tmp_path: Path):
    work = tmp_path / "i-b"
    agent = subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", str(tmp_path / "job"),
                              "--instance-id", "i-b", "--work-dir", str(work), "--standby", "1"],
                             env={**os.environ, settings.NOTICE_S_ENV: "5"}, start_new_session=True)
    try:
        note = _standby_notes(work / "parked", 1)[0]
        os.killpg(agent.pid, signal.SIGTERM)  # the instance goes away before any assignment
        assert agent.wait(timeout=60) == 128 + signal.SIGTERM
        assert not _alive(note.pid)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def test_standby_counts_the_gpus_nvidia_smi_lists(tmp_path: Path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv(settings.EMBEDDED_GPUS_ENV, "2 T4")
    assert agent_mod.num_gpus() == 2
    monkeypatch.setenv(settings.EMBEDDED_GPUS_ENV, "0 none")  # nvidia-smi fails: no GPUs, no standby
    assert agent_mod.num_gpus() == 0


def test_a_bad_standby_count_is_refused_in_one_line(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", str(tmp_path / "job"),
                           "--instance-id", "i-c", "--work-dir", str(tmp_path / "w"), "--standby", "two"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --standby must be auto or a count, got 'two'"
