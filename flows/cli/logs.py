"""``sailor logs``: the agents' and workers' logs of a job, from its storage, after the instances are gone.

Instances upload them as they run (``sailor_core/job/logs.py``) to the job's bucket: on a real
cloud the job's storage, on the embedded cloud its bucket on disk under the Sailor home (read
from there, live; the flow also copies them to the job's folder when its run ends).
"""

from __future__ import annotations

import sys
import time
from typing import Optional

import typer

from sailor_core.errors import InputError

FOLLOW_POLL_S = 2.0


def register(app: typer.Typer) -> None:
    app.command(name="logs")(logs)


def logs(job_id: str = typer.Argument(..., help="job id (see `sailor jobs`)"),
         attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="only this attempt's logs"),
         rank: Optional[int] = typer.Option(None, "--rank", min=0, help="only this rank's worker logs"),
         follow: bool = typer.Option(False, "--follow", "-f",
                                     help="keep printing new lines until the attempt (the latest by default) ends")
         ) -> None:
    """The agents' and workers' logs of a job, by attempt and instance (each log's last MiB)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.job import state as js
    from sailor_core.job.logs import find_logs, read_log

    store = js.JobStore()
    state = store.load(job_id)  # an unknown job: InputError, one line
    url = _logs_url(job_id, store.job_url(job_id))
    printed: dict = {}  # LogRef -> bytes of it printed
    while True:
        for ref in find_logs(url, attempt=attempt, rank=rank):
            data = read_log(url, ref)
            done = printed.get(ref)
            if done is None:
                sys.stdout.write(f"==> {ref.label} <==\n")
            elif len(data) < done:  # replaced by a later tail: print it whole again
                sys.stdout.write(f"==> {ref.label} (its older lines dropped) <==\n")
                done = 0
            sys.stdout.write(data[done or 0:].decode(errors="replace"))
            printed[ref] = len(data)
        sys.stdout.flush()
        if not follow or _attempt_ended(store.load(job_id), attempt or state.attempt):
            break
        time.sleep(FOLLOW_POLL_S)
    if not printed:
        which = f" of attempt {attempt}" if attempt else ""
        which += f" of rank {rank}" if rank is not None else ""
        raise InputError(f"job {job_id!r} has no logs{which} under {url}/logs")


def _logs_url(job_id: str, job_url: str) -> str:
    """Where the job's logs are: on the embedded cloud its bucket (on disk, uploaded as the
    instances run, so ``--follow`` is live), else the job's own storage."""
    # lazy: as above
    from infra.config import real_clouds, use_embedded_storage
    from sailor_core.job.logs import find_logs
    from tasks.embedded_bucket import EMBEDDED_BUCKET

    if real_clouds():
        return job_url
    from sailor_core.storage import StorageError  # lazy: as above

    use_embedded_storage()
    bucket_url = f"s3://{EMBEDDED_BUCKET}/{job_id}"
    try:
        return bucket_url if find_logs(bucket_url) else job_url
    except StorageError:  # the buckets' folder was removed: the copy the flow kept
        return job_url


def _attempt_ended(state, attempt: int) -> bool:
    # lazy: as above
    from sailor_core.job.state import ENDED_STATUSES

    return state.attempt > attempt or state.status in ENDED_STATUSES
