"""The simulator's residual kinds of issue 35, from first principles (docs/simulator.md, Accuracy).

* Kind 1/2: what DeepSpeed's partitioned boundary tensors (``stage.partitioned_boundary_s``)
  add to TP pipelines under its regime, per plan: OPT-350M and GPT-Neo-2.7B on GH-96 at TP 4
  (1-8 stages), and mixed RTX pipelines at TP 2 and 8, global batch 32.
* Kind 1: the closed form (``pipeline_time``) against the exact replay of DeepSpeed's lock-step
  ``TrainSchedule`` (``schedule_reference.blocking_makespan``) on the same stages and links.
* Kind 2 (a lead, not the model): the same lock-step schedule if a send completed once its
  data is buffered (the receiver alone waiting for the wire) instead of blocking both ends.
* Kind 3: the GH-96 OPT-350M profile's forward and backward sums per (TP, mbs): the per-block
  floor at TP 4 that does not shrink with the micro-batch.
* Kind 4: what the model charges a 2-stage, one-sample iteration, part by part.
* Kinds 1 and 4: what DeepSpeed's per-iteration work beyond the model's parts would add (the
  tied matrix's sum were OPT tied, the world barrier and the loss broadcast, ``ReduceGrads``'
  passes at DP 1, fp32 clipping's passes, the partition's meta sends), from bytes and latencies;
  and, as a sensitivity, what 1 ms per micro-batch and stage of host-side cost would add.
* Kinds 1 and 3, the regime: which matmul path Sailor's profiles ran on (each model's fastest
  block against the plain fp32 peak), and what the last stage of GH-96 TP 4 pipelines holds
  under DeepSpeed's regime now and with the tied copy counted as before.
* Kind 5: the memory model's bytes per extra micro-batch in flight on an H200 (mbs 1) and, with
  ``--saved``, what autograd saves in ``transformers``' models under CPU bf16 autocast (seq 256,
  depth 2 and 4 differenced) beside ``catalog/layers.py`` (a few minutes: full-width models).

    .venv/bin/python benchmarks/bench_residual_kinds.py [--saved]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sailor_core.catalog.gpus import get_gpu  # noqa: E402
from sailor_core.catalog.layers import layer_shapes  # noqa: E402
from sailor_core.catalog.models import get_model  # noqa: E402
from sailor_core.network.model import Endpoint, default_network  # noqa: E402
from sailor_core.plan.types import plan_from_dict  # noqa: E402
from sailor_core.profiles import default_profile_db  # noqa: E402
from sailor_core.regimes import get_regime  # noqa: E402
from sailor_core.profiles import estimator as est  # noqa: E402
from sailor_core.simulator import compose, memory, simulate, stage_memory  # noqa: E402
from sailor_core.simulator import stage as st  # noqa: E402
from sailor_core.simulator.schedule_reference import blocking_makespan, deepspeed_commands  # noqa: E402

ZONE = "us-central1-a"
BF16 = "torch-bf16-autocast-adamw"


def _plan(model: str, gpus: list[str], tp: int, mbs: int, gbs: int = 32) -> dict:
    n = get_model(model).num_layer_indices
    cuts = [round(i * n / len(gpus)) for i in range(len(gpus) + 1)]
    return {"model": model, "global_batch_size": gbs, "micro_batch_size": mbs,
            "stages": [{"layers": [cuts[i], cuts[i + 1]], "replicas": [{"gpu": g, "tp": tp, "zone": ZONE}]}
                       for i, g in enumerate(gpus)]}


def partition_rows() -> None:
    cases = [("opt-350m", ["GH-96"] * p, 4, m) for p in (2, 4) for m in (1, 4)]
    cases += [("gpt-neo-2.7b", ["GH-96"] * p, 4, m) for p in (4, 8) for m in (1, 4)]
    mixed = ["RTX-3090", "Titan-RTX", "RTX-2080", "RTX-3090"]
    cases += [("opt-350m", mixed[:p], tp, 1) for p in (2, 4) for tp in (2, 8)]
    print("| model | stages (GPUs) | TP | mbs | without partition s | with s | change |")
    print("|---|---|---|---|---|---|---|")
    orig = compose.partitions_boundaries
    for model, gpus, tp, mbs in cases:
        plan = plan_from_dict(_plan(model, gpus, tp, mbs))
        after = simulate(plan).iteration_time_s
        compose.partitions_boundaries = lambda regime: False
        try:
            before = simulate(plan).iteration_time_s
        finally:
            compose.partitions_boundaries = orig
        print(f"| {model} | {len(gpus)} ({'/'.join(sorted(set(gpus)))}) | {tp} | {mbs} | {before:.4f} | "
              f"{after:.4f} | {100 * (after / before - 1):+.1f} % |")


def memory_rows() -> None:
    db, regime = default_profile_db(), get_regime(BF16)
    print("\n| model (H200, mbs 1) | allocated k=1 GB | k=8 GB | per extra micro-batch MB |")
    print("|---|---|---|---|")
    for model in ("opt-350m", "opt-1.3b", "llama-3.2-1b"):
        prof = db.get(model, "H200", 1, 1, regime=BF16)
        n = get_model(model).num_layer_indices
        one, eight = (stage_memory(prof, 0, n, k, regime, 1 << 50) for k in (1, 8))
        print(f"| {model} | {one.allocated_bytes / 1e9:.2f} | {eight.allocated_bytes / 1e9:.2f} | "
              f"{(eight.allocated_bytes - one.allocated_bytes) / 7 / 1e6:.0f} |")


def saved_rows(seq: int = 256) -> None:
    import torch  # lazy: only for --saved
    import transformers  # lazy: the dev extra, only for --saved

    def saved(config) -> int:
        config._attn_implementation = "sdpa"
        model = transformers.AutoModelForCausalLM.from_config(config)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        tokens = torch.randint(0, config.vocab_size, (1, seq))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            model(tokens, labels=tokens)
        return sum(seen.values())

    t = transformers
    configs = {
        "opt-350m": lambda n: t.OPTConfig(num_hidden_layers=n, hidden_size=1024, ffn_dim=4096, num_attention_heads=16,
                                          word_embed_proj_dim=512, do_layer_norm_before=False, vocab_size=50272,
                                          dropout=0.0),
        "opt-1.3b": lambda n: t.OPTConfig(num_hidden_layers=n, hidden_size=2048, ffn_dim=8192, num_attention_heads=32,
                                          word_embed_proj_dim=2048, vocab_size=50272, dropout=0.0),
        "llama-3.2-1b": lambda n: t.LlamaConfig(num_hidden_layers=n, hidden_size=2048, intermediate_size=8192,
                                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                                tie_word_embeddings=True),
    }
    print(f"\n| model (seq {seq}) | saved per block MB | model | saved embedding+head MB | model |")
    print("|---|---|---|---|---|")
    for name, make in configs.items():
        torch.manual_seed(0)
        two, four = saved(make(2)), saved(make(4))
        shapes = layer_shapes(name, seq_len=seq, regime=BF16)
        rest = shapes[0].activation_bytes(1) + shapes[-1].activation_bytes(1)
        print(f"| {name} | {(four - two) / 2 / 1e6:.3f} | {shapes[1].activation_bytes(1) / 1e6:.3f} | "
              f"{(2 * two - four) / 1e6:.2f} | {rest / 1e6:.2f} |")


def _stages_and_links(result) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(forward, backward) of each stage's replica and (latency 0, one way) of each link, as
    ``simulate`` charged them (one replica per stage)."""
    steps = [(s.replicas[0].fwd_s, s.replicas[0].bwd_s) for s in result.stages]
    return steps, [(0.0, s.p2p_s_per_microbatch / 2) for s in result.stages[:-1]]


