"""What the metrics cost a step: the CPU engine (tiny model, 3 stages, gloo) with and without
TensorBoard, W&B (offline) and MLflow (file store), and the per-step figures by themselves.

  .venv/bin/python benchmarks/bench_metrics.py [--steps 30] [--repeats 2]

Step time: the median over the steps after the first two of rank 0's wall time per step
(``step_time_s``) and CPU time (``cpu_time_s``, less distorted by a busy shared machine), the
best of ``--repeats`` launches per variant, alternated.  The per-step figures (learning rate,
gradient norm, FLOPs, memory high-water mark, perplexity, the trackers' scalars) are counted
in every variant; their own cost is timed alone, in-process, at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _plan():
    from sailor_core.plan.types import plan_from_dict

    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2,
                           "stages": [{"layers": [a, b], "replicas": [{"gpu": "cpu"}]}
                                      for a, b in ((0, 2), (2, 3), (3, 4))]})


def _run(variant: str, steps: int, work: Path) -> tuple[float, float]:
    from sailor_core.runtime.launch import launch_local

    flags, env = ("--validate-every", "0"), {}
    if variant != "off":
        flags += ("--tensorboard-url", str(work / "tb"), "--job-id", f"bench-{time.time_ns()}")
    if variant == "all":
        env = {"WANDB_MODE": "offline", "WANDB_DIR": str(work / "wandb"), "WANDB_SILENT": "true",
               "MLFLOW_TRACKING_URI": f"file://{work / 'mlruns'}"}
    res = launch_local(_plan(), steps, workdir=work, timeout_s=600, worker_args=flags, env=env,
                       ckpt_dir=str(work / "ck"), ckpt_every=5)
    assert res.status == "ok", res.message
    return statistics.median(res.step_times_s[2:]), statistics.median(res.step_cpu_s[2:])


def _figures_alone(n: int = 2000) -> float:
    """Seconds per step of rank 0's figures without the step: what `_step_figures`, the memory
    high-water mark and `_tracked` cost on this machine."""
    import torch

    from sailor_core.runtime import worker
    from sailor_core.runtime.metrics import peak_memory_bytes
    from sailor_core.runtime.recipe import make_recipe

    class _T:  # the trainer's fields the figures read
        recipe = make_recipe(100, {})
        grad_norm_before_clip = torch.tensor(1.5)
        step = 10

    run = worker._Run(args=None, rank=0, plan=_plan(), spec=None, data=None, recipe=_T.recipe, storage=None,
                      metrics=None, stop={}, device=torch.device("cpu"), trainer=_T(), flops_per_step=1e9,
                      peak_flops=None)
    values = [1.0, 0.0, 0.0, 1e8, 1e8, 1e8]
    t0 = time.perf_counter()
    for _ in range(n):
        peak_memory_bytes(run.device)
        record = {"loss": 1.0, "samples_per_s": 1.0, "tokens_per_s": 1.0, "step_time_s": 1.0,
                  **worker._step_figures(run, values, 0.1)}
        worker._tracked(record)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    best: dict[str, tuple[float, float]] = {}
    for r in range(args.repeats):
        for variant in ("off", "tensorboard", "all"):
            with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
                wall, cpu = _run(variant, args.steps, Path(tmp))
            old = best.get(variant)
            best[variant] = (min(wall, old[0]), min(cpu, old[1])) if old else (wall, cpu)
    out = {v: {"step_s": round(w, 4), "cpu_s": round(c, 4)} for v, (w, c) in best.items()}
    out["figures_alone_us_per_step"] = round(_figures_alone() * 1e6, 1)
    for v in ("tensorboard", "all"):
        out[f"{v}_over_off_wall"] = round(best[v][0] / best["off"][0], 3)
        out[f"{v}_over_off_cpu"] = round(best[v][1] / best["off"][1], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
