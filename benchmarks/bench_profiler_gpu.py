"""Profile models with Sailor's profiler on this machine's device, compare with data/measurements,
and run one full-model training step with the engine to compare with the simulator's prediction.

Meant for the H200 (``benchmarks/gpu_profile_h200.sh``); it runs on CPU too (``--device cpu
--models tiny``), which is how it was checked on a machine without a GPU.

    .venv/bin/python benchmarks/bench_profiler_gpu.py --device cuda --models opt-350m,opt-1.3b --mbs 1,2,4

For each model and micro-batch size it prints: the profiler's whole-model forward+backward of one
micro-batch (sum over layer indices) and optimizer step, next to the measured ones in
``data/measurements/h200_opt_training.jsonl`` (same dimensions, Hugging Face implementation,
fused AdamW where the engine uses AdamW(foreach=False)); then one training step of a 1-stage,
1-replica plan (global batch = 4 micro-batches, as the measurements' ``iteration_ms``) run by
``launch_local`` next to ``simulate`` of that plan with the new profile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sailor_core.source_data import MEASUREMENTS_FILE as MEASUREMENTS  # noqa: E402


def measured_rows(model: str, path: Path = MEASUREMENTS) -> dict[int, dict]:
    """Full-depth rows of the H200 measurements for ``model``, by micro-batch size."""
    if not path.exists():
        return {}
    from sailor_core.catalog.models import get_model

    full = get_model(model).num_layers
    rows = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("model") == model and r.get("layers") == full:
            rows[int(r["mbs"])] = r
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--models", default="opt-350m,opt-1.3b")
    ap.add_argument("--mbs", default="1,2,4")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="engine steps (the first is a warm-up)")
    ap.add_argument("--step-mbs", default="1", help="micro-batch sizes of the engine steps, comma-separated")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--measurements", default=str(MEASUREMENTS),
                    help="the H200 measurements JSONL (default: data/measurements/...)")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sailor-profile-gpu-"))
    os.environ["SAILOR_HOME"] = str(workdir / "sailor_home")

    from sailor_core.plan.types import plan_from_dict
    from sailor_core.profiler.compute import Hardware, profile_model, save_profiles
    from sailor_core.profiler.stats import Repetitions
    from sailor_core.profiles import ProfileDB
    from sailor_core.runtime.launch import launch_local
    from sailor_core.simulator import simulate

    mbs_list = [int(x) for x in args.mbs.split(",")]
    report: dict = {"device": args.device, "models": {}}
    for model in args.models.split(","):
        run = profile_model(model, micro_batch_sizes=mbs_list, tp_degrees=[1], hardware=Hardware(device=args.device),
                            repeat=Repetitions(reps=args.reps), measure_overhead=True)
        save_profiles(run.profiles)
        meas = measured_rows(model, Path(args.measurements)) if run.profiles[0].gpu == "H200" else {}
        entry = {"device_name": run.device_name, "profile_wall_s": run.wall_s, "overhead_bytes": run.overhead_bytes,
                 "by_mbs": {}}
        print(f"== {model} on {run.device_name} (torch {run.torch_version}); profiling took {run.wall_s:.0f} s; "
              f"constant memory per process {run.overhead_bytes / 1e9:.2f} GB")
        for p in run.profiles:
            fb = p.fwd_bwd_s()
            upd = p.update_s(p.params())
            act = sum(layer.activation_bytes for layer in p.layers)
            row = {"fwd_bwd_s": fb, "update_s": upd, "activation_bytes": act, "params": p.params()}
            m = meas.get(p.micro_batch_size)
            line = f"mbs {p.micro_batch_size}: fwd+bwd {fb * 1e3:8.2f} ms, AdamW {upd * 1e3:7.2f} ms, " \
                   f"activations {act / 1e9:6.2f} GB"
            if m:
                mfb, mopt = m["fwd_bwd_ms"][0] / 1e3, m["optim_step_ms"][0] / 1e3
                mact = m["peak_alloc_bytes"] - m["static_bytes"]
                row.update(measured_fwd_bwd_s=mfb, measured_optim_s=mopt, measured_activation_bytes=mact)
                line += f" | measurements: fwd+bwd {mfb * 1e3:8.2f} ms ({fb / mfb - 1:+.0%}), fused AdamW " \
                        f"{mopt * 1e3:7.2f} ms, peak - static {mact / 1e9:6.2f} GB"
            print(line)
            entry["by_mbs"][p.micro_batch_size] = row

        # one full-model training step with the engine vs the simulator with this profile
        gpu = run.profiles[0].gpu
        entry["engine"] = {}
        for step_mbs in [int(x) for x in args.step_mbs.split(",")]:
            plan = plan_from_dict({"model": model, "global_batch_size": 4 * step_mbs,
                                   "micro_batch_size": step_mbs,
                                   "stages": [{"layers": [0, run.profiles[0].num_layer_indices],
                                               "replicas": [{"gpu": gpu, "tp": 1, "zone": "local"}]}]})
            prof = next((p for p in run.profiles if p.micro_batch_size == step_mbs), None)
            if prof is None:
                print(f"(no profile at mbs {step_mbs}; engine step skipped)")
                continue
            sim = simulate(plan, profiles=ProfileDB([prof]))
            res = launch_local(plan, args.steps, workdir=workdir / f"engine-{model}-{step_mbs}", timeout_s=900)
            if res.status != "ok":
                print(f"engine run failed: {res.status} {res.message}")
                entry["engine"][step_mbs] = {"status": res.status, "message": res.message}
            else:
                steady = res.step_times_s[1:] or res.step_times_s
                med = statistics.median(steady)
                mem = sim.stages[0].replicas[0].memory
                print(f"one step, gbs {plan.global_batch_size} (4 x mbs {step_mbs}): engine {med * 1e3:.1f} ms "
                      f"(steps {', '.join(f'{t * 1e3:.1f}' for t in res.step_times_s)}), simulator "
                      f"{sim.iteration_time_s * 1e3:.1f} ms ({sim.iteration_time_s / med - 1:+.0%}); predicted peak "
                      f"memory {mem.peak_bytes / 1e9:.2f} GB"
                      + (f", of which allocated {mem.allocated_bytes / 1e9:.2f} GB; engine's peak allocated "
                         f"{res.peak_memory_bytes / 1e9:.2f} GB ({mem.allocated_bytes / res.peak_memory_bytes - 1:+.1%})"
                         if res.peak_memory_bytes else ""))
                m = meas.get(step_mbs)
                if m:
                    print(f"measurements' iteration_ms (HF OPT, acc 4): {m['iteration_ms'][0]:.1f} ms, "
                          f"peak allocated {m['peak_alloc_bytes'] / 1e9:.2f} GB")
                entry["engine"][step_mbs] = {"status": "ok", "step_times_s": res.step_times_s, "median_s": med,
                                             "simulated_s": sim.iteration_time_s, "predicted_peak_bytes": mem.peak_bytes,
                                             "predicted_allocated_bytes": mem.allocated_bytes,
                                             "peak_memory_bytes": res.peak_memory_bytes}
        report["models"][model] = entry
        if args.json_out:  # after each model, so a run cut short keeps what it measured
            Path(args.json_out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
