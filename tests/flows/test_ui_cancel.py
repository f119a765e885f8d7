"""A cancel in the Prefect UI, clicked in a real browser, stops a deployment's job gracefully (issue 32).

`sailor deploy --worker` (a process worker, the session's server), then `sailor train --deployment` of 2000
steps with a checkpoint every 10; once the job passed step 50, headless Chromium opens the run's page and
clicks its heading's "Cancel" and the dialog's "Confirm".  The worker SIGTERMs the run's process (and kills it 30 s
later); the flow stops the workers with a final checkpoint, saves the job cancelled with how to go on,
terminates the instances, and the run ends Cancelled; `sailor train` follows it to the end and prints
the summary.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from flows.cli.prefect_server import prefect_home
from sailor_core.job import state as js
from tests.flows.conftest import ROOT
from tests.flows.test_deployment_e2e import OUT, UI_TIMEOUT_MS, _api, _Browser
from tests.flows.test_deployment_e2e import _env as _user_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # ~3 min: a deployment, a worker, a browser
JOB_ID = "ui-cancel"
STEPS, EVERY, CANCEL_AFTER = 2000, 10, 50  # far more steps than the browser needs to land the cancel


def _cancel_in_the_browser(url: str) -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = _Browser(p)
        try:
            page = b.page
            page.goto(url, wait_until="networkidle", timeout=UI_TIMEOUT_MS)
            # The page heading's "Cancel" (FlowRunCancelButton: a deployment's running run), then the dialog's
            page.locator(".page-heading-flow-run").get_by_role("button", name="Cancel", exact=True).click()
            page.get_by_role("button", name="Confirm").click()
            page.screenshot(path=str(OUT / "ui-cancel.png"), full_page=True)
        finally:
            b.browser.close()


def test_a_cancel_in_the_ui_stops_a_deployment_run_with_a_final_checkpoint(prefect_api):
    from flows.cli.worker import stop_worker

    env = _user_env()
    done = subprocess.run(["./sailor", "deploy", "--worker"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    store = js.JobStore()
    train = subprocess.Popen(["./sailor", "train", "--deployment", "--budget-usd", "0.5", "--steps", str(STEPS),
                              "--checkpoint-every", str(EVERY), "--global-batch", "128", "--val-fraction", "0",
                              "--validate-every", "0", "--max-gpus", "1", "--job-id", JOB_ID],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = train.stdout.readline()
        m = re.match(r"flow run (http\S+/runs/flow-run/([0-9a-f-]+))\s+job (\S+)", first)
        assert m, f"the first line is not the run's page: {first!r}"
        url, run_id, _ = m.groups()
        deadline = time.monotonic() + 400
        while not (store.exists(JOB_ID) and store.load(JOB_ID).steps_done >= CANCEL_AFTER):
            assert time.monotonic() < deadline, "the job did not pass step 50 within 400 s"
            assert train.poll() is None, train.stderr.read()[-3000:]
            time.sleep(0.5)
        _cancel_in_the_browser(url)
        out, err = train.communicate(timeout=300)
    finally:
        if train.poll() is None:
            train.kill()
        stop_worker()
    job = store.load(JOB_ID)
    reason = (f"stopped by the user (a cancel of its flow run: the Prefect UI or SIGTERM) at step {job.steps_done}; "
              f"checkpoint {job.last_checkpoint_step} saved; continue with `sailor train --job-id {JOB_ID}`")
    assert (job.status, job.status_reason) == (js.CANCELLED, reason)
    assert CANCEL_AFTER <= job.last_checkpoint_step == job.steps_done < STEPS
    assert not job.running_instances()
    run = _api(prefect_api, f"/flow_runs/{run_id}")
    assert run["state"]["type"] == "CANCELLED", run["state"]
    assert "Traceback" not in err and "TerminationSignal" not in out + err, err[-3000:]
    assert "stopped by the user" in first + out, out[-3000:]
    # What a person reads where they cancelled: the run's state message (the UI's run page) and its log,
    # and the worker's log (the run's output as the worker streamed it) -- the job's own reason, word for word.
    assert run["state"]["message"] == reason, run["state"]
    assert _wait_for(lambda: reason in _run_log(prefect_api, run_id)), _run_log(prefect_api, run_id)[-3000:]
    worker_log = prefect_home() / "worker.log"
    assert _wait_for(lambda: reason in worker_log.read_text(errors="replace")), worker_log


def _run_log(prefect_api: str, run_id: str) -> str:
    found = _api(prefect_api, "/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200,
                                               "sort": "TIMESTAMP_DESC"})
    return "\n".join(entry["message"] for entry in found)


def _wait_for(predicate, timeout_s: float = 30.0) -> bool:
    """Logs reach the API (and the worker's file) in batches, within seconds of the run's end."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
