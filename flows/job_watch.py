"""The job-watch flow (scheduled in prefect.yaml): re-submits the jobs whose controller died.

Any worker of the pool runs it, so a job whose controller's machine died is picked up by a
worker on another machine: every unended job whose train-job run came through a deployment and
whose lease expired (``sailor_core.job.lease.takeover_candidates``) gets one new run of that
deployment with its job id, which takes the lease over, adopts the dead controller's instances
and continues from the newest checkpoint (docs/orchestration.md, "Failover").
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as current_flow_run

from sailor_core.job import lease as jl
from sailor_core.job import state as js
from tasks import job_lease


@flow(name="job-watch", description="Re-submit the train-job runs of jobs whose controller stopped renewing its lease.")
def job_watch(jobs_url: str | None = None, stale_after_s: float = 300.0) -> list[dict[str, str]]:
    """The jobs re-submitted: job id, the dead controller's flow run, the new flow run.

    Args:
        jobs_url: where job states live (default: SAILOR_JOBS_URL, else $SAILOR_HOME/jobs)
        stale_after_s: a scheduled run this late returns at once (runs piled up while no worker polled)
    """
    log = get_run_logger()
    scheduled = current_flow_run.scheduled_start_time
    late_s = (datetime.now(timezone.utc) - scheduled).total_seconds() if scheduled else 0.0
    if late_s > stale_after_s:
        log.info("scheduled %.0f s ago: a later watch looks instead", late_s)
        return []
    store = js.JobStore(jobs_url)
    out = []
    for state, lease in jl.takeover_candidates(job_lease.leases(store), time.time(), js.ENDED_STATUSES):
        run_id = job_lease.resubmit(lease)
        log.info("job %s: its controller (flow run %s on %s) stopped renewing its lease %.0f s ago; "
                 "re-submitted to %s as flow run %s", state.job_id, lease.owner, lease.host,
                 time.time() - lease.expires_unix_s, lease.deployment, run_id)
        out.append({"job_id": state.job_id, "dead_flow_run": lease.owner, "flow_run": run_id})
    return out
