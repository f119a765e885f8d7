"""Simulator accuracy against real H200 training runs (data/measurements).

Each full-depth record becomes a one-stage, one-replica plan with 4 micro-batches of the
record's size (global batch = 4 x mbs), the way the record was taken (gradient accumulation
over 4 micro-batches, then one AdamW step).  Predicted vs measured:

* iteration time: ``SimResult.iteration_time_s`` vs ``iteration_ms`` (median);
* peak memory: the model's allocator-visible peak (everything but the regime's constant
  CUDA-context overhead, which torch's ``peak_alloc_bytes`` counter cannot see) vs
  ``peak_alloc_bytes``.

A second, held-out prediction uses a profile database *without* the H200 records (Sailor's
GPUs only): the H200 is then estimated by the analytic model (time calibrated on other GPUs,
activations from ``sailor_core.catalog.layers``), which shows what the same memory model
says from first principles alone.

Records whose min-max spread exceeds 10 % of the median (in ``iteration_ms`` or
``fwd_bwd_ms``) are launch-bound and noisy: they are printed but left out of the summary.

    .venv/bin/python benchmarks/bench_simulator_accuracy.py [--json] [PATH.jsonl]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sailor_core.source_data import MEASUREMENTS_FILE as DEFAULT  # noqa: E402
SPREAD_LIMIT = 0.10
NUM_MICROBATCHES = 4


def spread(triple: list[float]) -> float:
    median, lo, hi = triple
    return (hi - lo) / median


def evaluate(path: Path) -> dict:
    """Rows (one per full-depth record) and the summary; see the module docstring."""
    from sailor_core.catalog.models import get_model
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.profiles import ProfileDB, default_profile_db
    from sailor_core.simulator import simulate

    db = default_profile_db()
    held_out = ProfileDB(p for p in db.profiles() if p.gpu != "H200")
    rows = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "model" not in rec or rec["layers"] != get_model(rec["model"]).num_layers:
            continue
        mbs = rec["mbs"]
        n = get_model(rec["model"]).num_layer_indices
        plan = plan_from_dict({
            "model": rec["model"], "global_batch_size": NUM_MICROBATCHES * mbs, "micro_batch_size": mbs,
            "seq_len": rec["seq"], "regime": "torch-bf16-autocast-adamw",
            "stages": [{"layers": [0, n], "replicas": [{"gpu": "H200", "tp": 1, "zone": "local"}]}],
        })
        r = simulate(plan, profiles=db)
        mem = r.stages[0].replicas[0].memory
        h = simulate(plan, profiles=held_out)
        h_mem = h.stages[0].replicas[0].memory
        measured_s = rec["iteration_ms"][0] / 1e3
        noisy = max(spread(rec["iteration_ms"]), spread(rec["fwd_bwd_ms"])) > SPREAD_LIMIT
        rows.append({
            "model": rec["model"], "mbs": mbs,
            "measured_iteration_s": measured_s, "predicted_iteration_s": r.iteration_time_s,
            "time_error": r.iteration_time_s / measured_s - 1,
            "measured_peak_alloc_bytes": rec["peak_alloc_bytes"], "predicted_peak_alloc_bytes": mem.allocated_bytes,
            "memory_error": mem.allocated_bytes / rec["peak_alloc_bytes"] - 1,
            "held_out_time_error": h.iteration_time_s / measured_s - 1,
            "held_out_memory_error": h_mem.allocated_bytes / rec["peak_alloc_bytes"] - 1,
            "spread": max(spread(rec["iteration_ms"]), spread(rec["fwd_bwd_ms"])),
            "left_out": noisy,
            "profile_source": r.stages[0].replicas[0].profile_source,
        })
    kept = [row for row in rows if not row["left_out"]]
    summary = {
        "records": len(rows),
        "kept": len(kept),
        "left_out": [f"{row['model']} mbs {row['mbs']} (spread {row['spread']:.0%})" for row in rows if row["left_out"]],
    }
    for key in ("time_error", "memory_error", "held_out_time_error", "held_out_memory_error"):
        errs = [abs(row[key]) for row in kept]
        summary[f"{key}_median"] = statistics.median(errs)
        summary[f"{key}_max"] = max(errs)
        all_errs = [abs(row[key]) for row in rows]
        summary[f"{key}_median_all"] = statistics.median(all_errs)
        summary[f"{key}_max_all"] = max(all_errs)
    return {"rows": rows, "summary": summary}


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    paths = [a for a in argv if not a.startswith("--")]
    result = evaluate(Path(paths[0]) if paths else DEFAULT)
    rows, summary = result["rows"], result["summary"]
    if as_json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'model':10} {'mbs':>3} {'meas ms':>9} {'pred ms':>9} {'err':>7}   {'meas GB':>8} {'pred GB':>8} {'err':>7}"
          f"  spread   held-out: {'time':>7} {'memory':>7}")
    for row in rows:
        mark = "  (left out)" if row["left_out"] else ""
        print(f"{row['model']:10} {row['mbs']:>3} {row['measured_iteration_s'] * 1e3:9.1f} "
              f"{row['predicted_iteration_s'] * 1e3:9.1f} {row['time_error']:+7.2%}   "
              f"{row['measured_peak_alloc_bytes'] / 1e9:8.2f} {row['predicted_peak_alloc_bytes'] / 1e9:8.2f} "
              f"{row['memory_error']:+7.2%}  {row['spread']:>5.0%}             {row['held_out_time_error']:+7.2%} "
              f"{row['held_out_memory_error']:+7.2%}{mark}")
    print(f"\nkept {summary['kept']} of {summary['records']} records; left out: {', '.join(summary['left_out']) or 'none'}")
    print(f"iteration time: median |error| {summary['time_error_median']:.2%}, max {summary['time_error_max']:.2%} "
          f"(all records: median {summary['time_error_median_all']:.2%}, max {summary['time_error_max_all']:.2%})")
    print(f"peak memory:    median |error| {summary['memory_error_median']:.2%}, max {summary['memory_error_max']:.2%} "
          f"(all records: median {summary['memory_error_median_all']:.2%}, max {summary['memory_error_max_all']:.2%})")
    print(f"held out (no H200 profile; analytic estimate): time median {summary['held_out_time_error_median']:.2%}, "
          f"max {summary['held_out_time_error_max']:.2%}; memory median {summary['held_out_memory_error_median']:.2%}, "
          f"max {summary['held_out_memory_error_max']:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
