"""The Prefect process worker ``sailor deploy --worker`` leaves running for the local server.

``prefect worker start --pool sailor-process`` in its own session (log in
``$SAILOR_HOME/prefect/worker.log``), recorded in ``worker.json``; ``sailor ui --stop``
stops it with the server.  One per SAILOR_HOME: a second ``--worker`` finds the first.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from flows.cli import background
from flows.cli.prefect_server import prefect_home
from sailor_core.errors import SailorError

POOL = "sailor-process"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: prefect.yaml, and the flows the worker runs


def _record() -> Path:
    return prefect_home() / "worker.json"


def running_worker(api_url: str) -> int | None:
    """The pid of the worker Sailor started for ``api_url``, if it is alive."""
    record = background.read_record(_record())
    pid = int(record.get("pid", 0))
    return pid if record.get("api_url") == api_url and background.pid_alive(pid) else None


def pool_has_worker(api_url: str, pool: str = POOL) -> bool:
    """Whether some worker polls ``pool`` now (its heartbeat is recent), as the server sees it."""
    req = urllib.request.Request(f"{api_url.rstrip('/')}/work_pools/{pool}/workers/filter", method="POST",
                                 data=b"{}", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            workers = json.loads(resp.read())
    except (OSError, ValueError):
        return False
    return any(w.get("status") == "ONLINE" for w in workers)


def start_worker(api_url: str, pool: str = POOL, timeout_s: float = 120.0) -> tuple[int, bool]:
    """A process worker polling ``pool`` on ``api_url``: (its pid, whether this call started it)."""
    pid = running_worker(api_url)
    if pid:
        return pid, False
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_LOGGING_") and k != "PREFECT_PROFILE"}
    env["PREFECT_API_URL"] = api_url
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", "2")  # a run starts within seconds, not Prefect's 10
    prefect_bin = Path(sys.executable).with_name("prefect")
    cmd = [str(prefect_bin) if prefect_bin.exists() else "prefect", "worker", "start", "--pool", pool,
           "--type", "process"]
    log = prefect_home() / "worker.log"
    proc = background.start(cmd, env=env, log=log, cwd=ROOT)
    background.write_record(_record(), {"pid": proc.pid, "api_url": api_url, "pool": pool})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _record().unlink(missing_ok=True)
            raise SailorError(f"the Prefect worker exited with code {proc.returncode}; see {log}")
        if pool_has_worker(api_url, pool):
            return proc.pid, True
        time.sleep(0.5)
    return proc.pid, True  # started, not yet seen by the server: runs wait for it


def stop_worker() -> bool:
    """Stop the worker Sailor started; False when none was recorded."""
    record = background.read_record(_record())
    if not record:
        return False
    background.stop_group(int(record.get("pid", 0)))
    _record().unlink(missing_ok=True)
    return True
