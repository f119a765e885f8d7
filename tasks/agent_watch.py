"""The one loop that watches a set of instances' agents: a training attempt's
(``workers.watch_attempt``) and a network profile's (``net_profiling.run_workers``).

Each poll reads every agent's status document (``sailor_core.job.protocol``); every
``CLOUD_POLL_S`` it also asks the cloud for the instances' states and, for instances whose
agent has not reported yet, whether their boot failed.  What a poll means is the caller's:
its handler returns a result (the loop ends with it), ``Poll.AGAIN``, or
``Poll.WORKERS_FAILING``.  A rank whose peer was preempted dies before the cloud reports the
preemption, so failed workers are given ``FAILURE_GRACE_S`` (the cloud asked at every poll)
for the cloud to name that real cause before the handler blames them (``failure_grace_over``).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sailor_core.job.protocol import AgentStatus, read_status

POLL_S = 0.3
CLOUD_POLL_S = 1.0
FAILURE_GRACE_S = 4.0

T = TypeVar("T")


class Poll(enum.Enum):
    AGAIN = "again"  # keep polling
    WORKERS_FAILING = "workers failing"  # keep polling (the cloud asked every poll) until the grace is over


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentPoll:
    """What one poll saw, keyed by instance id."""

    now_unix_s: float
    statuses: Mapping[str, AgentStatus | None]  # None: the agent has not reported
    cloud_states: Mapping[str, str | None]  # as the cloud last said ("running", "stopping", ...)
    boot_failures: Mapping[str, str]  # why an instance's boot failed, as the cloud last said
    failing_for_s: float | None  # since the handler first said Poll.WORKERS_FAILING (None: never)

    @property
    def failure_grace_over(self) -> bool:
        return self.failing_for_s is not None and self.failing_for_s >= FAILURE_GRACE_S


def watch_agents(session, instance_ids: Sequence[str], on_poll: Callable[[AgentPoll], T | Poll]) -> T:
    """Poll the agents of ``instance_ids`` (and the cloud) until ``on_poll`` returns a result."""
    ids = list(instance_ids)
    cloud_states: dict[str, str | None] = {i: "running" for i in ids}
    boot_failures: dict[str, str] = {}
    last_cloud = -math.inf
    failed_since: float | None = None
    while True:
        now_unix_s = time.time()
        statuses = {i: read_status(session.jobs_url, i) for i in ids}
        now = time.monotonic()
        if now - last_cloud > CLOUD_POLL_S:
            last_cloud = now
            cloud_states = session.instance_states(ids)
            booting = [i for i in ids if statuses[i] is None]
            boot_failures = session.boot_failures(booting) if booting else {}
        result = on_poll(AgentPoll(now_unix_s=now_unix_s, statuses=statuses, cloud_states=cloud_states,
                                   boot_failures=boot_failures,
                                   failing_for_s=None if failed_since is None else now - failed_since))
        if result is Poll.WORKERS_FAILING:
            failed_since = now if failed_since is None else failed_since
            last_cloud = -math.inf  # the next poll asks the cloud: it may name a preempted peer
        elif result is not Poll.AGAIN:
            return result
        time.sleep(POLL_S)


class Listeners(Generic[T]):
    """Callbacks in this process (the CLI's progress bar) told of a watch's progress."""

    __slots__ = ("_fns",)

    def __init__(self) -> None:
        self._fns: list[Callable[[T], None]] = []

    def add(self, fn: Callable[[T], None]) -> None:
        self._fns.append(fn)

    def remove(self, fn: Callable[[T], None]) -> None:
        if fn in self._fns:
            self._fns.remove(fn)

    def emit(self, value: T) -> None:
        for fn in list(self._fns):
            fn(value)
