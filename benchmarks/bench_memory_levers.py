"""Plans with and without the memory levers (ZeRO, activation recomputation) on small-GPU pools.

    .venv/bin/python benchmarks/bench_memory_levers.py [--quick] [--always | --mode MODE]

For each model and pool: the best plan (throughput objective, global batch 256) with the levers
off and with the default (``pays``: the full ladder when nothing fits without them, else ZeRO on
the best plans and a short search on each rung), ``--always`` (every rung searched in full, its
plans competing with the plain ones) or ``--mode`` (e.g. ``when-needed``, the default before
``pays``); its throughput, USD per iteration, the levers its stages keep, and the search time.
Every call starts with the process's kind caches emptied (``kinds._SHARED``: the memos of a
model's kinds, which a fresh ``sailor plan`` starts without), so no call is timed warm on the
searches of the call before it.  Search times are CPU seconds (``time.process_time``): the shared
VM's wall clock counts the other jobs' share.  ``--quick``: two models, three pools.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sailor_core.errors import InfeasibleError  # noqa: E402
from sailor_core.planner import kinds, make_request, plan_job  # noqa: E402
from sailor_core.profiles import default_profile_db  # noqa: E402
from sailor_core.simulator.levers import lever_label  # noqa: E402

A, B = "us-central1-a", "us-central1-b"
MODELS = ("opt-2.7b", "gpt-neo-2.7b", "llama-3.2-3b", "llama-3-8b")
POOLS = {
    "V100-16 x16": {("V100-16", A): 16},
    "T4 x16": {("T4", A): 16},
    "L4 x16": {("L4", A): 16},
    "A100-40 x8": {("A100-40", A): 8},
    "V100-16 x8 + A100-40 x4": {("V100-16", A): 8, ("A100-40", A): 4},
    "T4 x8 + L4 x8": {("T4", A): 8, ("L4", A): 8},
    "V100-16 x8 in each of 2 zones": {("V100-16", A): 8, ("V100-16", B): 8},
    "T4 x16 in each of 2 zones": {("T4", A): 16, ("T4", B): 16},
}


def _best(model: str, pool: dict, levers: str, profiles) -> tuple[str, float]:
    req = make_request(model=model, availability=pool, global_batch_size=256, top_n=1, memory_levers=levers)
    kinds._SHARED.clear()
    t0 = time.process_time()
    try:
        result = plan_job(req, profiles=profiles)
    except InfeasibleError:
        return "no plan", time.process_time() - t0
    elapsed = time.process_time() - t0
    cand = result.candidates[0]
    stages = {lever_label(s.recompute, s.zero_stage) for s in cand.plan.stages} - {"none"}
    text = (f"{cand.throughput_samples_per_s:.3f} samples/s, {cand.usd_per_iteration:.4f} USD/it, "
            f"{cand.plan.num_gpus} GPUs PP{cand.plan.pp_degree}"
            + (f" [{'; '.join(sorted(stages))}]" if stages else ""))
    return text, elapsed


def main() -> None:
    quick = "--quick" in sys.argv
    mode = "always" if "--always" in sys.argv else "pays"
    if "--mode" in sys.argv:
        mode = sys.argv[sys.argv.index("--mode") + 1]
    profiles = default_profile_db()
    models = MODELS[::3] if quick else MODELS
    pools = dict(list(POOLS.items())[:3]) if quick else POOLS
    print(f"| model | pool | levers off | levers {mode} | search CPU s (off / {mode}) |")
    print("|---|---|---|---|---|")
    for model in models:
        for name, pool in pools.items():
            off, t_off = _best(model, pool, "off", profiles)
            on, t_on = _best(model, pool, mode, profiles)
            print(f"| {model} | {name} | {off} | {on} | {t_off:.2f} / {t_on:.2f} |", flush=True)


if __name__ == "__main__":
    main()
