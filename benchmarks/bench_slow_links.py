"""The link model against the engine over slow links: measured step time of 2-, 4- and 8-stage
pipelines with few and many micro-batches, against the simulator fed the same link figures.

The engine's point-to-point transfers go through its test-only slow link
(``sailor_core/runtime/links.py``: a fixed latency and bandwidth, rendezvous, one FIFO per
direction), and the simulator gets a network whose links are exactly that (every link class
``latency + bytes / bandwidth``, no fits) and the CPU per-layer profile of the model measured
here with the project's profiler (process CPU time, 1 thread).  One replica per stage; stages
split the model's layer indices evenly (``small``: 8 indices, so 8 stages hold one each:
embedding, 6 blocks, head).

The ranks share this machine's cores with each other and with other jobs, which stretches every
op on the critical path: a fair scheduler gives each runnable thread its share of the cores.
The stretch is measured in the run itself: per step, every worker's main thread's time on a
CPU and time runnable but waiting for one (``/proc/thread-self/schedstat``, recorded by
``slowlink_site/sitecustomize.py``, put first on the workers' PYTHONPATH).  The prediction is
the simulator's with each stage's layer times x its own rank's (on CPU + waiting) seconds per
steady step over the profile's CPU work of that stage (the CPU time of an op is not constant
here: the 2 cores may be hyperthreads of one, and a profile taken under heavy load measured
0.77 s per step where another took 0.44 s; and each rank adds its own overheads: Python around
the ops, the loss, the step's bookkeeping).  Printed beside it: all ranks' seconds pooled into
one factor for every op (which spreads the embedding stage's overheads over the others), and
the profile's own CPU times x the measured waiting only, which errs fast.  What neither sees:
the waiting is an average over the step, and the warm-up and cool-down ops, on the critical
path, run while fewer ranks compete for the cores, so with few micro-batches and many ranks
the prediction errs slow.  Printed beside them, the same from a 1 s probe of the machine's load before each
run (``L`` other runnable threads on ``C`` cores: ``k = max(1, (k W / T + L) / C)``, ``k W / T``
our ranks computing at once, never below the cores' throughput bound ``W / C_eff`` of
``sailor_core/profiler/cpu_sharing.py``), which misses when other jobs come and go.
``--rescore FILE`` predicts a saved run's rows again.

    .venv/bin/python benchmarks/bench_slow_links.py [--model small] [--depths 2,4,8]
        [--microbatches 4,16] [--latency-ms 20] [--mbps 10] [--steps 4] [--runs 2] [--json]
    .venv/bin/python benchmarks/bench_slow_links.py --rescore /tmp/.../slow_links.json

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
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SITE = Path(__file__).resolve().parent / "slowlink_site"


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


def predict(plan, profile, latency_s: float, bandwidth_bytes_per_s: float, other_load: float = 0.0,
            num_cores: float | None = None, stretch: float | None = None,
            cpu_per_step_s: float | None = None, per_rank: dict | None = None) -> dict:
    """The simulator's step for ``plan`` over the shim's links (and with free links), the ranks
    sharing this machine's cores with each other and with ``other_load`` threads of other jobs;
    with ``stretch`` (measured in the run: ``cpu_stretch``) the profile's times x that instead,
    and with ``cpu_per_step_s`` (all ranks' on-CPU seconds per steady step, measured there too)
    also x that over the profile's CPU work: the compute the run really had, spread over the
    layers as the profile has it (CPU seconds per op are not constant on a VM whose 2 cores
    may be hyperthreads of one: the profile of one run measured 0.44 s per step, of the next
    under heavier load 0.77 s)."""
    from sailor_core.profiler.cpu_sharing import shared_cpu_time
    from sailor_core.profiles import ProfileDB

    cores = float(num_cores or os.cpu_count() or 1)
    net = shim_network(latency_s, bandwidth_bytes_per_s)

    def at(k: float):
        return simulate_with(plan, ProfileDB([profile if k == 1.0 else scaled_profile(profile, k)]), net)

    sim = at(1.0)
    free = simulate_with(plan, ProfileDB([profile]), shim_network(0.0, 1e18))
    # the cores' throughput bound, from the unstretched CPU work
    shared = shared_cpu_time(plan, sim, threads_per_rank=1, other_load=other_load, num_cores=cores)
    probed_k = 1.0
    for _ in range(60):  # fixed point of k = max(1, (k W / T + L) / C); a damped step converges
        t = max(at(probed_k).iteration_time_s, shared.iteration_time_s)
        want = max(1.0, (probed_k * shared.work_s / t + other_load) / cores)
        if abs(want - probed_k) < 1e-4:
            break
        probed_k = 0.5 * (probed_k + want)
    probed = {"stretch": probed_k, "iteration_time_s": max(at(probed_k).iteration_time_s, shared.iteration_time_s)}
    # measured: what the run's ranks waited for a core is in the stretch, no bound on top
    profile_only = None
    if stretch is not None and cpu_per_step_s:
        profile_only = at(stretch).iteration_time_s
        stretch *= cpu_per_step_s / shared.work_s
    final = at(stretch if stretch is not None else probed_k)
    t = final.iteration_time_s if stretch is not None else probed["iteration_time_s"]
    per_stage = None
    if per_rank:
        factors = stage_factors(plan, profile, per_rank)
        per_stage = {"iteration_time_s": simulate_with(plan, ProfileDB([stage_scaled_profile(plan, profile, factors)]),
                                                       net).iteration_time_s, "factors": factors}
    pooled_s = t
    if per_stage is not None:  # the headline: each rank's time where it was spent
        t = per_stage["iteration_time_s"]
    return {"iteration_time_s": t, "stretch": stretch if stretch is not None else probed_k, "probed_load": probed,
            "profile_cpu_s": profile_only, "per_stage": per_stage, "pooled_s": pooled_s,
            "simulated_s": sim.iteration_time_s, "free_links_s": free.iteration_time_s, "cpu_work_s": shared.work_s,
            "other_load": other_load, "breakdown": final.breakdown, "bottleneck": final.bottleneck}


def stage_work_s(plan, profile, stage) -> float:
    """The profile's CPU seconds of one stage's replica per iteration: its micro-batches' forward
    and backward, and its optimizer step."""
    layers = profile.layers[stage.layer_start:stage.layer_end]
    num_mb = plan.num_microbatches // stage.dp_degree
    return (num_mb * sum(l.fwd_s + l.bwd_s for l in layers)
            + profile.update_s(sum(l.params for l in layers)))


def stage_factors(plan, profile, per_rank: dict) -> list[float]:
    """Per stage (one replica each, rank = stage): its rank's measured seconds per steady step,
    on a CPU or runnable and waiting for one, over the profile's CPU work of the stage.  Every
    rank's own overheads (Python around the ops, the loss, the step's bookkeeping) and its own
    wait for a core stay on its own stage, where its ops run one after another, rather than
    being spread over every stage's ops."""
    assert len(per_rank) == plan.pp_degree and all(s.dp_degree == 1 for s in plan.stages)
    out = []
    for i, stage in enumerate(plan.stages):
        on_cpu, waiting, steps = per_rank[str(i)]
        out.append((on_cpu + waiting) / steps / stage_work_s(plan, profile, stage))
    return out


