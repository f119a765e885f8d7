"""Run a plan locally and, on request, compare it with single-process training (CLI and benchmarks)."""

from __future__ import annotations

from pathlib import Path

from sailor_core.job.worker_args import worker_argv
from sailor_core.plan.types import Plan
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime.stage_checkpoint import full_params_close
from sailor_core.runtime.launch import ensure_corpus, launch_local
from sailor_core.runtime.recipe import Recipe
from sailor_core.plan.layout import world_size
from sailor_core.storage import open_storage


def final_params(url: str) -> tuple[ckpt.CheckpointInfo, dict]:
    """Full parameters of the latest valid checkpoint: {layer index: {name: tensor}}."""
    info = ckpt.latest_valid_checkpoint(url)
    if info is None:
        raise ckpt.CheckpointError(f"no valid checkpoint under {url}")
    storage = open_storage(url)
    n = int(info.meta["num_layer_indices"])
    return info, {i: ckpt.read_layer(storage, info, i)["params"] for i in range(n)}


def run_plan(plan: Plan, steps: int, *, workdir: Path, data: str | Path | None = None,
             ckpt_dir: str | None = None, ckpt_every: int = 0, resume: bool = False,
             recipe: Recipe | None = None, seed: int = 0, reference: bool = False,
             timeout_s: float = 900.0) -> dict:
    """Train ``plan`` up to step ``steps`` with ``recipe`` (default: a job's over ``steps``)."""
    # lazy: the reference loads torch in-process; a plain run only spawns workers
    from sailor_core.runtime.reference import train_reference

    recipe = recipe or Recipe(total_steps=steps)
    data = data or ensure_corpus(workdir, plan, seed=seed)
    if reference and ckpt_dir is None:
        ckpt_dir = str(workdir / "ckpt")  # the final checkpoint holds the full parameters to compare
    res = launch_local(plan, steps, data=data, ckpt_dir=ckpt_dir, ckpt_every=ckpt_every,
                       resume=resume, seed=seed, workdir=workdir, timeout_s=timeout_s,
                       worker_args=tuple(worker_argv(recipe)))
    out = res.to_dict()
    out.update(world_size=world_size(plan), global_batch_size=plan.global_batch_size,
               seq_len=plan.effective_seq_len(), model=plan.model)
    if reference and res.status == "ok":
        info, params = final_params(ckpt_dir)
        first_step = res.steps[0] - 1 if res.steps else 0
        # A resumed run is compared from its checkpoint's sample position onward only when it
        # started from scratch; otherwise the reference would need that checkpoint's weights.
        if first_step == 0:
            ref = train_reference(plan, steps, str(data), recipe=recipe, seed=seed)
            out["reference_losses"] = ref.losses
            out["max_param_diff"] = full_params_close(params, ref.params)
            out["max_loss_diff"] = max(abs(a - b) for a, b in zip(res.losses, ref.losses))
        else:
            out["message"] = "reference skipped: the run resumed from a checkpoint"
    return out
