"""Training's stall per checkpoint: saved on the training thread (sync) or in the background (async).

  .venv/bin/python benchmarks/bench_checkpoint_stall.py [--size m40] [--steps 12] [--every 3]
                                                        [--rounds 2] [--s3]

One rank holding the whole model (1 stage, TP 1; a one-rank gloo group, so the saves run the
engine's collectives) trains ``--steps`` steps and saves every ``--every`` with the engine's
``CheckpointWriter``, as the worker does: ``save_now`` (sync, as ``--ckpt-sync``) or
``save_async`` (the default); without saves as the yardstick.  Per mode: the training step's
time, the time the training thread spent in each save call (the stall: a sync save's whole
write; an async save's staging copy, plus waiting for the previous write when it was not done),
and the loop's wall time; the async run then waits for its last write (the worker's final and
emergency saves do so too), which is shown apart.  The three modes run interleaved, ``--rounds``
times, from the same initial state, and the last checkpoints of sync and async are compared byte
for byte.  Torch trains on one thread; the writer thread has the machine's other core(s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_checkpoint import _spec  # noqa: E402  (the benchmark models' sizes)


def _trainer(spec, data_path: Path):
    import torch

    from sailor_core.plan.types import plan_from_dict
    from sailor_core.runtime.data import TokenDataset
    from sailor_core.runtime.process_groups import make_groups
    from sailor_core.runtime.recipe import Recipe
    from sailor_core.runtime.trainer import StageTrainer

    plan = plan_from_dict({"model": spec.name, "global_batch_size": 4, "micro_batch_size": 2,
                           "stages": [{"layers": [0, spec.num_layer_indices], "replicas": [{"gpu": "cpu", "tp": 1}]}]})
    data = TokenDataset(data_path, plan.effective_seq_len(), spec.vocab_size, validation_fraction=0.0,
                        min_val_samples=0)
    return StageTrainer(plan=plan, spec=spec, rank=0, data=data, recipe=Recipe(total_steps=1000), seed=0,
                        device=torch.device("cpu"), groups=make_groups(plan, 0))


def run_mode(mode: str, spec, data: Path, url: str, steps: int, every: int) -> dict:
    from sailor_core.runtime.checkpoint_writer import CheckpointWriter
    from sailor_core.storage import open_storage

    trainer = _trainer(spec, data)
    trainer.train_step()  # warm-up, untimed: AdamW's state exists from here on
    writer = CheckpointWriter(open_storage(url), keep=1, rank=0)
    step_s, stall_s = [], []
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        trainer.train_step()
        step_s.append(time.perf_counter() - t)
        if mode != "none" and trainer.step % every == 0:
            t = time.perf_counter()
            (writer.save_now if mode == "sync" else writer.save_async)(trainer)
            stall_s.append(time.perf_counter() - t)
    loop_s = time.perf_counter() - t0
    t = time.perf_counter()
    writer.wait()
    drain_s = time.perf_counter() - t
    committed = writer.committed()
    return {"mode": mode, "step_s": step_s, "stall_s": stall_s, "loop_s": loop_s, "drain_s": drain_s,
            "committed": committed, "url": url, "last_step": trainer.step}


def _same_bytes(a: dict, b: dict) -> bool:
    from sailor_core.runtime import checkpoint as ckpt

    d = ckpt.step_dirname(a["committed"][-1])
    files_a = sorted((Path(a["url"]) / d).iterdir()) if "://" not in a["url"] else None
    if files_a is None:  # S3: through the storage
        from sailor_core.storage import open_storage

        sa, sb = open_storage(a["url"]), open_storage(b["url"])
        info = ckpt.read_checkpoint(sa, d)
        return all(sa.get(f"{d}/{n}") == sb.get(f"{d}/{n}") for n in [*info.files, ckpt.MANIFEST])
    return all(f.read_bytes() == (Path(b["url"]) / d / f.name).read_bytes() for f in files_a)


def _s3_url() -> tuple[str, object]:
    """moto's S3 server in a process of its own: in this one its request handling would take the
    training thread's interpreter lock, which a real object store does not."""
    import subprocess
    import urllib.request

    import boto3

    from sailor_core.ports import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                      AWS_DEFAULT_REGION="us-east-1")
    boto3.client("s3").create_bucket(Bucket="bench-stall")
    return "s3://bench-stall", server


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="m40")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--s3", action="store_true", help="write to moto's S3 server on localhost (its own process)")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    from sailor_core.runtime.data import generate_corpus

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    work = Path(tempfile.mkdtemp(prefix="bench-stall-"))
    base, server = _s3_url() if args.s3 else (str(work), None)
    spec = _spec(args.size)
    data = generate_corpus(work / "corpus.npy", vocab_size=spec.vocab_size, num_tokens=50_000)
    rows = []
    for r in range(args.rounds):
        for mode in ("none", "sync", "async"):
            rows.append({"round": r, **run_mode(mode, spec, data, f"{base}/r{r}-{mode}", args.steps, args.every)})
    state_bytes = 12 * sum(p.numel() for p in _trainer(spec, data).model.parameters())
    by = {(row["round"], row["mode"]): row for row in rows}
    same = all(_same_bytes(by[(r, "sync")], by[(r, "async")]) for r in range(args.rounds))
    print(f"{args.size}: {state_bytes / 1e6:.0f} MB of state (params + 2 AdamW moments), {args.steps} steps, "
          f"a save every {args.every}, {'S3 (moto)' if args.s3 else 'local folder'}; sync == async bytes: {same}")
    print(f"{'round':>5} {'mode':6} {'step s (median)':>15} {'stall s per save (each)':>34} {'loop s':>7} "
          f"{'then wait s':>11}")
    for row in rows:
        stalls = " ".join(f"{s:.2f}" for s in row["stall_s"]) or "-"
        print(f"{row['round']:5d} {row['mode']:6} {statistics.median(row['step_s']):15.3f} {stalls:>34} "
              f"{row['loop_s']:7.2f} {row['drain_s']:11.2f}")
    for mode in ("none", "sync", "async"):
        mine = [row for row in rows if row["mode"] == mode]
        stalls = [s for row in mine for s in row["stall_s"]]
        print(f"{mode:6} over {len(mine)} rounds: step s median {statistics.median(s for row in mine for s in row['step_s']):.3f}"
              + (f", stall per save median {statistics.median(stalls):.2f} s (max {max(stalls):.2f})" if stalls else "")
              + f", loop + final wait median {statistics.median(row['loop_s'] + row['drain_s'] for row in mine):.1f} s")
    print(json.dumps([{k: v for k, v in row.items() if k != "url"} for row in rows]))
    dist.destroy_process_group()
    if server is not None:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
