"""``sailor train --deployment``: run the train-job deployment on a Prefect server and follow it.

The CLI names the job, so the flow run is named after it from the start and its job state --
written by whichever worker runs it, to ``jobs_url`` -- is found without asking the worker.
While it runs, the terminal shows what a local run shows: the run's page first, then the
bar fed from the job state, and the job's events read back from the run's log.
"""

from __future__ import annotations

import time
from typing import Any

from sailor_core.catalog.models import model_slug
from sailor_core.errors import SailorError
from sailor_core.job import state as js

DEPLOYMENT = "train-job/train-job"
FINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
WORKER_HINT_AFTER_S = 15.0  # a run still waiting this long: say whether any worker polls its pool
_STATE_WORDS = {"SCHEDULED": "scheduled: waiting for a worker", "PENDING": "a worker picked it up",
                "RUNNING": "running on the worker"}


def job_id_for(model: str, flow_run_id) -> str:
    safe = "".join(c if c.isalnum() else "-" for c in model_slug(model).lower()).strip("-")
    return f"{safe}-{str(flow_run_id).replace('-', '')[:10]}"


def run_train_deployment(params: dict[str, Any], *, display, timeout_s: float = 24 * 3600.0,
                         poll_s: float = 1.0) -> dict[str, Any]:
    """Trigger the run with ``params`` (``job_id`` among them), follow it on ``display``
    (``flows.cli.progress.LiveDisplay``), return the job's summary."""
    from prefect.deployments import run_deployment  # lazy: prefect, after the CLI chose the API
    from prefect.exceptions import ObjectNotFound

    from tasks.reporting import flow_run_url

    store = js.JobStore(params.get("jobs_url"))
    job_id = params["job_id"]
    parameters = {k: v for k, v in params.items() if v is not None and v != []}
    parameters["jobs_url"] = store.root  # the worker writes the job state where this command reads it
    try:
        run = run_deployment(DEPLOYMENT, parameters=parameters, flow_run_name=job_id, timeout=0)
    except ObjectNotFound:
        raise SailorError(f"no deployment {DEPLOYMENT!r} on the Prefect server: run `sailor deploy --worker` "
                          "(see docs/orchestration.md)") from None
    url = flow_run_url(run.id)
    display.run_started(url, job_id)
    try:
        fr = _follow(run, job_id, store, display, timeout_s=timeout_s, poll_s=poll_s)
    except KeyboardInterrupt:  # stop at once (a second Ctrl-C): the worker ends the run and its instances
        _cancel_run(run.id)
        raise
    state = fr.state.type.value if fr.state else "PENDING"
    summary: dict[str, Any] = {"flow_run_id": str(run.id), "flow_run_url": url, "job_id": job_id,
                               "status": state.lower(), "status_reason": fr.state.message if fr.state else ""}
    if store.exists(job_id):
        job = store.load(job_id)
        from tasks.jobs import summary as job_summary  # lazy: prefect's task machinery

        summary = {**job_summary(job, instances_left_running=len(job.running_instances())),
                   "flow_run_id": str(run.id), "flow_run_url": url}
        if state != "COMPLETED":
            summary["status"] = job.status if job.status in js.ENDED_STATUSES else state.lower()
    return summary


def _cancel_run(run_id) -> None:
    """Cancel the flow run through the API: its worker kills the run's process, whose cancellation hook
    terminates the job's instances (after a short grace: ``flows.train_job``)."""
    from prefect.client.orchestration import get_client  # lazy: prefect, after the CLI chose the API
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Cancelling(message="stopped at once from `sailor train` (Ctrl-C)"),
                                  force=True)


def _follow(run, job_id: str, store: js.JobStore, display, *, timeout_s: float, poll_s: float):
    """Poll the run's state, the job state and the run's log until the run ends; the final flow run."""
    from prefect.client.orchestration import get_client  # lazy: prefect, after the CLI chose the API

    deadline = time.monotonic() + timeout_s
    waiting_since = time.monotonic()
    last_state, last_update, hinted = None, None, False
    logs = _LogReader(run.id, job_id)
    with get_client(sync_client=True) as client:
        while True:
            fr = client.read_flow_run(run.id)
            state = fr.state.type.value if fr.state else "PENDING"
            if state != last_state:
                display.event(_STATE_WORDS.get(state, state.lower()))
                last_state = state
            if state == "SCHEDULED" and not hinted and time.monotonic() - waiting_since > WORKER_HINT_AFTER_S:
                hinted = True
                if not _pool_has_worker(client, fr.work_pool_name):
                    display.event(f"no worker polls the work pool {fr.work_pool_name!r}: start one with "
                                  "`sailor deploy --worker`")
            logs.show(client, display)
            if store.exists(job_id):
                job = store.load(job_id)
                if job.updated_unix_s != last_update:
                    last_update = job.updated_unix_s
                    display.state(job)
            if state in FINAL_STATES:
                time.sleep(2.5)  # the run's last log lines reach the server in a batch after it ends
                logs.show(client, display)
                return fr
            if time.monotonic() > deadline:
                raise SailorError(f"flow run {run.id} did not finish within {timeout_s:.0f} s")
            time.sleep(poll_s)


class _LogReader:
    """The job's event lines of the run's log (``tasks.reporting.event_line``), each shown once."""

    def __init__(self, run_id, job_id: str) -> None:
        self.run_id, self.job_id = run_id, job_id
        self.after = None
        self.seen: set = set()

    def show(self, client, display) -> None:
        # lazy: prefect's client, once the CLI has chosen the API to talk to
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp

        from tasks.reporting import event_text

        flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[self.run_id]),
                        timestamp=LogFilterTimestamp(after_=self.after) if self.after else None)
        for log in client.read_logs(log_filter=flt, limit=200):
            if log.id in self.seen:
                continue
            self.seen.add(log.id)
            self.after = log.timestamp
            text = event_text(self.job_id, log.message)
            if text is not None:
                display.event(text, at_unix_s=log.timestamp.timestamp())


def _pool_has_worker(client, pool: str | None) -> bool:
    if not pool:
        return True
    try:
        return any(w.status == "ONLINE" for w in client.read_workers_for_work_pool(pool))
    except Exception:  # noqa: BLE001  only a hint: an API that cannot say is taken as "yes"
        return True
