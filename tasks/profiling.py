"""Profiling task: one profiler run, cached on its inputs (measuring the same thing twice is waste)."""

from __future__ import annotations

from datetime import timedelta

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE


@task(name="profile-model", tags=["profiler"], cache_policy=INPUTS + TASK_SOURCE,
      cache_expiration=timedelta(days=30), persist_result=True)
def profile_model_task(model: str, micro_batch_sizes: tuple[int, ...], tp_degrees: tuple[int, ...], device: str,
                       threads: int, reps: int) -> dict:
    # lazy: torch, only in the task that profiles
    from sailor_core.profiler.compute import Hardware, profile_model, save_profiles
    from sailor_core.profiler.stats import Repetitions

    run = profile_model(model, micro_batch_sizes=list(micro_batch_sizes), tp_degrees=list(tp_degrees),
                        hardware=Hardware(device=device, threads=threads), repeat=Repetitions(reps=reps))
    path = save_profiles(run.profiles)
    rows = [{"gpu": p.gpu, "tp": p.tp_degree, "mbs": p.micro_batch_size, "layer": i,
             "fwd_s": round(layer.fwd_s, 6), "bwd_s": round(layer.bwd_s, 6)}
            for p in run.profiles for i, layer in enumerate(p.layers)]
    return {"path": str(path), "device": run.device_name, "num_profiles": len(run.profiles), "rows": rows,
            "wall_s": run.wall_s}