def schedule_rows() -> None:
    print("\n| model | stages | mbs | micro-batches | closed form s | exact DeepSpeed schedule s | closed / exact |")
    print("|---|---|---|---|---|---|---|")
    for model, p, mbs in (("opt-350m", 2, 1), ("opt-350m", 4, 1), ("opt-350m", 4, 4), ("gpt-neo-2.7b", 4, 1),
                          ("gpt-neo-2.7b", 8, 1), ("gpt-neo-2.7b", 8, 4)):
        result = simulate(plan_from_dict(_plan(model, ["GH-96"] * p, 4, mbs)))
        pipe = result.breakdown["compute"] + result.breakdown["bubble"] + result.breakdown["p2p"]
        steps, links = _stages_and_links(result)
        exact = blocking_makespan(steps, result.num_microbatches, links)
        print(f"| {model} | {p} | {mbs} | {result.num_microbatches} | {pipe:.4f} | {exact:.4f} | {pipe / exact:.3f} |")


def buffered_send_makespan(steps, num_mb: int, links) -> float:
    """DeepSpeed's lock-step commands (``deepspeed_commands``) where a send costs its sender
    nothing once its data is buffered: the transfer starts at the send (one FIFO per link and
    direction) and the receive waits for its arrival.  An exploration for kind 2, not the model."""
    num_stages = len(steps)
    cmds = [deepspeed_commands(num_stages, s, num_mb) for s in range(num_stages)]
    pos, free = [0] * num_stages, [0.0] * num_stages
    arrival: dict[tuple[str, int, int], float] = {}
    link_free: dict[tuple[int, str], float] = {}
    remaining = sum(len(c) for c in cmds)
    while remaining:
        progressed = False
        for s in range(num_stages):
            while pos[s] < len(cmds[s]):
                kind, m = cmds[s][pos[s]]
                if kind in ("F", "B"):
                    free[s] += steps[s][0 if kind == "F" else 1]
                elif kind.startswith("send"):
                    peer = s + (1 if kind == "send_act" else -1)
                    lat, wire = links[min(s, peer)]
                    start = max(free[s], link_free.get((min(s, peer), kind), 0.0))
                    link_free[(min(s, peer), kind)] = start + wire
                    arrival[(kind[5:], m, peer)] = start + wire + lat
                elif (kind[5:], m, s) in arrival:
                    free[s] = max(free[s], arrival[(kind[5:], m, s)])
                else:
                    break
                pos[s] += 1
                remaining -= 1
                progressed = True
        assert progressed, "deadlock"
    return max(free)


