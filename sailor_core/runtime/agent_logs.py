"""The agent's own log and the uploads of its logs to the job's storage (``sailor_core/job/logs.py``).

The agent writes what it does (generations started and stopped, workers' exits, a preemption)
to ``<work dir>/agent.log``; ``AgentLogs.upload`` puts the tail of it and of each rank's log
under the job's URL, at most every ``UPLOAD_EVERY_S`` unless forced (a generation's end, the
agent's), and only the logs that changed.  A failed upload is retried at the next one: the logs
must never stop the workers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sailor_core.errors import SailorError
from sailor_core.job.logs import AGENT_LOG, UPLOAD_EVERY_S, LogRef, upload
from sailor_core.storage import open_storage


class AgentLogs:
    def __init__(self, job_url: str, instance_id: str, work_dir: Path) -> None:
        self.instance_id = instance_id
        self.path = work_dir / AGENT_LOG
        self._storage = open_storage(job_url.rstrip("/"))
        self._sent: dict[tuple[str, Path], tuple[int, int]] = {}  # (key, file) -> (size, mtime ns) uploaded
        self._last_s = 0.0

    def say(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} agent {self.instance_id}: {message}\n"
        with self.path.open("a") as f:
            f.write(line)
        sys.stderr.write(line)

    def upload(self, attempt: int, rank_logs: dict[int, Path], *, force: bool = False) -> None:
        """The agent's log and ``rank_logs`` (global rank -> file) as attempt ``attempt``'s."""
        now = time.monotonic()
        if not force and now - self._last_s < UPLOAD_EVERY_S:
            return
        self._last_s = now
        files = [(LogRef(attempt=attempt, instance_id=self.instance_id, rank=None), self.path)]
        files += [(LogRef(attempt=attempt, instance_id=self.instance_id, rank=r), p) for r, p in rank_logs.items()]
        for ref, path in files:
            try:
                st = path.stat()
                if self._sent.get((ref.key, path)) == (st.st_size, st.st_mtime_ns):
                    continue
                upload(self._storage, ref, path)
                self._sent[(ref.key, path)] = (st.st_size, st.st_mtime_ns)
            except (OSError, SailorError):  # not written yet, or the storage unreachable for now
                continue
