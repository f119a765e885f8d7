"""One process of test_handover.py: it takes its rank in each generation of GENERATIONS that lists it,
resumes (from 1 on) through ``handover.resume`` and, beside it, loads the same checkpoint from its
files into a second trainer; writes per generation where the state came from and every tensor that
differs, then trains and checkpoints before the next generation.

    python tests/runtime/handover_ranks.py INDEX PORT CORPUS CKPT_DIR OUT.json
"""

from __future__ import annotations

import datetime as dt
import json
import sys

# Per generation: stages (layers, [(gpu, tp)], options), the process of each rank, the processes
# whose state is gone before it (a new instance in their place), where each rank's state must come from.
GENERATIONS = [
    ([((0, 2), [("T4", 1), ("A100-40", 2)], {}), ((2, 4), [("T4", 1)], {})],
     [0, 1, 2, 3], set(), {}),
    # PP 2 -> 1, TP 1/2 -> 2/1, DP; process 1 preempted, process 2's instance replaced
    ([((0, 4), [("A100-40", 2), ("T4", 1)], {})],
     [3, 2, 0], {2}, {0: "peers", 1: "peers", 2: "peers"}),
    # PP 1 -> 2, a TP-2 stage of layer 0 alone; process 1 back on a new instance, process 0's replaced:
    # the state is put together from the TP-2 replica's two halves
    ([((0, 1), [("A100-40", 2)], {}), ((1, 4), [("T4", 1), ("L4", 1)], {})],
     [0, 1, 2, 3], {0, 1}, {0: "peers", 1: "peers", 2: "peers", 3: "peers"}),
    # PP 2 -> 3, ZeRO-1 in the middle; process 0's state gone, so layer 0's TP-2 set is incomplete:
    # the ranks needing it (layer 0 and the tied head's copy) read the checkpoint
    ([((0, 1), [("T4", 1)], {}), ((1, 3), [("T4", 1), ("A100-40", 1)], {"zero": 1}), ((3, 4), [("A100-40", 1)], {})],
     [1, 0, 3, 2], {0}, {0: "checkpoint", 1: "peers", 2: "memory", 3: "checkpoint"}),
]
TOTAL_STEPS = 10


def plan_of(stages):
    from sailor_core.plan.types import plan_from_dict

    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2,
                           "stages": [{"layers": list(layers), "replicas": [{"gpu": g, "tp": t} for g, t in reps],
                                       **opts} for layers, reps, opts in stages]})


def _trainer(plan, rank: int, corpus: str):
    import torch

    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.data import TokenDataset
    from sailor_core.runtime.process_groups import make_groups
    from sailor_core.runtime.recipe import Recipe
    from sailor_core.runtime.trainer import StageTrainer

    spec = get_model(plan.model)
    data = TokenDataset(corpus, plan.effective_seq_len(), spec.vocab_size, validation_fraction=0.0, min_val_samples=0)
    return StageTrainer(plan=plan, spec=spec, rank=rank, data=data, recipe=Recipe(total_steps=TOTAL_STEPS), seed=3,
                        device=torch.device("cpu"), groups=make_groups(plan, rank))


def differences(a, b) -> list[str]:
    """Every parameter, AdamW state and position in which trainers ``a`` and ``b`` differ (bit for bit)."""
    import torch

    from sailor_core.runtime.stage_checkpoint import named_tensors

    out = []
    for (i, name, p), (_, _, q) in zip(named_tensors(a), named_tensors(b), strict=True):
        if not torch.equal(p, q):
            out.append(f"layer {i} {name}")
        if a.optimizer is not None and (p in a.optimizer.state or q in b.optimizer.state):
            out += _state_differences(a.optimizer.state.get(p, {}), b.optimizer.state.get(q, {}), f"layer {i} {name}")
    if a.zero is not None:
        za, zb = list(a.zero.inner.state.values()), list(b.zero.inner.state.values())
        if len(za) != len(zb) or not za:
            out.append(f"ZeRO states {len(za)} vs {len(zb)}")
        for k, (sa, sb) in enumerate(zip(za, zb)):
            out += _state_differences(sa, sb, f"ZeRO piece {k}")
    if (a.step, a.next_sample, a.recipe) != (b.step, b.next_sample, b.recipe):
        out.append(f"position {(a.step, a.next_sample)} vs {(b.step, b.next_sample)}")
    return out


def _state_differences(sa: dict, sb: dict, where: str) -> list[str]:
    import torch

    if sa.keys() != sb.keys() or not sa:
        return [f"{where}: AdamW keys {sorted(sa)} vs {sorted(sb)}"]
    return [f"{where}: {k}" for k in sa if not torch.equal(sa[k], sb[k])]


def main(index: int, port: int, corpus: str, ckpt_dir: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from sailor_core.runtime import checkpoint as ckpt
    from sailor_core.runtime import handover
    from sailor_core.runtime.stage_checkpoint import kept_state, load
    from sailor_core.runtime.worker import _save
    from sailor_core.storage import open_storage

    torch.set_num_threads(1)
    timeout = dt.timedelta(seconds=90)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    storage = open_storage(ckpt_dir)
    kept, results = None, []
    for g, (stages, procs, lost, _) in enumerate(GENERATIONS):
        if index in lost:
            kept = None
        if index not in procs:
            continue
        rank, plan = procs.index(index), plan_of(stages)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"gen{g}/", store), rank=rank,
                                world_size=len(procs), timeout=timeout)
        trainer = _trainer(plan, rank, corpus)
        if g > 0:
            info = ckpt.latest_valid_checkpoint(ckpt_dir)
            state_from = handover.resume(trainer, kept, info, storage)
            reloaded = _trainer(plan, rank, corpus)
            load(reloaded, storage, info)
            results.append({"generation": g, "rank": rank, "state_from": state_from,
                            "differences": differences(trainer, reloaded)})
            del reloaded
        kept = None
        for _ in range(2 if g == 0 else 1):
            trainer.train_step()
        _save(trainer, storage, keep=2, rank=rank)
        kept = kept_state(trainer)
        del trainer
        dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
