"""Seeded chaos trials of the train-job flow on the embedded local cloud (tests/reliability/chaos.py).

    .venv/bin/python benchmarks/bench_chaos.py --trials 30 [--seed0 0] [--faults 2] [--out results.jsonl]

Prints one line per trial and the totals: faults injected (by kind), trials passed,
steps redone (against the one-interval-per-fault bound), time to recover, final
parameter agreement with an uninterrupted run of the same plan.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--faults", type=int, default=2, help="faults per trial")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--out", default=None, help="append one JSON line per trial here")
    ap.add_argument("--summarize", default=None, help="only print the totals of a --out file")
    args = ap.parse_args(argv)
    if args.summarize:
        rows = [json.loads(line) for line in open(args.summarize) if line.strip()]
        report([_Row(r) for r in rows], sum(r["wall_s"] for r in rows))
        return 0

    from tests.reliability.chaos import ChaosEnv, run_trial

    results = []
    references: dict = {}
    t_start = time.time()
    with ChaosEnv() as env:
        print(f"chaos env {env.home} (Prefect {env.api_url})", flush=True)
        for seed in range(args.seed0, args.seed0 + args.trials):
            r = run_trial(env, seed, steps=args.steps, ckpt_every=args.ckpt_every, num_faults=args.faults,
                          references=references)
            results.append(r)
            kinds = ",".join(f"{f.kind}@{f.fired_step}" for f in r.faults)
            rec = [f"{f.recover_s:.1f}" for f in r.faults if f.recover_s is not None]
            print(f"seed {seed:3d} {'PASS' if r.passed else 'FAIL'} {r.status:10s} faults [{kinds}] "
                  f"redone {r.steps_redone}/{r.redo_bound} recover_s {rec} usd {r.usd_spent:.5f}/{r.budget_usd} "
                  f"left {r.instances_left_running} diff {r.max_abs_param_diff} bitwise {r.bitwise_equal} "
                  f"flow_runs {r.num_flow_runs} wall {r.wall_s:.0f}s {'; '.join(r.failures)}", flush=True)
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(r.to_dict()) + "\n")
    report(results, time.time() - t_start)
    return 0 if all(r.passed for r in results) else 1


class _Row:
    """A trial read back from a --out file, with the attributes ``report`` uses."""

    def __init__(self, d: dict) -> None:
        self.__dict__.update(d)
        self.faults = [_Fault(f) for f in d["faults"]]


class _Fault:
    def __init__(self, d: dict) -> None:
        self.__dict__.update(d)


def report(results, wall_s: float) -> None:
    faults = [f for r in results for f in r.faults]
    by_kind = Counter(f.kind for f in faults)
    recover = {k: [f.recover_s for f in faults if f.kind == k and f.recover_s is not None and f.recover_s > 0]
               for k in by_kind}
    print(f"\ntrials: {len(results)}, passed: {sum(r.passed for r in results)}, wall {wall_s:.0f} s")
    print(f"faults injected: {len(faults)} ({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items()))})")
    redone = [r.steps_redone for r in results]
    if redone:
        print(f"steps redone per trial: mean {statistics.mean(redone):.2f}, max {max(redone)}; "
              f"bound (interval x breaking faults) mean {statistics.mean(r.redo_bound for r in results):.2f}")
    for k, xs in sorted(recover.items()):
        if xs:
            print(f"time to recover, {k}: median {statistics.median(xs):.1f} s, max {max(xs):.1f} s (n={len(xs)})")
    diffs = [r.max_abs_param_diff for r in results if r.max_abs_param_diff is not None]
    print(f"final parameters bitwise equal to the uninterrupted run: {sum(bool(r.bitwise_equal) for r in results)}"
          f"/{len(results)}; max |diff| {max(diffs) if diffs else None}")
    print(f"spend within budget: {sum(r.usd_spent <= r.budget_usd for r in results)}/{len(results)}; "
          f"instances left running: {sum(max(0, r.instances_left_running) for r in results)}")


if __name__ == "__main__":
    sys.exit(main())
