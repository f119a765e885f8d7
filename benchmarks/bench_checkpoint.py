"""Checkpoint save / restore time vs model size, and resharded restore, with the engine's own code.

  .venv/bin/python benchmarks/bench_checkpoint.py [--sizes small,m40,m120] [--s3]

For each model: one rank holding the whole model (1 stage, TP 1) trains one step (so AdamW
state exists), saves a checkpoint (full per-layer params + AdamW moments, manifest last),
then a fresh rank restores it: (a) the same layout, (b) resharded into another plan, stage 0
at TP 2 (rank 0's shard) and stage 1 at TP 1; ranks restore in parallel, so the resharded
restore time is the slower of the two.  `latest_valid_checkpoint` (which re-reads and
checksums every file) is timed on its own.  With --s3 the mid size is also saved to and
restored from moto's S3 server on localhost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {  # name -> (layers, hidden, vocab); tiny and small come from the catalog
    "m40": (8, 512, 16384),
    "m120": (12, 768, 32000),
}


def _spec(name: str):
    from sailor_core.catalog.models import ModelSpec, get_model, register_model

    if name not in SIZES:
        return get_model(name)
    layers, hidden, vocab = SIZES[name]
    spec = ModelSpec(name=f"bench-{name}", family="opt", num_layers=layers, hidden_size=hidden,
                     ffn_size=4 * hidden, num_heads=hidden // 64, num_kv_heads=hidden // 64,
                     vocab_size=vocab, seq_len=64, max_position_embeddings=64)
    register_model(spec)
    return spec


def _trainer(spec, stages, rank: int, data_path: Path):
    import torch

    from sailor_core.plan.types import plan_from_dict
    from sailor_core.runtime.data import TokenDataset
    from sailor_core.runtime.process_groups import Groups
    from sailor_core.runtime.recipe import Recipe
    from sailor_core.runtime.trainer import StageTrainer

    plan = plan_from_dict({"model": spec.name, "global_batch_size": 2, "micro_batch_size": 2,
                           "stages": [{"layers": [a, b], "replicas": [{"gpu": "cpu", "tp": t}]}
                                      for a, b, t in stages]})
    data = TokenDataset(data_path, plan.effective_seq_len(), spec.vocab_size)
    # Restores touch no process group; TP slicing only needs the rank and degree.
    return StageTrainer(plan=plan, spec=spec, rank=rank, data=data, recipe=Recipe(total_steps=1), seed=0,
                        device=torch.device("cpu"),
                        groups=Groups(tp=None, dp=None, dp_mixed_tp=False, fwd=None, bwd=None))


def bench(name: str, url: str, work: Path) -> dict:
    from sailor_core.runtime import checkpoint as ckpt
    from sailor_core.runtime.data import generate_corpus
    from sailor_core.runtime.stage_checkpoint import checkpoint_meta, load, save_layers
    from sailor_core.storage import open_storage

    spec = _spec(name)
    n = spec.num_layer_indices
    data = generate_corpus(work / f"c{spec.vocab_size}.npy", vocab_size=spec.vocab_size,
                           num_tokens=20_000)
    src = _trainer(spec, [(0, n, 1)], 0, data)
    src.train_step()
    num_params = sum(p.numel() for p in src.model.parameters())
    storage = open_storage(url)
    t0 = time.perf_counter()
    files = save_layers(src, storage)
    ckpt.commit(storage, src.step, files, checkpoint_meta(src), keep=1)
    save_s = time.perf_counter() - t0
    total_bytes = sum(f["bytes"] for f in files.values())
    del src

    t0 = time.perf_counter()
    info = ckpt.latest_valid_checkpoint(url)
    find_s = time.perf_counter() - t0
    same = _trainer(spec, [(0, n, 1)], 0, data)
    t0 = time.perf_counter()
    load(same, storage, info)
    restore_s = time.perf_counter() - t0
    del same

    split = n // 2
    reshard = []
    for rank in (0, 2):  # stage 0 TP rank 0 (of 2), stage 1
        t = _trainer(spec, [(0, split, 2), (split, n, 1)], rank, data)
        t0 = time.perf_counter()
        load(t, storage, info)
        reshard.append(time.perf_counter() - t0)
        del t
    return {"model": name, "params": num_params, "checkpoint_bytes": total_bytes, "save_s": save_s,
            "latest_valid_s": find_s, "restore_s": restore_s, "resharded_restore_s": max(reshard),
            "url": url.split(":")[0] if "://" in url else "local"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="small,m40,m120")
    ap.add_argument("--s3", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    rows = [bench(s, str(work / f"ck-{s}"), work) for s in args.sizes.split(",")]
    if args.s3:
        import boto3
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="x",
                          AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3").create_bucket(Bucket="bench-ckpt")
        rows.append(bench("m40", "s3://bench-ckpt/run", work))
        server.stop()
    print(f"{'model':8} {'store':6} {'params':>11} {'bytes':>13} {'save s':>8} {'find s':>8} "
          f"{'restore s':>10} {'reshard s':>10}")
    for r in rows:
        print(f"{r['model']:8} {r['url']:6} {r['params']:11,d} {r['checkpoint_bytes']:13,d} "
              f"{r['save_s']:8.3f} {r['latest_valid_s']:8.3f} {r['restore_s']:10.3f} "
              f"{r['resharded_restore_s']:10.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
