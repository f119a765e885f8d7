"""The Rich progress bar ``sailor train`` shows while the flow runs in this process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def progress_display(*, enabled: bool, steps: int) -> Iterator[None]:
    if not enabled:
        yield
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tasks.workers import add_progress_listener, remove_progress_listener

    with Progress(TextColumn("[bold]train[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), transient=False) as bar:
        task_id = bar.add_task("train", total=steps, info="planning and provisioning...")

        def on_progress(state) -> None:
            loss = "-" if state.last_loss is None else f"{state.last_loss:.4f}"
            bar.update(task_id, completed=min(state.steps_done, steps),
                       info=f"loss {loss} | attempt {state.attempt} | preemptions {state.num_preemptions} | "
                            f"{state.usd_spent():.4f}/{state.spec.budget_usd:.2f} USD")

        add_progress_listener(on_progress)
        try:
            yield
        finally:
            remove_progress_listener(on_progress)
