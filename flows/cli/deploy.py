"""``sailor deploy``: Sailor's deployments on the Prefect server, in one command.

Against the server the CLI uses (``flows.cli.prefect_server``: ``PREFECT_API_URL``, the
active Prefect profile, else the local server ``sailor ui`` runs, started if needed):
creates the process work pool, runs ``prefect --no-prompt deploy --all`` on the checkout's
``prefect.yaml`` (Prefect records the checkout as the flows' working directory), and with
``--worker`` leaves a process worker running.  Nothing to export first.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from flows.cli.common import console, print_json
from flows.cli.prefect_server import configure_prefect_env, prefect_home, would_start_server
from flows.cli.worker import POOL, ROOT, start_worker
from sailor_core.errors import SailorError


def deploy_cmd(
    worker: bool = typer.Option(False, "--worker", help="also leave a process worker running for the pool (log "
                                                        "under $SAILOR_HOME/prefect; `sailor ui --stop` stops it)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Create the work pool, deploy every flow of prefect.yaml and (--worker) start a worker, on the Prefect
    server `sailor ui` runs; then `sailor train --deployment` runs jobs through it."""
    out = console()
    if not as_json and would_start_server():
        out.print("[dim]starting a local Prefect server (first time ~15-60 s)...[/dim]")
    choice = configure_prefect_env(start_server=True)
    if choice.api_url is None:
        raise SailorError("sailor deploy needs a Prefect server: unset SAILOR_PREFECT_EPHEMERAL or run `sailor ui`")
    pool_created = _create_pool()
    deployments = _deploy()
    worker_pid, worker_started = None, False
    if worker:
        worker_pid, worker_started = start_worker(choice.api_url)
    if as_json:
        print_json({"api_url": choice.api_url, "ui_url": choice.ui_url, "work_pool": POOL,
                    "work_pool_created": pool_created, "deployments": deployments, "worker_pid": worker_pid})
        return
    out.print(choice.describe(), highlight=False)
    out.print(f"work pool {POOL}: {'created' if pool_created else 'already there'}")
    out.print(f"deployed from prefect.yaml: {', '.join(deployments)}", highlight=False)
    if worker_pid:
        out.print(f"worker: {'started' if worker_started else 'already running'} (pid {worker_pid}, log "
                  f"{prefect_home() / 'worker.log'}; `sailor ui --stop` stops it)", highlight=False)
    else:
        out.print(f"no worker started: `sailor deploy --worker`, or `prefect worker start --pool {POOL}`")
    out.print("next: sailor train --deployment --budget-usd 0.05")


def _create_pool() -> bool:
    """The process work pool the deployments name; False when it was already there."""
    # lazy: loaded when the command runs (the CLI starts light)
    from prefect.client.orchestration import get_client  # lazy: prefect, after the API is chosen
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                                   base_job_template=ProcessWorker.get_default_base_job_template()))
        except ObjectAlreadyExists:
            return False
    return True


def _deploy() -> list[str]:
    """``prefect --no-prompt deploy --all`` in the checkout; the names of the deployments it made."""
    prefect_bin = Path(sys.executable).with_name("prefect")
    cmd = [str(prefect_bin) if prefect_bin.exists() else "prefect", "--no-prompt", "deploy", "--all"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise SailorError("prefect deploy did not finish within 600 s") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        raise SailorError(f"prefect deploy failed: {lines[-1] if lines else f'exit code {done.returncode}'}")
    from prefect.client.orchestration import get_client  # lazy: prefect, after the API is chosen

    with get_client(sync_client=True) as client:
        found = client.read_deployments()
        flows = {f.id: f.name for f in client.read_flows()}
    return sorted(f"{flows.get(d.flow_id, '?')}/{d.name}" for d in found if d.work_pool_name == POOL)


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy_cmd)
