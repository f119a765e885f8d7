"""How repeatable are the profiler's figures on this machine? And how well does the network fit hold?

Profiles ``small`` (or --model) on CPU --runs times, back to back, and prints for each run the
whole-model forward+backward of one micro-batch and the update line, by wall clock and by CPU
time, then their spread across runs (max/min - 1); then one network profile between two local
processes: measured vs fitted p2p time per size and the fit's stated error, and measured
all-reduce vs the network model's ring on that fit.

    .venv/bin/python benchmarks/bench_profiler.py [--model small] [--mbs 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    os.environ["SAILOR_HOME"] = tempfile.mkdtemp(prefix="sailor-bench-profiler-")

    from sailor_core.network.model import Endpoint, NetworkModel
    from sailor_core.profiler.compute import profile_model
    from sailor_core.profiler.stats import Repetitions
    from sailor_core.profiler.network import profile_network

    la = Path("/proc/loadavg").read_text().split()[0]
    print(f"{args.model} on CPU, mbs {args.mbs}, 1 thread, {args.reps} reps per layer; "
          f"{os.cpu_count()} CPUs, load average {la} at start")
    totals = {"wall": [], "cpu": []}
    for k in range(args.runs):
        t0 = time.monotonic()
        run = profile_model(args.model, micro_batch_sizes=[args.mbs], tp_degrees=[1], repeat=Repetitions(reps=args.reps),
                            timer="cpu")
        layers = run.details[0]["layers"]
        wall = sum(m["fwd"]["median_s"] + m["bwd"]["median_s"] for m in layers)
        cpu = sum(m["fwd_cpu"]["median_s"] + m["bwd_cpu"]["median_s"] for m in layers)
        spread_w = max(max(m["fwd"]["spread"], m["bwd"]["spread"]) for m in layers)
        spread_c = max(max(m["fwd_cpu"]["spread"], m["bwd_cpu"]["spread"]) for m in layers)
        totals["wall"].append(wall)
        totals["cpu"].append(cpu)
        p = run.profiles[0]
        print(f"run {k}: fwd+bwd per micro-batch: wall {wall * 1e3:7.1f} ms (worst layer spread {spread_w:.0%}), "
              f"cpu {cpu * 1e3:7.1f} ms (worst layer spread {spread_c:.0%}); AdamW {p.update_s_per_param * 1e9:.2f} "
              f"ns/param + {p.update_fixed_s * 1e3:.2f} ms; {time.monotonic() - t0:.0f} s")
    for name, xs in totals.items():
        print(f"across runs, {name} clock: {min(xs) * 1e3:.1f}..{max(xs) * 1e3:.1f} ms ({max(xs) / min(xs) - 1:.0%})")

    prof = profile_network(2, reps=5)
    net = NetworkModel(inter_fits={("local", "cpu", 1, "local", "cpu", 1): prof.fit})
    e = Endpoint(zone="local", gpu="cpu")
    print(f"network, 2 local gloo processes: bw(x) = {prof.fit.a:.4g} x^2 + {prof.fit.b:.4g} x + {prof.fit.c:.4g} GB/s,"
          f" max {prof.fit.max_bw_bytes_per_s / 1e9:.2f} GB/s; stated error {prof.max_rel_error:.0%}")
    ar = dict(prof.allreduce_points.get(2, ()))
    for b, t in prof.p2p_points:
        fit_t = b / prof.fit.bandwidth_bytes_per_s(b)
        line = f"  {b:>11,} B: p2p {t * 1e3:8.3f} ms, fit {fit_t * 1e3:8.3f} ms ({fit_t / t - 1:+.0%})"
        if b in ar:
            ring = net.allreduce_time_s(b, [e, e])
            line += f"; all-reduce {ar[b] * 1e3:8.3f} ms, ring model {ring * 1e3:8.3f} ms ({ring / ar[b] - 1:+.0%})"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
