"""Job bookkeeping tasks: start or resume the job, training data, the checkpoint it stands on, the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from sailor_core.catalog.models import get_model, model_slug
from sailor_core.errors import InputError, SailorError
from sailor_core.job import state as js
from sailor_core.job.logs import copy_logs
from sailor_core.job.spec import JobSpec, raised_limits, raised_words

SYNTHETIC = "synthetic"
SYNTHETIC_TOKENS = 1 << 16


def start_or_resume(store: js.JobStore, spec: JobSpec, job_id: str, *, run_id=None,
                    url: str | None = None) -> js.JobState:
    """The job's saved state when it exists (same job, next flow run), else a new job; either way
    with this flow run (``run_id``, its page ``url``) as the job's latest.

    A job whose data its workers would refuse (``check_data``) is saved as failed and its
    InputError raised, before anything is rented."""
    if store.exists(job_id):
        state = store.load(job_id)
        raised = raised_limits(state.spec, spec) if state.spec != spec else None
        if raised is not None:
            get_run_logger().info("job %s continues with %s", job_id, raised_words(state.spec, raised))
            state = js.with_spec(state, raised)
        elif state.spec != spec:
            get_run_logger().warning(
                "job %s continues with the settings it was started with (budget %.4f USD, %d steps); "
                "the new flow run's differing parameters are ignored", job_id, state.spec.budget_usd,
                state.spec.steps)
    else:
        state = js.new_job(spec, job_id)
    request = store.stop_request(job_id)
    if request is not None and state.status in js.ENDED_STATUSES and state.updated_unix_s >= request.at_unix_s:
        store.clear_stop(job_id)  # it stopped an earlier run; a newer one (a Ctrl-C while this run started) stands
    state = js.with_flow_run(state, str(run_id) if run_id else None, url)
    if not state.finished:
        try:
            check_data(state.spec)
        except InputError as exc:
            store.save(js.with_status(state, js.FAILED, str(exc)))
            raise
    store.save(state)
    return state


def check_data(spec: JobSpec) -> None:
    """InputError when the job's data splits as its workers would refuse it (``TokenDataset``'s
    split: the held-out samples, at least one global batch, leave none to train on), so that no
    instance is rented for workers that exit at once.  The synthetic corpus holds
    ``SYNTHETIC_TOKENS``; a local file is counted from its header, and its manifest (``sailor data
    prepare``'s, when there is one) must name a tokenizer whose ids the model embeds.  Data in object
    storage is left to the workers (the flow may lack what the instances have to read it): their
    refusal ends the job after its first attempt (``recovery.after_attempt``)."""
    # lazy: torch (~2 s), which the flow loads anyway to find the checkpoint
    from sailor_core.runtime.data import is_remote, local_num_tokens, split_samples
    from sailor_core.runtime.token_manifest import check_manifest

    model = get_model(spec.model)
    if spec.dataset == SYNTHETIC:
        num_tokens = SYNTHETIC_TOKENS
    elif is_remote(spec.dataset):
        return
    else:
        num_tokens = local_num_tokens(spec.dataset)
        check_manifest(spec.dataset, num_tokens, spec.model, model.vocab_size)
    # As the worker splits it: a job's plans leave the sequence length to the model, and hold out at
    # least the plan's global batch (at least one sample when the planner picks the batch).
    split_samples(spec.dataset, num_tokens, model.seq_len,
                  validation_fraction=spec.validation_fraction, min_val_samples=spec.global_batch_size or 1)


# No result cache: the file itself is the cache (a cached path whose file was removed would break the job).
@task(name="prepare-data", tags=["data"], cache_policy=NO_CACHE)
def prepare_data(dataset: str, model: str, seed: int, data_dir: str) -> str:
    """A synthetic token corpus for ``dataset="synthetic"``; any other dataset is a path or URL used as is."""
    if dataset != SYNTHETIC:
        return dataset
    path = Path(data_dir) / f"synthetic-{model_slug(model)}-seed{seed}.npy"
    if not path.exists():
        from sailor_core.runtime.data import generate_corpus  # lazy: torch (~2 s), only to make a corpus

        generate_corpus(path, vocab_size=get_model(model).vocab_size, num_tokens=SYNTHETIC_TOKENS, seed=seed)
    return str(path)


@task(name="find-checkpoint", tags=["checkpoint"], retries=2, retry_delay_seconds=[1, 2], cache_policy=NO_CACHE)
def note_checkpoint(state: js.JobState) -> js.JobState:
    """Record the newest checkpoint whose files have the sizes its manifest says (a torn one is
    skipped).  Sizes, not contents: this machine is not where the job trains, and reading a whole
    checkpoint from the bucket at every attempt's end would cost minutes and internet egress on a
    real model; the job's rank 0 reads and hashes every file before training on it."""
    # lazy: torch (~2 s), when the task runs
    from sailor_core.runtime.checkpoint import VERIFY_SIZES, latest_valid_checkpoint

    info = latest_valid_checkpoint(state.spec.checkpoint_url, verify=VERIFY_SIZES)
    if info is None:
        return state
    known = state.last_checkpoint
    when = known.at_unix_s if known is not None and known.step == info.step else None  # as its workers reported it
    return js.with_checkpoint(state, js.CheckpointRecord(step=info.step, url=f"{info.url.rstrip('/')}/{info.dirname}",
                                                         at_unix_s=when))


def keep_logs(instances_url: str, job_url: str) -> None:
    """The logs the instances uploaded, copied to the job's own storage when theirs is elsewhere
    (the embedded cloud's bucket lives only as long as its process): ``sailor logs`` reads them there."""
    if instances_url.rstrip("/") == job_url.rstrip("/"):
        return
    try:
        num_logs = copy_logs(instances_url, job_url)
    except (SailorError, OSError) as exc:  # the job's end stands without its logs
        get_run_logger().warning("the instances' logs were not kept: %s", exc)
        return
    get_run_logger().info("%d logs of the job's instances kept under %s/logs", num_logs, job_url.rstrip("/"))


def summary(state: js.JobState, *, instances_left_running: int) -> dict[str, Any]:
    """The ``sailor train`` summary plus the job id, why it ended and its flow run."""
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
        "flow_run_id": state.flow_run_id,
        "flow_run_url": state.flow_run_url,
    }
