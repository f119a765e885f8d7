"""TP ranks as threads of the test process: torch's threaded process group (the one torch's own
distributed tests use), so a TP-2 forward and backward run the engine's real collectives without
starting processes (a gloo launch costs seconds)."""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.distributed as dist
from torch.testing._internal.distributed import multi_threaded_pg as threaded


@contextlib.contextmanager
def threaded_world():
    """Install the thread-local process-group world for the duration (restored after)."""
    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # a group registry per thread
    threaded._install_threaded_pg()
    try:
        yield
    finally:
        threaded._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)


def run_tp(tp_degree: int, fn, timeout_s: float = 60.0) -> list:
    """``fn(tp_rank, group)`` on every TP rank at once (``group`` None for TP 1); their results.
    Call inside ``threaded_world()``."""
    if tp_degree == 1:
        return [fn(0, None)]
    store = dist.HashStore()
    results: list = [None] * tp_degree
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=tp_degree, store=store)
        try:
            results[rank] = fn(rank, dist.group.WORLD)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
        finally:
            dist.destroy_process_group()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(tp_degree)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"TP ranks did not finish within {timeout_s} s")
    return results