def buffered_send_rows() -> None:
    print("\n| stages (GPUs) | TP | simulate s | p2p s | exact blocking s | buffered sends s | buffered / blocking |")
    print("|---|---|---|---|---|---|---|")
    mixed = ["RTX-3090", "Titan-RTX", "RTX-2080", "RTX-3090"]
    for p, tp in ((2, 2), (2, 8), (4, 2), (4, 8)):
        result = simulate(plan_from_dict(_plan("opt-350m", mixed[:p], tp, 1)))
        steps, links = _stages_and_links(result)
        exact = blocking_makespan(steps, result.num_microbatches, links)
        eager = buffered_send_makespan(steps, result.num_microbatches, links)
        print(f"| {p} ({'/'.join(mixed[:p])}) | {tp} | {result.iteration_time_s:.3f} | {result.breakdown['p2p']:.3f} | "
              f"{exact:.3f} | {eager:.3f} | {eager / exact:.3f} |")


def profile_floor_rows() -> None:
    """The GH-96 OPT-350M profile's forward / backward sums, beside the whole model's arithmetic
    (``catalog/layers.py``'s FLOPs, backward twice the forward) at the GPU's fp32 peak: at TP 4 the
    measured time is several times the arithmetic, so these stages are bound by fixed per-op
    costs (launches, TP latencies, the host), where any host-side work of the engine adds in full."""
    db = default_profile_db()
    shapes = layer_shapes("opt-350m", seq_len=2048, regime="megatron-fp32-adamw")
    peak = get_gpu("GH-96").peak_fp32_flops
    print("\n| GH-96 opt-350m | mbs 1 fwd/bwd ms | mbs 2 | mbs 4 | mbs 8 | mbs 1 fwd+bwd at fp32 peak ms |")
    print("|---|---|---|---|---|---|")
    for tp in (1, 2, 4):
        cells = []
        for mbs in (1, 2, 4, 8):
            prof = db.get("opt-350m", "GH-96", tp, mbs, regime="megatron-fp32-adamw")
            fwd = sum(layer.fwd_s for layer in prof.layers)
            bwd = sum(layer.bwd_s for layer in prof.layers)
            cells.append(f"{1e3 * fwd:.1f} / {1e3 * bwd:.1f}")
        arithmetic = 3 * sum(s.fwd_flops(1, 2048) for s in shapes) / tp / peak
        print(f"| TP {tp} | " + " | ".join(cells) + f" | {1e3 * arithmetic:.1f} |")


