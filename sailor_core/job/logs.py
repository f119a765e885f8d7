"""The job's logs in its storage: an instance's agent log and its workers' logs, per attempt.

Each instance's agent uploads, every ``UPLOAD_EVERY_S`` and when a generation ends, the last
``MAX_LOG_BYTES`` of each log to ``<job url>/logs/attempt-<N>/<instance>/agent.log`` and
``.../rank-<R>.log`` (older bytes are dropped, a first line says how many), so the logs
outlive the instance on every cloud; ``sailor logs`` reads them back (``find_logs``, ``read_log``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sailor_core.storage import Storage, open_storage

MAX_LOG_BYTES = 1 << 20  # per uploaded log: its last MiB
UPLOAD_EVERY_S = 5.0
AGENT_LOG = "agent.log"
_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
_ATTEMPT_DIR = re.compile(r"^attempt-(\d+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRef:
    """One uploaded log: whose (the agent's when ``rank`` is None) and of which attempt."""

    attempt: int
    instance_id: str
    rank: int | None

    @property
    def key(self) -> str:
        return log_key(self.attempt, self.instance_id, self.rank)

    @property
    def label(self) -> str:
        who = "agent" if self.rank is None else f"rank {self.rank}"
        return f"attempt {self.attempt} {self.instance_id} {who}"


def log_key(attempt: int, instance_id: str, rank: int | None) -> str:
    """Where a log goes under the job's URL."""
    name = AGENT_LOG if rank is None else f"rank-{rank}.log"
    return f"logs/attempt-{attempt}/{instance_id}/{name}"


def log_tail(path: Path, max_bytes: int = MAX_LOG_BYTES) -> bytes:
    """The file's last ``max_bytes``, from a whole line on, after a line saying what was dropped."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if size <= max_bytes:
            return f.read()
        f.seek(size - max_bytes)
        data = f.read(max_bytes)
    cut = data.find(b"\n") + 1
    return f"[... {size - max_bytes + cut} earlier bytes dropped]\n".encode() + data[cut:]


def find_logs(job_url: str, *, attempt: int | None = None, rank: int | None = None) -> list[LogRef]:
    """The job's uploaded logs, by attempt, instance, the agent's before the ranks'; ``rank``: only
    that rank's workers' logs."""
    root = open_storage(job_url.rstrip("/") + "/logs")
    attempts = sorted(int(m.group(1)) for d in root.list_dirs() if (m := _ATTEMPT_DIR.match(d)))
    refs = []
    for a in attempts if attempt is None else [a for a in attempts if a == attempt]:
        for instance_id in open_storage(f"{root.url}/attempt-{a}").list_dirs():
            for name in open_storage(f"{root.url}/attempt-{a}/{instance_id}").list_files():
                m = _RANK_LOG.match(name)
                r = int(m.group(1)) if m else None
                if (m or name == AGENT_LOG) and (rank is None or r == rank):
                    refs.append(LogRef(attempt=a, instance_id=instance_id, rank=r))
    return sorted(refs, key=lambda x: (x.attempt, x.instance_id, -1 if x.rank is None else x.rank))


def read_log(job_url: str, ref: LogRef) -> bytes:
    return open_storage(job_url.rstrip("/")).get(ref.key)


def copy_logs(from_url: str, to_url: str) -> int:
    """Copy the job's uploaded logs from one storage to another (the embedded cloud's bucket lives
    only as long as its process); the number of logs copied."""
    source, target = open_storage(from_url.rstrip("/")), open_storage(to_url.rstrip("/"))
    refs = find_logs(from_url)
    for ref in refs:
        target.put_atomic(ref.key, source.get(ref.key))
    return len(refs)


def upload(storage: Storage, ref: LogRef, path: Path) -> None:
    storage.put_atomic(ref.key, log_tail(path))