def stage_scaled_profile(plan, profile, factors: list[float]):
    """``profile`` with each stage's layers ``factors[stage]`` times longer (the stages hold
    disjoint layers), the optimizer step by their median."""
    layers = list(profile.layers)
    for stage, k in zip(plan.stages, factors, strict=True):
        for i in range(stage.layer_start, stage.layer_end):
            layers[i] = replace(layers[i], fwd_s=layers[i].fwd_s * k, bwd_s=layers[i].bwd_s * k)
    k = statistics.median(factors)
    return replace(profile, layers=tuple(layers), update_s_per_param=profile.update_s_per_param * k,
                   update_fixed_s=profile.update_fixed_s * k)


def scaled_profile(profile, factor: float):
    """``profile`` with every compute time (layers, optimizer step) ``factor`` times longer."""
    layers = tuple(replace(l, fwd_s=l.fwd_s * factor, bwd_s=l.bwd_s * factor) for l in profile.layers)
    return replace(profile, layers=layers, update_s_per_param=profile.update_s_per_param * factor,
                   update_fixed_s=profile.update_fixed_s * factor)


def paced_profile(profile, pace):
    """``profile`` with every layer's forward and backward at the pace's seconds (the optimizer
    step as measured): what the engine's paced ops take."""
    layers = tuple(replace(l, fwd_s=pace.fwd_s_per_layer, bwd_s=pace.bwd_s_per_layer) for l in profile.layers)
    return replace(profile, layers=layers)


def predict_paced(plan, profile, pace, latency_s: float, bandwidth_bytes_per_s: float) -> dict:
    """The simulator's step for ``plan`` with paced ops, over the shim's links and over free ones."""
    from sailor_core.profiles import ProfileDB

    db = ProfileDB([paced_profile(profile, pace)])
    sim = simulate_with(plan, db, shim_network(latency_s, bandwidth_bytes_per_s))
    free = simulate_with(plan, db, shim_network(0.0, 1e18))
    return {"iteration_time_s": sim.iteration_time_s, "free_links_s": free.iteration_time_s,
            "bottleneck": sim.bottleneck, "breakdown": sim.breakdown}


