"""From the command line to the Prefect UI and back, as a new user would go, on one shared setup:

- prefect.yaml's recipe as written, from the checkout with nothing exported: `./sailor deploy
  --worker` (work pool, every deployment, a worker, against the local server), then plain
  `prefect` commands reach that server through the `sailor` Prefect profile;
- `./sailor train --deployment` with a preemption: the run's page is the first line it prints,
  the events of the recovery follow, the summary comes back from the worker;
- headless Chromium opens the printed page and finds the run named after the job, its INFO
  logs, the live status artifact with spend against the budget while the job runs, and one
  attempts artifact with its attempts in order; screenshots go to test-output/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.flows.conftest import ROOT

# One journey (deploy, a worker, train --deployment with a preemption, Chromium) takes ~2 min: -m slow.
# The default run covers the flow through sailor train (test_train_job) and the server (test_prefect_server).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CHROMIUM = "/usr/bin/chromium"
OUT = ROOT / "test-output"
STEPS, PREEMPT_AT, BUDGET = 20, 8, 0.05
UI_TIMEOUT_MS = 180_000


def _env() -> dict[str, str]:
    """The user's shell: no PREFECT_API_URL, no SAILOR_ROOT; SAILOR_HOME/PREFECT_HOME are the session's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "SAILOR_ROOT", "PREFECT_PROFILE")}
    return {**env, "PREFECT_WORKER_QUERY_SECONDS": "1", "PYTHONUNBUFFERED": "1"}


def _api(prefect_api: str, path: str, body: dict | None = None) -> object:
    req = urllib.request.Request(f"{prefect_api}{path}", method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _artifacts(prefect_api: str, run_id: str) -> dict[str, dict]:
    found = _api(prefect_api, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})
    return {a["key"].split("-", 1)[0]: a for a in found if a["key"]}


def _recipe() -> list[list[str]]:
    """The `./sailor deploy` and `./sailor train` lines of prefect.yaml's header, as written there."""
    lines = [ln.lstrip("# ").split("#")[0].split() for ln in (ROOT / "prefect.yaml").read_text().splitlines()
             if ln.startswith("#   ./sailor")]
    return [ln for ln in lines if ln[1] in ("deploy", "train")]


class _Browser:
    def __init__(self, playwright) -> None:
        self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.set_default_timeout(UI_TIMEOUT_MS)  # a shared 2-core machine can be slow to render

    def run_page(self, url: str, tab: str, *, title: str | None = None):
        """The run's page, on ``tab``; ``title``: wait for it in the page's title first (a tab's click
        sets the title back to "Prefect Server")."""
        self.page.goto(url, wait_until="networkidle", timeout=UI_TIMEOUT_MS)
        if title is not None:
            self.page.wait_for_function(f"document.title.includes({json.dumps(title)})", timeout=UI_TIMEOUT_MS)
        self.page.locator("ul[role=tablist] li.p-tab", has_text=tab).first.click()
        return self.page

    def artifact_page(self, url: str, key: str, shows: str):
        """The run's page, its Artifacts tab, the card of ``key``: its page, once it shows ``shows``."""
        page = self.run_page(url, "Artifacts")
        card = page.locator("a[href*='/artifacts/artifact/']").filter(has=page.get_by_text(key, exact=True))
        card.first.wait_for(timeout=UI_TIMEOUT_MS)
        card.first.click()
        page.wait_for_url("**/artifacts/artifact/**", timeout=UI_TIMEOUT_MS)
        page.get_by_text(shows).first.wait_for(timeout=UI_TIMEOUT_MS)
        return page


