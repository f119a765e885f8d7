"""Which flow run controls a job: a lease kept next to the job's state, renewed while its controller lives.

A job has at most one controller (a train-job flow run).  While it runs, it renews the job's
lease (``<job>/lease.json`` in the job store) every quarter of the lease's length; a controller
whose machine dies stops renewing, and once the lease has expired another flow run may take
the job over (``may_take``).  The job watch (``flows/job_watch.py``, a scheduled deployment any
worker of the pool runs) re-submits to its deployment every unfinished job whose controller ran
through a deployment and whose lease expired (``takeover_candidates``), once per dead controller
(``takeover_key``: Prefect's idempotency key, so watches running at once submit one run).

The lease is a document of its own rather than a field of ``JobState``: it is written by a
thread of the controller on a timer, while the flow's loop rewrites the state on every change,
and two writers of one document would lose each other's updates.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from sailor_core.errors import InputError, SailorError

LEASE_VERSION = 1
DEFAULT_LEASE_S = 60.0

TAKE = "take"  # the job is free (no lease, released, expired) or already this flow run's
WAIT = "wait"  # another controller held it recently: wait for its lease to expire
YIELD = "yield"  # another controller renewed its lease while this one waited: it is alive, leave the job to it


class JobHeldError(SailorError):
    """The job is controlled by another live flow run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobLease:
    job_id: str
    owner: str  # the flow run holding it
    host: str  # the machine it runs on, for people reading `sailor status`
    ttl_s: float
    renewed_unix_s: float
    # Where a worker ran it ("train-job/train-job"), and the run-only parameters to run it with
    # again: only such a controller is re-submitted by the job watch when it dies.
    deployment: str | None = None
    run_parameters: dict[str, Any] = field(default_factory=dict)
    released: bool = False
    version: int = LEASE_VERSION

    @property
    def expires_unix_s(self) -> float:
        return self.renewed_unix_s + self.ttl_s

    def live(self, now_unix_s: float) -> bool:
        return not self.released and now_unix_s < self.expires_unix_s


def take(*, job_id: str, owner: str, host: str, ttl_s: float, now_unix_s: float, deployment: str | None = None,
         run_parameters: dict[str, Any] | None = None) -> JobLease:
    if ttl_s <= 0:
        raise InputError(f"a job lease must last more than 0 s, got {ttl_s}")
    return JobLease(job_id=job_id, owner=owner, host=host, ttl_s=ttl_s, renewed_unix_s=now_unix_s,
                    deployment=deployment, run_parameters=dict(run_parameters or {}))


def renewed(lease: JobLease, now_unix_s: float) -> JobLease:
    return dataclasses.replace(lease, renewed_unix_s=now_unix_s)


def released(lease: JobLease, now_unix_s: float) -> JobLease:
    return dataclasses.replace(lease, renewed_unix_s=now_unix_s, released=True)


def may_take(held: JobLease | None, owner: str, now_unix_s: float, *, first_seen: JobLease | None = None) -> str:
    """TAKE, WAIT or YIELD for flow run ``owner`` that finds ``held``; ``first_seen`` is the lease it
    found when it started looking.  A lease renewed since then has a live controller behind it: a
    second controller would rent and terminate the same instances, so the newcomer yields."""
    if held is None or held.released or held.owner == owner or not held.live(now_unix_s):
        return TAKE
    if first_seen is not None and first_seen.owner == held.owner and held.renewed_unix_s > first_seen.renewed_unix_s:
        return YIELD
    if first_seen is not None and first_seen.owner != held.owner:
        return YIELD  # someone else took it over meanwhile
    return WAIT


def takeover_candidates(jobs: list[tuple[Any, JobLease | None]], now_unix_s: float,
                        ended_statuses: tuple[str, ...]) -> list[tuple[Any, JobLease]]:
    """(job state, lease) of the jobs the watch re-submits: not ended, controlled through a
    deployment, and whose controller stopped renewing its lease without releasing it."""
    return [(state, lease) for state, lease in jobs
            if lease is not None and state.status not in ended_statuses and lease.deployment
            and not lease.released and not lease.live(now_unix_s)]


def takeover_key(lease: JobLease) -> str:
    """One re-submission per dead controller: the key names the job and the flow run that died."""
    return f"sailor-takeover-{lease.job_id}-{lease.owner}"


def lease_to_json(lease: JobLease) -> bytes:
    return json.dumps(dataclasses.asdict(lease), indent=1).encode()


def lease_from_json(raw: bytes) -> JobLease:
    """The lease document; InputError when it is not one."""
    try:
        data = json.loads(raw)
        if data.get("version") != LEASE_VERSION:
            raise InputError(f"job lease version {data.get('version')!r} is not {LEASE_VERSION}")
        return JobLease(**data)
    except InputError:
        raise
    except (ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"corrupt job lease: {type(exc).__name__}: {exc}") from None
