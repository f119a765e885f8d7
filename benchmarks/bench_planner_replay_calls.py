"""Planner requests of a cold replay: CPU time of answering, in order and in one process, the
``plan_job`` requests a cold replay of a derived trace sends to the planner, and a check that
every answer is exactly (bit for bit) the one the planner of branch ``search`` (issue 35: every
efficient DP degree, rings in order, simpler plans within 2 %) gave; 523cc49's before it,
60137dd's before the simulator's link model, memory in flight and embedding group.

    .venv/bin/python benchmarks/bench_planner_replay_calls.py                 # both traces, check + time
    .venv/bin/python benchmarks/bench_planner_replay_calls.py --trace aws-3d --six --reps 3
    .venv/bin/python benchmarks/bench_planner_replay_calls.py --dump /tmp/answers.json
    .venv/bin/python benchmarks/bench_planner_replay_calls.py record          # re-record (see below)

The requests are the replay's (``run_policies(..., workers=0, plan_cache_path=None)`` on
``derived:aws-3d:1`` with 1e9 tokens and ``derived:gcp-4d:1`` with 5e9, opt-350m; read from the
suite's ``planner_call_log``), with the replay's knobs: throughput, spot, top 3, 200 evaluations.
They are answered in their recorded order in one process, as the replay does: the planner's
process-level memos warm up across requests.  ``--six``: only the requests of two GPU types in
six pools (aws-3d).  Times are process CPU seconds of the requests alone (the profiles are loaded
by one request first); the shared machine is noisy, so each repetition runs in a fresh process
and the minimum is reported, with the sum over requests of each one's least time over the
repetitions (less sensitive to bursts of load from other jobs).

``record`` replays both traces and writes their requests, and the SHA-256 of each answer (its
plans, throughput, USD per hour, evaluation count and exhausted flag as JSON), to
``tests/planner/data/replay_calls.json.gz``: answers of the code at hand become the reference,
so only record on a commit whose answers are known to be right (the file holds issue 35's).
``tests/planner/test_replay_calls.py`` replays the first requests of each on every test run.

To time the implementation before the change with the same script, unpack that commit's
``sailor_core`` next to a copy of this file and of the data, and run it there::

    mkdir -p /tmp/before/benchmarks /tmp/before/tests/planner/data
    git archive 60137dd sailor_core | tar -x -C /tmp/before
    cp benchmarks/bench_planner_replay_calls.py /tmp/before/benchmarks/
    cp tests/planner/data/replay_calls.json.gz /tmp/before/tests/planner/data/
    (cd /tmp/before && /work/main/.venv/bin/python benchmarks/bench_planner_replay_calls.py)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "tests" / "planner" / "data" / "replay_calls.json.gz"
TRACES = {"aws-3d": ("derived:aws-3d:1", 1e9), "gcp-4d": ("derived:gcp-4d:1", 5e9)}
MODEL = "opt-350m"


def record_calls(trace_name: str, tokens: float) -> list[list[list]]:
    """The planner requests (availability as [gpu, zone, count] rows) of a cold replay, in order."""
    from sailor_core.replay import run_policies
    from sailor_core.specs.replay import ReplaySpec
    from sailor_core.traces import load_trace

    suite = run_policies(load_trace(trace_name), ReplaySpec(trace=trace_name, model=MODEL, tokens=tokens, workers=0))
    return [[[g, z, n] for (g, z), n in call.available.items()] for call in suite.planner_call_log]


def answer(available: list[list]) -> dict:
    """What the replay takes from ``plan_job`` for one request, as JSON-ready data."""
    from sailor_core.errors import InfeasibleError
    from sailor_core.planner import make_request, plan_job

    req = make_request(model=MODEL, availability={(g, z): n for g, z, n in available}, objective="throughput",
                       global_batch_size=None, max_usd_per_hour=None, min_throughput_samples_per_s=None,
                       top_n=3, spot=True, max_evaluations=200,
                       # the reference answers are the search's without memory levers where a plan
                       # fits (issue 35's); what the default ``pays`` adds is the planner goldens'
                       # and tests/planner/test_levers.py's to check (its answers count more evaluations)
                       memory_levers="when-needed")
    try:
        result = plan_job(req)
    except InfeasibleError as exc:
        return {"infeasible": str(exc)}
    return {"num_evaluated": result.num_evaluated, "exhausted": result.exhausted,
            "cands": [[c.sim.throughput_samples_per_s, c.sim.usd_per_hour, c.plan.to_dict()]
                      for c in result.candidates]}


def digest(ans: dict) -> str:
    return hashlib.sha256(json.dumps(ans, sort_keys=True).encode()).hexdigest()


def load() -> dict:
    with gzip.open(DATA, "rt") as f:
        return json.load(f)


def run_once(name: str, six: bool) -> dict:
    """Answer one trace's requests in this process: CPU seconds and the answers' digests."""
    data = load()[name]
    calls = [c for c in data["calls"] if not six or len(c) == 6]
    answer([["V100-16", "us-east-1a", 8]])  # loads the profiles
    answers, per_call_s = [], []
    for available in calls:
        t0 = time.process_time()
        answers.append(answer(available))
        per_call_s.append(time.process_time() - t0)
    cpu_s = sum(per_call_s)
    expected = [d for c, d in zip(data["calls"], data["answer_sha256"]) if not six or len(c) == 6]
    bad = [i for i, (a, d) in enumerate(zip(answers, expected)) if digest(a) != d]
    return {"cpu_s": cpu_s, "per_call_s": per_call_s, "num_calls": len(calls), "differences": bad,
            "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="time", choices=["time", "record", "one"])
    ap.add_argument("--trace", default="all", choices=["all", *TRACES])
    ap.add_argument("--six", action="store_true", help="aws-3d: only the two-type, six-pool requests")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dump", help="write the answers of the first repetition (JSON) here")
    args = ap.parse_args()
    if args.command == "record":
        out = {}
        for name, (trace_name, tokens) in TRACES.items():
            calls = record_calls(trace_name, tokens)
            out[name] = {"trace": trace_name, "tokens": tokens, "model": MODEL, "calls": calls,
                         "answer_sha256": [digest(answer(c)) for c in calls]}
            print(f"{name}: {len(calls)} requests")
        with gzip.open(DATA, "wt") as f:
            json.dump(out, f)
        return
    if args.command == "one":  # one repetition in this process (run by "time" in a fresh one)
        res = run_once(args.trace, args.six)
        if args.dump:
            Path(args.dump).write_text(json.dumps(res["answers"]))
        print(json.dumps({k: v for k, v in res.items() if k != "answers"}))
        return
    names = list(TRACES) if args.trace == "all" else [args.trace]
    for name in names:
        runs = []
        for rep in range(args.reps):
            cmd = [sys.executable, __file__, "one", "--trace", name] + (["--six"] if args.six else [])
            if args.dump and rep == 0:
                cmd += ["--dump", args.dump]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        times = sorted(r["cpu_s"] for r in runs)
        # Noise comes in bursts: each request's least time over the repetitions, summed.
        least = sum(min(ts) for ts in zip(*(r["per_call_s"] for r in runs)))
        bad = sorted({i for r in runs for i in r["differences"]})
        print(f"{name}{' (six pools)' if args.six else ''}: {runs[0]['num_calls']} requests, CPU s "
              f"min {times[0]:.2f}, all {', '.join(f'{t:.2f}' for t in times)}, sum of per-request "
              f"minima {least:.2f}; answers differing from 60137dd's: {len(bad)}{' ' + str(bad[:20]) if bad else ''}")


if __name__ == "__main__":
    main()
