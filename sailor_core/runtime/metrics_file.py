"""The worker's metrics file (``--metrics-file``): the lines its agent reads (``job/protocol.py``'s
``read_metrics_line``); ``runtime/worker.py`` says which lines each rank writes."""

from __future__ import annotations

import json
import os


class MetricsFile:
    """A worker's ``--metrics-file``: rank 0 writes its lines through an open handle; the other ranks
    only their own (``error``, ``egress``: ``any_rank``)."""

    def __init__(self, path: str | None, enabled: bool) -> None:
        self.path = path
        self.fh = open(path, "a") if (path and enabled) else None

    def write(self, record: dict) -> None:
        if self.fh:
            self.fh.write(json.dumps(record) + "\n")
            self.fh.flush()

    def error(self, rank: int, message: str) -> None:
        """An ``error`` line from any rank, not only rank 0: the rank that refused its inputs is
        the one that knows why (its agent forwards the lowest rank's)."""
        self.any_rank({"event": "error", "rank": rank, "message": message})

    def any_rank(self, record: dict) -> None:
        """A line any rank writes: rank 0's through its handle, the others' appended in one write,
        so lines of the ranks sharing the file do not interleave."""
        if self.fh:
            self.write(record)
        elif self.path:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)
