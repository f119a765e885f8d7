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
  caller waits ``failure_grace_s`` before believing it).  The reason leads with the workers'
  own error line when one wrote it (``AgentStatus.worker_error``), then the exit codes; a
  worker that exited with the engine's bad-input code makes it ``bad_input``: any plan
  would meet the same refusal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sailor_core.job.protocol import EXIT_BAD_INPUT, AgentState, AgentStatus

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
    exit_codes: Mapping[str, Mapping[int, int]] = field(default_factory=dict)  # failed: instance -> rank -> code

    @property
    def bad_input(self) -> bool:
        """A worker refused its plan, data or checkpoint (the engine's exit 2): not a crash to retry.
        A peer's preemption (77) or the worker's own (75, 76) is not."""
        return self.kind == WORKER_FAILED and any(
            code == EXIT_BAD_INPUT for codes in self.exit_codes.values() for code in codes.values())


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
        return _worker_failed({i: current[i] for i in failed})
    if len(current) == len(statuses) and all(st.state == AgentState.EXITED for st in current.values()):
        return AttemptOutcome(kind=FINISHED, reason="step target reached")
    return AttemptOutcome(kind=RUNNING)


def _worker_failed(failed: Mapping[str, AgentStatus]) -> AttemptOutcome:
    """The failed instances' outcome: the lowest rank's error line first (rank 0's when it wrote one)."""
    outcome = AttemptOutcome(kind=WORKER_FAILED, instance_ids=tuple(failed),
                             exit_codes={i: dict(st.exit_codes) for i, st in failed.items()})
    codes = {i: {str(rank): code for rank, code in st.exit_codes.items()} for i, st in failed.items()}
    errors = [st.worker_error for st in failed.values() if st.worker_error is not None]
    if not errors:
        return dataclasses.replace(outcome, reason=f"worker exited non-zero: {codes}")
    first = min(errors, key=lambda e: e.rank)
    what = "worker failed on bad input" if outcome.bad_input else "worker failed"
    return dataclasses.replace(outcome, reason=f"{what}: {first.message} (exit codes {codes})")


def restart_facts(statuses: Mapping[str, AgentStatus | None], generation: int) -> dict[str, Any]:
    """How ``generation``'s workers came back, from its agents' reports (``ReplanRecord``'s fields):
    ranks in all, ranks handed to parked workers, rank 0's time to be ready and its state's source."""
    current = [st for st in statuses.values() if st is not None and st.generation == generation]
    started = next((st.started for st in current if st.started is not None), None)
    fields = started.fields if started is not None else {}
    ready_s = fields.get("ready_s")
    return {"num_ranks": sum(len(st.pids) for st in current),
            "num_ranks_rejoined": sum(len(st.rejoined) for st in current),
            "num_ranks_standby": sum(len(st.standby) for st in current),
            "ready_s": float(ready_s) if isinstance(ready_s, (int, float)) else None,
            "state_from": fields.get("state_from") if isinstance(fields.get("state_from"), str) else None}
