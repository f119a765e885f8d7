#!/usr/bin/env bash
# Session 7 on the lent device machine (16 CPUs, one H200): the replay's cold time with 0 to 15
# worker processes, and the engine's fused AdamW on CUDA (bench_engine_gpu.py). Figures:
# docs/benchmarks/replay.md ("Seventh round") and docs/benchmarks/engine.md ("H200").
#
#   bash benchmarks/device_replay_engine.sh            # writes its log to $OUT (or /tmp)
#
# The device gets the repository only: pydantic travels as wheels in an ignored .whl/ (see
# docs/benchmarks/profiler.md, "H200"); the derived traces are generated, no trace file is needed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
PY=${PY:-python3}
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
  echo "CPUs: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); load $(cut -d' ' -f1-3 /proc/loadavg)"
  R="$PY benchmarks/bench_replay.py --model opt-350m --cold"
  for run in 1 2; do
    for w in 0 2 8; do
      echo "== aws-3d, workers $w, run $run"; $R --trace derived:aws-3d:1 --tokens 1e9 --workers $w
    done
  done
  for w in 4 15; do echo "== aws-3d, workers $w"; $R --trace derived:aws-3d:1 --tokens 1e9 --workers $w; done
  echo "== aws-3d, workers 2, on 2 CPUs (taskset -c 0,1)"
  taskset -c 0,1 $R --trace derived:aws-3d:1 --tokens 1e9 --workers 2
  for w in 0 2 8; do echo "== gcp-4d, workers $w"; $R --trace derived:gcp-4d:1 --tokens 5e9 --workers $w; done
  echo "== engine"
  $PY benchmarks/bench_engine_gpu.py --device cuda --model opt-350m --mbs 1,4 --steps 8
} 2>&1 | tee "$OUT/device_log.txt"
