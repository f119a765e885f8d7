"""Memory under a stage's levers: the CPU engine's measured peak per rank under each recomputation
and ZeRO choice, K micro-batches in flight, with the parts of the stage's static memory.

What is measured: the peak bytes of live tensor storages of each worker (a torch dispatch mode
in every worker, ``benchmarks/inflight_site/sitecustomize.py``, as ``bench_memory_inflight.py``:
CPU torch has no allocator statistics; this is what ``torch.cuda.max_memory_allocated`` counts
on a GPU, without the caching allocator's rounding) over 3 steps of ``small``, fp32.

* Recomputation: stage 0 = layers [0, 4) of a 2-stage plan, one replica, whose stage 1 has
  K - 1 replicas (``bench_memory_inflight``'s plan), so stage 0 holds K micro-batches in flight;
  K = 1..8.
* ZeRO: stage 0 = layers [0, 4) with two replicas (the DP group ZeRO shards over); stage 1's
  replica count sets the 1F1B lookahead, K is counted from the schedule (``rank_op_order``).

Per row: rank 0's measured peak, and the stage's static parts as the engine lays them out (not
measured: tensor sizes): weights, gradients (their peak: the full gradient, held through the
backward of every micro-batch; ZeRO-2 drops it after the step's reduce-scatter, keeping its
range), the DP all-reduce's flat buckets (a second copy of the gradients; ZeRO-2: its ranges),
AdamW's two states (ZeRO: this rank's ranges of the buckets), and the rest per
micro-batch in flight, (peak - weights - gradients - states) / K: activations and the step's
transient buffers.  ``--json`` prints the rows for the memory model's comparison.

    .venv/bin/python benchmarks/bench_zero_memory.py [--ks 1,2,3,4,5,6,7,8] [--zero-stage1-dps 1,2,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
MODEL, SPLIT, MBS = "small", 4, 2


def recompute_plan(k: int, recompute: str):
    from sailor_core.plan.types import plan_from_dict

    rep = {"gpu": "cpu", "tp": 1}
    num_mb = 1 if k == 1 else 2 * k
    return plan_from_dict({"model": MODEL, "global_batch_size": num_mb * MBS, "micro_batch_size": MBS,
                           "stages": [{"layers": [0, SPLIT], "replicas": [rep], "recompute": recompute},
                                      {"layers": [SPLIT, 8], "replicas": [rep] * max(1, k - 1)}]})


def zero_plan(stage1_dp: int, zero: int):
    from sailor_core.plan.types import plan_from_dict

    rep = {"gpu": "cpu", "tp": 1}
    return plan_from_dict({"model": MODEL, "global_batch_size": 8 * MBS, "micro_batch_size": MBS,
                           "stages": [{"layers": [0, SPLIT], "replicas": [rep, rep], "zero": zero},
                                      {"layers": [SPLIT, 8], "replicas": [rep] * stage1_dp}]})


def in_flight(plan, stage: int = 0, replica: int = 0) -> int:
    from sailor_core.runtime.pipeline_order import rank_op_order

    order = rank_op_order(plan.num_microbatches, [s.dp_degree for s in plan.stages], stage, replica)
    live = peak = 0
    for kind, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def static_parts(plan, stage: int = 0) -> dict[str, int]:
    """Weights, gradients, the DP sync's buffers and AdamW states (bytes) of a replica-0 rank of
    ``stage``, laid out as the engine lays them (``OverlappedAllReduce``'s buckets, ZeRO's ranges)."""
    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.allreduce import OverlappedAllReduce, buckets_of
    from sailor_core.runtime.model import StageModel
    from sailor_core.runtime.zero import chunk_of

    st, spec = plan.stages[stage], get_model(plan.model)
    model = StageModel(spec, st.layer_start, st.layer_end)
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    tied = model.layers[0].tok if spec.tie_embeddings and len(plan.stages) > 1 and model.is_first else None
    synced = [p for p in params if p is not tied]  # the embedding group sums a tied matrix
    sizes = [sum(p.numel() for p in b) for b in buckets_of(synced, OverlappedAllReduce.BUCKET_BYTES)]
    d = st.dp_degree
    zero = st.zero_stage if d > 1 else 0
    mine = sum(min(chunk_of(n, d), n) for n in sizes)  # this rank's ranges (rank 0's are full chunks)
    states = 2 * weights if not zero else 2 * 4 * (mine + (tied.numel() if tied is not None else 0))
    # the all-reduce's flat buckets persist (a second copy of the synced gradients); ZeRO-2's
    # reduce-scatter keeps only this rank's ranges of them
    buffers = 0 if d == 1 else 4 * (mine if zero == 2 else sum(sizes))
    return {"weights_bytes": weights, "grads_bytes": weights, "dp_buffer_bytes": buffers,
            "optimizer_state_bytes": states}


def row(name: str, plan, peaks: dict[int, int]) -> dict:
    k = in_flight(plan)
    parts = static_parts(plan)
    rest = peaks[0] - sum(parts.values())
    return {"choice": name, "k": k, "measured_peak_bytes": peaks[0], **parts,
            "per_microbatch_bytes": rest / k, "stage": 0, "layers": [0, SPLIT], "model": MODEL,
            "micro_batch_size": MBS, "dp_degree": plan.stages[0].dp_degree}


def main(argv=None) -> int:
    from bench_memory_inflight import measure

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--recompute", default="none,selective,full")
    ap.add_argument("--zero-stage1-dps", default="1,2,4")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sailor-levers-mem-"))
    os.environ["SAILOR_HOME"] = str(work / "sailor_home")
    rows = []

    def report(r: dict) -> None:
        rows.append(r)
        if not args.json:
            print(f"{r['choice']:<10} DP{r['dp_degree']} K={r['k']}: peak {r['measured_peak_bytes'] / 1e6:8.2f} MB = "
                  f"weights {r['weights_bytes'] / 1e6:6.2f} + grads {r['grads_bytes'] / 1e6:6.2f} + "
                  f"DP buffers {r['dp_buffer_bytes'] / 1e6:6.2f} + AdamW {r['optimizer_state_bytes'] / 1e6:6.2f} + K x {r['per_microbatch_bytes'] / 1e6:6.2f} MB",
                  flush=True)

    for mode in [m for m in args.recompute.split(",") if m]:
        for k in [int(x) for x in args.ks.split(",") if x]:
            plan = recompute_plan(k, mode)
            report(row(mode, plan, measure(plan, args.steps, work / f"{mode}-k{k}")))
    for zero in (0, 1, 2):
        for d1 in [int(x) for x in args.zero_stage1_dps.split(",") if x]:
            plan = zero_plan(d1, zero)
            report(row(f"zero{zero}", plan, measure(plan, args.steps, work / f"zero{zero}-d{d1}")))
    (work / "zero_memory.json").write_text(json.dumps(rows, indent=2))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # Where the peak is not at the last forward (the optimizer step, or one micro-batch's
    # backward, under full recomputation at small K), (peak - static) / K is not a slope:
    # the measured growth per micro-batch in flight is.
    for choice in dict.fromkeys(r["choice"] for r in rows):
        mine = sorted((r["k"], r["measured_peak_bytes"]) for r in rows if r["choice"] == choice)
        if len(mine) > 1 and mine[-1][0] > mine[0][0]:
            (k0, p0), (k1, p1) = mine[0], mine[-1]
            print(f"{choice:<10} peak grows {(p1 - p0) / (k1 - k0) / 1e6:6.2f} MB per micro-batch in flight "
                  f"(K = {k0} -> {k1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
