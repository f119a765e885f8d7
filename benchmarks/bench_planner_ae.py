"""The planner on Sailor's 11 artifact-evaluation rows (issue 35): search time of
``sailor plan --trace ... --row N --no-spot`` (a fresh process per run, as a user runs it; best
of ``--runs``) against Sailor's planner timed on a machine of the same kind, and the best plan
against the Sailor-rule baseline (``planner/baseline.py``) in our own simulator.  Then the
completeness scenarios (``tests/planner/test_completeness.py``): the search against an
exhaustive enumeration over every DP degree, and, where the optimum needs a stage of several GPU
types, against ``enumerate_mixed_best`` (every mixed plan; the search proves its answer over that
space on pools of at most 8 GPUs, ``planner/mixed_space.py``).

    .venv/bin/python benchmarks/bench_planner_ae.py [--runs 3] [--only geo]
    .venv/bin/python benchmarks/bench_planner_ae.py completeness
    .venv/bin/python benchmarks/bench_planner_ae.py cpu [--runs 3] [--only geo]

``cpu``: the CPU time (``time.process_time``) of one ``plan_job`` of each row's request in a fresh
process after the profiles are loaded (what ``search_time_s`` counts, without the wall clock's
share of a loaded machine), best of ``--runs``.

``search s`` is the ``search_time_s`` the command reports (the search, not the process start);
``start s`` the process's wall time before and after it (imports, profiles, printing).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = ROOT / "data" / "sailor_data" / "simulations" / "configs"
AE = ROOT / "data" / "sailor_data" / "ae_planner"

# Sailor's planner, seconds per row (issue 35's table: best of 3 on a 2-core machine)
SAILOR_S = {"homog 0": 0.036, "homog 1": 0.086, "homog 2": 0.118, "hetero 0": 1.110, "hetero 1": 3.427,
            "hetero 2": 7.821, "geo 0": 0.148, "geo 1": 0.439, "geo 2": 0.583, "floor": 0.343, "cap": 10.555}
TRACES = {"homog": "gpu_trace_scaled.csv", "hetero": "gpu_trace_heterogeneous_imbalanced.csv",
          "geo": "gpu_trace_multizone.csv", "floor": "gpu_trace_2zones_2gpus.csv", "cap": "gpu_trace_2zones_2gpus.csv"}
MODEL, GBS = "opt-350m", 1024


def _limits(name: str) -> dict:
    if name == "floor":
        it_s = json.loads((AE / "min_throughput_file.json").read_text())[0]
        return {"objective": "cost", "min_throughput_samples_per_s": it_s * GBS}
    if name == "cap":
        return {"max_usd_per_iteration": json.loads((AE / "max_budget_file.json").read_text())[0]}
    return {}


def _cli_args(name: str, row: int) -> list[str]:
    args = ["plan", "--model", MODEL, "--trace", str(CONFIGS / TRACES[name]), "--row", str(row), "--no-spot",
            "--global-batch-size", str(GBS), "--json", "--top", "1"]
    lim = _limits(name)
    if "objective" in lim:
        args += ["--objective", lim["objective"], "--min-throughput", repr(lim["min_throughput_samples_per_s"])]
    if "max_usd_per_iteration" in lim:
        args += ["--max-usd-per-iter", repr(lim["max_usd_per_iteration"])]
    return args


def rows() -> list[tuple[str, str, int]]:
    out = [(f"{k} {r}", k, r) for k in ("homog", "hetero", "geo") for r in range(3)]
    return out + [("floor", "floor", 0), ("cap", "cap", 0)]


def time_rows(runs: int, only: str | None) -> None:
    from sailor_core.network.model import default_network
    from sailor_core.planner.baseline import sailor_rule_best
    from sailor_core.profiles import default_profile_db

    db, net = default_profile_db(), default_network()
    sailor = str(ROOT / ".venv" / "bin" / "sailor")
    print("| row | Sailor s | ours search s (best of %d) | ours/Sailor time | start s | ours samples/s | "
          "USD/iter | Sailor-rule samples/s | USD/iter | ours/Sailor-rule (our simulator) |" % runs)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, name, row in rows():
        if only and not label.startswith(only):
            continue
        best_s, start_s, out = float("inf"), float("inf"), None
        for _ in range(runs):
            t0 = time.perf_counter()
            proc = subprocess.run([sailor, *_cli_args(name, row)], capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t0
            out = json.loads(proc.stdout)
            best_s = min(best_s, out["search_time_s"])
            start_s = min(start_s, wall - out["search_time_s"])
        plan = out["plans"][0]
        base = sailor_rule_best(_request(name, row), profiles=db, network=net)
        if name == "floor":  # cost objective: the cheaper, the better
            ratio = base.res.usd_per_iteration / plan["usd_per_iteration"]
        else:
            ratio = plan["throughput_samples_per_s"] / base.res.throughput_samples_per_s
        print(f"| {label} | {SAILOR_S[label]:.3f} | {best_s:.3f} | {best_s / SAILOR_S[label]:.2f} | {start_s:.2f} | "
              f"{plan['throughput_samples_per_s']:.2f} | {plan['usd_per_iteration']:.4f} | "
              f"{base.res.throughput_samples_per_s:.2f} | {base.res.usd_per_iteration:.4f} | {ratio:.3f} |", flush=True)


def _request(name: str, row: int):
    from sailor_core.planner import make_request
    from sailor_core.traces import load_gpu_trace

    trace = load_gpu_trace(CONFIGS / TRACES[name])
    avail = {k: n for k, n in trace.row(row).items() if n}
    return make_request(model=MODEL, availability=avail, global_batch_size=GBS, spot=False, **_limits(name))


def cpu_one(label: str) -> None:
    """One row's ``plan_job`` in this process: its CPU and wall seconds and the plan, as JSON."""
    from sailor_core.network.model import default_network
    from sailor_core.planner import plan_job
    from sailor_core.profiles import default_profile_db

    name, row = next((n, r) for lab, n, r in rows() if lab == label)
    db, net, req = default_profile_db(), default_network(), _request(name, row)
    c0, w0 = time.process_time(), time.perf_counter()
    res = plan_job(req, profiles=db, network=net)
    cpu_s, wall_s = time.process_time() - c0, time.perf_counter() - w0
    best = res.candidates[0].sim
    print(json.dumps({"cpu_s": cpu_s, "wall_s": wall_s, "samples_per_s": best.throughput_samples_per_s,
                      "usd_per_iteration": best.usd_per_iteration, "num_evaluated": res.num_evaluated}))


