"""Markdown tables from bench_replay.py's JSON outputs.

    .venv/bin/python benchmarks/bench_replay_report.py results/*.json
"""

from __future__ import annotations

import json
import sys


def _h(s):
    return "-" if s is None else f"{s / 3600:.2f}"


def _x(r):
    return "-" if r is None else f"{r:.2f}"


def main(paths: list[str]) -> None:
    runs = [json.load(open(p)) for p in paths]
    print("| trace | policy | finished | time to train (h) | USD | cost / ours | time / ours | useful work | re-plans | restarts | waiting (h) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in runs:
        for name, r in run["policies"].items():
            done = "yes" if r["finished"] else f"no: {r['stop_reason'].split(':')[0]}"
            print(f"| {run['trace_arg'].split('/')[-1]} | {name} | {done} | {_h(r['time_to_train_s'])} | "
                  f"{r['usd_spent']:.2f} | {_x(r.get('cost_ratio_to_ours', 1.0 if name == 'ours' else None))} | "
                  f"{_x(r.get('time_ratio_to_ours', 1.0 if name == 'ours' else None))} | "
                  f"{r['useful_work_fraction']:.2f} | {r['num_replans']} | {r['num_restarts']} | {_h(r['wait_s'])} |")
    print()
    print("| trace | rows | hours | preemption events | tokens | single-type GPU | planner evaluations cap | planner calls | planning (s) | wall cold (s) | wall warm (s) |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for run in runs:
        print(f"| {run['trace_arg'].split('/')[-1]} | {run['trace_rows']} | {run['trace_hours']:.1f} | "
              f"{run['num_trace_preemptions']} | {run['tokens']:.3g} | {run['single_gpu_type']} | "
              f"{run.get('max_evaluations', 200)} | "
              f"{run['planner_calls']} | {run['planner_time_s']:.1f} | {run['wall_cold_s']:.1f} | {run['wall_warm_s']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
