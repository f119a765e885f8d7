"""Per-layer times measured alone (the profiler) against the same layers timed inside one
whole-model forward and backward (CUDA events between layers, no host syncs).

    python3 benchmarks/bench_layer_timing_gpu.py --device cuda --model opt-350m --mbs 1,4

The profiler times each layer alone between two syncs (``measure_layer``); at small sizes the sum
over layers came out 16-36 % above whole-model measurements on an H200 (docs/benchmarks/profiler.md).
This separates where the difference is: each layer's time alone, its time inside a chained pass,
and the whole pass's wall time on the host (launch-bound when the host is the slower side).
Diagnostic only: it changes nothing in the profiler.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def whole_pass_s(spec, mbs: int, seq: int, device, reps: int) -> float:
    """Median wall time of one whole-model forward and backward, from a sync to a sync."""
    import torch

    from sailor_core.profiler.measure import _autocast
    from sailor_core.runtime.model import StageModel

    model = StageModel(spec, 0, spec.num_layer_indices).to(device)
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, spec.vocab_size, (mbs, seq), generator=gen).to(device)
    labels = torch.randint(0, spec.vocab_size, (mbs, seq), generator=gen).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for rep in range(2 + reps):
        sync()
        t0 = time.perf_counter()
        with _autocast(device):
            loss = model(tokens, labels)
        loss.backward()
        sync()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[2:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a check of the script itself (host clocks stand in for CUDA events)")
    ap.add_argument("--model", default="opt-350m")
    ap.add_argument("--mbs", default="1,4")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from sailor_core.catalog.models import get_model
    from sailor_core.profiler.measure import measure_chained, measure_layer
    from sailor_core.profiler.stats import Repetitions

    device = torch.device(args.device)
    spec = get_model(args.model)
    seq = spec.seq_len
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"== {args.model} on {name} (torch {torch.__version__}), seq {seq}")
    for mbs in [int(x) for x in args.mbs.split(",")]:
        alone = [measure_layer(spec, i, micro_batch_size=mbs, seq_len=seq, device=device,
                               repeat=Repetitions(reps=args.reps, update_reps=1)) for i in range(spec.num_layer_indices)]
        fa = [m.fwd.median_s for m in alone]
        ba = [m.bwd.median_s for m in alone]
        chained = measure_chained(spec, micro_batch_size=mbs, seq_len=seq, device=device, reps=args.reps)
        fc = [f.median_s for f, _ in chained]
        bc = [b.median_s for _, b in chained]
        host_s = whole_pass_s(spec, mbs, seq, device, args.reps)
        print(f"mbs {mbs}: alone fwd {sum(fa) * 1e3:7.2f} + bwd {sum(ba) * 1e3:7.2f} = {(sum(fa) + sum(ba)) * 1e3:7.2f} ms"
              f" | chained fwd {sum(fc) * 1e3:7.2f} + bwd {sum(bc) * 1e3:7.2f} = {(sum(fc) + sum(bc)) * 1e3:7.2f} ms"
              f" | whole pass, sync to sync {host_s * 1e3:7.2f} ms", flush=True)
        kinds = {"embedding": [0], "block": list(range(1, spec.num_layer_indices - 1)),
                 "head": [spec.num_layer_indices - 1]}
        for kind, idx in kinds.items():
            print(f"   {kind:9s} (x{len(idx):2d}) alone fwd {statistics.median([fa[i] for i in idx]) * 1e3:6.3f}"
                  f" bwd {statistics.median([ba[i] for i in idx]) * 1e3:6.3f} ms | chained fwd "
                  f"{statistics.median([fc[i] for i in idx]) * 1e3:6.3f} bwd {statistics.median([bc[i] for i in idx]) * 1e3:6.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
