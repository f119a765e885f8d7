"""One worker of a network profile: ``python -m sailor_core.profiler.net_worker [--out FILE]``.

env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), so the same command runs as
local processes or, launched by the orchestration, one per cloud instance.  Rank 0 prints JSON
progress lines and a last ``{"event": "result", "result": ...}`` line, writes the result to
``--out`` when given (``network.network_profile_from_points`` turns it into a profile), and
appends the same lines to ``--metrics-file``: on a cloud instance the agent
(``sailor_core.runtime.agent``) forwards that file's last event to the flow in its status document.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys

import torch
import torch.distributed as dist

from sailor_core.profiler.network import DEFAULT_SIZES, measure_in_group


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sailor_core.profiler.net_worker")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="message sizes in bytes")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-allreduce", action="store_true")
    ap.add_argument("--out", default=None, help="rank 0 writes the measured points here (JSON)")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--metrics-file", default=None, help="rank 0 appends its JSON lines here too (the agent's)")
    args = ap.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="env://", rank=rank,
                            world_size=world, timeout=_dt.timedelta(seconds=args.timeout_s))

    metrics = open(args.metrics_file, "a") if args.metrics_file and rank == 0 else None

    def progress(msg: dict) -> None:
        line = json.dumps(msg)
        print(line, flush=True)
        if metrics is not None:
            metrics.write(line + "\n")
            metrics.flush()

    res = measure_in_group([int(s) for s in args.sizes.split(",")], reps=args.reps,
                           allreduce=not args.no_allreduce, progress=progress)
    if rank == 0:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f)
        progress({"event": "result", "result": res})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
