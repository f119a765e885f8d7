"""How an attempt of a job is doing, from what its agents and the cloud report.

An attempt is one plan running on one set of instances.  The train-job flow
polls the agents' status documents and the cloud's instance states and asks
``classify_attempt`` what that means; the answer is one of:

- ``running``: keep watching;
- ``finished``: every worker of the attempt exited 0 (the step target is reached);
- ``preempted``: the cloud took instances (or their agents got the SIGTERM of a notice);
- ``lost``: instances ended without a preemption, or their agents stopped reporting;
- ``failed``: a worker exited non-zero and no instance is gone (a crash to retry from the
  checkpoint; a peer's preemption shows up as this before the cloud reports it, so the
  caller waits ``failure_grace_s`` before believing it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sailor_core.job.protocol import AgentState, AgentStatus

RUNNING = "running"
FINISHED = "finished"
INSTANCE_PREEMPTED = "preempted"
LOST = "lost"
WORKER_FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptOutcome:
    kind: str
    instance_ids: tuple[str, ...] = ()
    reason: str = ""


def run_generation(attempt: int) -> int:
    """The assignment generation that runs ``attempt``'s workers (the one after it stops them)."""
    return 2 * attempt


def stop_generation(attempt: int) -> int:
    return 2 * attempt + 1


def classify_attempt(*, generation: int, statuses: Mapping[str, AgentStatus | None],
                     cloud_states: Mapping[str, str | None], now_unix_s: float,
                     heartbeat_timeout_s: float = 60.0) -> AttemptOutcome:
    """``statuses``/``cloud_states`` are keyed by the attempt's instance ids (None: not seen)."""
    preempted = sorted(i for i, s in cloud_states.items() if s == "preempted")
    preempted += sorted(i for i, st in statuses.items()
                        if st and st.state == AgentState.PREEMPTED and i not in preempted)
    if preempted:
        return AttemptOutcome(kind=INSTANCE_PREEMPTED, instance_ids=tuple(preempted),
                              reason=f"preempted: {', '.join(preempted)}")
    gone = sorted(i for i, s in cloud_states.items() if s in ("terminated", None))
    if gone:
        return AttemptOutcome(kind=LOST, instance_ids=tuple(gone),
                              reason=f"instance ended outside the job: {', '.join(gone)}")
    current = {i: st for i, st in statuses.items() if st and st.generation == generation}
    stale = sorted(i for i, st in current.items()
                   if st.heartbeat_unix_s is not None and now_unix_s - st.heartbeat_unix_s > heartbeat_timeout_s)
    if stale:
        return AttemptOutcome(kind=LOST, instance_ids=tuple(stale),
                              reason=f"agent stopped reporting: {', '.join(stale)}")
    failed = sorted(i for i, st in current.items() if st.state == AgentState.FAILED)
    if failed:
        codes = {i: {str(rank): code for rank, code in current[i].exit_codes.items()} for i in failed}
        return AttemptOutcome(kind=WORKER_FAILED, instance_ids=tuple(failed),
                              reason=f"worker exited non-zero: {codes}")
    if len(current) == len(statuses) and all(st.state == AgentState.EXITED for st in current.values()):
        return AttemptOutcome(kind=FINISHED, reason="step target reached")
    return AttemptOutcome(kind=RUNNING)


def restart_facts(statuses: Mapping[str, AgentStatus | None], generation: int) -> dict[str, Any]:
    """How ``generation``'s workers came back, from its agents' reports (``ReplanRecord``'s fields):
    ranks in all, ranks handed to parked workers, rank 0's time to be ready and its state's source."""
    current = [st for st in statuses.values() if st is not None and st.generation == generation]
    started = next((st.started for st in current if st.started is not None), None)
    fields = started.fields if started is not None else {}
    ready_s = fields.get("ready_s")
    return {"num_ranks": sum(len(st.pids) for st in current),
            "num_ranks_rejoined": sum(len(st.rejoined) for st in current),
            "ready_s": float(ready_s) if isinstance(ready_s, (int, float)) else None,
            "state_from": fields.get("state_from") if isinstance(fields.get("state_from"), str) else None}
