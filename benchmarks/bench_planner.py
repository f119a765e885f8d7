"""Planner benchmarks: speed on Sailor's artifact scenarios, ratio to a Sailor-rule baseline,
optimality against exhaustive enumeration, and growth with the cluster size.

    .venv/bin/python benchmarks/bench_planner.py speed        # scenarios + baseline ratio
    .venv/bin/python benchmarks/bench_planner.py optimality   # 20 random small cases
    .venv/bin/python benchmarks/bench_planner.py scaling      # 32 -> 1024 GPUs

Times: ``wall`` is elapsed seconds, ``cpu`` the process CPU seconds (the shared 2-core VM
runs other jobs, so wall time overstates what the search needs).  Profiles are loaded once
before timing (``sailor plan`` loads them in about 0.2-0.8 s on its own).  A full cyclic
garbage collection runs before each timed request, outside the timing: the collector's older
generations hold the memos of every request before, and a pass over them (about 0.2 s every
ten or so requests) otherwise lands in whichever request crosses its threshold.
"""

from __future__ import annotations

import gc
import json
import math
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sailor_core.source_data import SAILOR_CONFIGS_DIR as CONFIGS, SAILOR_DATA_DIR  # noqa: E402
A, V, A80 = "A100-40", "V100-16", "A100-80"
C = "us-central1-"


def _gbs(model: str) -> int:
    name = {"opt-350m": "training_config_opt_350.json", "gpt-neo-2.7b": "training_config_gpt_neo27.json"}[model]
    return json.loads((CONFIGS / name).read_text())["global_batch_size"]


def scenarios():
    from sailor_core.traces import load_gpu_trace

    out = []
    for label, trace in (("homogeneous", "gpu_trace_scaled.csv"),
                         ("heterogeneous", "gpu_trace_heterogeneous_imbalanced.csv"),
                         ("geo 5 zones", "gpu_trace_multizone.csv")):
        t = load_gpu_trace(CONFIGS / trace)
        for row in range(t.num_rows):
            counts = {k: n for k, n in t.row(row).items() if n}
            out.append((f"{label} row {row}", counts, {}))
    two = {k: n for k, n in load_gpu_trace(CONFIGS / "gpu_trace_2zones_2gpus.csv").row(0).items() if n}
    floor_it_s = json.loads((SAILOR_DATA_DIR / "ae_planner" / "min_throughput_file.json").read_text())[0]
    cap = json.loads((SAILOR_DATA_DIR / "ae_planner" / "max_budget_file.json").read_text())[0]
    out.append(("2 zones A100+V100, floor", two, {"objective": "cost", "floor_it_s": floor_it_s}))
    out.append(("2 zones A100+V100, cost cap", two, {"max_usd_per_iteration": cap}))
    three = {}
    for g in (A, V, A80):
        for i, z in enumerate((C + "a", C + "b", C + "c")):
            three[(g, z)] = 86 if i < 2 else 84
    out.append(("3 types x 256, 3 zones", three, {}))
    return out


