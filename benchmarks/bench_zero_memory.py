"""Memory under a stage's levers: the CPU engine's measured peak per rank under each recomputation
and ZeRO choice, K micro-batches in flight, against the memory model (``sailor memory``), with
the parts of the stage's static memory.

What is measured: the peak bytes of live tensor storages of each worker (a torch dispatch mode
in every worker, ``benchmarks/inflight_site/sitecustomize.py``, as ``bench_memory_inflight.py``:
CPU torch has no allocator statistics; this is what ``torch.cuda.max_memory_allocated`` counts
on a GPU, without the caching allocator's rounding) over 3 steps of ``small``, fp32 (the first
step allocates AdamW's states; the second is the first with the full static memory).

* Recomputation: stage 0 = layers [0, 4) of a 2-stage plan, one replica, whose stage 1 has
  K - 1 replicas (``bench_memory_inflight``'s plan), so stage 0 holds K micro-batches in flight;
  K = 1 runs one micro-batch per step.
* ZeRO 0/1/2: stage 0 = layers [0, 4) with two replicas (the DP group ZeRO shards over) and
  stage 1 with 2 (K - 1) replicas: the 1F1B lookahead counts in the widest stage's micro-batches
  (``pipeline_order.rank_op_order``), so stage 0's replica 0 holds K (K = 1: one micro-batch per
  replica per step).  K is counted from the engine's order and checked against the model's.

Predicted: the memory model's allocated bytes (its peak less the regime's constant process
overhead) of stage 0's replica 0 from ``simulate`` of the same plan under regime
``torch-fp32-adamw`` (what the engine runs on CPU) -- ``sailor memory --model small --gpu cpu
--mbs 2 --layers 0:4 --regime torch-fp32-adamw --inflight K --recompute R --zero Z --dp D``,
which ``simulate`` equals wherever the replica runs more micro-batches than it holds (K = 1 runs
one per step: no gradient accumulation, so ``sailor memory``'s figure, which assumes it, is
printed beside it).  Per row also: the stage's static parts as the engine lays them out (tensor
sizes, not measured): weights, gradients, the DP all-reduce's flat buckets (ZeRO-2: this rank's
ranges), AdamW's two states (ZeRO: this rank's ranges).

    .venv/bin/python benchmarks/bench_zero_memory.py [--ks 1,...,8] [--zero-ks 1,2,3,4] [--json]
    .venv/bin/python benchmarks/bench_zero_memory.py --measured zero_memory.json   (no engine run:
        a previous run's rows against today's model)
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
MODEL, SPLIT, MBS, REGIME = "small", 4, 2, "torch-fp32-adamw"
RECOMPUTE = ("none", "selective", "full")


def recompute_plan(k: int, recompute: str):
    from sailor_core.plan.types import plan_from_dict

    rep = {"gpu": "cpu", "tp": 1}
    num_mb = 1 if k == 1 else 2 * k
    return plan_from_dict({"model": MODEL, "global_batch_size": num_mb * MBS, "micro_batch_size": MBS,
                           "stages": [{"layers": [0, SPLIT], "replicas": [rep], "recompute": recompute},
                                      {"layers": [SPLIT, 8], "replicas": [rep] * max(1, k - 1)}]})


def zero_plan(k: int, zero: int):
    from sailor_core.plan.types import plan_from_dict

    rep = {"gpu": "cpu", "tp": 1}
    num_mb = 2 if k == 1 else 16  # 16: enough for K = 8 (stage 1 of 14 replicas)
    return plan_from_dict({"model": MODEL, "global_batch_size": num_mb * MBS, "micro_batch_size": MBS,
                           "stages": [{"layers": [0, SPLIT], "replicas": [rep, rep], "zero": zero},
                                      {"layers": [SPLIT, 8], "replicas": [rep] * max(1, 2 * (k - 1))}]})


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


def predicted(plan) -> dict:
    """Stage 0 replica 0 under the memory model: ``simulate``'s and ``sailor memory``'s (the same
    ``stage_memory`` without the plan's micro-batch count) allocated bytes."""
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.simulator import simulate
    from sailor_core.simulator.simulate import stage_memory_under

    mem = simulate(plan_from_dict({**plan.to_dict(), "regime": REGIME})).stages[0].replicas[0].memory
    st = plan.stages[0]
    cli = stage_memory_under((st.recompute, st.zero_stage, st.dp_degree), MODEL, "cpu", 1, MBS, mem.num_inflight,
                             (st.layer_start, st.layer_end), regime=REGIME)
    return {"model_k": mem.num_inflight, "predicted_bytes": mem.allocated_bytes,
            "sailor_memory_bytes": cli.allocated_bytes, "predicted_parts": mem.to_dict()}


def plans(args) -> list[tuple[str, object]]:
    out = [(mode, recompute_plan(k, mode)) for mode in RECOMPUTE if mode in args.recompute.split(",")
           for k in [int(x) for x in args.ks.split(",") if x]]
    return out + [(f"zero{z}", zero_plan(k, z)) for z in (0, 1, 2) for k in [int(x) for x in args.zero_ks.split(",") if x]]


def plan_of(choice: str, k: int):
    return zero_plan(k, int(choice[4:])) if choice.startswith("zero") else recompute_plan(k, choice)


def compare(choice: str, plan, peak: int) -> dict:
    k, pred = in_flight(plan), predicted(plan)
    return {"choice": choice, "k": k, "measured_peak_bytes": peak, **static_parts(plan), **pred,
            "error": pred["predicted_bytes"] / peak - 1, "stage": 0, "layers": [0, SPLIT], "model": MODEL,
            "micro_batch_size": MBS, "dp_degree": plan.stages[0].dp_degree,
            "stage1_dp_degree": plan.stages[1].dp_degree, "num_microbatches": plan.num_microbatches}


def print_row(r: dict) -> None:
    mb = {key: r[key] / 1e6 for key in ("measured_peak_bytes", "predicted_bytes", "sailor_memory_bytes",
                                        "weights_bytes", "grads_bytes", "dp_buffer_bytes", "optimizer_state_bytes")}
    print(f"{r['choice']:<9} DP{r['dp_degree']} K={r['k']} (model {r['model_k']}): measured "
          f"{mb['measured_peak_bytes']:7.2f} MB, predicted {mb['predicted_bytes']:7.2f} ({r['error']:+.1%}); "
          f"sailor memory {mb['sailor_memory_bytes']:7.2f}; static: weights {mb['weights_bytes']:.2f} + grads "
          f"{mb['grads_bytes']:.2f} + DP buffers {mb['dp_buffer_bytes']:.2f} + AdamW {mb['optimizer_state_bytes']:.2f}",
          flush=True)


def print_table(rows: list[dict]) -> None:
    print("\n| K | " + " | ".join(dict.fromkeys(r["choice"] for r in rows)) + " |")
    by = {(r["choice"], r["k"]): r for r in rows}
    choices = list(dict.fromkeys(r["choice"] for r in rows))
    print("|---" * (len(choices) + 1) + "|")
    for k in sorted({r["k"] for r in rows}):
        cells = [f"{by[c, k]['measured_peak_bytes'] / 1e6:.2f} / {by[c, k]['predicted_bytes'] / 1e6:.2f} "
                 f"({by[c, k]['error'] * 100:+.1f} %)" if (c, k) in by else "" for c in choices]
        print(f"| {k} | " + " | ".join(cells) + " |")
    errs = [abs(r["error"]) for r in rows]
    print(f"\nmeasured / predicted MB (error); {len(rows)} cells, |error| max {max(errs):.1%}, "
          f"{sum(e <= 0.05 for e in errs)} within 5 %; model K = engine K in {sum(r['k'] == r['model_k'] for r in rows)}")


def main(argv=None) -> int:
    from bench_memory_inflight import measure

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--recompute", default="none,selective,full")
    ap.add_argument("--zero-ks", default="1,2,3,4", help="K for ZeRO 0/1/2 (stage 1 of 2 (K - 1) replicas)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--measured", default=None, help="a previous run's zero_memory.json: compare, run nothing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sailor-levers-mem-"))
    os.environ["SAILOR_HOME"] = str(work / "sailor_home")
    rows = []
    if args.measured:
        for old in json.loads(Path(args.measured).read_text()):
            plan = plan_of(old["choice"], old["k"])
            rows.append(compare(old["choice"], plan, old["measured_peak_bytes"]))
    else:
        for i, (choice, plan) in enumerate(plans(args)):
            rows.append(compare(choice, plan, measure(plan, args.steps, work / f"{i}-{choice}")[0]))
            if not args.json:
                print_row(rows[-1])
    (work / "zero_memory.json").write_text(json.dumps(rows, indent=2))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)
        print(f"rows: {work / 'zero_memory.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
