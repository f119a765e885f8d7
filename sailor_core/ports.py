"""A free TCP port on this machine: the one helper every local rendezvous and server uses."""

from __future__ import annotations

import socket

from sailor_core.errors import SailorError


def free_port(preferred: int = 0) -> int:
    """A port free on 127.0.0.1 now: ``preferred`` when it is free, else one the OS picks.
    (Free now, not reserved: whoever binds it next gets it.)"""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise SailorError("no free TCP port on 127.0.0.1")