def single_sample_rows() -> None:
    print("\n| 2 stages, 1 micro-batch of 1 sample | iteration ms | compute | bubble | p2p | dp_sync | update |")
    print("|---|---|---|---|---|---|---|")
    for model, gpu, tp in (("opt-350m", "GH-96", 4), ("opt-350m", "GH-96", 1), ("gpt-neo-2.7b", "GH-96", 4),
                           ("opt-350m", "RTX-3090", 2)):
        result = simulate(plan_from_dict(_plan(model, [gpu] * 2, tp, 1, gbs=1)))
        parts = " | ".join(f"{1e3 * result.breakdown[k]:.1f}" for k in ("compute", "bubble", "p2p", "dp_sync", "update"))
        print(f"| {model} {gpu} TP {tp} | {1e3 * result.iteration_time_s:.1f} | {parts} |")


def host_cost_rows(cost_s: float = 1e-3) -> None:
    """A sensitivity, not a fit: what a fixed cost per micro-batch and stage (half on each
    forward, half on each backward: the engine's Python exposed by its host syncs) adds under
    DeepSpeed's lock-step schedule, replayed exactly (``blocking_makespan``)."""
    print(f"\n| GH-96 TP 4, global batch 32 | stages | mbs | iteration s | +{1e3 * cost_s:.0f} ms per micro-batch "
          "and stage: added s | added % |")
    print("|---|---|---|---|---|---|")
    for model, p, mbs in (("opt-350m", 1, 1), ("opt-350m", 2, 1), ("opt-350m", 4, 1), ("opt-350m", 4, 4),
                          ("gpt-neo-2.7b", 4, 1), ("gpt-neo-2.7b", 8, 1), ("gpt-neo-2.7b", 8, 4)):
        result = simulate(plan_from_dict(_plan(model, ["GH-96"] * p, 4, mbs)))
        steps, links = _stages_and_links(result)
        base = blocking_makespan(steps, result.num_microbatches, links)
        more = blocking_makespan([(f + cost_s / 2, b + cost_s / 2) for f, b in steps], result.num_microbatches, links)
        print(f"| {model} | {p} | {mbs} | {result.iteration_time_s:.4f} | {more - base:.4f} | "
              f"{100 * (more - base) / result.iteration_time_s:+.1f} % |")


