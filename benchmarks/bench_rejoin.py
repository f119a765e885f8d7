"""What parked workers save on a preemption: the surviving instance's ranks rejoin in place
instead of starting new processes (``sailor_core/runtime/park.py``).

Two real agents on this machine (as on two instances), a 2-stage plan with stage 1 on both
(ranks 0, 1 on ``i-a``, rank 2 on ``i-b``); once it trains, ``i-b`` is preempted (SIGTERM to its
process group, as the embedded cloud does), every rank checkpoints the same step, and ``i-a``
is given the job again on its two ranks: with parking its workers keep their processes and,
the shards being the same, their state; with the stage boundary moved they keep their
processes and read the checkpoint; with ``--no-park`` new processes start and read it.  And an
instance's first assignment (a new instance, a fresh job on its two ranks), given once its agent
is up: to its standby workers (``--standby 2``, started at boot, parked) or to new processes
(``--standby 0``).  Printed
per mode: rank 0's ``ready_s`` (from the agent's handover or start to the rank being ready to
train: process start, imports, rendezvous, model build, state), and the wall time from the new
assignment to its first step, median over ``--runs``.

    .venv/bin/python benchmarks/bench_rejoin.py [--model tiny] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sailor_core import settings  # noqa: E402
from sailor_core.catalog.models import get_model  # noqa: E402
from sailor_core.job.protocol import AgentAction, AgentAssignment, read_status, write_assignment  # noqa: E402
from sailor_core.plan.types import plan_from_dict  # noqa: E402
from sailor_core.ports import free_port  # noqa: E402


def _plan(model: str, replicas: int, *, moved: bool = False) -> dict:
    n = get_model(model).num_layer_indices
    cut = n // 2 + (1 if moved else 0)
    return plan_from_dict({"model": model, "global_batch_size": 8, "micro_batch_size": 2, "stages": [
        {"layers": [0, cut], "replicas": [{"gpu": "cpu"}]},
        {"layers": [cut, n], "replicas": [{"gpu": "cpu"}] * replicas}]}).to_dict()


def _wait(job_url: str, iid: str, pred, timeout_s: float = 300.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = read_status(job_url, iid)
        if st is not None and pred(st):
            return st
        time.sleep(0.02)
    raise SystemExit(f"error: {iid} never reached the expected state; last: {read_status(job_url, iid)}")


def one_run(model: str, corpus: str, park: bool, work: Path, *, moved: bool = False) -> dict:
    job_url, ckpt, port = str(work / "job"), str(work / "ckpt"), free_port()
    extra = () if park else ("--no-park",)
    agents = {iid: subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                                     "--instance-id", iid, "--work-dir", str(work / iid), *extra],
                                    env={**os.environ, settings.NOTICE_S_ENV: "30"}, start_new_session=True)
              for iid in ("i-a", "i-b")}
    common = dict(master_addr="127.0.0.1", master_port=port, data=corpus, ckpt_url=ckpt, ckpt_every=0,
                  extra_worker_args=("--threads", "1", "--validate-every", "0"))
    try:
        wide = _plan(model, 2)
        write_assignment(job_url, "i-a", AgentAssignment(generation=1, action=AgentAction.RUN, plan=wide,
                                                         ranks=(0, 1), world_size=3, steps=10_000, **common))
        write_assignment(job_url, "i-b", AgentAssignment(generation=1, action=AgentAction.RUN, plan=wide,
                                                         ranks=(2,), world_size=3, steps=10_000, **common))
        _wait(job_url, "i-a", lambda st: st.step is not None and st.step >= 3)
        os.killpg(agents["i-b"].pid, signal.SIGTERM)
        stopped = _wait(job_url, "i-a", lambda st: len(st.exit_codes) == 2)
        write_assignment(job_url, "i-a", AgentAssignment(generation=2, action=AgentAction.STOP))
        _wait(job_url, "i-a", lambda st: st.generation == 2)
        t0 = time.monotonic()
        write_assignment(job_url, "i-a", AgentAssignment(
            generation=3, action=AgentAction.RUN, plan=_plan(model, 1, moved=moved), ranks=(0, 1), world_size=2,
            steps=stopped.step + 3, resume=True, **common))
        first = _wait(job_url, "i-a", lambda st: st.generation == 3 and st.step is not None)
        to_first_step_s = time.monotonic() - t0
        lines = (Path(first.log_dir) / "metrics.jsonl").read_text().splitlines()
        started = next(json.loads(line) for line in lines if '"started"' in line)
        return {"ready_s": started["ready_s"], "state_from": started["state_from"],
                "to_first_step_s": to_first_step_s, "same_processes": first.pids == stopped.pids}
    finally:
        for p in agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def first_assignment(model: str, corpus: str, standby: int, work: Path) -> dict:
    """A new instance's first generation, assigned once its agent is up (and its standby workers,
    if any, parked): rank 0's ready_s and the wall time from the assignment to the first step."""
    job_url, port = str(work / "job"), free_port()
    agent = subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                              "--instance-id", "i-new", "--work-dir", str(work / "i-new"), "--standby", str(standby)],
                             env={**os.environ, settings.NOTICE_S_ENV: "30"}, start_new_session=True)
    try:
        _wait(job_url, "i-new", lambda st: st.generation == -1)
        deadline = time.monotonic() + 300
        while len(list((work / "i-new" / "parked").glob("*.parked.json"))) < standby:
            if time.monotonic() > deadline:
                raise SystemExit("error: the standby workers never parked")
            time.sleep(0.02)
        t0 = time.monotonic()
        write_assignment(job_url, "i-new", AgentAssignment(
            generation=1, action=AgentAction.RUN, plan=_plan(model, 1), ranks=(0, 1), world_size=2, steps=3,
            master_addr="127.0.0.1", master_port=port, data=corpus, ckpt_url=str(work / "ckpt"), ckpt_every=0,
            extra_worker_args=("--threads", "1", "--validate-every", "0")))
        first = _wait(job_url, "i-new", lambda st: st.generation == 1 and st.step is not None)
        to_first_step_s = time.monotonic() - t0
        lines = (Path(first.log_dir) / "metrics.jsonl").read_text().splitlines()
        started = next(json.loads(line) for line in lines if '"started"' in line)
        return {"ready_s": started["ready_s"], "state_from": started["state_from"],
                "to_first_step_s": to_first_step_s, "same_processes": len(first.rejoined) == 2}
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from sailor_core.runtime.data import generate_corpus  # lazy: torch-free import of the module above

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rejoin-") as tmp:
        corpus = str(generate_corpus(Path(tmp) / "corpus.npy", vocab_size=get_model(args.model).vocab_size,
                                     num_tokens=200_000, seed=1))
        work = Path(tmp)
        modes = {
            "parked workers": lambda i: one_run(args.model, corpus, True, work / f"park{i}"),
            "parked, stage boundary moved": lambda i: one_run(args.model, corpus, True, work / f"moved{i}", moved=True),
            "new processes (--no-park)": lambda i: one_run(args.model, corpus, False, work / f"nopark{i}"),
            "1st assignment: standby": lambda i: first_assignment(args.model, corpus, 2, work / f"standby{i}"),
            "1st assignment: new procs": lambda i: first_assignment(args.model, corpus, 0, work / f"fresh{i}"),
        }
        for mode, one in modes.items():
            runs = [one(i) for i in range(args.runs)]
            rows.append({"mode": mode,
                         "state_from": sorted({r["state_from"] for r in runs}),
                         "same_processes": all(r["same_processes"] for r in runs),
                         "ready_s": statistics.median(r["ready_s"] for r in runs),
                         "to_first_step_s": statistics.median(r["to_first_step_s"] for r in runs)})
    if args.json:
        print(json.dumps({"model": args.model, "runs": args.runs, "rows": rows}, indent=2))
        return 0
    print(f"model {args.model}, median of {args.runs} runs, 2 ranks rejoining after a preemption "
          f"(same pids: handed over), or starting a new instance's first generation")
    print(f"{'mode':28s} {'state from':12s} {'same pids':9s} {'ready s':>8s} {'to 1st step s':>14s}")
    for r in rows:
        print(f"{r['mode']:28s} {','.join(r['state_from']):12s} {str(r['same_processes']):9s} "
              f"{r['ready_s']:8.2f} {r['to_first_step_s']:14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
