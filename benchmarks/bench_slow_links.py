"""The link model against the engine over slow links: measured step time of 2-, 4- and 8-stage
pipelines with few and many micro-batches, against the simulator fed the same link figures.

The engine's point-to-point transfers go through its test-only slow link
(``sailor_core/runtime/links.py``: a fixed latency and bandwidth, rendezvous, one FIFO per
direction), and the simulator gets a network whose links are exactly that (every link class
``latency + bytes / bandwidth``, no fits) and the CPU per-layer profile of the model measured
here with the project's profiler (process CPU time, 1 thread).  The ranks share this machine's
cores: the prediction is ``max(simulated, CPU work / effective cores)``
(``sailor_core/profiler/cpu_sharing.py``), and the link figures are chosen so that the links,
not the two cores, decide the step.  One replica per stage; stages split the model's layer
indices evenly (``small``: 8 indices, so 8 stages hold one each: embedding, 6 blocks, head).

    .venv/bin/python benchmarks/bench_slow_links.py [--model small] [--depths 2,4,8]
        [--microbatches 4,16] [--latency-ms 20] [--mbps 10] [--steps 4] [--runs 2] [--json]

Prints per (depth, micro-batches): measured step (median of the steady steps of all runs, and
the run medians' range), predicted, the error, and what the simulator says with free links.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def plan_for(model: str, depth: int, num_microbatches: int, mbs: int = 1):
    """``depth`` stages of one CPU replica each over the model's layer indices, split evenly."""
    from sailor_core.catalog.models import get_model
    from sailor_core.plan.types import plan_from_dict

    n = get_model(model).num_layer_indices
    bounds = [round(i * n / depth) for i in range(depth + 1)]
    rep = [{"gpu": "cpu", "tp": 1, "zone": "local"}]
    return plan_from_dict({"model": model, "global_batch_size": num_microbatches * mbs,
                           "micro_batch_size": mbs,
                           "stages": [{"layers": [a, b], "replicas": rep} for a, b in zip(bounds, bounds[1:])]})


def shim_network(latency_s: float, bandwidth_bytes_per_s: float):
    """A network model whose every link is the shim's: ``latency + bytes / bandwidth``."""
    from sailor_core.network import LinkClass, LinkDefault, NetworkModel

    d = LinkDefault(bw_1gpu_bytes_per_s=bandwidth_bytes_per_s, latency_s=latency_s)
    return NetworkModel(defaults={cls: d for cls in LinkClass if cls is not LinkClass.INTRA_NODE})


def predict(plan, profile, latency_s: float, bandwidth_bytes_per_s: float, other_load: float = 0.0) -> dict:
    """The simulator's step for ``plan`` over the shim's links (and with free links), the ranks
    sharing this machine's cores."""
    from sailor_core.profiler.cpu_sharing import shared_cpu_time
    from sailor_core.profiles import ProfileDB

    db = ProfileDB([profile])
    sim = simulate_with(plan, db, shim_network(latency_s, bandwidth_bytes_per_s))
    free = simulate_with(plan, db, shim_network(0.0, 1e18))
    shared = shared_cpu_time(plan, sim, threads_per_rank=1, other_load=other_load)
    return {"iteration_time_s": shared.iteration_time_s, "simulated_s": sim.iteration_time_s,
            "free_links_s": free.iteration_time_s, "cpu_work_s": shared.work_s,
            "breakdown": sim.breakdown, "bottleneck": sim.bottleneck}


def simulate_with(plan, db, network):
    from sailor_core.simulator import simulate

    return simulate(plan, profiles=db, network=network)


