"""The job protocol's documents (round trip, another version, malformed ones) and the instance
agent as a real process: assignment -> worker processes -> status; generations; SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sailor_core import settings
from sailor_core.errors import InputError
from sailor_core.job.protocol import (
    PROTOCOL_VERSION,
    AgentAction,
    AgentAssignment,
    AgentState,
    AgentStatus,
    InjectionReport,
    InjectPreemption,
    ProtocolError,
    StepReport,
    WorkerEvent,
    read_assignment,
    read_metrics_line,
    read_status,
    write_assignment,
    write_status,
)

TINY_PLAN = {"model": "tiny", "global_batch_size": 2, "micro_batch_size": 1,
             "stages": [{"layers": [0, 4], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local"}]}]}


def _wait_status(job_url: str, iid: str, pred, timeout_s: float = 120.0) -> AgentStatus:
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
                             env={**os.environ, settings.NOTICE_S_ENV: "5"}, start_new_session=True)
    try:
        _wait_status(job_url, iid, lambda st: st.state == AgentState.IDLE, timeout_s=60)
        # Generation 2: a world size the plan does not have -> the worker refuses with its bad-input code.
        write_assignment(job_url, iid, AgentAssignment(
            generation=2, action=AgentAction.RUN, plan=TINY_PLAN, ranks=(0,), world_size=2,
            master_addr="127.0.0.1", master_port=29999, steps=3, data=str(tmp_path / "none.npy"),
            ckpt_url=str(tmp_path / "ckpt"), ckpt_every=1))
        st = _wait_status(job_url, iid, lambda st: st.generation == 2 and st.state == AgentState.FAILED)
        assert st.exit_codes == {0: 2}
        log = Path(st.log_dir) / "rank0.log"
        assert "WORLD_SIZE" in log.read_text()
        # Generation 3 stops: the previous generation's last report is kept under "previous".
        write_assignment(job_url, iid, AgentAssignment(generation=3, action=AgentAction.STOP))
        st = _wait_status(job_url, iid, lambda st: st.generation == 3)
        assert st.state == AgentState.IDLE and st.previous.generation == 2
        assert st.previous.exit_codes == {0: 2} and st.previous.previous is None
        # A preemption's SIGTERM: the agent reports its last word and exits 128 + SIGTERM.
        os.killpg(agent.pid, signal.SIGTERM)
        assert agent.wait(timeout=30) == 128 + signal.SIGTERM
        assert read_status(job_url, iid).state == AgentState.PREEMPTED
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    assert json.loads((tmp_path / "job" / "agents" / iid / "assignment.json").read_text())["generation"] == 3


# ---- the documents -------------------------------------------------------------------------


def _assignment() -> AgentAssignment:
    return AgentAssignment(
        generation=4, attempt=2, plan=TINY_PLAN, ranks=(2, 3), world_size=4, master_addr="10.0.0.1",
        master_port=29500, steps=30, data="/data/tokens.npy", ckpt_url="s3://bucket/ckpt", ckpt_every=5,
        resume=True, seed=7, extra_worker_args=("--threads", "1"), env={"OMP_NUM_THREADS": "1"},
        inject_preemption=InjectPreemption(at_step=10, instance_id="i-2", control_url="http://127.0.0.1:1/sailor"))


def _status() -> AgentStatus:
    previous = AgentStatus(instance_id="i-1", generation=2, state=AgentState.EXITED, exit_codes={0: 0, 1: 0},
                           pids={0: 11, 1: 12}, losses=((1, 10.5), (2, 9.25)), step=2)
    return AgentStatus(
        instance_id="i-1", generation=4, state=AgentState.RUNNING, pids={2: 21, 3: 22}, log_dir="/w/gen4",
        step=12, losses=((11, 4.5), (12, 4.25)), samples_per_s=33.5,
        event=WorkerEvent(kind="p2p", fields={"bytes": 65536}),
        injected_preemption=InjectionReport(at_step=10, step=12, instance_id="i-2", ok=False, http_status=404,
                                            error="HTTP 404"),
        previous=previous, heartbeat_unix_s=1700000000.5)


def test_documents_round_trip_through_the_jobs_storage(tmp_path: Path):
    job_url = str(tmp_path / "job")
    assert read_assignment(job_url, "i-1") is None and read_status(job_url, "i-1") is None
    write_assignment(job_url, "i-1", _assignment())
    write_status(job_url, "i-1", _status())
    assert read_assignment(job_url, "i-1") == _assignment()
    assert read_status(job_url, "i-1") == _status()
    stop = AgentAssignment(generation=5, attempt=2, action=AgentAction.STOP)
    assert AgentAssignment.from_dict(json.loads(json.dumps(stop.to_dict()))) == stop
    # The JSON an agent of this version writes and reads: keys and values as in docs/CONTRACTS.md.
    raw = json.loads((tmp_path / "job" / "agents" / "i-1" / "status.json").read_text())
    assert raw["version"] == PROTOCOL_VERSION and raw["state"] == "running"
    assert raw["pids"] == {"2": 21, "3": 22} and raw["previous"]["exit_codes"] == {"0": 0, "1": 0}
    assert raw["losses"] == [[11, 4.5], [12, 4.25]] and raw["event"] == {"event": "p2p", "bytes": 65536}


@pytest.mark.parametrize("version", [None, 0, PROTOCOL_VERSION + 1, "1"])
def test_a_document_of_another_version_is_refused_in_one_line(version):
    for doc, kind in ((_assignment().to_dict(), AgentAssignment), (_status().to_dict(), AgentStatus)):
        data = {k: v for k, v in doc.items() if k != "version"}
        if version is not None:
            data["version"] = version
        with pytest.raises(ProtocolError, match=f"protocol version {version!r}, this Sailor speaks") as err:
            kind.from_dict(data)
        assert isinstance(err.value, InputError) and "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"generation": None}, "assignment has no 'generation'"),
    ({"generation": "4"}, "assignment: generation = '4' is not valid"),
    ({"action": "dance"}, "assignment: action = 'dance' is not valid"),
    ({"ranks": [0, "1"]}, "assignment: ranks"),
    ({"inject_preemption": {"at_step": 3}}, "inject_preemption has no 'instance_id'"),
    ({"module": "os"}, "not one of Sailor's"),
])
def test_a_malformed_assignment_is_refused_naming_the_field(change, message):
    data = {**_assignment().to_dict(), **change}
    with pytest.raises(ProtocolError, match=message) as err:
        AgentAssignment.from_dict(data)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"state": "dancing"}, "agent status: state = 'dancing' is not valid"),
    ({"exit_codes": {"zero": 1}}, "agent status: exit_codes"),
    ({"losses": [[1]]}, "agent status: losses"),
    ({"previous": {"generation": 1}}, "agent status is of protocol version None"),
    ({"instance_id": None}, "agent status has no 'instance_id'"),
])
def test_a_malformed_status_is_refused_naming_the_field(change, message):
    with pytest.raises(ProtocolError, match=message):
        AgentStatus.from_dict({**_status().to_dict(), **change})
    with pytest.raises(ProtocolError, match="not a JSON object"):
        AgentStatus.from_dict([1, 2])


def test_a_malformed_document_in_storage_raises_and_a_half_written_one_reads_as_none(tmp_path: Path):
    job_url = str(tmp_path / "job")
    path = tmp_path / "job" / "agents" / "i-1" / "assignment.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"generation": 2, "ac')  # being replaced (S3/rename make this rare): ask again
    assert read_assignment(job_url, "i-1") is None
    path.write_text(json.dumps({"generation": 2, "action": "run"}))  # an agent of before the protocol's version
    with pytest.raises(ProtocolError, match="protocol version None"):
        read_assignment(job_url, "i-1")


def test_metrics_lines_are_steps_events_or_nothing():
    assert read_metrics_line(b'{"step": 3, "loss": 2.5, "samples_per_s": 8}') == \
        StepReport(step=3, loss=2.5, samples_per_s=8.0)
    event = read_metrics_line('{"event": "result", "result": {"p2p": []}}')
    assert event == WorkerEvent(kind="result", fields={"result": {"p2p": []}}) and event.result == {"p2p": []}
    assert read_metrics_line(b'{"event": "p2p", "bytes": 1024}').num_bytes == 1024
    assert read_metrics_line(b'{"step": 3') is None and read_metrics_line(b"[]") is None
    assert read_metrics_line(b'{"event": 5}') is None


def test_an_agent_refuses_an_assignment_of_another_version_in_one_line(tmp_path: Path):
    job_url, iid = str(tmp_path / "job"), "i-old"
    path = tmp_path / "job" / "agents" / iid / "assignment.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**_assignment().to_dict(), "version": PROTOCOL_VERSION + 1}))
    out = subprocess.run([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                          "--instance-id", iid, "--work-dir", str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: assignment is of protocol version {PROTOCOL_VERSION + 1}, this Sailor speaks {PROTOCOL_VERSION}"]
    assert read_status(job_url, iid).state == AgentState.IDLE  # it had said it was up
