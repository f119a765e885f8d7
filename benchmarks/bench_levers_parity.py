"""Parity of a stage's memory levers: the engine trained under each recomputation and ZeRO choice
against the same plan without them, fp32 on this CPU (gloo), clipped every step.

Plan: PP 2 x TP 2 x DP 2 with replicas of different GPU types (the CPU engine runs any GPU name):
stage 0 = two TP-2 replicas (V100-16, A100-40), stage 1 = a TP-2 and a TP-1 replica (T4, L4: the
mixed-TP DP group, whose ZeRO shards full tensors).  Each choice is set on both stages.  Printed:
the largest |loss difference| over the steps and |parameter difference| after the last step
(from the final checkpoints), against the run without levers.

    .venv/bin/python benchmarks/bench_levers_parity.py [--steps 20] [--model tiny-llama] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHOICES = {  # name -> (recompute, zero) on every stage
    "none": ("none", 0), "selective": ("selective", 0), "full": ("full", 0),
    "zero1": ("none", 1), "zero2": ("none", 2), "full+zero2": ("full", 2), "selective+zero1": ("selective", 1),
}


def plan_for(model: str, recompute: str, zero: int):
    from sailor_core.plan.types import plan_from_dict

    levers = {"recompute": recompute, "zero": zero}
    return plan_from_dict({"model": model, "global_batch_size": 8, "micro_batch_size": 2, "stages": [
        {"layers": [0, 2], "replicas": [{"gpu": "V100-16", "tp": 2}, {"gpu": "A100-40", "tp": 2}], **levers},
        {"layers": [2, 4], "replicas": [{"gpu": "T4", "tp": 2}, {"gpu": "L4", "tp": 1}], **levers}]})


def main(argv=None) -> int:
    from sailor_core.runtime.data import generate_corpus
    from sailor_core.runtime.engine_run import final_params
    from sailor_core.runtime.launch import launch_local
    from sailor_core.runtime.stage_checkpoint import full_params_close

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--choices", default=",".join(CHOICES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sailor-levers-"))
    corpus = generate_corpus(work / "corpus.npy", vocab_size=512, num_tokens=60_000, seed=1)
    runs = {}
    for name in ["none", *(c for c in args.choices.split(",") if c != "none")]:
        started = time.time()
        url = str(work / name / "ck")
        res = launch_local(plan_for(args.model, *CHOICES[name]), args.steps, data=corpus, ckpt_dir=url,
                           workdir=work / name, timeout_s=1800, worker_args=("--grad-clip-norm", "0.3"))
        if res.status != "ok":
            raise RuntimeError(f"{name}: {res.status} {res.message} {res.stderr_tails}")
        runs[name] = (res.losses, final_params(url)[1], time.time() - started)
    base_losses, base_params, _ = runs["none"]
    rows = []
    for name, (losses, params, wall_s) in runs.items():
        rows.append({"choice": name, "steps": len(losses), "final_loss": losses[-1],
                     "max_loss_diff": max(abs(a - b) for a, b in zip(losses, base_losses)),
                     "max_param_diff": full_params_close(params, base_params), "wall_s": round(wall_s, 1)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.model}, PP2 x TP2 x DP2 (V100-16+A100-40 TP2 | T4 TP2 + L4 TP1), {args.steps} steps, fp32 CPU")
    print(f"{'choice':<18}{'final loss':>12}{'max |dloss|':>14}{'max |dparam|':>14}{'wall s':>9}")
    for r in rows:
        print(f"{r['choice']:<18}{r['final_loss']:>12.6f}{r['max_loss_diff']:>14.3g}{r['max_param_diff']:>14.3g}"
              f"{r['wall_s']:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
