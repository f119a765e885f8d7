"""Closed loop on this machine: profile -> simulate -> run the same plan -> compare.

1. Profile ``small`` (or --model) on CPU with the profiler (1 intra-op thread per rank, as the
   engine's launch_local runs), and the network between two local gloo workers.
2. Simulate a 2-stage x 2-replica plan with exactly those profiles (``simulate(plan,
   profiles=ProfileDB(profiles), network=<measured>)``).
3. Run the same plan with the engine (``launch_local``: 4 worker processes, gloo) several
   times; per-step time (steady steps: the first of each run is dropped) and each worker's peak
   resident memory (VmHWM, sampled from /proc).
4. Print predicted vs measured step time and per-process memory, with the spread over runs.

    .venv/bin/python benchmarks/bench_closed_loop.py [--model small] [--runs 3] [--steps 6] [--json]

The profile, network fit and all figures land under --workdir (default a temp dir); nothing is
written to the user's ~/.sailor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def plan_for(model: str, mbs: int, gbs: int):
    from sailor_core.catalog.models import get_model
    from sailor_core.plan.types import plan_from_dict

    n = get_model(model).num_layer_indices
    cut = n // 2
    reps = [{"gpu": "cpu", "tp": 1, "zone": "local"}] * 2
    return plan_from_dict({"model": model, "global_batch_size": gbs, "micro_batch_size": mbs,
                           "stages": [{"layers": [0, cut], "replicas": reps}, {"layers": [cut, n], "replicas": reps}]})


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class RunMonitor:
    """Samples the workers while they run: each one's peak resident set (VmHWM) and the CPU
    seconds all of them used (utime + stime), read at each step boundary (a new line in rank 0's
    metrics file), which gives the CPU work per step whatever the load of the machine."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self.cpu_at_step: list[tuple[int, float]] = []
        self._thread = None
        self._tick = os.sysconf("SC_CLK_TCK")

    def on_started(self, procs, metrics_path) -> None:
        self._thread = threading.Thread(target=self._watch, args=(procs, Path(metrics_path)), daemon=True)
        self._thread.start()

    def _cpu_s(self, pid: int) -> float | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / self._tick

    def _watch(self, procs, metrics: Path) -> None:
        seen = 0
        while any(p.poll() is None for p in procs.values()):
            for rank, p in procs.items():
                try:
                    for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM"):
                            self.peaks[rank] = max(self.peaks.get(rank, 0), int(line.split()[1]) * 1024)
                except OSError:
                    pass
            try:
                steps = sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line)
            except OSError:
                steps = 0
            if steps > seen:
                cpus = [self._cpu_s(p.pid) for p in procs.values()]
                if all(c is not None for c in cpus):
                    self.cpu_at_step.append((steps, sum(cpus)))
                seen = steps
            time.sleep(0.02)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=10)

    def cpu_per_step_s(self) -> float | None:
        """CPU seconds of all workers per steady step (from the first step boundary on)."""
        if len(self.cpu_at_step) < 2:
            return None
        (s0, c0), (s1, c1) = self.cpu_at_step[0], self.cpu_at_step[-1]
        return (c1 - c0) / (s1 - s0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--gbs", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sailor-closed-loop-"))
    os.environ["SAILOR_HOME"] = str(workdir / "sailor_home")  # never touch the user's ~/.sailor

    from sailor_core.network.model import Endpoint, default_network
    from sailor_core.profiler.cpu_sharing import probe_other_load, shared_cpu_time
    from sailor_core.profiler.compute import profile_model, save_profiles, to_model_profile
    from sailor_core.profiler.stats import Repetitions
    from sailor_core.profiler.network import profile_network, save_network_profile
    from sailor_core.profiler.overhead import idle_worker_rss_bytes
    from sailor_core.profiles import ProfileDB
    from sailor_core.regimes import get_regime
    from sailor_core.runtime.launch import ensure_corpus, launch_local
    from sailor_core.simulator import simulate

    plan = plan_for(args.model, args.mbs, args.gbs)
    out: dict = {"model": args.model, "plan": plan.to_dict(), "cpu_count": os.cpu_count(),
                 "loadavg_start": loadavg()}

    # 1. profiles
    t0 = time.monotonic()
    run = profile_model(args.model, micro_batch_sizes=[args.mbs], tp_degrees=[1], repeat=Repetitions(reps=args.reps),
                        timer="cpu")
    (prof_cpu,) = run.profiles
    detail = run.details[0]
    prof_wall = to_model_profile((args.model, "cpu", 1, args.mbs, prof_cpu.seq_len), detail["layers"],
                                 [[m["params"], m["update"]["median_s"]] for m in detail["layers"]],
                                 regime=prof_cpu.regime, source=prof_cpu.source.replace("cpu clock", "wall clock"),
                                 timer="wall")
    save_profiles([prof_cpu])
    net_prof = profile_network(2, sizes=[2**k for k in range(16, 27, 2)], reps=7)
    save_network_profile(net_prof)
    overhead = idle_worker_rss_bytes()
    out["profile_s"] = time.monotonic() - t0
    out["loadavg_after_profile"] = loadavg()
    out["network_fit"] = net_prof.to_json()
    out["overhead_bytes_measured"] = overhead
    out["overhead_bytes_regime"] = get_regime(prof_cpu.regime).constant_overhead_bytes

    # 2. predictions
    net = default_network()
    preds = {}
    sims = None
    for name, prof in (("cpu_clock", prof_cpu), ("wall_clock", prof_wall)):
        sim = simulate(plan, profiles=ProfileDB([prof]), network=net)
        sims = sims if name != "cpu_clock" else sim
        shared = shared_cpu_time(plan, sim, threads_per_rank=1, other_load=0.0,
                                 allreduce_s=net_prof.allreduce_time_s, allreduce_cpu_s=net_prof.allreduce_cpu_s)
        preds[name] = {"iteration_time_s": sim.iteration_time_s, "breakdown": sim.breakdown,
                       "shared_idle_machine": shared.to_dict(),
                       "peak_memory_bytes": [[r.memory.peak_bytes for r in s.replicas] for s in sim.stages],
                       "memory": [s.replicas[0].memory.to_dict() for s in sim.stages]}
    out["predicted"] = preds
    e = Endpoint(zone="local", gpu="cpu")
    out["allreduce_check"] = [
        {"bytes": b, "measured_s": t, "measured_cpu_s": net_prof.allreduce_cpu_s(b, 2),
         "ring_model_s": net.allreduce_time_s(b, [e, e])}
        for b, t in net_prof.allreduce_points.get(2, ())]

    # 3. the engine, several runs
    data = ensure_corpus(workdir, plan)
    runs = []
    for k in range(args.runs):
        rss = RunMonitor()
        la = loadavg()
        load_before = probe_other_load()
        res = launch_local(plan, args.steps, data=data, workdir=workdir / f"run{k}", threads_per_rank=1,
                           timeout_s=900, on_started=rss.on_started)
        rss.join()
        load_after = probe_other_load()
        other = (load_before + load_after) / 2
        pred = shared_cpu_time(plan, sims, threads_per_rank=1, other_load=other,
                               allreduce_s=net_prof.allreduce_time_s, allreduce_cpu_s=net_prof.allreduce_cpu_s)
        if res.status != "ok":
            print(f"run {k}: {res.status} {res.message}", file=sys.stderr)
            return 1
        steady = res.step_times_s[1:]
        runs.append({"loadavg_before": la, "step_times_s": res.step_times_s,
                     "other_load_probed": [load_before, load_after], "predicted": pred.to_dict(),
                     "median_step_s": statistics.median(steady),
                     "cpu_work_per_step_s": rss.cpu_per_step_s(),
                     "mean_steady_step_s": statistics.mean(steady),
                     "peak_rss_bytes": {str(r): v for r, v in sorted(rss.peaks.items())}})
    out["runs"] = runs
    meds = [r["median_step_s"] for r in runs]
    all_steady = [t for r in runs for t in r["step_times_s"][1:]]
    out["measured"] = {"median_step_s": statistics.median(all_steady), "run_medians_s": meds,
                       "min_step_s": min(all_steady), "max_step_s": max(all_steady)}
    from sailor_core.plan.layout import rank_layout

    roles = rank_layout(plan)
    mem = {}
    for r in runs:
        for rank, v in r["peak_rss_bytes"].items():
            mem.setdefault(roles[int(rank)].stage, []).append(v)
    out["measured"]["peak_rss_bytes_by_stage"] = {str(s): [min(v), max(v)] for s, v in sorted(mem.items())}
    out["loadavg_end"] = loadavg()
    (workdir / "closed_loop.json").write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        report(out)
    return 0


