"""One process of test_handover_egress.py: generation 0 trains a DP-2 plan in zones A and B and
checkpoints; generation 1 (the same processes and two new ones, in B and C) resumes through
``handover.resume`` with the engine's egress meter on (``links.meter_zones``), as the worker does.
Beside the meter it records every message the backend was actually given (``torch.distributed.isend``
wrapped: the message still goes), and writes both.

    python tests/runtime/handover_egress_ranks.py INDEX PORT CORPUS CKPT_DIR OUT.json
"""

from __future__ import annotations

import datetime as dt
import json
import sys

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
# per generation: each rank's process and zone (one stage of all 4 layers, TP 1)
GENERATIONS = [
    [(0, A), (1, B)],
    # the two holders keep theirs; process 2 (B) has a holder in its zone, process 3 (C) none
    [(0, A), (1, B), (2, B), (3, C)],
]


def plan_of(zones):
    from sailor_core.plan.types import plan_from_dict

    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2,
                           "stages": [{"layers": [0, 4], "replicas": [{"gpu": "cpu", "tp": 1, "zone": z}
                                                                      for z in zones]}]})


def main(index: int, port: int, corpus: str, ckpt_dir: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from sailor_core.runtime import checkpoint as ckpt
    from sailor_core.runtime import handover, links
    from sailor_core.runtime.checkpoint_writer import save_sync
    from sailor_core.runtime.stage_checkpoint import kept_state
    from sailor_core.storage import open_storage

    from handover_ranks import _trainer  # (run as a script: its folder is on the path)

    torch.set_num_threads(1)
    sent: dict[int, int] = {}  # destination rank -> bytes the backend was given
    real_isend = dist.isend

    def isend(tensor, dst=None, group=None, tag=0, **kw):
        sent[dst] = sent.get(dst, 0) + tensor.numel() * tensor.element_size()
        return real_isend(tensor, dst=dst, group=group, tag=tag, **kw)

    timeout = dt.timedelta(seconds=90)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    storage = open_storage(ckpt_dir)
    kept, result = None, {}
    for g, ranks in enumerate(GENERATIONS):
        procs = [p for p, _ in ranks]
        if index not in procs:
            continue
        rank, zones = procs.index(index), [z for _, z in ranks]
        plan = plan_of(zones)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"gen{g}/", store), rank=rank,
                                world_size=len(procs), timeout=timeout)
        trainer = _trainer(plan, rank, corpus)
        if g > 0:
            links.meter_zones(zones)
            dist.isend = isend
            try:
                state_from = handover.resume(trainer, kept, ckpt.latest_valid_checkpoint(ckpt_dir), storage)
            finally:
                dist.isend = real_isend
            result = {"rank": rank, "zones": zones, "state_from": state_from, "metered": links.take_sent_bytes(),
                      "sent": {str(d): n for d, n in sent.items()}}
        else:
            trainer.train_step()
            save_sync(trainer, storage, keep=2, rank=rank)
            kept = kept_state(trainer)
        del trainer
        dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
