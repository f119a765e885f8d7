"""The engine's optimizer on a GPU: AdamW step time, whole training steps, and a resume.

    python3 benchmarks/bench_engine_gpu.py --device cuda --model opt-350m --mbs 1,4

Three parts, each printed as it finishes:
1. One AdamW step over the whole model's parameters (gradients present): the engine's
   ``make_optimizer`` next to ``AdamW(foreach=False)`` (the engine's choice before session 7)
   and ``AdamW(foreach=True)``; median of ``--reps`` steps after one warm-up.
2. One training step of a 1-stage, 1-replica plan (4 micro-batches) run by ``launch_local``:
   median of the steps after the first.
3. A resume: ``--steps`` uninterrupted steps against a run checkpointed half-way and resumed
   in fresh processes; the losses after the resume must match (the optimizer's moments and step
   counts come back from the checkpoint onto the device).

Runs on CPU too (``--device cpu --model tiny``), which is how it was checked without a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="opt-350m")
    ap.add_argument("--mbs", default="1,4", help="micro-batch sizes of the training steps")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=20, help="optimizer steps timed per variant")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--no-resume", action="store_true", help="skip part 3")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the resume is half-way)")

    import torch

    from sailor_core.catalog.models import get_model
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.profiler.compute import gpu_type_of
    from sailor_core.profiler.measure import measure_model_update
    from sailor_core.runtime.optimizer import BETAS, WEIGHT_DECAY, make_optimizer
    from sailor_core.runtime.launch import launch_local

    device = torch.device(args.device)
    gpu = gpu_type_of(torch.cuda.get_device_name(0)) if device.type == "cuda" else "cpu"
    spec = get_model(args.model)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sailor-engine-gpu-"))
    print(f"== {args.model} on {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'CPU'} "
          f"(torch {torch.__version__}); catalog type {gpu}")

    def adamw(**kw):
        return lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=BETAS, eps=1e-8, weight_decay=WEIGHT_DECAY, **kw)

    variants = {"make_optimizer (engine)": lambda ps: make_optimizer(ps, 1e-3),
                "AdamW(foreach=False)": adamw(foreach=False), "AdamW(foreach=True)": adamw(foreach=True)}
    for name, make in variants.items():
        _, step, _ = measure_model_update(spec, device=device, reps=args.reps, make=make)
        print(f"optimizer step, {name}: {step.median_s * 1e3:.2f} ms", flush=True)

    def plan_for(mbs: int):
        return plan_from_dict({"model": args.model, "global_batch_size": 4 * mbs, "micro_batch_size": mbs,
                               "stages": [{"layers": [0, spec.num_layer_indices],
                                           "replicas": [{"gpu": gpu, "tp": 1, "zone": "local"}]}]})

    ok = True
    for mbs in [int(x) for x in args.mbs.split(",")]:
        res = launch_local(plan_for(mbs), args.steps, workdir=workdir / f"steps-{mbs}", timeout_s=900)
        if res.status != "ok":
            print(f"mbs {mbs}: engine run failed: {res.status} {res.message}")
            ok = False
            continue
        med = statistics.median(res.step_times_s[1:])
        print(f"one step, gbs {4 * mbs} (4 x mbs {mbs}): {med * 1e3:.1f} ms "
              f"(steps {', '.join(f'{t * 1e3:.1f}' for t in res.step_times_s)})"
              + (f", peak allocated {res.peak_memory_bytes / 1e9:.2f} GB" if res.peak_memory_bytes else ""),
              flush=True)

    if args.no_resume:
        return 0 if ok else 1
    plan = plan_for(int(args.mbs.split(",")[0]))
    half = args.steps // 2
    whole = launch_local(plan, args.steps, workdir=workdir / "whole", timeout_s=900)
    ckpt_dir = workdir / "ckpt"
    first = launch_local(plan, half, workdir=workdir / "first", ckpt_dir=str(ckpt_dir), ckpt_every=half,
                         timeout_s=900)
    second = launch_local(plan, args.steps, workdir=workdir / "second", ckpt_dir=str(ckpt_dir),
                          ckpt_every=half, resume=True, timeout_s=900)
    runs = {"whole": whole, "first": first, "resumed": second}
    bad = {k: f"{r.status} {r.message}" for k, r in runs.items() if r.status != "ok"}
    if bad:
        print(f"resume check failed to run: {bad}")
        return 1
    after = dict(zip(second.steps, second.losses))
    pairs = [(whole.losses[i], after[s]) for i, s in enumerate(whole.steps) if s in after]
    worst = max(abs(a - b) / abs(a) for a, b in pairs)
    print(f"resume after step {half}: steps {sorted(after)} resumed; losses uninterrupted "
          f"{[round(a, 4) for a, _ in pairs]}, resumed {[round(b, 4) for _, b in pairs]}; "
          f"worst relative difference {worst:.2e}")
    # bf16 autocast kernels need not be bit-reproducible run to run; a lost optimizer state
    # (moments or step count reset) moves the loss by far more than this.
    ok = ok and bool(pairs) and worst < 1e-3
    print("resume check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