def time_cpu(runs: int, only: str | None) -> None:
    print("| row | Sailor s | ours CPU s (best of %d) | wall s of that run | ours/Sailor | samples/s | evaluated |" % runs)
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, _, _ in rows():
        if only and not label.startswith(only):
            continue
        outs = [json.loads(subprocess.run([sys.executable, __file__, "_one", label], capture_output=True, text=True,
                                          check=True).stdout) for _ in range(runs)]
        best = min(outs, key=lambda o: o["cpu_s"])
        print(f"| {label} | {SAILOR_S[label]:.3f} | {best['cpu_s']:.3f} | {best['wall_s']:.3f} | "
              f"{best['cpu_s'] / SAILOR_S[label]:.2f} | {best['samples_per_s']:.2f} | {best['num_evaluated']} |", flush=True)


def completeness() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "planner"))
    from test_completeness import MIXED, SCENARIOS

    from sailor_core.network.model import default_network
    from sailor_core.planner import make_request, plan_job
    from sailor_core.planner.exhaustive import enumerate_best, enumerate_mixed_best
    from sailor_core.planner.mixed_space import STAGE_SPACES
    from sailor_core.profiles import default_profile_db

    db, net = default_profile_db(), default_network()
    print("| scenario | exhaustive plans | exhaustive best | search best | search s | exhausted | DP degrees |")
    print("|---|---:|---:|---:|---:|---|---|")
    for name, (_, kw) in SCENARIOS.items():
        req = make_request(mixed_stages=False, max_stages=2, **kw)
        exact = enumerate_best(req, profiles=db, network=net, every_degree=True)
        res = plan_job(req, profiles=db, network=net)
        cost = req.ranking.by_cost
        fig = (lambda t, u: f"{u:.6f} USD/it" if cost else f"{t:.2f} samples/s")
        dp = "/".join(str(sum(n for _, _, n in s.groups)) for s in exact.best.stages)
        print(f"| {name} | {exact.num_plans} | "
              f"{fig(exact.best.res.throughput_samples_per_s, exact.best.res.usd_per_iteration)} (DP {dp}) | "
              f"{fig(res.best.throughput_samples_per_s, res.best.usd_per_iteration)} | {res.search_time_s:.3f} | "
              f"{res.exhausted} | {res.searched_dp_degrees} |", flush=True)
    for name, kw in MIXED.items():  # the optimum needs a stage of several GPU types
        req = make_request(max_stages=2, **kw)
        mixed = enumerate_mixed_best(req, profiles=db, network=net)
        one_type = enumerate_best(req, profiles=db, network=net, every_degree=True).best
        res = plan_job(req, profiles=db, network=net)
        fig = (lambda t, u: f"{u:.6f} USD/it" if req.ranking.by_cost else f"{t:.2f} samples/s")
        stages = " / ".join("+".join(f"{n}x{k.gpu}@{z[-1]}" for k, z, n in st.groups) for st in mixed.best.stages)
        one = fig(one_type.res.throughput_samples_per_s, one_type.res.usd_per_iteration) if one_type else "none"
        space = next(k for k, v in STAGE_SPACES.items() if v == res.searched_stages)
        print(f"| {name} | {mixed.num_plans} (mixed) | "
              f"{fig(mixed.best.res.throughput_samples_per_s, mixed.best.res.usd_per_iteration)} "
              f"({stages}; one-type stages: {one}) | {fig(res.best.throughput_samples_per_s, res.best.usd_per_iteration)} | "
              f"{res.search_time_s:.3f} | {res.exhausted} | stages: {space}, DP: {res.searched_dp_degrees} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="rows", choices=["rows", "completeness", "cpu", "_one"])
    ap.add_argument("label", nargs="?", help="_one: the row (e.g. 'geo 0')")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only")
    args = ap.parse_args()
    if args.what == "completeness":
        completeness()
    elif args.what == "cpu":
        time_cpu(args.runs, args.only)
    elif args.what == "_one":
        cpu_one(args.label)
    else:
        time_rows(args.runs, args.only)


if __name__ == "__main__":
    main()
