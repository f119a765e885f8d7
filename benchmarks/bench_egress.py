"""Egress metered and budgeted (issue 36): a job on the embedded cloud whose plan spans two zones.

Runs `train_job` (tiny model) on a forced plan of 2 data-parallel replicas, one T4 in each of two
zones, with a budget it cannot finish within, against a local Prefect server.  The embedded
cloud's instances are local processes: the bytes their DP ring sends across the zones are real,
and the flow prices them at the network model's egress prices.  Prints what the ledger charged
(GPU rent and egress apart, egress per zone pair), what the simulator predicts for the steps
trained, whether the job stopped within its budget, and what a ledger of rent only would have
let it spend.

    .venv/bin/python benchmarks/bench_egress.py [--budget 0.015] [--zones us-central1-a,us-central1-b] [--gbs 64]
        [--samples-per-s 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time


def force_two_zone_plan(zones: tuple[str, str], gbs: int, mbs: int, given: list,
                        samples_per_s: float | None) -> None:
    """The flow's planner answers 1 stage x DP 2, one T4 replica in each of ``zones`` (priced and
    placed by the flow's own planner, its egress simulated: ``Planner.option``), at
    ``samples_per_s`` (None: the simulator's throughput for T4s, about 20 times what the embedded
    cloud's CPU processes train at: the controller's egress per hour is then that much too high
    until the job's first steps are measured, and a small budget stops it before they are)."""
    from sailor_core.catalog.models import get_model
    from sailor_core.controller.options import CachedPlanner
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.simulator.simulate import simulate
    from tasks import control

    real = control.job_planner

    def job_planner(spec, offers):
        planner = real(spec, offers)
        last = get_model(spec.model).num_layer_indices

        def two_zones(available):
            if any(available.get(("T4", z), 0) < 1 for z in zones):
                return []
            plan = plan_from_dict({"model": spec.model, "global_batch_size": gbs, "micro_batch_size": mbs,
                                   "stages": [{"layers": [0, last], "replicas": [
                                       {"gpu": "T4", "tp": 1, "zone": z} for z in zones]}]})
            given.append(plan)
            return [planner.option(plan, samples_per_s or simulate(plan).throughput_samples_per_s)]

        return dataclasses.replace(planner, cached=CachedPlanner(plan_fn=two_zones), cheap=None)

    control.job_planner = job_planner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=0.015)
    ap.add_argument("--zones", default="us-central1-a,us-central1-b")
    ap.add_argument("--gbs", type=int, default=64)
    ap.add_argument("--mbs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--samples-per-s", type=float, default=200.0,
                    help="the forced plan's throughput as the controller sees it (0: the simulator's)")
    args = ap.parse_args()
    zones = tuple(args.zones.split(","))
    os.environ.setdefault("SAILOR_HOME", tempfile.mkdtemp(prefix="sailor-bench-"))
    from flows.cli.prefect_server import configure_prefect_env, start_local_server, stop_local_server

    api = start_local_server(port=0)
    os.environ["PREFECT_API_URL"] = api
    configure_prefect_env()
    given: list = []
    force_two_zone_plan(zones, args.gbs, args.mbs, given, args.samples_per_s or None)
    try:
        from flows.train_job import train_job
        from sailor_core.job.state import JobStore

        t0 = time.monotonic()
        summary = train_job(model="tiny", budget_usd=args.budget, steps=args.steps, global_batch_size=args.gbs,
                            validation_fraction=0.0, validate_every_steps=0, cloud="embedded", gpus=("T4",),
                            zones=zones, max_gpus=2, max_gpus_per_zone=1)
        wall = time.monotonic() - t0
        state = JobStore().load(summary["job_id"])
    finally:
        stop_local_server()
    report(state, summary, given, wall)


def report(state, summary, given, wall: float) -> None:
    from sailor_core.simulator.simulate import simulate

    ledger, end = state.ledger(), state.updated_unix_s
    rent, egress, spent = ledger.rent_usd(end), ledger.egress_usd(), ledger.spent_usd(end)
    # the checkpoints' egress (the embedded jobs bucket is in us-east-1, these zones are GCP's) is
    # no part of the simulator's per-iteration egress: compared without it
    ckpt = ledger.checkpoint_egress_usd()
    print(f"status {summary['status']} ({state.status_reason}); steps {state.steps_done}; flow wall {wall:.1f} s")
    print(f"spent {spent:.6f} of {state.spec.budget_usd:.6f} USD: GPU rent {rent:.6f} + egress {egress:.6f} "
          f"({100 * egress / spent:.0f} % egress, checkpoints {ckpt:.6f}); within the budget: "
          f"{spent <= state.spec.budget_usd}")
    for (src, dst), (num_bytes, usd) in sorted(ledger.egress_by_pair().items()):
        print(f"  egress {src} -> {dst}: {num_bytes / 1e6:.3f} MB, {usd:.6f} USD")
    sim = simulate(given[-1])
    steps_run = sum(max(0, r.steps_done_before - r.at_step) for r in state.replans[1:]) + state.steps_done
    predicted = sim.egress_usd_per_iteration * steps_run
    if predicted <= 0:
        print(f"no steps trained ({steps_run}): nothing to compare")
        return
    print(f"simulator: {sim.egress_usd_per_iteration:.3e} USD of egress per iteration x {steps_run} iterations = "
          f"{predicted:.6f} USD; ledger (checkpoints apart) / simulator = {(egress - ckpt) / predicted:.4f}")
    # A ledger of rent only (before issue 36) stops when the rent alone reaches the budget: the
    # job would have trained on, its egress unseen, at the egress share of spend measured here.
    if rent > 0:
        print(f"rent only: would stop at {state.spec.budget_usd:.6f} USD of rent, truly spending about "
              f"{state.spec.budget_usd * spent / rent:.6f} USD ({100 * (spent / rent - 1):.0f} % over the budget)")


if __name__ == "__main__":
    main()