def simulate_with(plan, db, network):
    from sailor_core.simulator import simulate

    return simulate(plan, profiles=db, network=network)


def measure(plan, latency_s: float, bandwidth_bytes_per_s: float, steps: int, workdir: Path,
            data: str | None = None, timeout_s: float = 600.0, sharing: dict | None = None,
            pace=None) -> list[float]:
    """Steady step times (the first step dropped) of the engine over the shim's links; with
    ``sharing`` (a dict), also what CPU sharing did to the ranks' steady steps (``cpu_stretch``);
    with ``pace`` (a ``ComputePace``), every forward and backward paced."""
    from sailor_core.runtime.launch import launch_local
    from sailor_core.runtime.links import LinkShim

    env = LinkShim(latency_s=latency_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s).to_env()
    if pace is not None:
        env = {**env, **pace.to_env()}
    sched_dir = workdir / "schedstat"
    if sharing is not None:
        sched_dir.mkdir(parents=True, exist_ok=True)
        env = {**env, "PYTHONPATH": str(SITE), "SAILOR_BENCH_SCHEDSTAT_DIR": str(sched_dir)}
    res = launch_local(plan, steps, data=data, workdir=workdir, threads_per_rank=1, env=env, timeout_s=timeout_s)
    if res.status != "ok":
        raise RuntimeError(f"engine run {res.status}: {res.message} {res.stderr_tails}")
    if sharing is not None:
        sharing.update(cpu_stretch(sched_dir))
    return res.step_times_s[1:]


def cpu_stretch(sched_dir: Path) -> dict:
    """Over every rank's steady steps (the first dropped): on-CPU seconds, runnable-but-waiting
    seconds, and their ratio ``(on CPU + waiting) / on CPU``, how much longer an op took than its
    CPU time because the cores were shared (with the other ranks and with other jobs)."""
    run_s = wait_s = 0.0
    late: list[float] = []
    steps = 0
    per_rank: dict[str, list[float]] = {}
    for f in sorted(sched_dir.glob("rank*.json")):
        got = json.loads(f.read_text())
        steps = max(steps, len(got["steps"]) - 1)
        mine = [0.0, 0.0, 0.0]  # on CPU, waiting, steps
        for _, on_cpu, waiting in got["steps"][1:]:
            run_s, wait_s = run_s + on_cpu, wait_s + waiting
            mine = [mine[0] + on_cpu, mine[1] + waiting, mine[2] + 1]
        per_rank[str(got["rank"])] = mine
        late += got.get("late", [])
    # late deliveries: the real transport behind the slow link's arrival (the shim cannot hide it)
    stretch = (run_s + wait_s) / run_s if run_s > 0 else 1.0
    return {"on_cpu_s": run_s, "waiting_s": wait_s, "steps": steps, "stretch": stretch, "per_rank": per_rank,
            "late_max_s": max(late, default=0.0), "late_over_10ms": sum(1 for x in late if x > 0.01),
            "receives": len(late)}


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
    ap.add_argument("--rescore", default=None, help="a saved run's slow_links.json: predict its rows again")
    ap.add_argument("--pace-ms", default=None,
                    help="FWD,BWD: every forward and backward of a micro-batch takes that many ms per layer "
                         "(ops longer than they compute: the ranks no longer stretch each other's ops)")
    args = ap.parse_args(argv)
    if args.rescore:
        return rescore(Path(args.rescore))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sailor-slow-links-"))
    os.environ["SAILOR_HOME"] = str(workdir / "sailor_home")  # never touch the user's ~/.sailor

    from sailor_core.catalog.models import get_model
    from sailor_core.errors import SailorError
    from sailor_core.profiler.compute import profile_model
    from sailor_core.profiler.stats import Repetitions
    from sailor_core.profiler.cpu_sharing import probe_other_load
    from sailor_core.runtime.launch import ensure_corpus

    depths = [int(x) for x in args.depths.split(",")]
    try:
        num_indices = get_model(args.model).num_layer_indices
    except SailorError as exc:
        sys.exit(f"bench_slow_links: {exc}")
    if max(depths) > num_indices:
        sys.exit(f"bench_slow_links: {args.model} has {num_indices} layer indices, too few for "
                 f"{max(depths)} stages of at least one each (--depths)")
    pace = parse_pace(args.pace_ms)
    latency, bandwidth = args.latency_ms / 1e3, args.mbps * 1e6
    out = {"model": args.model, "latency_s": latency, "bandwidth_bytes_per_s": bandwidth,
           "cpu_count": os.cpu_count(), "loadavg_start": loadavg(), "rows": [],
           "pace_s": [pace.fwd_s_per_layer, pace.bwd_s_per_layer] if pace else None}
    t0 = time.monotonic()
    (profile,) = profile_model(args.model, micro_batch_sizes=[1], tp_degrees=[1],
                               repeat=Repetitions(reps=args.reps), timer="cpu").profiles
    out["profile_s"] = time.monotonic() - t0
    out["profile_ms"] = [[round(l.fwd_s * 1e3, 3), round(l.bwd_s * 1e3, 3)] for l in profile.layers]
    out["update_s"] = [profile.update_s_per_param, profile.update_fixed_s]
    for depth in depths:
        for num_mb in [int(x) for x in args.microbatches.split(",")]:
            plan = plan_for(args.model, depth, num_mb)
            data = ensure_corpus(workdir, plan)
            runs = []
            for k in range(args.runs):
                other = probe_other_load()
                la = loadavg()
                sharing: dict = {}
                steps = measure(plan, latency, bandwidth, args.steps, workdir / f"p{depth}-m{num_mb}-r{k}", data,
                                sharing=sharing, pace=pace)
                runs.append({"loadavg": la, "other_load": other, "step_times_s": steps,
                             "median_s": statistics.median(steps), "sharing": sharing})
            pred = (predict_paced(plan, profile, pace, latency, bandwidth) if pace is not None
                    else predict(plan, profile, latency, bandwidth, **sharing_of(runs)))
            measured = statistics.median([t for r in runs for t in r["step_times_s"]])
            row = {"depth": depth, "microbatches": num_mb, "measured_s": measured,
                   "run_medians_s": [r["median_s"] for r in runs], "predicted": pred,
                   "error": pred["iteration_time_s"] / measured - 1, "runs": runs}
            out["rows"].append(row)
            if not args.json:
                (print_paced_row if pace is not None else print_row)(row, flush=True)
    out["loadavg_end"] = loadavg()
    (workdir / "slow_links.json").write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        summary(out)
        print(f"figures in {workdir / 'slow_links.json'}")
    return 0


