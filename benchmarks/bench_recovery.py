"""Recovery figures of the train-job flow on the embedded local cloud.

Runs `train_job` (tiny model) with injected preemptions against a local Prefect
server and prints, per preemption: detection-to-new-plan, new-plan-to-first-step
(provisioning + agent + worker start-up + checkpoint load), work redone (steps
between the resumed checkpoint and the furthest step reached), plus totals.

    .venv/bin/python benchmarks/bench_recovery.py [--steps 40] [--preempt-at 10,25] [--gbs 64]

With survivors (a plan over two instances, of which one is preempted: the survivor trains on an
interim while a new instance boots, whose worker then takes its state from the survivor,
``runtime/handover.py``):

    .venv/bin/python benchmarks/bench_recovery.py --steps 16 --preempt-at 5,11 --gbs 1024 \
        --zones us-central1-a,us-central1-b,us-central1-c --notice-s 10

(a plan over two instances steps slowly on two loaded cores: with the 2 s notice its emergency
checkpoint may not finish, and the survivor then exits as for a lost peer instead of parking)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--preempt-at", default="10,25")
    ap.add_argument("--gbs", type=int, default=64)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--zones", default="", help="comma-separated zones the job may use (default: any)")
    ap.add_argument("--notice-s", type=float, default=2.0,
                    help="the embedded cloud's preemption notice (2 s: its default; a real spot notice is 30-120 s)")
    args = ap.parse_args()
    os.environ.setdefault("SAILOR_HOME", tempfile.mkdtemp(prefix="sailor-bench-"))
    from flows.cli.prefect_server import configure_prefect_env, start_local_server, stop_local_server

    t0 = time.monotonic()
    api = start_local_server(port=0)
    os.environ["PREFECT_API_URL"] = api
    configure_prefect_env()
    print(f"prefect server up in {time.monotonic() - t0:.1f} s ({api})")
    try:
        from flows.train_job import train_job
        from infra.config import in_process_cloud

        cloud = in_process_cloud()  # the flow's own; the notice counts from the next preemption on
        cloud.notice_s = cloud.machines.notice_s = args.notice_s
        from sailor_core.job.state import JobStore

        t1 = time.monotonic()
        summary = train_job(model="tiny", budget_usd=0.05, steps=args.steps, global_batch_size=args.gbs,
                            checkpoint_every_steps=args.checkpoint_every, cloud="embedded", max_gpus=2,
                            max_gpus_per_zone=1,
                            preempt_at_steps=[int(x) for x in args.preempt_at.split(",") if x],
                            **({"gpus": ("T4",), "zones": tuple(args.zones.split(",")),  # batches of 1024
                                "validation_fraction": 0.0, "validate_every_steps": 0} if args.zones else {}))
        wall = time.monotonic() - t1
        state = JobStore().load(summary["job_id"])
    finally:
        stop_local_server()
    print(f"status {summary['status']}, steps {summary['steps']}, final loss {summary['final_loss']:.4f}, "
          f"preemptions {summary['preemptions']}, re-plans {summary['replans']}, "
          f"spent {summary['usd_spent']:.5f} USD, flow wall {wall:.1f} s")
    for rec in state.replans:  # every attempt, interims included: how its workers came back
        plan = rec.plan or {}
        shape = " | ".join(f"{st['layers']}:" + "+".join(f"{r['gpu']}x{r.get('tp', 1)}" for r in st["replicas"])
                           for st in plan.get("stages", []))
        print(f"  attempt {rec.attempt} from step {rec.at_step}: {shape}; ranks {rec.num_ranks}, kept "
              f"{rec.num_ranks_rejoined}, ready {rec.ready_s if rec.ready_s is None else round(rec.ready_s, 2)} s, "
              f"state from {rec.state_from}; "
              f"first step {(rec.first_step_unix_s or float('nan')) - rec.at_unix_s:.1f} s "
              f"after the plan ({rec.reason[:60]})")
    first = state.replans[0]
    print(f"start: plan -> first step {first.first_step_unix_s - first.at_unix_s:.1f} s "
          f"(provision, agent, worker start-up)")
    ended = sorted((i.ended_unix_s for i in state.instances if i.end_reason == "preempted"))
    # each preemption's first attempt after it (an interim's, when survivors train on)
    after = [next(r for r in state.replans if r.at_unix_s >= t) for t in ended]
    for k, (rec, preempted_at) in enumerate(zip(after, ended), 1):
        to_plan = rec.at_unix_s - preempted_at
        to_step = (rec.first_step_unix_s or float("nan")) - rec.at_unix_s
        print(f"preemption {k}: instance gone -> new plan {to_plan:.1f} s, new plan -> first step {to_step:.1f} s, "
              f"resumed from step {rec.at_step}, redone {max(0, rec.steps_done_before - rec.at_step)} steps")
    home = Path(os.environ["SAILOR_HOME"])  # the workers' logs: how many ranks took their state from peers
    said = Counter(m for f in home.rglob("rank*.log") for m in _STATE_SAID if m in f.read_text(errors="replace"))
    print(f"worker logs under {home}: " + ", ".join(f"{n} x state {m}" for m, n in sorted(said.items())))


_STATE_SAID = ("kept in memory", "handed over by its peers", "state read")


if __name__ == "__main__":
    main()