def report(out: dict) -> None:
    m = out["measured"]
    print(f"closed loop: {out['model']}, 2 stages x 2 replicas, mbs {out['plan']['micro_batch_size']}, "
          f"gbs {out['plan']['global_batch_size']}, {out['cpu_count']} CPUs; load average "
          f"{out['loadavg_start']:.1f} at start, {out['loadavg_end']:.1f} at end")
    print(f"measured step: median {m['median_step_s']:.3f} s (run medians "
          f"{', '.join(f'{x:.3f}' for x in m['run_medians_s'])}; steps {m['min_step_s']:.3f}..{m['max_step_s']:.3f})")
    for name, p in out["predicted"].items():
        parts = ", ".join(f"{k} {v:.3f}" for k, v in p["breakdown"].items())
        sh = p["shared_idle_machine"]
        print(f"simulator ({name} profile), one core per rank: {p['iteration_time_s']:.3f} s [{parts}]; "
              f"4 ranks sharing {sh['effective_cores']:.1f} idle cores: {sh['iteration_time_s']:.3f} s "
              f"(work {sh['work_s']:.3f} CPU-s)")
    work = out["predicted"]["cpu_clock"]["shared_idle_machine"]["work_s"]
    print(f"CPU work per step (all 4 workers): predicted {work:.3f} CPU-s from the cpu-clock profile; measured "
          + ", ".join(f"{r['cpu_work_per_step_s']:.3f}" for r in out["runs"] if r["cpu_work_per_step_s"])
          + " CPU-s; CPU share our workers got: "
          + ", ".join(f"{r['cpu_work_per_step_s'] / r['mean_steady_step_s']:.2f}" for r in out["runs"]
                      if r["cpu_work_per_step_s"]) + " cores")
    print("per run (cpu-clock profile, cores shared with the other jobs' probed load):")
    for k, r in enumerate(out["runs"]):
        p = r["predicted"]
        err = p["iteration_time_s"] / r["median_step_s"] - 1
        print(f"  run {k}: other load {r['other_load_probed'][0]:.1f}/{r['other_load_probed'][1]:.1f} -> "
              f"{p['effective_cores']:.2f} cores for us; predicted {p['iteration_time_s']:.3f} s, measured median "
              f"{r['median_step_s']:.3f} s ({err:+.0%}); steps {min(r['step_times_s'][1:]):.3f}.."
              f"{max(r['step_times_s'][1:]):.3f}")
    pred = out["predicted"]["cpu_clock"]["memory"]
    for s, (lo, hi) in m["peak_rss_bytes_by_stage"].items():
        pb = pred[int(s)]["peak_memory_bytes"]
        print(f"stage {s} per-process memory: predicted {pb / 1e6:.0f} MB, measured peak RSS "
              f"{lo / 1e6:.0f}..{hi / 1e6:.0f} MB ({pb / hi - 1:+.0%} vs the largest)")
    print(f"idle worker: {out['overhead_bytes_measured'] / 1e6:.0f} MB measured, regime constant "
          f"{out['overhead_bytes_regime'] / 1e6:.0f} MB")
    for c in out["allreduce_check"]:
        print(f"all-reduce 2 ranks {c['bytes']:>10,} B: measured {c['measured_s'] * 1e3:8.2f} ms "
              f"({c['measured_cpu_s'] * 1e3:.2f} CPU-ms), "
              f"ring model from the p2p fit {c['ring_model_s'] * 1e3:8.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
