"""Ctrl-C on `sailor train` leaves nothing running (issue 7: every instance is terminated, also on cancellation;
issue 32: after a final checkpoint, tests/flows/test_stop_and_continue.py).

The job runs on a standalone embedded cloud (`python -m infra.local.daemon`, found through
``$SAILOR_HOME/cloud.json``), so its instances and their agent/worker processes outlive the
train process and can be checked after it exits.  SIGINT goes to the train process's whole
process group, as a terminal's Ctrl-C does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.local.confine import host_pid
from tests.flows.conftest import ROOT, home_pids

JOB_ID = "cancel-test"
STEPS = 1_000_000  # far more than the test waits for (hours of the tiny model): only the SIGINT ends it


def _env(home: Path, api_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(SAILOR_HOME=str(home), PYTHONPATH=str(ROOT), SAILOR_CLOUDS="embedded", PREFECT_API_URL=api_url,
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_HOME=str(home / "prefect"))
    env.pop("SAILOR_JOBS_URL", None)
    env.pop("SAILOR_DEBUG", None)  # the test checks the user-facing one-line message
    return env


def _stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.fixture()
def standalone_cloud(tmp_path, prefect_api):
    """A standalone embedded cloud in its own SAILOR_HOME; yields (home, cloud.json contents)."""
    home = tmp_path / "home"
    home.mkdir()
    log = open(home / "cloud.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "infra.local.daemon", "--notice-s", "2"],
                            env=_env(home, prefect_api), cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    try:
        deadline = time.monotonic() + 120
        state = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                state = json.loads((home / "cloud.json").read_text())
                if state.get("pid") == proc.pid:
                    break
            except (OSError, ValueError):
                pass
            state = None
            time.sleep(0.3)
        assert state is not None, f"standalone cloud did not start: {(home / 'cloud.log').read_text()[-2000:]}"
        yield home, state
    finally:
        _stop_group(proc)


def _instances(cloud: dict) -> list:
    from infra.local.cloud import providers_for
    from infra.records import job_labels

    providers = providers_for(cloud["aws_endpoint"], cloud["gce_endpoint"], aws_keys=cloud["aws_keys"])
    return [i for p in providers.values() for i in p.query_instances(job_labels(JOB_ID))]


def _agent_statuses(cloud: dict) -> list[dict]:
    """The job's agents' reports, in its prefix of the standalone cloud's bucket (where its instances write)."""
    from tasks.embedded_bucket import agent_reports

    return agent_reports(JOB_ID, ends=cloud)


def _runtime_pids(home: Path) -> set[int]:
    """Live agent/worker processes (``sailor_core.runtime.*``) that belong to this test's SAILOR_HOME."""
    return home_pids(home, (b"sailor_core.runtime",))


def _sigint_ignored() -> None:
    """Start `sailor train` with SIGINT ignored, as a shell without job control (a script, a CI step)
    starts `cmd &` and as this test's own runner may have left it: the Ctrl-C must still cancel."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ~1 min (a standalone cloud, a job that must be training first): -m slow; the default run interrupts a flow's
# instances in test_network_profile_flow::test_ctrl_c_after_the_launch_terminates_the_instances
@pytest.mark.slow
def test_sigint_terminates_instances_and_workers(standalone_cloud, prefect_api):
    home, cloud = standalone_cloud
    err_path = home / "train.err"
    with open(home / "train.out", "wb") as out, open(err_path, "wb") as err:
        train = subprocess.Popen(
            [sys.executable, "-m", "flows.cli.app", "train", "--budget-usd", "0.5", "--steps", str(STEPS),
             "--checkpoint-every", "50", "--job-id", JOB_ID, "--cloud", "embedded"],
            env=_env(home, prefect_api), cwd=str(ROOT), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_sigint_ignored)
    try:
        # Training, not just launching: instances running and rank 0's workers past a step.
        worker_pids: set[tuple[str, int]] = set()  # (instance, its pid as the instance numbers it)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert train.poll() is None, f"train exited early ({train.returncode}): {err_path.read_text()[-2000:]}"
            running = [i for i in _instances(cloud) if i.state == "running"]
            statuses = [s for s in _agent_statuses(cloud) if s.get("state") == "running"]
            worker_pids = {(s["instance_id"], int(p)) for s in statuses for p in (s.get("pids") or {}).values()}
            if running and worker_pids and any((s.get("step") or 0) >= 3 for s in statuses):
                break
            time.sleep(1.0)
        else:
            pytest.fail(f"the job did not start training within 300 s: {err_path.read_text()[-2000:]}")
        time.sleep(3.0)  # the flow saves the agents' progress every second: the interrupt must not lose it
        agent_pids = _runtime_pids(home)
        assert agent_pids, "found no agent/worker processes of this job to watch"

        t0 = time.monotonic()
        os.killpg(train.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            code = train.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("sailor train was still running 120 s after SIGINT")
        exit_s = time.monotonic() - t0
    finally:
        _stop_group(train, signal.SIGKILL)

    stderr = err_path.read_text()
    assert code == 130, f"exit status {code} after SIGINT; stderr: {stderr[-2000:]}"
    assert "Traceback" not in stderr, stderr[-4000:]
    assert "stopped by the user (Ctrl-C)" in (home / "train.out").read_text(), "the summary says how it ended"
    assert exit_s < 120

    # Nothing of the job is pending or running on either cloud once the command has returned.
    left = [(i.instance_id, i.state) for i in _instances(cloud) if i.state in ("pending", "running")]
    assert not left, f"instances still up after Ctrl-C: {left}"

    # Their processes go with them (a terminated instance's processes get SIGTERM, then SIGKILL).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_runtime_pids(home) or any(host_pid(i, p) for i, p in worker_pids)):
        time.sleep(0.5)
    assert not _runtime_pids(home), f"agent/worker processes alive: {sorted(_runtime_pids(home))}"
    assert not [p for i, p in worker_pids if host_pid(i, p)]
    assert not [i for i in _instances(cloud) if i.live and i.state != "stopping"]

    from sailor_core.job import state as js

    state = js.JobStore(str(home / "jobs")).load(JOB_ID)
    assert state.status == js.CANCELLED, (state.status, state.status_reason)
    assert not state.running_instances()
    assert state.status_reason.startswith("stopped by the user (Ctrl-C) at step"), state.status_reason
    assert 3 <= state.steps_done < STEPS  # the progress made before Ctrl-C is kept for a resume
