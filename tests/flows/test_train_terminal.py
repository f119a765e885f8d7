"""What `sailor train` lets through to the terminal of Prefect's run logs."""

from __future__ import annotations

import logging
import sys

from flows.cli.progress import EngineFailureFilter, progress_info


def _record(name: str, level: int, msg: str, *, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("no capacity")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord(name, level, __file__, 1, msg, None, exc_info)


def test_engine_failure_reports_stay_off_the_terminal_and_the_flows_own_warnings_do_not():
    keep = EngineFailureFilter().filter
    # Prefect's report of a task the flow handles (a provisioning try without capacity), with traceback.
    assert not keep(_record("prefect.task_runs", logging.ERROR,
                            "Task run failed with exception: CapacityError('x') - Retries are exhausted", exc=True))
    assert not keep(_record("prefect.task_runs", logging.ERROR, "Finished in state Failed('Task run encountered')"))
    assert not keep(_record("prefect.flow_runs", logging.ERROR, "Encountered exception during execution: x",
                            exc=True))
    # The flow's own one-line warnings, and other libraries' logs, still show.
    assert keep(_record("prefect.flow_runs", logging.WARNING, "provisioning failed: no T4 in us-central1-a"))
    assert keep(_record("prefect.task_runs", logging.WARNING,
                        "preemption at step 21 (--preempt-at 20) not injected: i-1 is no longer live"))
    assert keep(_record("sailor.infra.local", logging.ERROR, "embedded cloud tick failed", exc=True))


def test_the_progress_line_fits_an_80_column_terminal_next_to_the_bar():
    info = progress_info(loss=4.93941, num_preemptions=12, usd_spent=0.04999, budget_usd=100.0)
    assert info == "loss 4.9394 | 12 preemptions | 0.0500/100.00 USD"
    # "train", a 12-column bar, "30/30", "0:01:15" and the spaces between them take 32 columns.
    assert 32 + len(info) <= 80
