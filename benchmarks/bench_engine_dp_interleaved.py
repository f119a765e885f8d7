"""Engine DP step vs torch DDP step, interleaved inside the same two processes (CPU, gloo).

  .venv/bin/python benchmarks/bench_engine_dp_interleaved.py [--model small] [--steps 24]

bench_engine.py compares separate engine and baseline runs; on a shared machine the
load differs between runs, which shifts CPU time per step by 10-20 % (cache and core
contention). Here each of the 2 ranks (1 thread each) holds both an engine
``StageTrainer`` (1 stage x 2 replicas) and a ``DistributedDataParallel`` copy of the
same model, and alternates one engine iteration and one DDP iteration (order swapped
every step, barrier before each), so both see the same neighbours. Same micro-batches
(global batch 8, micro-batch 2), AdamW, fp32; DDP accumulates with ``no_sync``.
Figures: rank 0's process CPU time and wall time per iteration, median over the
iterations after the first two; ratio = DDP / engine = engine throughput / DDP's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GBS, MBS = 8, 2


def _worker(rank: int, port: int, data: str, model_name: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench_engine import _null, _plan
    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.data import TokenDataset
    from sailor_core.runtime.optimizer import make_optimizer
    from sailor_core.runtime.process_groups import make_groups
    from sailor_core.runtime.recipe import Recipe
    from sailor_core.runtime.trainer import StageTrainer
    from sailor_core.runtime.model import StageModel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    plan = _plan(model_name, "dp", GBS, MBS)
    spec = get_model(model_name)
    ds = TokenDataset(data, plan.effective_seq_len(), spec.vocab_size)
    trainer = StageTrainer(plan=plan, spec=spec, rank=rank, data=ds, recipe=Recipe(total_steps=1), seed=0,
                           device=torch.device("cpu"), groups=make_groups(plan, rank))
    ddp = DDP(StageModel(spec, 0, spec.num_layer_indices))
    opt = make_optimizer(ddp.parameters(), 1e-3)
    num_mb = GBS // MBS
    mine = [m for m in range(num_mb) if m % 2 == rank]
    status = torch.zeros(2)

    def engine_step(it: int) -> None:  # what worker.py does around train_step
        status[0] = trainer.train_step()
        dist.all_reduce(status)

    def ddp_step(it: int) -> None:
        total = torch.zeros(())
        for j, m in enumerate(mine):
            x, y = ds.microbatch(0, it, m, GBS, MBS)
            with ddp.no_sync() if j < len(mine) - 1 else _null():
                loss = ddp(x, y)
                (loss / num_mb).backward()
            total += loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(total)

    times: dict[str, list[tuple[float, float]]] = {"engine": [], "ddp": []}
    for it in range(steps):
        order = ("engine", "ddp") if it % 2 == 0 else ("ddp", "engine")
        for name in order:
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            (engine_step if name == "engine" else ddp_step)(it)
            times[name].append((time.process_time() - c0, time.perf_counter() - t0))
    if rank == 0:
        med = {k: (statistics.median(c for c, _ in v[2:]), statistics.median(w for _, w in v[2:]))
               for k, v in times.items()}
        print(f"model {model_name}, global batch {GBS}, micro-batch {MBS}, {steps} interleaved "
              "iterations each, 2 processes x 1 thread")
        print(f"{'':8} {'cpu s/step':>11} {'wall s/step':>12}")
        for k, (c, w) in med.items():
            print(f"{k:8} {c:11.4f} {w:12.4f}")
        print(f"ratio (DDP/engine): cpu {med['ddp'][0] / med['engine'][0]:.3f}, "
              f"wall {med['ddp'][1] / med['engine'][1]:.3f}")
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from bench_engine import _plan
    from sailor_core.ports import free_port
    from sailor_core.runtime.launch import ensure_corpus

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-engine-dp-"))
    data = ensure_corpus(work, _plan(args.model, "dp", GBS, MBS))
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.spawn(_worker, args=(free_port(), str(data), args.model, args.steps), nprocs=2)


if __name__ == "__main__":
    main()
