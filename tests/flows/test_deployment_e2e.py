"""End to end against a real local Prefect server: deploy from prefect.yaml, run through a
process worker with parameters (via `sailor train --deployment`), read the run's artifacts
back through the API, and find the run and its plan in the UI with headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.flows.conftest import ROOT

pytestmark = pytest.mark.e2e
CHROMIUM = "/usr/bin/chromium"


def _env(prefect_api: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": prefect_api, "SAILOR_ROOT": str(ROOT),
            "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "COLUMNS": "200"}


def _prefect(args: list[str], env: dict[str, str], timeout_s: float = 180) -> str:
    exe = Path(sys.executable).with_name("prefect")
    out = subprocess.run([str(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, f"prefect {' '.join(args)}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out.stdout


def _api(prefect_api: str, path: str, body: dict | None = None) -> object:
    req = urllib.request.Request(f"{prefect_api}{path}", method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def deployed_run(prefect_api, tmp_path_factory):
    """Deploy every flow of prefect.yaml, start a worker, run train-job with parameters through the CLI."""
    env = _env(prefect_api)
    _prefect(["work-pool", "create", "sailor-process", "--type", "process", "--overwrite"], env)
    _prefect(["--no-prompt", "deploy", "--all"], env)
    log = open(tmp_path_factory.mktemp("worker") / "worker.log", "w")
    worker = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "worker", "start", "--pool",
                               "sailor-process"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        out = subprocess.run([str(Path(sys.executable).with_name("sailor")), "train", "--deployment",
                              "--budget-usd", "0.05", "--steps", "8", "--max-gpus", "1", "--json"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    finally:
        worker.terminate()  # a foreground worker stops on SIGTERM; it is our child, so no signal is lost
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_deployments_from_prefect_yaml(prefect_api, deployed_run):
    deployments = {d["name"]: d for d in _api(prefect_api, "/deployments/filter", {})}
    assert {"train-job", "plan", "profile", "refresh-offers"} <= set(deployments)
    assert deployments["train-job"]["parameters"]["model"] == "tiny"
    assert deployments["train-job"]["work_pool_name"] == "sailor-process"
    crons = [s["schedule"].get("cron") for s in deployments["refresh-offers"]["schedules"]]
    assert crons == ["*/30 * * * *"]


def test_triggered_run_completes_with_its_parameters_and_artifacts(prefect_api, deployed_run):
    summary = deployed_run
    assert summary["status"] == "succeeded", summary
    assert summary["steps"] == 8 and summary["instances_left_running"] == 0
    assert summary["usd_spent"] <= summary["budget_usd"] == 0.05
    run = _api(prefect_api, f"/flow_runs/{summary['flow_run_id']}")
    assert run["state"]["type"] == "COMPLETED"
    assert run["parameters"]["steps"] == 8 and run["parameters"]["budget_usd"] == 0.05
    artifacts = _api(prefect_api, "/artifacts/filter",
                     {"artifacts": {"flow_run_id": {"any_": [summary["flow_run_id"]]}}})
    by_key = {a["key"]: a for a in artifacts if a["key"]}
    job = summary["job_id"]
    for kind in ("plan", "replan", "pareto", "progress", "cost"):
        assert f"{kind}-{job}" in by_key, f"no {kind} artifact; got {sorted(by_key)}"
    assert by_key[f"progress-{job}"]["data"] == 100.0
    plan_rows = json.loads(by_key[f"plan-{job}"]["data"])
    assert plan_rows and {"stage", "gpu", "tp", "zone"} <= set(plan_rows[0])


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/bootstrap --with-browser)")
def test_the_ui_shows_the_run_and_its_plan_artifact(prefect_api, deployed_run):
    from playwright.sync_api import sync_playwright

    out_dir = ROOT / "test-output"
    out_dir.mkdir(exist_ok=True)
    ui = prefect_api.removesuffix("/api")
    run = _api(prefect_api, f"/flow_runs/{deployed_run['flow_run_id']}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{ui}/runs/flow-run/{run['id']}", wait_until="networkidle", timeout=60_000)
            page.wait_for_function(f"document.title.includes({json.dumps(run['name'])})", timeout=60_000)
            page.locator("ul[role=tablist] li.p-tab", has_text="Artifacts").first.click()
            card = page.locator("a[href*='/artifacts/artifact/']").filter(
                has=page.get_by_text(f"plan-{deployed_run['job_id']}", exact=True))
            card.first.wait_for(timeout=60_000)
            page.screenshot(path=str(out_dir / "flow-run-artifacts.png"), full_page=True)
            card.first.click()
            page.wait_for_url("**/artifacts/artifact/**", timeout=60_000)
            page.get_by_text("zone", exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(out_dir / "plan-artifact.png"), full_page=True)
            body = page.inner_text("body")
        finally:
            browser.close()
    plan = json.loads(_api(prefect_api, "/artifacts/filter", {"artifacts": {"key": {"any_": [
        f"plan-{deployed_run['job_id']}"]}}})[0]["data"])
    assert plan[0]["gpu"] in body and plan[0]["zone"] in body
