"""The rendezvous store, listening on the cluster's private address only.

torch's ``TCPStore`` server (what ``init_process_group("env://")`` starts on rank 0)
listens on every interface (``[::]``), so on a cloud VM with a public address the
job's rendezvous port would be reachable from the internet.  Here the socket is
bound to ``MASTER_ADDR`` -- the instance's private address -- and handed to the
store (``master_listen_fd``).
"""

from __future__ import annotations

import datetime as _dt
import os
import socket


def private_store(host: str, port: int, world_size: int, *, is_master: bool, timeout: _dt.timedelta,
                  wait_for_workers: bool = False):
    """A TCPStore; its server (``is_master``) listens on ``host:port`` only."""
    # lazy: torch loads only in the processes that rendezvous
    from torch.distributed import TCPStore

    if not is_master:
        return TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=max(128, world_size))
    bound_port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the listening socket from here on
    return TCPStore(host, bound_port, world_size, is_master=True, timeout=timeout,
                    wait_for_workers=wait_for_workers, master_listen_fd=fd)


def uses_agent_store() -> bool:
    """True when a launcher hosts the store (torchelastic's convention; ``launch_local`` does)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
