"""The job's status card in the Prefect UI shows its chart: headless Chromium opens the flow run's
status artifact after a job with a preemption and finds the chart's image loaded (a screenshot
goes to the test's tmp dir)."""

from __future__ import annotations

import base64
import re

import pytest

from sailor_core.job import state as js

# A job with a preemption (~1 min on 2 cores) and a browser: -m slow.  The chart's data and drawing
# are tested fast in tests/job/test_curves.py.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_status_card_shows_the_loss_throughput_and_spend_chart(prefect_api, tmp_path):
    from playwright.sync_api import sync_playwright

    from flows.train_job import train_job
    from tests.flows.test_deployment_e2e import _artifacts, _Browser

    summary = train_job(model="tiny", budget_usd=0.05, steps=12, preempt_at_steps=[6], checkpoint_every_steps=3,
                        global_batch_size=8, cloud="embedded", max_gpus=1, job_id="tiny-chart")
    assert summary["status"] == "succeeded" and summary["preemptions"] == 1, summary
    state = js.JobStore().load("tiny-chart")
    status = _artifacts(prefect_api, state.flow_run_id)["status"]
    png = re.search(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", status["description"])
    assert png and base64.b64decode(png.group(1)).startswith(b"\x89PNG"), status["description"][:300]
    url = f"{prefect_api.rsplit('/api', 1)[0]}/runs/flow-run/{state.flow_run_id}"
    with sync_playwright() as p:
        b = _Browser(p)
        try:
            page = b.artifact_page(url, "status-tiny-chart", "Progress:")
            img = page.locator("img[src^='data:image/png']").first
            img.wait_for()
            img.scroll_into_view_if_needed()
            page.wait_for_function("() => [...document.querySelectorAll(\"img[src^='data:image/png']\")]"
                                   ".some(i => i.complete && i.naturalWidth > 0)")
            width = img.evaluate("i => i.naturalWidth")
            page.screenshot(path=str(tmp_path / "status-chart.png"), full_page=True)
        finally:
            b.browser.close()
    assert width == 9 * 72  # the chart as drawn (job/curves.py), loaded by the browser
    assert (tmp_path / "status-chart.png").stat().st_size > 0
