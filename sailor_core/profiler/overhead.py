"""The framework's constant memory per worker process: what a worker holds before any model.

CPU: the resident set (VmRSS) of a worker that imported what the engine's worker imports, set its
threads, initialised gloo with a peer and trained two steps of ``tiny`` (so the kernels' code,
oneDNN/BLAS buffers and gloo's buffers are in memory as they are in a real worker), minus tiny's
own weights, gradients and AdamW state; the larger of the two ranks.  Just after gloo's
initialisation a worker holds ~0.1 GB less: that part only appears once it computes.  CUDA: device
memory in use that torch's allocator does not account for (CUDA context, cuBLAS/NCCL
workspaces) after one matmul and one NCCL all-reduce, less what the calling process holds on the
device (the GPU's free memory is device-wide: a profiler that has just measured layers holds its
own context and cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sailor_core.errors import ProfileError
from sailor_core.ports import free_port

_IDLE = r"""
import json, os, sys, datetime
import torch, torch.distributed as dist
import sailor_core.runtime.trainer, sailor_core.runtime.data  # the worker's imports
threads, cuda, other_used = int(sys.argv[1]), sys.argv[2] == "cuda", int(sys.argv[3])
torch.set_num_threads(threads)
rank = int(os.environ["RANK"])
if cuda:
    torch.cuda.set_device(rank)
dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank,
                        world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=120))
dev = "cuda" if cuda else "cpu"
from sailor_core.catalog.models import get_model
from sailor_core.runtime.optimizer import make_optimizer
from sailor_core.runtime.model import StageModel
spec = get_model("tiny")
model = StageModel(spec, 0, spec.num_layer_indices).to(dev)
opt = make_optimizer(model.parameters(), 1e-3)
x = torch.randint(0, spec.vocab_size, (1, spec.seq_len), device=dev)
for _ in range(2):
    model(x, x).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(grads)
    opt.step()
    opt.zero_grad(set_to_none=False)
own = 16 * sum(p.numel() for p in model.parameters())  # fp32 weights, grads, two AdamW moments
out = {}
if cuda:
    a = torch.randn(1024, 1024, device="cuda"); (a @ a).sum().item()
    free, total = torch.cuda.mem_get_info()
    out["bytes"] = total - free - other_used - torch.cuda.memory_allocated()
else:
    rss = [l for l in open("/proc/self/status") if l.startswith("VmRSS")][0]
    out["bytes"] = int(rss.split()[1]) * 1024 - own
print(json.dumps(out), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def idle_worker_rss_bytes(*, device: str = "cpu", threads: int = 1, timeout_s: float = 120.0) -> int:
    """Constant memory of one worker process (see the module doc); the larger of two ranks."""
    port = free_port()
    other_used = 0
    if device == "cuda" and "torch" in sys.modules:
        import torch  # lazy: only a torch the caller already loaded (its CUDA context); never load it here

        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info()
            other_used = total - free
    procs = []
    world = 1 if device == "cuda" else 2  # one GPU may be all there is; NCCL initialises with one rank
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                   OMP_NUM_THREADS=str(threads))
        argv = [sys.executable, "-c", _IDLE, str(threads), device, str(other_used)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    values = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise ProfileError("the idle-worker memory probe did not finish") from None
        if p.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise ProfileError(f"the idle-worker memory probe failed: {last}")
        values.append(json.loads(out.strip().splitlines()[-1])["bytes"])
    return max(values)
