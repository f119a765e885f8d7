"""What profiling the network between cloud instances costs on top of the measurement itself.

Runs the network-profile flow on the embedded cloud (its instances are local processes, so the
link is this machine's loopback, as with local processes) and, right after, the same
measurement between local processes (`profile_network`), several times each, interleaved so
the machine's changing load hits both alike.  Prints, per run: the flow's phases (offers and
cost check, rent + boot, agents start the workers + rendezvous, measurement, terminate) from
its progress events, and the p2p bandwidths of both ways.

    .venv/bin/python benchmarks/bench_network_cloud.py --runs 3 --max-mib 16

A scratch SAILOR_HOME and a local Prefect server of its own (stopped at the end).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-mib", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    os.environ["SAILOR_HOME"] = tempfile.mkdtemp(prefix="sailor-bench-net-")
    from flows.cli.prefect_server import configure_prefect_env, stop_local_server

    configure_prefect_env(start_server=True)
    try:
        run(args)
    finally:
        stop_local_server()


def run(args) -> None:
    from flows.network_profile_flow import network_profile_flow
    from sailor_core.profiler.network import profile_network, sizes_up_to
    from tasks import net_profiling

    sizes = sizes_up_to(args.max_mib)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{args.workers} workers, sizes {sizes[0]}..{sizes[-1]} bytes, {args.reps} reps (more for small sizes)\n")
    phases_all: dict[str, list[float]] = {}
    for i in range(args.runs):
        stamps: dict[str, float] = {}

        def on_event(msg: dict, stamps=stamps) -> None:
            what = msg["event"]
            key = {"p2p": "first measurement", "allreduce": "first measurement"}.get(what, what)
            stamps.setdefault(key, time.monotonic())

        net_profiling.add_progress_listener(on_event)
        t0 = time.monotonic()
        try:
            out = network_profile_flow(gpu="T4", zone="us-central1-a", workers=args.workers, cloud="embedded",
                                       max_mib=args.max_mib, reps=args.reps, timeout_s=300.0)
        finally:
            net_profiling.remove_progress_listener(on_event)
        t_end = time.monotonic()
        order = ["launching", "launched", "workers", "first measurement", "measured"]
        marks = [t0] + [stamps.get(k, stamps["measured"]) for k in order] + [t_end]  # a poll may miss a step
        names = ["flow run start, session, offers, cost check", "rent + boot 2 instances", "addresses + assignments",
                 "agents start workers + rendezvous", "measurement", "fit + save + artifact + terminate"]
        phases = {n: b - a for n, a, b in zip(names, marks, marks[1:])}
        for n, v in phases.items():
            phases_all.setdefault(n, []).append(v)
        cloud_bw = [b / t / 1e9 for b, t in out["profile"]["p2p_points"]]
        local = profile_network(args.workers, sizes=sizes, reps=args.reps)
        local_bw = [b / t / 1e9 for b, t in local.p2p_points]
        print(f"run {i}: flow {t_end - t0:.1f} s, left running {out['instances_left_running']}, "
              f"{out['usd_spent']:.5f} USD (catalog spot price)")
        print("  " + ", ".join(f"{n} {v:.1f} s" for n, v in phases.items()))
        print("  p2p GB/s by size, cloud instances: " + " ".join(f"{x:.2f}" for x in cloud_bw))
        print("  p2p GB/s by size, local processes: " + " ".join(f"{x:.2f}" for x in local_bw))
    print("\nmedian phase times over the runs:")
    for n, vs in phases_all.items():
        print(f"  {n:45s} {statistics.median(vs):6.1f} s  (min {min(vs):.1f}, max {max(vs):.1f})")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
