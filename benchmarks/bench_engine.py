"""Engine vs plain torch on the same model, samples and homogeneous configuration (CPU, gloo).

  .venv/bin/python benchmarks/bench_engine.py [--model small] [--steps 12]

DP: a 1-stage x 2-replica plan vs torch DDP (gradient accumulation with no_sync).
PP: a 2-stage x 1-replica plan vs torch.distributed.pipelining Schedule1F1B.
Every variant: 2 processes, 1 thread each, same initial weights, same micro-batches
(global batch 8, micro-batch 2), fp32, AdamW; time per optimizer step as the median
over the steps after the first two, measured inside rank 0 (process start-up excluded);
also rank 0's process CPU time per step, which a busy shared machine distorts less.
ratio = baseline time / engine time = engine throughput / baseline throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _plan(model: str, kind: str, gbs: int, mbs: int):
    from sailor_core.catalog.models import get_model
    from sailor_core.plan.types import plan_from_dict

    n = get_model(model).num_layer_indices
    if kind == "dp":
        stages = [{"layers": [0, n], "replicas": [{"gpu": "cpu"}, {"gpu": "cpu"}]}]
    else:
        stages = [{"layers": [0, n // 2], "replicas": [{"gpu": "cpu"}]},
                  {"layers": [n // 2, n], "replicas": [{"gpu": "cpu"}]}]
    return plan_from_dict({"model": model, "global_batch_size": gbs, "micro_batch_size": mbs,
                           "stages": stages})


def _median_step_s(times: list[float]) -> float:
    return statistics.median(times[2:] if len(times) > 4 else times)


def run_engine(plan, steps: int, data: Path, workdir: Path) -> tuple[float, float]:
    from sailor_core.runtime.launch import launch_local

    res = launch_local(plan, steps, data=data, workdir=workdir, threads_per_rank=1, timeout_s=1200)
    if res.status != "ok":
        raise RuntimeError(f"engine run failed: {res.message} {res.stderr_tails}")
    return _median_step_s(res.step_times_s), _median_step_s(res.step_cpu_s)


def run_baseline(kind: str, model: str, steps: int, gbs: int, mbs: int,
                 data: Path) -> tuple[float, float]:
    from sailor_core.ports import free_port

    port = free_port()
    out = Path(tempfile.mkdtemp()) / "times.json"
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--baseline-worker", kind, "--model", model, "--steps",
             str(steps), "--gbs", str(gbs), "--mbs", str(mbs), "--data", str(data), "--out", str(out)],
            env=env))
    codes = [p.wait(timeout=1200) for p in procs]
    # gloo sometimes aborts at interpreter teardown ("terminate called without an active
    # exception") after the measurement was written; only a missing measurement is a failure.
    if not out.exists():
        raise RuntimeError(f"baseline {kind} failed (exit codes {codes})")
    rec = json.loads(out.read_text())
    return _median_step_s(rec["wall"]), _median_step_s(rec["cpu"])


def baseline_worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.data import TokenDataset
    from sailor_core.runtime.optimizer import make_optimizer
    from sailor_core.runtime.model import StageModel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = get_model(args.model)
    data = TokenDataset(args.data, spec.seq_len, spec.vocab_size)
    n = spec.num_layer_indices
    m_count = args.gbs // args.mbs
    times, cpu = [], []
    if args.baseline_worker == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(StageModel(spec, 0, n))
        opt = make_optimizer(model.parameters(), 1e-3)
        mine = [m for m in range(m_count) if m % 2 == rank]
        for it in range(args.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            total = torch.zeros(())
            for j, m in enumerate(mine):
                x, y = data.microbatch(0, it, m, args.gbs, args.mbs)
                ctx = model.no_sync() if j < len(mine) - 1 else _null()
                with ctx:
                    loss = model(x, y)
                    (loss / m_count).backward()
                total += loss.detach()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dist.all_reduce(total)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        split = n // 2
        if rank == 0:
            module = StageModel(spec, 0, split)
        else:
            module = _LogitsTail(StageModel(spec, split, n))
        stage = PipelineStage(module, rank, 2, torch.device("cpu"))
        def loss_fn(logits, y):
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        sched = Schedule1F1B(stage, m_count, loss_fn=loss_fn, scale_grads=True)
        opt = make_optimizer(module.parameters(), 1e-3)
        for it in range(args.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            x, y = data.samples(list(range(it * args.gbs, (it + 1) * args.gbs)))
            total = torch.zeros(())
            if rank == 0:
                sched.step(x)
            else:
                losses = []
                sched.step(target=y, losses=losses)
                total += sum(l.detach() for l in losses)
            opt.step()
            opt.zero_grad(set_to_none=True)
            dist.all_reduce(total)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"wall": times, "cpu": cpu}))
    dist.destroy_process_group()


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _logits_tail_cls():
    import torch.nn.functional as F
    from torch import nn

    from sailor_core.runtime.model import Head

    class LogitsTail(nn.Module):
        """The last stage without its loss: pipelining applies loss_fn itself."""

        def __init__(self, stage):
            super().__init__()
            self.stage = stage

        def forward(self, x):
            for layer in self.stage.layers:
                if isinstance(layer, Head):
                    if layer.spec.pre_norm:
                        x = F.layer_norm(x, (x.shape[-1],), layer.norm_w, getattr(layer, "norm_b", None))
                    return F.linear(x, layer.lm_weight())  # a tied head's is the embedding's
                x = layer(x)
            return x

    return LogitsTail


def _LogitsTail(stage):
    return _logits_tail_cls()(stage)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="alternate engine/baseline runs")
    ap.add_argument("--configs", default="dp,pp", help="which comparisons: dp, pp")
    ap.add_argument("--baseline-worker", default=None)
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.baseline_worker:
        return baseline_worker(args)

    from sailor_core.runtime.launch import ensure_corpus

    work = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    rows = []
    for kind, base_name in (("dp", "torch DDP"), ("pp", "torch.distributed.pipelining 1F1B")):
        if kind not in args.configs.split(","):
            continue
        plan = _plan(args.model, kind, args.gbs, args.mbs)
        data = ensure_corpus(work, plan)
        eng, base = [], []
        for _ in range(args.repeats):  # alternate so a busy neighbour hurts both alike
            eng.append(run_engine(plan, args.steps, data, work / f"{kind}-{len(eng)}"))
            base.append(run_baseline(kind, args.model, args.steps, args.gbs, args.mbs, data))
        e, b = min(x[0] for x in eng), min(x[0] for x in base)
        ec, bc = min(x[1] for x in eng), min(x[1] for x in base)
        rows.append({"config": kind, "baseline": base_name, "engine_step_s": e, "baseline_step_s": b,
                     "engine_samples_per_s": args.gbs / e, "baseline_samples_per_s": args.gbs / b,
                     "throughput_ratio": b / e, "engine_cpu_s": ec, "baseline_cpu_s": bc,
                     "cpu_ratio": bc / ec})
    print(f"model {args.model}, global batch {args.gbs}, micro-batch {args.mbs}, {args.steps} steps, "
          f"2 processes x 1 thread, best of {args.repeats} runs (median step)")
    print(f"{'config':6} {'baseline':36} {'engine s/step':>14} {'baseline s/step':>16} {'ratio':>7}"
          f" {'engine cpu s':>13} {'baseline cpu s':>15} {'cpu ratio':>10}")
    for r in rows:
        print(f"{r['config']:6} {r['baseline']:36} {r['engine_step_s']:14.4f} "
              f"{r['baseline_step_s']:16.4f} {r['throughput_ratio']:7.3f} {r['engine_cpu_s']:13.4f} "
              f"{r['baseline_cpu_s']:15.4f} {r['cpu_ratio']:10.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
