"""One rank of a TP group being profiled: ``python -m sailor_core.profiler.tp_worker --model M --mbs 1,2 ...``.

env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE = the TP degree).  Every rank
measures the same layers in lockstep (the layers' TP all-reduces need all of them); rank 0 prints
one JSON line per layer (progress) and a last ``{"event": "result", "result": ...}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys

import torch
import torch.distributed as dist

from sailor_core.profiler.compute import run_measurements
from sailor_core.profiler.stats import Repetitions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sailor_core.profiler.tp_worker")
    ap.add_argument("--model", required=True)
    ap.add_argument("--mbs", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    device = "cpu"
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="env://", rank=rank,
                            world_size=world, timeout=_dt.timedelta(seconds=args.timeout_s))
    group = dist.new_group(list(range(world)))

    def progress(msg: dict) -> None:
        if rank == 0:
            print(json.dumps(msg), flush=True)

    res = run_measurements(args.model, [int(x) for x in args.mbs.split(",")], device=device,
                           seq_len=args.seq_len or None, tp_degree=world, tp_rank=rank, tp_group=group,
                           repeat=Repetitions(warmups=args.warmups, reps=args.reps), progress=progress)
    if rank == 0:
        print(json.dumps({"event": "result", "result": res}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