def measure(plan, latency_s: float, bandwidth_bytes_per_s: float, steps: int, workdir: Path,
            data: str | None = None, timeout_s: float = 600.0) -> list[float]:
    """Steady step times (the first step dropped) of the engine over the shim's links."""
    from sailor_core.runtime.launch import launch_local
    from sailor_core.runtime.links import LinkShim

    env = LinkShim(latency_s=latency_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s).to_env()
    res = launch_local(plan, steps, data=data, workdir=workdir, threads_per_rank=1, env=env, timeout_s=timeout_s)
    if res.status != "ok":
        raise RuntimeError(f"engine run {res.status}: {res.message} {res.stderr_tails}")
    return res.step_times_s[1:]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--depths", default="2,4,8")
    ap.add_argument("--microbatches", default="4,16")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--mbps", type=float, default=10.0, help="link bandwidth, MB/s")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10, help="profiler repetitions per layer")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sailor-slow-links-"))
    os.environ["SAILOR_HOME"] = str(workdir / "sailor_home")  # never touch the user's ~/.sailor

    from sailor_core.profiler.compute import profile_model
    from sailor_core.profiler.cpu_sharing import probe_other_load
    from sailor_core.runtime.launch import ensure_corpus

    latency, bandwidth = args.latency_ms / 1e3, args.mbps * 1e6
    out = {"model": args.model, "latency_s": latency, "bandwidth_bytes_per_s": bandwidth,
           "cpu_count": os.cpu_count(), "loadavg_start": loadavg(), "rows": []}
    t0 = time.monotonic()
    (profile,) = profile_model(args.model, micro_batch_sizes=[1], tp_degrees=[1], device="cpu", threads=1,
                               reps=args.reps, timer="cpu").profiles
    out["profile_s"] = time.monotonic() - t0
    out["profile_ms"] = [[round(l.fwd_s * 1e3, 3), round(l.bwd_s * 1e3, 3)] for l in profile.layers]
    for depth in [int(x) for x in args.depths.split(",")]:
        for num_mb in [int(x) for x in args.microbatches.split(",")]:
            plan = plan_for(args.model, depth, num_mb)
            data = ensure_corpus(workdir, plan)
            runs = []
            for k in range(args.runs):
                other = probe_other_load()
                la = loadavg()
                steps = measure(plan, latency, bandwidth, args.steps, workdir / f"p{depth}-m{num_mb}-r{k}", data)
                runs.append({"loadavg": la, "other_load": other, "step_times_s": steps,
                             "median_s": statistics.median(steps)})
            other = statistics.mean(r["other_load"] for r in runs)
            pred = predict(plan, profile, latency, bandwidth, other_load=other)
            measured = statistics.median([t for r in runs for t in r["step_times_s"]])
            row = {"depth": depth, "microbatches": num_mb, "measured_s": measured,
                   "run_medians_s": [r["median_s"] for r in runs], "predicted": pred,
                   "error": pred["iteration_time_s"] / measured - 1, "runs": runs}
            out["rows"].append(row)
            if not args.json:
                print_row(row, flush=True)
    out["loadavg_end"] = loadavg()
    (workdir / "slow_links.json").write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        errs = [abs(r["error"]) for r in out["rows"]]
        print(f"model {args.model}, links {args.latency_ms:g} ms + {args.mbps:g} MB/s, {out['cpu_count']} CPUs, "
              f"load {out['loadavg_start']:.1f} -> {out['loadavg_end']:.1f}; |error| median "
              f"{statistics.median(errs):.1%}, max {max(errs):.1%}; figures in {workdir / 'slow_links.json'}")
    return 0


def print_row(row: dict, flush: bool = False) -> None:
    p = row["predicted"]
    meds = row["run_medians_s"]
    print(f"{row['depth']} stages x {row['microbatches']:>2} micro-batches: measured {row['measured_s']:.3f} s "
          f"(runs {min(meds):.3f}..{max(meds):.3f}), predicted {p['iteration_time_s']:.3f} s "
          f"({row['error']:+.1%}); free links {p['free_links_s']:.3f} s, CPU work {p['cpu_work_s']:.3f} s, "
          f"bottleneck {p['bottleneck']}", flush=flush)


if __name__ == "__main__":
    sys.exit(main())
