"""Markdown tables from bench_replay.py's JSON outputs.

    .venv/bin/python benchmarks/bench_replay_report.py results/*.json
    .venv/bin/python benchmarks/bench_replay_report.py --compare results/aws3d.json [--before results/base_aws3d.json]

Without ``--compare``: one row per policy of plain runs.  With it (outputs of ``bench_replay.py
--compare``): per trace, each policy at each objective, ours' Pareto front, the comparison at
equal terms, and, with ``--before`` (a plain run of an earlier controller on the same planner
answers), the fastest runs before and now.
"""

from __future__ import annotations

import argparse
import json


def _h(s):
    return "-" if s is None else f"{s / 3600:.2f}"


def _x(r):
    return "-" if r is None else f"{r:.2f}"


def plain(runs: list[dict]) -> None:
    from sailor_core.replay import activity_words

    print("| trace | policy | finished | time to train (h) | USD | cost / ours | time / ours | useful work | re-plans | restarts | waiting (h) | paid GPU time |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for run in runs:
        for name, r in run["policies"].items():
            done = "yes" if r["finished"] else f"no: {r['stop_reason'].split(':')[0]}"
            print(f"| {run['trace_arg'].split('/')[-1]} | {name} | {done} | {_h(r['time_to_train_s'])} | "
                  f"{r['usd_spent']:.2f} | {_x(r.get('cost_ratio_to_ours', 1.0 if name == 'ours' else None))} | "
                  f"{_x(r.get('time_ratio_to_ours', 1.0 if name == 'ours' else None))} | "
                  f"{r['useful_work_fraction']:.2f} | {r['num_replans']} | {r['num_restarts']} | {_h(r['wait_s'])} | "
                  f"{activity_words(r.get('gpu_s_by_activity') or {}) if r.get('gpu_s_by_activity') else '-'} |")
    print()
    print("| trace | rows | hours | preemption events | tokens | single-type GPU | planner evaluations cap | planner calls | planning (s) | wall cold (s) | wall warm (s) |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for run in runs:
        print(f"| {run['trace_arg'].split('/')[-1]} | {run['trace_rows']} | {run['trace_hours']:.1f} | "
              f"{run['num_trace_preemptions']} | {run['tokens']:.3g} | {run['single_gpu_type']} | "
              f"{run.get('max_evaluations', 200)} | "
              f"{run['planner_calls']} | {run['planner_time_s']:.1f} | {run['wall_cold_s']:.1f} | {run['wall_warm_s']:.2f} |")


def _point(p: dict) -> str:
    t = f"{p['time_h']:.2f}" if p["time_h"] is not None else f"- ({p['stop_reason'].split(':')[0]})"
    return f"{t} | {p['usd']:.2f} | {p['useful_work_fraction']:.0%} | {p['num_replans']}"


def compare(run: dict, before: dict | None) -> None:
    name = run["trace_arg"].split("/")[-1]
    od = run.get("on_demand_gpus") or 0
    print(f"**{name}** ({run['tokens']:.3g} tokens, {run['trace_hours']:.1f} h, {run['num_trace_preemptions']} "
          f"preemption events, single-type GPU {run['single_gpu_type']}"
          + (f", {od} on-demand GPUs per pool" if od else "") + ")")
    print()
    c = run["comparison"]
    print("| policy | terms | time (h) | USD | useful | re-plans |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for p in c["points"]:
        print(f"| {p['policy']} | {p['terms']} | {_point(p)} |")
    if before is not None:
        for pol, r in before["policies"].items():
            p = {"time_h": r["time_to_train_s"] / 3600 if r["time_to_train_s"] else None, "usd": r["usd_spent"],
                 "useful_work_fraction": r["useful_work_fraction"], "num_replans": r["num_replans"],
                 "stop_reason": r["stop_reason"]}
            print(f"| {pol}, before (--before) | fastest | {_point(p)} |")
    print()
    print("Ours' Pareto front: " + "; ".join(f"{p['terms'].split(' (')[0]} {p['time_h']:.2f} h / {p['usd']:.2f} USD"
                                             for p in c["front"]) + ".")
    print()
    for line in run.get("summary", []):
        print(f"- {line}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--before", action="append", default=[], help="a plain run of an earlier controller, per path")
    args = ap.parse_args()
    runs = [json.load(open(p)) for p in args.paths]
    if not args.compare:
        return plain(runs)
    befores = [json.load(open(p)) for p in args.before] + [None] * (len(runs) - len(args.before))
    for run, before in zip(runs, befores):
        compare(run, before)


if __name__ == "__main__":
    main()
