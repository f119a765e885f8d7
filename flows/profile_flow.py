"""The profile flow: measure a model's layers on this machine's GPUs (or CPU) and add them to the profile DB."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_table_artifact

from tasks.profiling import profile_model_task


@flow(name="profile", description="Profile a model on the worker's GPUs (or CPU) and save the profiles.")
def profile_flow(model: str = "tiny", micro_batch_sizes: list[int] | None = None, tp_degrees: list[int] | None = None,
                 device: str = "cpu", threads: int = 1, reps: int = 5) -> dict:
    saved = profile_model_task(model, tuple(micro_batch_sizes or (1,)), tuple(tp_degrees or (1,)), device, threads, reps)
    create_table_artifact(key=f"profile-{model.lower().replace('.', '-')}", table=saved["rows"],
                          description=f"{model} on {saved['device']}: seconds per layer (forward, backward)")
    return saved
