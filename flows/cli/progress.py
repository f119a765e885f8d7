"""What ``sailor train`` shows on the terminal while the flow runs in this process.

A Rich progress bar fed by the watch task's progress listeners, and a filter on
Prefect's console handler: the engine's failure reports (``Task run failed
with exception ...`` with its traceback, ``Finished in state Failed``) are about
conditions the flow handles (a provisioning try that found no capacity, a
retried cloud call) or reports itself (the CLI's ``error: ...`` line), so they
stay in the Prefect UI and API logs, not on the terminal.  ``SAILOR_DEBUG=1``
shows everything.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from sailor_core import settings

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
    from prefect.logging.handlers import PrefectConsoleHandler

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


@contextlib.contextmanager
def progress_display(*, enabled: bool, steps: int) -> Iterator[Callable[[dict], None]]:
    """Yields ``finish(summary)``: shows the job's final figures on the bar (the spend goes on
    through the shutdown, after the last progress report)."""
    if not enabled:
        yield lambda summary: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flows.cli.common import console
    from tasks.workers import add_progress_listener, remove_progress_listener

    with Progress(TextColumn("[bold]train[/bold]"), BarColumn(bar_width=12), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console(),
                  transient=False) as bar:
        task_id = bar.add_task("train", total=steps, info="planning and provisioning...")

        def on_progress(state) -> None:
            bar.update(task_id, completed=min(state.steps_done, steps),
                       info=progress_info(loss=state.last_loss, num_preemptions=state.num_preemptions,
                                          usd_spent=state.usd_spent(), budget_usd=state.spec.budget_usd))

        def finish(summary: dict) -> None:
            bar.update(task_id, completed=min(int(summary.get("steps") or 0), steps),
                       info=progress_info(loss=summary.get("final_loss"),
                                          num_preemptions=int(summary.get("preemptions") or 0),
                                          usd_spent=float(summary.get("usd_spent") or 0.0),
                                          budget_usd=float(summary.get("budget_usd") or 0.0)))

        add_progress_listener(on_progress)
        try:
            yield finish
        finally:
            remove_progress_listener(on_progress)
