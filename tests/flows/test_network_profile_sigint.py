"""Ctrl-C on `sailor profile network --cloud` while the workers measure leaves nothing running.

A standalone embedded cloud (its instances outlive the CLI process and can be checked after it
exits); SIGINT to the CLI's process group, as a terminal's Ctrl-C.  Slow (~40 s): the default
run covers the flow's cleanup with an in-process KeyboardInterrupt
(tests/flows/test_network_profile_flow.py).
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
from tests.flows.test_cancellation import _env, _stop_group, standalone_cloud  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _statuses(home: Path, cloud: dict) -> list[dict]:
    """The profile's agents' reports, in its job's prefix of the standalone cloud's bucket."""
    from tasks.embedded_bucket import agent_reports

    return agent_reports("network-profile-*", ends=cloud)


def _instances(cloud: dict, home: Path) -> list:
    """Every instance of the profile's job (its id comes from the flow run: found in the jobs folder)."""
    from infra.local.cloud import providers_for
    from infra.records import job_labels

    providers = providers_for(cloud["aws_endpoint"], cloud["gce_endpoint"], aws_keys=cloud["aws_keys"])
    return [i for job in (home / "jobs").glob("network-profile-*") for p in providers.values()
            for i in p.query_instances(job_labels(job.name))]


def _sailor_pids(home: Path) -> set[int]:
    """Live agent/profiler processes started for this test's SAILOR_HOME."""
    return home_pids(home, (b"sailor_core.runtime.agent", b"sailor_core.profiler.net_worker"))


def test_sigint_while_measuring_terminates_the_instances(standalone_cloud, prefect_api):
    home, cloud = standalone_cloud
    err_path = home / "profile.err"
    with open(home / "profile.out", "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli.app", "profile", "network", "--cloud", "embedded", "--gpu", "T4",
             "--zone", "us-central1-a", "--workers", "2", "--max-mib", "256", "--reps", "40", "--timeout-s", "300"],
            env=_env(home, prefect_api), cwd=str(ROOT), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        worker_pids: set[tuple[str, int]] = set()  # (instance, its pid as the instance numbers it)
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited early ({proc.returncode}): {err_path.read_text()[-2000:]}"
            running = [s for s in _statuses(home, cloud) if s.get("state") == "running" and s.get("generation") == 1]
            worker_pids = {(s["instance_id"], int(p)) for s in running for p in (s.get("pids") or {}).values()}
            if len(running) == 2 and any((s.get("event") or {}).get("event") == "p2p" for s in running):
                break  # both ranks up and measuring
            time.sleep(0.5)
        else:
            pytest.fail(f"the workers did not start measuring within 180 s: {err_path.read_text()[-2000:]}")
        assert [i for i in _instances(cloud, home) if i.live], "no live instances to watch"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("sailor profile network was still running 120 s after SIGINT")
    finally:
        _stop_group(proc, signal.SIGKILL)

    stderr = err_path.read_text()
    assert code == 130, (code, stderr[-2000:])
    assert "Traceback" not in stderr, stderr[-4000:]
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: interrupted; the profile's instances were terminated (see `sailor jobs`)"], stderr
    left = [(i.instance_id, i.state) for i in _instances(cloud, home) if i.state in ("pending", "running")]
    assert not left, f"instances still up after Ctrl-C: {left}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_sailor_pids(home) or any(host_pid(i, p) for i, p in worker_pids)):
        time.sleep(0.5)
    assert not _sailor_pids(home) and not [p for i, p in worker_pids if host_pid(i, p)]

    from sailor_core.job import state as js

    (state,) = js.JobStore(str(home / "jobs")).list()
    assert state.status == js.CANCELLED and not state.running_instances() and len(state.instances) == 2