def speed() -> None:
    from sailor_core.errors import InfeasibleError
    from sailor_core.network.model import default_network
    from sailor_core.planner import make_request, plan_job
    from sailor_core.planner.baseline import sailor_rule_best
    from sailor_core.profiles import default_profile_db

    db, net = default_profile_db(), default_network()
    print("| model | scenario | GPUs | wall s | cpu s | evaluated | plan: samples/s | USD/iter | GPUs used | stages | baseline samples/s | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in ("opt-350m", "gpt-neo-2.7b"):
        gbs = _gbs(model)
        for label, avail, extra in scenarios():
            kw = dict(extra)
            floor = kw.pop("floor_it_s", None)
            if floor is not None:
                kw["min_throughput_samples_per_s"] = floor * gbs
            req = make_request(model=model, availability=avail, global_batch_size=gbs, **kw)
            gc.collect()
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                res = plan_job(req, profiles=db, network=net)
                best = res.best
                got = (f"{best.throughput_samples_per_s:.1f} | {best.usd_per_iteration:.3f} | "
                       f"{best.plan.num_gpus} | {best.plan.pp_degree}")
                evaluated = res.num_evaluated
            except InfeasibleError as exc:
                best, got, evaluated = None, f"infeasible: {exc} | | |", "-"
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            base_txt, ratio = "-", "-"
            if "3 types" not in label:
                base = sailor_rule_best(req, profiles=db, network=net)
                if base is not None and best is not None:
                    base_txt = f"{base.res.throughput_samples_per_s:.1f}"
                    if req.objective.value == "throughput":
                        ratio = f"{best.throughput_samples_per_s / base.res.throughput_samples_per_s:.2f}"
                    else:
                        base_txt += f" ({base.res.usd_per_iteration:.3f} USD/it)"
                        ratio = f"cost {best.usd_per_iteration / base.res.usd_per_iteration:.2f}"
            print(f"| {model} | {label} | {sum(avail.values())} | {wall:.2f} | {cpu:.2f} | {evaluated} | "
                  f"{got} | {base_txt} | {ratio} |", flush=True)


def optimality_cases(num_cases: int = 20, seed: int = 1) -> list[dict]:
    """The random small cases of ``optimality``: each one's ``make_request`` keyword arguments
    (``benchmarks/golden.py`` records the planner's and the enumeration's answers on them)."""
    rng = random.Random(seed)
    gpu_pool = [A, V, A80, "L4", "T4"]
    zones = [C + "a", C + "b", "us-west1-b"]
    cases = []
    for _ in range(num_cases):
        types = rng.sample(gpu_pool, 2)
        zs = rng.sample(zones, 2)
        total = rng.randint(4, 16)
        avail = {}
        for _ in range(total):
            key = (rng.choice(types), rng.choice(zs))
            avail[key] = avail.get(key, 0) + 1
        model = rng.choice(["small", "small", "tiny"])
        gbs = rng.choice([32, 64, 128])
        cases.append(dict(model=model, availability=avail, global_batch_size=gbs, max_stages=4,
                          micro_batch_sizes=(1, 2, 4), mixed_stages=False))
    return cases


def optimality(num_cases: int = 20, seed: int = 1) -> None:
    from sailor_core.network.model import default_network
    from sailor_core.planner import make_request, plan_job
    from sailor_core.planner.exhaustive import enumerate_best
    from sailor_core.profiles import default_profile_db

    db, net = default_profile_db(), default_network()
    print("| case | model | GPUs (type@zone=count) | batch | exhaustive plans | exhaustive samples/s | planner samples/s | gap % | planner evaluated |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    worst, sizes = 0.0, []
    for case, kw in enumerate(optimality_cases(num_cases, seed)):
        model, avail, gbs = kw["model"], kw["availability"], kw["global_batch_size"]
        req = make_request(**kw)
        exact = enumerate_best(req, profiles=db, network=net)
        got = plan_job(req, profiles=db, network=net)
        e = exact.best.res.throughput_samples_per_s
        p = got.best.throughput_samples_per_s
        gap = max(0.0, (e - p) / e * 100)
        worst = max(worst, gap)
        sizes.append(exact.num_plans)
        desc = ", ".join(f"{g}@{z}={n}" for (g, z), n in sorted(avail.items()))
        print(f"| {case} | {model} | {desc} | {gbs} | {exact.num_plans} | {e:.2f} | {p:.2f} | {gap:.3f} | {got.num_evaluated} |",
              flush=True)
    print(f"\nworst gap {worst:.3f} %; enumeration size {min(sizes)}..{max(sizes)} plans "
          f"(median {sorted(sizes)[len(sizes) // 2]})")


def _scaling_child(total: int) -> None:
    from sailor_core.network.model import default_network
    from sailor_core.planner import make_request, plan_job
    from sailor_core.profiles import default_profile_db

    db, net = default_profile_db(), default_network()
    half = total // 4
    avail = {(A, C + "a"): half, (A, C + "b"): half, (V, C + "a"): half, (V, C + "b"): total - 3 * half}
    req = make_request(model="opt-350m", availability=avail, global_batch_size=1024)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    w0, c0 = time.perf_counter(), time.process_time()
    res = plan_job(req, profiles=db, network=net)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(total=total, wall=wall, cpu=cpu, evaluated=res.num_evaluated,
                          rss_mb=after / 1024, growth_mb=(after - before) / 1024,
                          thr=res.best.throughput_samples_per_s)))


def scaling() -> None:
    rows = []
    print("| GPUs (A100-40 + V100-16, 2 zones) | wall s | cpu s | evaluated | peak RSS MB | RSS growth in search MB | best samples/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for total in (32, 64, 128, 256, 512, 1024):
        out = subprocess.run([sys.executable, __file__, "_scaling_child", str(total)], capture_output=True,
                             text=True, check=True, cwd=ROOT)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"| {total} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['evaluated']} | {r['rss_mb']:.0f} | "
              f"{r['growth_mb']:.0f} | {r['thr']:.1f} |", flush=True)
    xs = [math.log(r["total"]) for r in rows]
    ys = [math.log(max(r["cpu"], 1e-3)) for r in rows]
    n = len(xs)
    slope = (n * sum(x * y for x, y in zip(xs, ys)) - sum(xs) * sum(ys)) / (n * sum(x * x for x in xs) - sum(xs) ** 2)
    print(f"\nCPU time grows like GPUs^{slope:.2f} (least-squares slope of log cpu vs log GPUs)")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "speed"
    if cmd == "_scaling_child":
        _scaling_child(int(sys.argv[2]))
    else:
        {"speed": speed, "optimality": optimality, "scaling": scaling}[cmd]()