def parse_pace(text: str | None):
    """``--pace-ms FWD,BWD`` as a ``ComputePace`` (None without it); a bad value exits with one line."""
    from sailor_core.errors import SailorError
    from sailor_core.runtime.links import ComputePace

    if not text:
        return None
    try:
        fwd_ms, bwd_ms = (float(x) for x in text.split(","))
        return ComputePace(fwd_s_per_layer=fwd_ms / 1e3, bwd_s_per_layer=bwd_ms / 1e3)
    except (ValueError, SailorError) as exc:
        sys.exit(f"bench_slow_links: --pace-ms wants FWD,BWD milliseconds per layer, got {text!r} ({exc})")


def print_paced_row(row: dict, flush: bool = False) -> None:
    p, meds = row["predicted"], row["run_medians_s"]
    waits = [r["sharing"] for r in row["runs"] if r.get("sharing", {}).get("on_cpu_s")]
    busy = (f"; ranks on a CPU {sum(w['on_cpu_s'] for w in waits) / sum(w['steps'] for w in waits):.3f} s and "
            f"waiting for one {sum(w['waiting_s'] for w in waits) / sum(w['steps'] for w in waits):.3f} s per step "
            f"(all ranks)") if waits else ""
    print(f"{row['depth']} stages x {row['microbatches']:>2} micro-batches, paced: measured {row['measured_s']:.3f} s "
          f"(runs {min(meds):.3f}..{max(meds):.3f}), predicted {p['iteration_time_s']:.3f} s ({row['error']:+.1%}); "
          f"free links {p['free_links_s']:.3f} s, bottleneck {p['bottleneck']}{busy}", flush=flush)


def sharing_of(runs: list[dict]) -> dict:
    """The probed other load of a row's runs, and their measured stretch where they have it (the
    runs' on-CPU and waiting seconds pooled)."""
    got = {"other_load": statistics.mean(r["other_load"] for r in runs)}
    if all("sharing" in r for r in runs):
        on_cpu = sum(r["sharing"]["on_cpu_s"] for r in runs)
        got["stretch"] = (on_cpu + sum(r["sharing"]["waiting_s"] for r in runs)) / on_cpu
        if all(r["sharing"].get("steps") for r in runs):
            got["cpu_per_step_s"] = on_cpu / sum(r["sharing"]["steps"] for r in runs)
        if all("per_rank" in r["sharing"] for r in runs):
            pooled: dict[str, list[float]] = {}
            for r in runs:
                for rank, figs in r["sharing"]["per_rank"].items():
                    pooled[rank] = [a + b for a, b in zip(pooled.get(rank, [0.0, 0.0, 0.0]), figs)]
            got["per_rank"] = pooled
    return got


