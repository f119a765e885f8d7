"""One real Prefect server for the flow tests (SQLite in a temp dir), started once per session.

A real server rather than ``prefect_test_harness``: the end-to-end test deploys
from prefect.yaml and runs a process worker against it, which needs an API a
separate process can reach; the in-process flows use the same server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flows.cli.background import pid_alive as process_alive  # noqa: F401 - the tests' name for it
from sailor_core.ports import free_port
from tests.conftest import PROCESS_SAILOR_HOME

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def sailor_home() -> Path:
    """The process's Sailor home (tests/conftest.py's), not one of the flow tests' own: the process's
    embedded cloud, started by whichever test needs it first (`sailor doctor`'s test, say), keeps its
    buckets in the home it started in, and a new shell reads the buckets of the home it is given.  With
    a second home here, a job's checkpoints went to the first home's buckets and `sailor export` from a
    new shell listed the second's: a 404 in any worker that had run such a test before this folder's."""
    return Path(PROCESS_SAILOR_HOME)


@pytest.fixture(scope="session")
def prefect_api(sailor_home) -> str:
    """API URL of a server started the way `sailor ui` starts one; this process points at it."""
    from flows.cli.prefect_server import start_local_server, stop_local_server

    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    # The Prefect profile `sailor` the start makes active lands in this PREFECT_HOME, as it would in
    # the user's: commands run by the tests with this environment reach the server through it.
    os.environ["PREFECT_HOME"] = str(sailor_home / "prefect")
    os.environ.pop("PREFECT_API_URL", None)
    _stop_server_when_this_process_ends()  # before the start: a kill may come while it waits for the server
    api_url = start_local_server(port=free_port())
    os.environ["PREFECT_API_URL"] = api_url
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings

    # Every INFO line of the flows reaches the server, as in `sailor train` (the UI shows the run's logs).
    with temporary_settings({PREFECT_API_URL: api_url, PREFECT_HOME: str(sailor_home / "prefect"),
                             PREFECT_SERVER_ANALYTICS_ENABLED: False}):
        yield api_url
    stop_local_server()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _stop_server_when_this_process_ends() -> None:
    """A test run that is killed (CI's time limit, a crashed xdist worker, a second Ctrl-C) skips
    the fixture's teardown and used to leave its Prefect server running for good: a watchdog, in
    its own session so the kill does not reach it, stops the server once this process is gone
    (`stop_local_server`, with this process's SAILOR_HOME and PREFECT_HOME; after a normal
    teardown it finds no server and does nothing)."""
    stop = "from flows.cli.prefect_server import stop_local_server; stop_local_server()"
    watch = f'while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; exec "$0" -c "$1"'
    subprocess.Popen(["sh", "-c", watch, sys.executable, stop], cwd=ROOT, env=dict(os.environ),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def home_pids(home, markers: tuple[bytes, ...]) -> set[int]:
    """Live processes whose command line holds one of ``markers`` and that belong to the test's
    SAILOR_HOME ``home`` (named on their command line or in their environment)."""
    from pathlib import Path

    found = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            if not any(m in cmdline for m in markers):
                continue
            environ = (d / "environ").read_bytes()
        except OSError:
            continue
        if str(home).encode() in cmdline + environ and process_alive(int(d.name)):
            found.add(int(d.name))
    return found
