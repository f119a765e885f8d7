"""A standby worker: started by the agent at an instance's boot, ready before any assignment.

``python -m sailor_core.runtime.worker --standby --park-dir DIR`` imports the engine (the worker
module does, and torch's compiler, which the first optimizer would import otherwise), creates the CUDA context of its GPU (``LOCAL_RANK``) and parks without state
(``park.STANDBY_RANK``); the instance's first generation is then handed to it as a later one is
to a survivor (``runtime/park.py``), and the interpreter, the imports and the device context are
paid while the instance waits for work rather than after its assignment.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch._dynamo  # noqa: F401 - imported by the first optimizer (torch/_compile.py): 2-4 s, paid at boot

from sailor_core.runtime import park

FLAG = "--standby"


def ready(argv: list[str]) -> str:
    """Make this process a parked standby worker; its park directory (where the handover comes)."""
    ap = argparse.ArgumentParser(prog=f"python -m sailor_core.runtime.worker {FLAG}")
    ap.add_argument(FLAG, action="store_true")
    ap.add_argument("--park-dir", required=True)
    park_dir = ap.parse_args(argv).park_dir
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device_context(local_rank)
    park.write_parked(park_dir, park.Parked(pid=os.getpid(), rank=park.STANDBY_RANK, local_rank=local_rank, step=-1))
    return park_dir


def device_context(local_rank: int) -> None:
    """Create the CUDA context of this worker's GPU now rather than in its first generation (the
    second or so it takes is then spent while the instance waits for work); none without a GPU."""
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
        torch.empty(1, device="cuda")
