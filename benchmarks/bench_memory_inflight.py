"""Memory with K micro-batches in flight: the engine's peak tensor memory per rank against the
memory model (``sailor memory`` / ``simulator/memory.py``), K = 1..8, measured on this CPU.

The measured stage is the same for every K: layers [0, 4) of ``small`` (embedding + 3 blocks)
as stage 0 of a 2-stage plan whose stage 1 ([4, 8): 3 blocks, norm, head, loss) has D = K - 1
replicas.  The engine's 1F1B lookahead counts in the widest stage's micro-batches
(``runtime/pipeline_order``), so stage 0 runs D warm-up forwards and holds K = D + 1 micro-batches
in flight (K = 1: one micro-batch per iteration).  Each stage-1 replica holds one (the last
stage, with the loss).  Every worker counts the bytes of its live tensor storages through a
torch dispatch mode (``benchmarks/inflight_site/sitecustomize.py``; CPU torch has no allocator
statistics) over 3 steps; the prediction is the model's allocated bytes (its peak less the
regime's constant process overhead) from ``simulate`` of the same plan, regime
``torch-fp32-adamw`` (what the engine runs on CPU).

    .venv/bin/python benchmarks/bench_memory_inflight.py [--mbs 2] [--ks 1,2,3,4,5,6,7,8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SITE = Path(__file__).resolve().parent / "inflight_site"
MODEL, SPLIT = "small", 4


def plan_for(k: int, mbs: int):
    from sailor_core.plan.types import plan_from_dict

    rep = {"gpu": "cpu", "tp": 1, "zone": "local"}
    num_mb = 1 if k == 1 else 2 * k
    return plan_from_dict({"model": MODEL, "global_batch_size": num_mb * mbs, "micro_batch_size": mbs,
                           "stages": [{"layers": [0, SPLIT], "replicas": [rep]},
                                      {"layers": [SPLIT, 8], "replicas": [rep] * max(1, k - 1)}]})


def measure(plan, steps: int, workdir: Path) -> dict[int, int]:
    """Peak live tensor bytes of every rank over ``steps`` steps of the engine."""
    from sailor_core.runtime.launch import launch_local

    out = workdir / "live"
    out.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(SITE), "SAILOR_BENCH_LIVE_TENSORS_DIR": str(out)}
    res = launch_local(plan, steps, workdir=workdir, env=env, timeout_s=900)
    if res.status != "ok":
        raise RuntimeError(f"engine run {res.status}: {res.message} {res.stderr_tails}")
    peaks = {}
    for f in out.glob("rank*.json"):
        rec = json.loads(f.read_text())
        peaks[int(rec["rank"])] = int(rec["peak_bytes"])
    return peaks


def predict(plan):
    """The simulator's memory of each stage's first replica (``MemoryBreakdown``), regime
    ``torch-fp32-adamw`` (the engine on CPU: fp32, no autocast)."""
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.simulator import simulate

    sim = simulate(plan_from_dict({**plan.to_dict(), "regime": "torch-fp32-adamw"}))
    return [s.replicas[0].memory for s in sim.stages]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sailor-inflight-"))
    os.environ["SAILOR_HOME"] = str(workdir / "sailor_home")
    rows = []
    for k in [int(x) for x in args.ks.split(",")]:
        plan = plan_for(k, args.mbs)
        peaks = measure(plan, args.steps, workdir / f"k{k}")
        first, last = predict(plan)
        assert first.num_inflight == k
        last_measured = max(v for r, v in peaks.items() if r > 0)
        row = {"k": k, "stage0_measured_bytes": peaks[0], "stage0_predicted_bytes": first.allocated_bytes,
               "stage0_error": first.allocated_bytes / peaks[0] - 1, "stage0_parts": first.to_dict(),
               "last_measured_bytes": last_measured, "last_predicted_bytes": last.allocated_bytes,
               "last_error": last.allocated_bytes / last_measured - 1}
        rows.append(row)
        if not args.json:
            print(f"K={k}: stage 0 [0, {SPLIT}) measured {peaks[0] / 1e6:7.2f} MB, predicted "
                  f"{first.allocated_bytes / 1e6:7.2f} MB ({row['stage0_error']:+.1%}); last stage (K=1) measured "
                  f"{last_measured / 1e6:7.2f} MB, predicted {last.allocated_bytes / 1e6:7.2f} MB "
                  f"({row['last_error']:+.1%})", flush=True)
    (workdir / "memory_inflight.json").write_text(json.dumps(rows, indent=2))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        errs = [abs(r["stage0_error"]) for r in rows]
        print(f"stage 0 over K = {args.ks}: |error| median {statistics.median(errs):.1%}, max {max(errs):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
