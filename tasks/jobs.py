"""Job bookkeeping tasks: start or resume the job, training data, the checkpoint it stands on, the summary."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE

from sailor_core import jobstate as js

SYNTHETIC = "synthetic"
SYNTHETIC_TOKENS = 1 << 17


def start_or_resume(store: js.JobStore, spec: js.JobSpec, job_id: str) -> js.JobState:
    """The job's saved state when it exists (same job, next flow run), else a new job."""
    if store.exists(job_id):
        state = store.load(job_id)
        if state.spec != spec:
            get_run_logger().warning(
                "job %s continues with the settings it was started with (budget %.4f USD, %d steps); "
                "the new flow run's differing parameters are ignored", job_id, state.spec.budget_usd,
                state.spec.steps)
    else:
        state = js.new_job(spec, job_id)
    state = js.with_flow_run(state)
    store.save(state)
    return state


@task(name="prepare-data", tags=["data"], cache_policy=INPUTS + TASK_SOURCE,
      cache_expiration=timedelta(days=7), persist_result=True)
def prepare_data(spec: js.JobSpec, job_url: str) -> str:
    """A synthetic token corpus for ``dataset="synthetic"``; any other dataset is a path or URL used as is."""
    if spec.dataset != SYNTHETIC:
        return spec.dataset
    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.data import generate_corpus

    path = Path(job_url.removeprefix("file://")) / "data" / f"synthetic-{spec.model}-seed{spec.seed}.npy"
    if not path.exists():
        generate_corpus(path, vocab_size=get_model(spec.model).vocab_size, num_tokens=SYNTHETIC_TOKENS,
                        seed=spec.seed)
    return str(path)


@task(name="find-checkpoint", tags=["checkpoint"], retries=2, retry_delay_seconds=[1, 2], cache_policy=NO_CACHE)
def note_checkpoint(state: js.JobState) -> js.JobState:
    """Record the newest checkpoint whose manifest verifies (a torn one is skipped)."""
    from sailor_core.runtime.checkpoint import latest_valid_checkpoint

    info = latest_valid_checkpoint(state.spec.checkpoint_url)
    if info is None:
        return state
    return js.with_progress(state, last_checkpoint_step=info.step)


def summary(state: js.JobState, *, instances_left_running: int) -> dict[str, Any]:
    """The ``sailor train`` summary (DESIGN.md keys) plus the job id and why it ended."""
    return {
        "status": state.status,
        "steps": state.steps_done,
        "final_loss": state.last_loss,
        "replans": max(0, len(state.replans) - 1),
        "preemptions": state.num_preemptions,
        "usd_spent": round(state.usd_spent(state.updated_unix_s), 6),
        "budget_usd": state.spec.budget_usd,
        "instances_left_running": instances_left_running,
        "job_id": state.job_id,
        "status_reason": state.status_reason,
        "attempts": state.attempt,
        "last_checkpoint_step": state.last_checkpoint_step,
        "flow_run_id": _flow_run_id(),
    }


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return str(run_id) if run_id else None
