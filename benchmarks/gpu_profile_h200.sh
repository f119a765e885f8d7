#!/usr/bin/env bash
# Profile opt-350m and opt-1.3b with Sailor's profiler on one H200, compare with
# data/measurements, and run one full-model training step with the engine against the
# simulator's prediction from the new profile.  Prints the comparison; writes JSON to $OUT (or /tmp).
#
# Ran on an H200 in session 5 (figures: docs/benchmarks/profiler.md, "H200"): ~3 min for these two models.
#
#   bash benchmarks/gpu_profile_h200.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
"$PY" benchmarks/bench_profiler_gpu.py --device cuda --models opt-350m,opt-1.3b --mbs 1,2,4 --reps 5 \
    --steps 6 --step-mbs 1,4 --workdir "$OUT/sailor-profile-h200" --json-out "$OUT/profile_h200.json"