def engine_extras_rows() -> None:
    """What DeepSpeed's pipeline engine does per iteration beyond the model's parts, sized on
    GH-96 TP 4 OPT-350M plans (kind 1: 4 stages, 32 micro-batches of 1; kind 4: 2 stages, one
    sample): what each would add, from its bytes on the network model's links and GPU memory."""
    network = default_network()
    gpu = get_gpu("GH-96")
    print("\n| OPT-350M GH-96 TP 4 | iteration ms | the tied matrix's sum, were OPT tied ms | world barrier + "
          "loss broadcast (fits, no latency floor) ms | ReduceGrads at DP 1 ms | fp32 clipping ms | "
          "partition meta sends (modelled) ms |")
    print("|---|---|---|---|---|---|---|")
    for stages, gbs in ((4, 32), (2, 1)):
        plan = plan_from_dict(_plan("opt-350m", ["GH-96"] * stages, 4, 1, gbs=gbs))
        result = simulate(plan)
        prof = default_profile_db().get("opt-350m", "GH-96", 4, 1, regime="megatron-fp32-adamw")
        matrix = -(-50304 // 4) * 1024  # Megatron's padded vocabulary x hidden, one TP shard
        ends = [(ZONE, "GH-96", 4)] * 2
        tied = st.stage_dp_sync_s(network, matrix * 4, ends)
        world = [Endpoint(zone=ZONE, gpu="GH-96", num_gpus=1)] * (4 * stages)
        pipe = [Endpoint(zone=ZONE, gpu="GH-96", num_gpus=1)] * stages
        sync = network.allreduce_time_s(4, world) + network.allreduce_time_s(8, pipe)
        biggest = max(st.stage_params(prof, s.layer_start, s.layer_end) for s in plan.stages)
        reduce_grads = 24 * biggest / gpu.memory_bw_bytes_per_s  # flatten, 1-rank all-reduce, copy back
        clipping = 12 * biggest / gpu.memory_bw_bytes_per_s  # each gradient's norm, then its scaling
        src = dst = st.endpoint(ZONE, "GH-96", 4)
        meta = result.num_microbatches * 2 * (stages - 1) * network.p2p_time_s(64, src, dst)
        print(f"| {stages} stages, {result.num_microbatches} micro-batches | {1e3 * result.iteration_time_s:.1f} | "
              f"{1e3 * tied:.2f} | {1e3 * sync:.3f} | {1e3 * reduce_grads:.2f} | {1e3 * clipping:.2f} | {1e3 * meta:.2f} |")


def precision_rows() -> None:
    """Which matmul path Sailor's profiles ran on (issue 35): each model's fastest measured block
    (``estimator.fastest_block_flops``) against the GPU's plain fp32 peak; above it only TF32 can
    run (the DeepSpeed regime's ``matmul_precision``)."""
    profiles = default_profile_db().profiles()
    print("\n| GPU | plain fp32 peak TFLOP/s | TF32 peak | model: fastest block TFLOP/s (x plain peak) |")
    print("|---|---|---|---|")
    for gpu in ("GH-96", "A100-40", "A100-80", "V100-16"):
        spec = get_gpu(gpu)
        rates = est.fastest_block_flops(profiles, gpu, "megatron-fp32-adamw")
        cells = ", ".join(f"{m} {r / 1e12:.0f} ({r / spec.peak_fp32_flops:.2f})" for m, r in sorted(rates.items()))
        tf32 = est.matmul_peak_flops(spec, get_regime("megatron-fp32-adamw"))
        print(f"| {gpu} | {spec.peak_fp32_flops / 1e12:.1f} | {tf32 / 1e12:.1f} | {cells} |")


def last_stage_memory_rows() -> None:
    """The last stage of GH-96 TP 4 pipelines under DeepSpeed's regime: what it holds now (what
    its profile's head counts; GPT-Neo's pipe is headless, its loss reading the norm's output) and
    with the tied copy and vocabulary-wide loss counted as before (``memory`` patched back)."""
    print("\n| GH-96 TP 4, global batch 32 | stages | mbs | DP | last stage peak GB | params | loss MB | "
          "before: peak GB | params | loss MB | iteration s now / before |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, p, mbs, dp in (("gpt-neo-2.7b", 4, 1, 1), ("gpt-neo-2.7b", 4, 4, 1), ("gpt-neo-2.7b", 8, 1, 1),
                              ("gpt-neo-2.7b", 4, 1, 2), ("opt-350m", 4, 1, 1), ("opt-350m", 1, 1, 1)):
        d = _plan(model, ["GH-96"] * p, 4, mbs, gbs=32 * dp)
        for stage in d["stages"]:
            stage["replicas"] = stage["replicas"] * dp
        figures = []
        for before in (False, True):
            saved = memory.tied_copy_params, memory.headless, st.embedding_group_params
            if before:
                memory.tied_copy_params = lambda prof: memory._tied_copy_params(
                    prof.model, prof.tp_degree, prof.layers[-1].params, True)
                memory.headless = lambda prof: False
                st.embedding_group_params = lambda prof: 0  # no embedding group's sum (third round)
            try:
                result = simulate(plan_from_dict(d))
            finally:
                memory.tied_copy_params, memory.headless, st.embedding_group_params = saved
            mem = result.to_dict()["stages"][-1]["replicas"][0]["memory"]
            figures.append((mem["peak_memory_bytes"] / 1e9, mem["num_params"], mem["loss_working_bytes"] / 1e6,
                            result.iteration_time_s))
        (now_gb, now_params, now_loss, now_s), (old_gb, old_params, old_loss, old_s) = figures
        print(f"| {model} | {p} | {mbs} | {dp} | {now_gb:.3f} | {now_params:,} | {now_loss:.1f} | {old_gb:.3f} | "
              f"{old_params:,} | {old_loss:.1f} | {now_s:.4f} / {old_s:.4f} |")


if __name__ == "__main__":
    partition_rows()
    schedule_rows()
    buffered_send_rows()
    profile_floor_rows()
    single_sample_rows()
    engine_extras_rows()
    host_cost_rows()
    memory_rows()
    precision_rows()
    last_stage_memory_rows()
    if "--saved" in sys.argv[1:]:
        saved_rows()
