"""What ``sailor train`` shows on the terminal while a job runs, here or on a worker.

The run's page in the Prefect UI first, then a Rich progress bar (steps, loss, preemptions,
spend) with the job's events printed above it as they happen: a preemption, the
checkpoint, the re-plan, provisioning, training resumed.  A local run feeds it from the
flow's listeners (``tasks.workers``' progress, ``tasks.reporting``'s events); a deployment
run from the job state and the run's logs (``flows.deploy_client``).

A filter on Prefect's console handler keeps the engine's failure reports (``Task run failed
with exception ...`` with its traceback, ``Finished in state Failed``) off the terminal: they
are about conditions the flow handles (a provisioning try that found no capacity, a retried
cloud call) or reports itself (the CLI's ``error: ...`` line), and stay in the Prefect UI and
API logs.  ``SAILOR_DEBUG=1`` shows everything.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from sailor_core import settings
from sailor_core.job import report

_RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
_ENGINE_FAILURES = ("Task run failed with", "Finished in state", "Encountered exception during execution",
                    "Crash detected")


class EngineFailureFilter(logging.Filter):
    """Drops Prefect's own failure reports (and any traceback) of flow and task runs; keeps the
    flow's own warnings, e.g. ``provisioning failed: ...``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_RUN_LOGGERS):
            return True
        if record.exc_info:
            return False
        return not record.getMessage().startswith(_ENGINE_FAILURES)


@contextlib.contextmanager
def quiet_engine_failures() -> Iterator[None]:
    """Install ``EngineFailureFilter`` on the console handlers (Prefect's logging is set up by now)."""
    if settings.debug():
        yield
        return
    from prefect.logging.handlers import PrefectConsoleHandler  # lazy: prefect, after the API is chosen

    handlers = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    flt = EngineFailureFilter()
    for h in handlers:
        h.addFilter(flt)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(flt)


def progress_info(*, loss: float | None, num_preemptions: int, usd_spent: float, budget_usd: float) -> str:
    # Short enough for an 80-column terminal next to the bar, the count and the time.
    shown = "-" if loss is None else f"{loss:.4f}"
    return f"loss {shown} | {num_preemptions} preemptions | {usd_spent:.4f}/{budget_usd:.2f} USD"


class LiveDisplay:
    """The bar and the event lines above it; every method is a no-op when not ``enabled`` (``--json``)."""

    def __init__(self, *, enabled: bool, steps: int) -> None:
        self.enabled = enabled
        self.steps = steps
        self._bar = None
        self._task = None

    def start(self) -> None:
        if not self.enabled:
            return
        # lazy: loaded when the command runs (the CLI starts light)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # lazy: loaded when the command runs (the CLI starts light)
        from flows.cli.common import console

        self._bar = Progress(TextColumn("[bold]train[/bold]"), BarColumn(bar_width=12), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console(),
                             transient=False)
        self._task = self._bar.add_task("train", total=self.steps, info="planning...")
        self._bar.start()

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()

    def line(self, text: str) -> None:
        """A line above the bar."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def run_started(self, url: str | None, job_id: str) -> None:
        self.line(f"flow run {url or '(no Prefect UI: temporary server)'}  job {job_id}")

    def event(self, text: str, at_unix_s: float | None = None) -> None:
        self.line(f"  {report.local_time(at_unix_s or time.time(), date=False)}  {text}")

    def state(self, state) -> None:
        """Progress from a job state (``sailor_core.job.state.JobState``)."""
        if self._bar is None:
            return
        self.steps = state.spec.steps  # the job's own total (a continued job keeps its steps)
        self._bar.update(self._task, total=self.steps, completed=min(state.steps_done, self.steps),
                         info=progress_info(loss=state.last_loss, num_preemptions=state.num_preemptions,
                                            usd_spent=state.usd_spent(), budget_usd=state.spec.budget_usd))

    def finish(self, summary: dict) -> None:
        """The job's final figures on the bar (the spend goes on through the shutdown, after the last step)."""
        if self._bar is None:
            return
        self._bar.update(self._task, completed=min(int(summary.get("steps") or 0), self.steps),
                         info=progress_info(loss=summary.get("final_loss"),
                                            num_preemptions=int(summary.get("preemptions") or 0),
                                            usd_spent=float(summary.get("usd_spent") or 0.0),
                                            budget_usd=float(summary.get("budget_usd") or 0.0)))

    def on_job_event(self, event) -> None:
        """A listener of ``tasks.reporting``'s events (a flow run in this process)."""
        if event.kind == "run":
            self.run_started(event.url, event.job_id)
        elif event.kind == "event":
            self.event(event.text)


@contextlib.contextmanager
def live_display(*, enabled: bool, steps: int) -> Iterator[LiveDisplay]:
    display = LiveDisplay(enabled=enabled, steps=steps)
    display.start()
    try:
        yield display
    finally:
        display.stop()
