"""The memory model under each lever against the engine's measured peaks (issue 34).

    .venv/bin/python benchmarks/bench_levers_memory_model.py

Simulates the plans of the engine's ``benchmarks/bench_zero_memory.py`` (``small``, micro-batch
2, stage 0 of 2 holding layers [0, 4) with K micro-batches in flight; ZeRO over stage 0's two
replicas) and prints stage 0 replica 0's modelled allocated bytes against the engine's peaks
measured on the zeroengine branch at 063a2f4 (docs/benchmarks/engine.md there, copied below).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sailor_core.plan.types import plan_from_dict  # noqa: E402
from sailor_core.simulator import simulate  # noqa: E402
MODEL, SPLIT, MBS = "small", 4, 2
rep = {"gpu": "cpu", "tp": 1}
eng_rc = {1: (64.13, 64.13, 64.13), 2: (77.05, 77.01, 64.13), 3: (86.79, 86.72, 64.13), 4: (96.53, 96.43, 64.68),
          5: (106.27, 106.15, 65.73), 6: (116.01, 115.86, 66.78), 7: (125.75, 125.57, 67.83), 8: (135.48, 135.29, 68.88)}
print("| K | none model/engine | selective | full |")
for k in range(1, 9):
    num_mb = 1 if k == 1 else 2 * k
    row = []
    for i, rc in enumerate(("none", "selective", "full")):
        plan = plan_from_dict({"model": MODEL, "global_batch_size": num_mb * MBS, "micro_batch_size": MBS,
                               "stages": [{"layers": [0, SPLIT], "replicas": [rep], "recompute": rc},
                                          {"layers": [SPLIT, 8], "replicas": [rep] * max(1, k - 1)}]})
        m = simulate(plan).stages[0].replicas[0].memory
        got = m.allocated_bytes / 1e6
        row.append(f"{got:.2f} / {eng_rc[k][i]:.2f} ({(got / eng_rc[k][i] - 1) * 100:+.1f} %)")
    print(f"| {k} (model K={m.num_inflight}) | " + " | ".join(row) + " |")
eng_z = {2: (90.86, 77.05, 70.15), 3: (100.60, 86.79, 79.89)}
for dp1, k in ((1, 2), (2, 3)):
    row = []
    for z in (0, 1, 2):
        plan = plan_from_dict({"model": MODEL, "global_batch_size": 8 * MBS, "micro_batch_size": MBS,
                               "stages": [{"layers": [0, SPLIT], "replicas": [rep, rep], "zero": z},
                                          {"layers": [SPLIT, 8], "replicas": [rep] * dp1}]})
        m = simulate(plan).stages[0].replicas[0].memory
        got = m.allocated_bytes / 1e6
        row.append(f"{got:.2f} / {eng_z[k][z]:.2f} ({(got / eng_z[k][z] - 1) * 100:+.1f} %)")
    print(f"| ZeRO, K={k} (model K={m.num_inflight}) | " + " | ".join(row) + " |")
