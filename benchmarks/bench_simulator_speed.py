"""Plan evaluations per second: how fast ``simulate`` answers the planner.

Representative plan: opt-350m, 4 stages x 8 data-parallel replicas (32 GPUs; A100-40 in two
us-central1 zones plus a V100-16 straggler in one stage), micro-batch 2, global batch 1024
(512 micro-batches).  Profiles and network links are warm (cached) as in a planner's search;
the plan is validated once, as the planner validates its candidates by construction.

    .venv/bin/python benchmarks/bench_simulator_speed.py [--seconds S] [--json]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def representative_plan():
    from sailor_core.plan.types import plan_from_dict

    bounds = [(0, 7), (7, 14), (14, 20), (20, 26)]
    stages = []
    for i, (a, b) in enumerate(bounds):
        zone = "us-central1-a" if i < 2 else "us-central1-b"
        reps = [{"gpu": "A100-40", "tp": 1, "zone": zone} for _ in range(8)]
        if i == 1:
            reps[-1] = {"gpu": "V100-16", "tp": 1, "zone": zone}
        stages.append({"layers": [a, b], "replicas": reps})
    return plan_from_dict({"model": "opt-350m", "global_batch_size": 1024, "micro_batch_size": 2, "stages": stages})


def measure(seconds: float) -> dict:
    from sailor_core.network import default_network
    from sailor_core.profiles import default_profile_db
    from sailor_core.simulator import simulate

    plan = representative_plan()
    db, net = default_profile_db(), default_network()
    t0 = time.perf_counter()
    first = simulate(plan, profiles=db, network=net)
    cold_s = time.perf_counter() - t0
    n = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - start) < seconds:
        simulate(plan, profiles=db, network=net, validate=False)
        n += 1
    cpu = time.process_time() - cpu_start
    validated = 0
    start_v = time.perf_counter()
    while (elapsed_v := time.perf_counter() - start_v) < seconds / 2:
        simulate(plan, profiles=db, network=net)
        validated += 1
    return {
        "plan": "opt-350m, 4 stages x 8 replicas, mbs 2, gbs 1024",
        "evaluations_per_s": n / elapsed,
        # the VM is shared: per CPU-second is the steadier figure
        "evaluations_per_cpu_s": n / cpu,
        "evaluations_per_s_with_validation": validated / elapsed_v,
        "first_call_s": cold_s,
        "iteration_time_s": first.iteration_time_s,
    }


def main(argv: list[str]) -> int:
    seconds = float(argv[argv.index("--seconds") + 1]) if "--seconds" in argv else 3.0
    out = measure(seconds)
    if "--json" in argv:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['plan']}: {out['evaluations_per_s']:,.0f} plan evaluations/s wall clock, "
              f"{out['evaluations_per_cpu_s']:,.0f} per CPU-second "
              f"({out['evaluations_per_s_with_validation']:,.0f}/s including validate_plan); "
              f"first call {out['first_call_s'] * 1e3:.1f} ms (profiles, network and tables cold)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