@pytest.fixture(scope="module")
def journey(prefect_api, tmp_path_factory):
    """The recipe, a deployment run, and the browser on the page it printed while the job runs."""
    from flows.cli.worker import stop_worker

    env = _env()
    deploy, train = _recipe()
    assert deploy == ["./sailor", "deploy", "--worker"] and train[:3] == ["./sailor", "train", "--deployment"]
    t0 = time.monotonic()
    done = subprocess.run(deploy, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    sys.stderr.write(f"[e2e] sailor deploy --worker: {time.monotonic() - t0:.1f} s\n")
    assert done.returncode == 0, done.stdout + done.stderr
    plain = subprocess.run([str(Path(sys.executable).with_name("prefect")), "deployment", "ls"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "train-job/train-job" in plain.stdout, plain.stdout + plain.stderr
    t0 = time.monotonic()
    proc = subprocess.Popen([*train, "--steps", str(STEPS), "--preempt-at", str(PREEMPT_AT), "--max-gpus", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        seen = _watch_while_running(prefect_api, first)
        out, err = proc.communicate(timeout=600)
        sys.stderr.write(f"[e2e] sailor train --deployment: {time.monotonic() - t0:.1f} s\n")
    finally:
        if proc.poll() is None:
            proc.kill()
        stop_worker()
    assert proc.returncode == 0, first + out + err
    return {"deploy": done.stdout, "first": first, "out": first + out, "seen": seen}


def _watch_while_running(prefect_api: str, first_line: str) -> dict:
    """While the job runs: its status artifact in the browser with spend against the budget."""
    from playwright.sync_api import sync_playwright

    m = re.match(r"flow run (http\S+/runs/flow-run/([0-9a-f-]+))\s+job (\S+)", first_line)
    assert m, f"the first line is not the run's page: {first_line!r}"
    url, run_id, job_id = m.groups()
    OUT.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = _Browser(p)
        try:
            deadline = time.monotonic() + 300
            mid_run = None
            while time.monotonic() < deadline and mid_run is None:
                status = _artifacts(prefect_api, run_id).get("status")
                spent = re.search(r"\*\*Spent\*\* ([0-9.]+) of", status["description"]) if status else None
                if spent and float(spent.group(1)) > 0:
                    page = b.artifact_page(url, f"status-{job_id}", "Progress:")
                    text = page.inner_text("body")
                    state = _api(prefect_api, f"/flow_runs/{run_id}")["state"]["type"]
                    page.screenshot(path=str(OUT / "status-mid-run.png"), full_page=True)
                    mid_run = {"text": text, "state": state}
                time.sleep(1.0)
        finally:
            b.browser.close()
    return {"url": url, "run_id": run_id, "job_id": job_id, "mid_run": mid_run}


def test_the_recipe_deploys_every_flow_with_nothing_exported(prefect_api, journey):
    deployments = {d["name"]: d for d in _api(prefect_api, "/deployments/filter", {})}
    assert {"train-job", "plan", "profile", "network-profile", "refresh-offers"} <= set(deployments)
    assert deployments["train-job"]["work_pool_name"] == "sailor-process"
    [step] = deployments["train-job"]["pull_steps"]  # prefect deploy recorded the checkout
    assert step["prefect.deployments.steps.set_working_directory"]["directory"] == str(ROOT)
    crons = [s["schedule"].get("cron") for s in deployments["refresh-offers"]["schedules"]]
    assert crons == ["*/30 * * * *"]
    assert "work pool sailor-process" in journey["deploy"] and "worker: started" in journey["deploy"]


def test_train_deployment_prints_the_run_first_then_what_recovery_does(prefect_api, journey):
    seen, out = journey["seen"], journey["out"]
    run = _api(prefect_api, f"/flow_runs/{seen['run_id']}")
    assert run["state"]["type"] == "COMPLETED"
    assert run["name"] == seen["job_id"] == run["parameters"]["job_id"]  # named after the job, parameter filled
    assert run["parameters"]["steps"] == STEPS and run["parameters"]["budget_usd"] == BUDGET
    events = [ln for ln in out.splitlines() if re.match(r"\s+\d\d:\d\d:\d\d  ", ln)]
    said = " / ".join(events)
    for what in ("planned on", "provisioning", "training: attempt 1 started", "spot preemption took",
                 "newest checkpoint: step", "re-planned on", "training: attempt 2 resumed from step"):
        assert what in said, f"{what!r} not among the events: {said}"
    assert out.count(f"/runs/flow-run/{seen['run_id']}") >= 2, out  # first line, and the summary's


def test_the_run_has_its_info_logs_and_one_artifact_of_each_kind(prefect_api, journey):
    seen = journey["seen"]
    logs = _api(prefect_api, "/logs/filter", {"logs": {"flow_run_id": {"any_": [seen["run_id"]]},
                                                       "level": {"ge_": 20}}, "limit": 200})
    job_lines = [lg["message"] for lg in logs if lg["message"].startswith(f"job {seen['job_id']}: ")]
    assert any("re-planned on" in m for m in job_lines), job_lines
    artifacts = _api(prefect_api, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [seen["run_id"]]}}})
    keys = sorted(a["key"] for a in artifacts)
    assert keys == sorted(f"{k}-{seen['job_id']}" for k in ("attempts", "cost", "status")), keys
    by_kind = _artifacts(prefect_api, seen["run_id"])
    assert by_kind["status"]["data"] == 100.0 and all(a["task_run_id"] is None for a in artifacts)


def test_the_ui_shows_the_run_its_logs_live_spend_and_the_attempts_in_order(prefect_api, journey):
    from playwright.sync_api import sync_playwright

    seen = journey["seen"]
    mid = seen["mid_run"]
    assert mid is not None, "the status artifact never showed spend while the job ran"
    assert mid["state"] == "RUNNING", "the job had ended before the status showed its spend"
    spent = re.search(r"Spent ([0-9.]+) of 0\.0500 USD \((\d+) %\)", mid["text"])
    assert spent and 0 < float(spent.group(1)) <= BUDGET, mid["text"]
    assert re.search(rf"Step (\d+) of {STEPS}", mid["text"]) and "Plan (attempt" in mid["text"], mid["text"]
    with sync_playwright() as p:
        b = _Browser(p)
        try:
            page = b.run_page(seen["url"], "Logs", title=f"Flow Run: {seen['job_id']}")
            line = page.get_by_text(re.compile(f"job {re.escape(seen['job_id'])}: planned on")).first
            line.wait_for(timeout=UI_TIMEOUT_MS)
            line.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "flow-run-logs.png"))
            page = b.run_page(seen["url"], "Artifacts")
            page.get_by_text(f"attempts-{seen['job_id']}").wait_for(timeout=UI_TIMEOUT_MS)
            page.screenshot(path=str(OUT / "flow-run-artifacts.png"), full_page=True)
            page = b.artifact_page(seen["url"], f"attempts-{seen['job_id']}", "Attempt 2 ·")
            page.screenshot(path=str(OUT / "attempts-artifact.png"))
            page.get_by_text("Attempt 2 ·").first.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "attempts-artifact-2.png"))
            text = page.inner_text("body")
            assert 0 <= text.index("Attempt 1 ·") < text.index("Attempt 2 ·"), text[:2000]
            assert "spot preemption took" in text and "the smallest shape holding" in text
            page = b.artifact_page(seen["url"], f"cost-{seen['job_id']}", "preempted")
            page.screenshot(path=str(OUT / "cost-artifact.png"), full_page=True)
            # Every column fits the page at 1400 px: no table scrolls sideways.
            overflow = page.evaluate("() => [...document.querySelectorAll('table')].map("
                                     "t => t.scrollWidth - t.parentElement.clientWidth)")
            assert overflow and max(overflow) <= 1, overflow
        finally:
            b.browser.close()