def saved_profile(out: dict):
    """The CPU profile a saved run was predicted with: its layer times (to the microsecond) on the
    model's layer sizes, and its optimizer rate (where the file has it)."""
    from sailor_core.profiles import default_profile_db

    base = default_profile_db().get(out["model"], "cpu", 1, 1)
    times = zip(base.layers, out["profile_ms"], strict=True)
    layers = tuple(replace(layer, fwd_s=f / 1e3, bwd_s=b / 1e3) for layer, (f, b) in times)
    rate, fixed = out.get("update_s", (base.update_s_per_param, base.update_fixed_s))
    return replace(base, layers=layers, update_s_per_param=rate, update_fixed_s=fixed)


def rescore(path: Path) -> int:
    """Predict a saved run's rows again (the measured figures as they were)."""
    from sailor_core.runtime.links import ComputePace

    out = json.loads(path.read_text())
    profile = saved_profile(out)
    fwd_s, bwd_s = out.get("pace_s") or (None, None)
    pace = ComputePace(fwd_s_per_layer=fwd_s, bwd_s_per_layer=bwd_s) if fwd_s is not None else None
    for row in out["rows"]:
        plan = plan_for(out["model"], row["depth"], row["microbatches"])
        if pace is not None:
            row["predicted"] = predict_paced(plan, profile, pace, out["latency_s"], out["bandwidth_bytes_per_s"])
        else:
            row["predicted"] = predict(plan, profile, out["latency_s"], out["bandwidth_bytes_per_s"],
                                       num_cores=out["cpu_count"], **sharing_of(row["runs"]))
        row["error"] = row["predicted"]["iteration_time_s"] / row["measured_s"] - 1
        (print_paced_row if pace is not None else print_row)(row)
    summary(out)
    return 0


def summary(out: dict) -> None:
    errs = [abs(r["error"]) for r in out["rows"]]
    print(f"model {out['model']}, links {out['latency_s'] * 1e3:g} ms + {out['bandwidth_bytes_per_s'] / 1e6:g} MB/s, "
          f"{out['cpu_count']} CPUs, load {out['loadavg_start']:.1f} -> {out['loadavg_end']:.1f}; |error| median "
          f"{statistics.median(errs):.1%}, max {max(errs):.1%}")


def print_row(row: dict, flush: bool = False) -> None:
    p = row["predicted"]
    meds = row["run_medians_s"]
    probed = p["probed_load"]
    late = [r["sharing"] for r in row["runs"] if "late_max_s" in r.get("sharing", {})]
    late_text = (f"; receives late > 10 ms {sum(x['late_over_10ms'] for x in late)}/{sum(x['receives'] for x in late)}"
                 f" (max {max(x['late_max_s'] for x in late) * 1e3:.0f} ms)") if late else ""
    only = p.get("profile_cpu_s")
    only_text = f"; at the profile's CPU times {only:.3f} s ({only / row['measured_s'] - 1:+.1%})" if only else ""
    ps = p.get("per_stage")
    if ps:
        only_text = (f" (each stage x{min(ps['factors']):.2f}..{max(ps['factors']):.2f} its rank's own time); all "
                     f"ranks' time pooled {p['pooled_s']:.3f} s ({p['pooled_s'] / row['measured_s'] - 1:+.1%})"
                     + only_text)
    print(f"{row['depth']} stages x {row['microbatches']:>2} micro-batches: measured {row['measured_s']:.3f} s "
          f"(runs {min(meds):.3f}..{max(meds):.3f}), predicted {p['iteration_time_s']:.3f} s "
          f"({row['error']:+.1%}); ops x{p['stretch']:.2f}{only_text}; own cores {p['simulated_s']:.3f} s; other load "
          f"probed {p['other_load']:.1f}: ops x{probed['stretch']:.2f}, {probed['iteration_time_s']:.3f} s "
          f"({probed['iteration_time_s'] / row['measured_s'] - 1:+.1%}); free links {p['free_links_s']:.3f} s, "
          f"CPU work {p['cpu_work_s']:.3f} s, "
          f"bottleneck {p['bottleneck']}{late_text}", flush=flush)


if __name__ == "__main__":
    sys.exit(main())
