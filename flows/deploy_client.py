"""``sailor train --deployment``: run the train-job deployment on a Prefect server and follow it.

The run's job id is derived from its flow-run id (``flows.train_job``), so its
job state -- written by whichever worker runs it, to ``jobs_url`` -- is found
without asking the worker anything.
"""

from __future__ import annotations

import time
from typing import Any

from sailor_core.job import state as js
from sailor_core.errors import SailorError

DEPLOYMENT = "train-job/train-job"
FINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def job_id_for(model: str, flow_run_id) -> str:
    safe = "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")
    return f"{safe}-{str(flow_run_id).replace('-', '')[:10]}"


def run_train_deployment(params: dict[str, Any], *, show: bool, timeout_s: float = 24 * 3600.0,
                         poll_s: float = 2.0) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    store = js.JobStore(params.get("jobs_url"))
    parameters = {k: v for k, v in params.items() if v is not None and v != []}
    parameters["jobs_url"] = store.root  # the worker writes the job state where this command reads it
    try:
        run = run_deployment(DEPLOYMENT, parameters=parameters, timeout=0)
    except ObjectNotFound:
        raise SailorError(f"no deployment {DEPLOYMENT!r} on the Prefect server: run `prefect --no-prompt deploy "
                          "--all` in the repository (see docs/orchestration.md)") from None
    job_id = params.get("job_id") or job_id_for(params.get("model", "tiny"), run.id)
    if show:
        print(f"flow run {run.name} ({run.id}) of {DEPLOYMENT}; job {job_id}; waiting for a worker...")
    deadline = time.monotonic() + timeout_s
    last = None
    with get_client(sync_client=True) as client:
        while True:
            fr = client.read_flow_run(run.id)
            state = fr.state.type.value if fr.state else "PENDING"
            if show and state != last:
                print(f"  {state.lower()}")
                last = state
            if state in FINAL_STATES:
                break
            if time.monotonic() > deadline:
                raise SailorError(f"flow run {run.id} did not finish within {timeout_s:.0f} s")
            time.sleep(poll_s)
    summary: dict[str, Any] = {"flow_run_id": str(run.id), "job_id": job_id, "status": state.lower(),
                               "status_reason": fr.state.message if fr.state else ""}
    if store.exists(job_id):
        job = store.load(job_id)
        from tasks.jobs import summary as job_summary

        summary = {**job_summary(job, instances_left_running=len(job.running_instances())), **{
            "flow_run_id": str(run.id)}}
        if state != "COMPLETED":
            summary["status"] = job.status if job.status in js.ENDED_STATUSES else state.lower()
    return summary
