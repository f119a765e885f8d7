"""What the vocabulary-parallel embedding, LM head and cross-entropy save per GPU, and what they cost.

    .venv/bin/python benchmarks/bench_vocab_parallel.py [--tp 4] [--vocab 32000 --hidden 512 --seq 512 --mbs 2]

Part 1 (memory, per GPU, exact counts from the catalog's shapes; 16 B of state per parameter as
the ``torch-bf16-autocast-adamw`` regime: fp32 weights, gradients and two AdamW moments; mbs 1 at
the model's sequence length): the vocabulary matrix's state, and the head's logits
memory (saved bf16 logits + fp32 softmax, and the loss's working gradients, ``catalog/layers.py``
and ``simulator/memory.py``), replicated on every TP rank (the engine before) against split in
``ceil(V / tp)`` rows (now).  A 1-stage plan holds the matrix once when the model ties it, twice
(embedding and head) when not; a last stage without layer 0 holds one (its head, or the tied copy).

Part 2 (CPU time, measured): two gloo processes (one thread each, one per core) run the LM head +
cross-entropy and the embedding lookup forward and backward: as the engine did before (each rank
the whole vocabulary, ``F.cross_entropy`` on the full logits), replicated with the new loss, and
vocabulary-parallel at TP 2 (half each, Megatron's all-reduces), alternating, median of ``--reps``;
and the bytes the head's backward keeps (saved-tensor hooks, as the profiler counts them).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sailor_core.catalog.layers import layer_shapes  # noqa: E402
from sailor_core.catalog.models import ModelSpec, get_model  # noqa: E402
from sailor_core.regimes import get_regime  # noqa: E402
from sailor_core.simulator.memory import loss_working_bytes  # noqa: E402

REGIME = "torch-bf16-autocast-adamw"
MODELS = ("llama-3.2-1b", "llama-3-8b", "opt-350m", "gpt-neo-2.7b")


def memory_row(model: str, tp: int) -> dict:
    """Per-GPU bytes of the vocabulary matrix's state and of the head's logits, replicated vs split."""
    spec = get_model(model)
    regime = get_regime(REGIME)
    state = regime.state_bytes_per_param
    seq = spec.seq_len
    rows_split = -(-spec.vocab_size // tp)
    matrix = spec.embedding_dim * state
    head_t = layer_shapes(model, tp_degree=tp, seq_len=seq, regime=REGIME)[-1]
    head_1 = layer_shapes(model, tp_degree=1, seq_len=seq, regime=REGIME)[-1]
    logits_rep = head_1.activation_bytes(1) + loss_working_bytes(model, 1, 1, seq, regime)
    logits_split = head_t.activation_bytes(1) + loss_working_bytes(model, tp, 1, seq, regime)
    matrices_one_stage = 1 if spec.tie_embeddings else 2  # embedding and head on one GPU
    return {
        "model": model, "tp": tp, "vocab": spec.vocab_size, "tied": spec.tie_embeddings,
        "one_stage_state_replicated": matrices_one_stage * spec.vocab_size * matrix,
        "one_stage_state_split": matrices_one_stage * rows_split * matrix,
        "head_stage_state_replicated": spec.vocab_size * matrix,  # a last stage: its head (or tied copy)
        "head_stage_state_split": rows_split * matrix,
        "logits_replicated": logits_rep, "logits_split": logits_split,
    }


def print_memory(tp: int) -> None:
    gb = 1e9
    print(f"## Memory per GPU at TP {tp} (16 B/param; logits at mbs 1 x the model's seq)\n")
    print("| model | vocab | tied | vocab matrices, 1 stage: replicated -> split | last stage's matrix | "
          "logits + loss | saved per GPU (1 stage) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m in MODELS:
        r = memory_row(m, tp)
        saved = (r["one_stage_state_replicated"] - r["one_stage_state_split"]
                 + r["logits_replicated"] - r["logits_split"])
        print(f"| {m} | {r['vocab']:,} | {'yes' if r['tied'] else 'no'} | "
              f"{r['one_stage_state_replicated'] / gb:.2f} -> {r['one_stage_state_split'] / gb:.2f} GB | "
              f"{r['head_stage_state_replicated'] / gb:.2f} -> {r['head_stage_state_split'] / gb:.2f} GB | "
              f"{r['logits_replicated'] / gb:.2f} -> {r['logits_split'] / gb:.2f} GB | {saved / gb:.2f} GB |")
    print()


# ---- part 2: two gloo ranks ----------------------------------------------------------------------

def _rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from sailor_core.profiler.measure import saved_activation_bytes
    from sailor_core.runtime.model import Embedding, Head

    torch.set_num_threads(1)
    rank = int(os.environ["BENCH_RANK"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    spec = ModelSpec(name="bench-vocab", family="llama", num_layers=1, hidden_size=args.hidden,
                     ffn_size=4 * args.hidden, num_heads=8, num_kv_heads=8, vocab_size=args.vocab,
                     seq_len=args.seq, max_position_embeddings=args.seq, tie_embeddings=False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.mbs, args.seq, args.hidden, generator=gen)
    tokens = torch.randint(0, args.vocab, (args.mbs, args.seq), generator=gen)
    labels = torch.randint(0, args.vocab, (args.mbs, args.seq), generator=gen)
    full_head, full_emb = Head(spec), Embedding(spec)

    def before(inp, labels):  # the engine's head until now: full logits, then F.cross_entropy
        h = F.rms_norm(inp, (inp.shape[-1],), full_head.norm_w, eps=spec.norm_eps)
        logits = F.linear(h, full_head.lm_w).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))

    before.parameters = full_head.parameters
    variants = {"before": (before, full_emb), "replicated": (full_head, full_emb),
                "vocab-parallel": (Head(spec, 2, rank, group), Embedding(spec, 2, rank, group))}
    times: dict[str, dict[str, list[float]]] = {v: {"head": [], "embedding": []} for v in variants}
    for rep in range(args.warmups + args.reps):
        for name, (head, emb) in variants.items():
            dist.barrier(group)
            t0 = time.perf_counter()
            inp = x.clone().requires_grad_(True)
            head(inp, labels).backward()
            t1 = time.perf_counter()
            emb(tokens).sum().backward()
            t2 = time.perf_counter()
            if rep >= args.warmups:
                times[name]["head"].append(t1 - t0)
                times[name]["embedding"].append(t2 - t1)
    saved = {}
    for name, (head, _) in list(variants.items())[1:]:
        ptrs = {p.untyped_storage().data_ptr() for p in head.parameters()}
        inp = x.clone().requires_grad_(True)
        saved[name], _ = saved_activation_bytes(lambda: head(inp, labels), ptrs)
    out = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    print(json.dumps({"rank": rank, "median_s": out, "saved_bytes": saved,
                      "param_bytes": {n: sum(p.numel() * 4 for p in h.parameters()) for n, (h, _) in variants.items()},
                      "before_saved_bytes": _before_saved(before, x, labels, saved_activation_bytes, full_head)}))
    dist.destroy_process_group()


def _before_saved(before, x, labels, saved_activation_bytes, head) -> int:
    ptrs = {p.untyped_storage().data_ptr() for p in head.parameters()}
    inp = x.clone().requires_grad_(True)
    return saved_activation_bytes(lambda: before(inp, labels), ptrs)[0]


def measure_cpu(args) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--port", str(port), "--vocab", str(args.vocab), "--hidden", str(args.hidden),
           "--seq", str(args.seq), "--mbs", str(args.mbs), "--reps", str(args.reps), "--warmups", str(args.warmups)]
    procs = [subprocess.Popen(cmd, env={**os.environ, "BENCH_RANK": str(r), "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def print_cpu(args, results: list[dict]) -> None:
    print(f"## CPU, 2 gloo ranks (1 thread each): vocab {args.vocab:,}, hidden {args.hidden}, "
          f"{args.mbs} x {args.seq} tokens, median of {args.reps}\n")
    print("| fwd + bwd, slowest rank | before: replicated, F.cross_entropy (ms) | replicated, new loss (ms) | "
          "vocab-parallel TP 2 (ms) | vocab-parallel / before |")
    print("| --- | --- | --- | --- | --- |")
    for part, label in (("head", "LM head + loss"), ("embedding", "embedding")):
        ms = {v: max(r["median_s"][v][part] for r in results) * 1e3 for v in ("before", "replicated", "vocab-parallel")}
        print(f"| {label} | {ms['before']:.1f} | {ms['replicated']:.1f} | {ms['vocab-parallel']:.1f} | "
              f"{ms['vocab-parallel'] / ms['before']:.2f} |")
    r0 = results[0]
    mb = 1e6
    print(f"\nhead per rank: parameters {r0['param_bytes']['replicated'] / mb:.1f} -> "
          f"{r0['param_bytes']['vocab-parallel'] / mb:.1f} MB (fp32); kept for backward: before "
          f"{r0['before_saved_bytes'] / mb:.1f} MB, replicated with the new loss "
          f"{r0['saved_bytes']['replicated'] / mb:.1f} MB, "
          f"vocab-parallel {r0['saved_bytes']['vocab-parallel'] / mb:.1f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=4, help="TP degree of the memory table")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmups", type=int, default=3)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if "BENCH_RANK" in os.environ:
        _rank_main(args)
        return
    print_memory(args.tp)
    print_cpu(args, measure_cpu(args))


if __name__ == "__main__":
    main()
