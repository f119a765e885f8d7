"""The state of one training job, and where it is kept between flow runs.

A job outlives any one flow run: a restarted run (after a crash, a cancel, a
lost flow process) loads this state and continues the same job -- same job id,
next attempt, resume from the last checkpoint, spend carried over -- instead of
starting over.  Every change is a pure function returning a new ``JobState``;
``JobStore`` writes it as one JSON document per job to a local directory or a
``file://`` / ``s3://`` URL (the engine's storage).

Spend is derived from the instance records (running time x price) and the egress
records (the bytes the engine counted across zones, priced per pair): the
controller's ``CostLedger`` is rebuilt from them (``JobState.ledger()``), so
the persisted state needs no separate ledger document.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from sailor_core.controller.ledger import CostLedger, EgressCharge
from sailor_core.controller.state import observed_preemption_rates_per_s
from sailor_core.catalog.models import model_slug
from sailor_core.errors import InputError
from sailor_core.job.curves import with_step_time
from sailor_core.job.lease import JobLease, lease_from_json, lease_to_json
from sailor_core.job.spec import JobSpec
from sailor_core.settings import jobs_url
from sailor_core.storage import open_storage

STATE_VERSION = 1
STOP_FILE = "stop.json"  # next to the job's state.json: a StopRequest

SUCCEEDED = "succeeded"
STOPPED_BUDGET = "stopped_budget"
FAILED = "failed"
CANCELLED = "cancelled"
# A job in a final status is never resumed; a failed or cancelled one is, by a new flow run
# with its job id (the run that failed may have died with its flow process, not the job).
FINAL_STATUSES = (SUCCEEDED, STOPPED_BUDGET)
ENDED_STATUSES = (SUCCEEDED, STOPPED_BUDGET, FAILED, CANCELLED)
PENDING = "pending"
RUNNING = "running"
RECOVERING = "recovering"


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceRecord:
    """One rented instance, from launch to its end; what the ledger charges."""

    instance_id: str
    cloud: str
    zone: str
    instance_type: str
    gpu: str
    num_gpus: int
    usd_per_hr: float
    spot: bool
    attempt: int
    launched_unix_s: float
    ended_unix_s: float | None = None
    end_reason: str | None = None  # "preempted", "terminated", "lost"

    @property
    def running(self) -> bool:
        return self.ended_unix_s is None



@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecord:
    """The job's newest checkpoint: where its workers committed it, and when (None: found by listing
    the checkpoint storage, not reported as it completed)."""

    step: int
    url: str
    at_unix_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressRecord:
    """The bytes one generation of workers sent from ``src_zone`` to ``dst_zone`` as the agent of
    ``instance_id`` last reported them (its running total), priced when charged."""

    instance_id: str
    generation: int
    src_zone: str
    dst_zone: str
    num_bytes: float
    usd: float
    at_unix_s: float

    def charge(self) -> EgressCharge:
        return EgressCharge(src_zone=self.src_zone, dst_zone=self.dst_zone, num_bytes=self.num_bytes,
                            usd=self.usd, at_s=self.at_unix_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanRecord:
    """One (re-)plan: why it happened and what was chosen."""

    attempt: int
    at_step: int  # the checkpoint this attempt resumes from
    reason: str
    plan: dict[str, Any]
    usd_per_hr: float
    throughput_samples_per_s: float
    at_unix_s: float
    steps_done_before: int = 0  # the furthest step reached before: steps_done_before - at_step are redone
    first_step_unix_s: float | None = None  # when this attempt's first step completed (recovery time)
    # How its workers came back (the agents' reports): ranks in all, ranks that kept their
    # processes (parked workers), rank 0's time to be ready to train and where its state came from
    num_ranks: int | None = None
    num_ranks_rejoined: int | None = None
    num_ranks_standby: int | None = None  # ranks handed to standby workers (new instances' agents start them at boot)
    ready_s: float | None = None
    state_from: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobState:
    job_id: str
    spec: JobSpec
    status: str = PENDING
    status_reason: str = ""
    attempt: int = 0  # 0 before the first launch; +1 per (re-)launch
    plan: dict[str, Any] | None = None
    instances: tuple[InstanceRecord, ...] = ()
    steps_done: int = 0
    last_checkpoint_step: int | None = None
    last_checkpoint: CheckpointRecord | None = None  # the same checkpoint: its URL and when it completed
    last_loss: float | None = None
    losses: tuple[tuple[int, float], ...] = ()  # (step, loss) as reported by rank 0
    val_losses: tuple[tuple[int, float], ...] = ()  # (step, validation loss after it) as reported by rank 0
    step_times: tuple[tuple[float, int], ...] = ()  # (unix s, step) as the flow saw steps, bounded (job/curves.py)
    replans: tuple[ReplanRecord, ...] = ()
    num_preemptions: int = 0
    injected_preemption_steps: tuple[int, ...] = ()  # --preempt-at steps already injected
    egress: tuple[EgressRecord, ...] = ()  # what the ledger charges for bytes across zones
    num_flow_runs: int = 0
    flow_run_id: str | None = None  # the latest flow run of the job, and its page in the Prefect UI
    flow_run_url: str | None = None
    created_unix_s: float = field(default_factory=time.time)
    updated_unix_s: float = field(default_factory=time.time)
    version: int = STATE_VERSION

    @property
    def last_val_loss(self) -> float | None:
        return self.val_losses[-1][1] if self.val_losses else None

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    def running_instances(self) -> tuple[InstanceRecord, ...]:
        return tuple(i for i in self.instances if i.running)

    def ledger(self) -> CostLedger:
        """The cost ledger of this job, rebuilt from the instance records (the controller's CostLedger)."""
        return CostLedger.from_instance_records(self.instances, budget_usd=self.spec.budget_usd,
                                                egress=[e.charge() for e in self.egress])

    def usd_spent(self, now_unix_s: float | None = None) -> float:
        return self.ledger().spent_usd(time.time() if now_unix_s is None else now_unix_s)

    def preemption_rates_per_s(self, now_unix_s: float) -> dict[tuple[str, str], float]:
        """Preemptions per second seen on each (GPU type, zone) since the first launch: the
        controller's ``preemption_rate_per_s``.  Instances of one pool preempted at the same
        second are one event (a zone's capacity taken at once)."""
        if not self.instances:
            return {}
        events = {(i.gpu, i.zone, i.ended_unix_s) for i in self.instances if i.end_reason == "preempted"}
        num_events: dict[tuple[str, str], int] = {}
        for gpu, zone, _ in events:
            num_events[(gpu, zone)] = num_events.get((gpu, zone), 0) + 1
        first_launch = min(i.launched_unix_s for i in self.instances)
        return observed_preemption_rates_per_s(num_events, now_unix_s - first_launch)


# ---- transitions -------------------------------------------------------------


def _touch(state: JobState, **changes: Any) -> JobState:
    return dataclasses.replace(state, updated_unix_s=time.time(), **changes)


def new_job(spec: JobSpec, job_id: str | None = None) -> JobState:
    return JobState(job_id=job_id or new_job_id(spec.model), spec=spec)


def new_job_id(model: str) -> str:
    safe = "".join(c if c.isalnum() else "-" for c in model_slug(model).lower()).strip("-")
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def with_status(state: JobState, status: str, reason: str = "") -> JobState:
    return _touch(state, status=status, status_reason=reason)


def with_spec(state: JobState, spec: JobSpec) -> JobState:
    """A continued job's raised limits (``sailor_core.job.spec.raised_limits``)."""
    return _touch(state, spec=spec)


def with_flow_run(state: JobState, run_id: str | None = None, url: str | None = None) -> JobState:
    return _touch(state, num_flow_runs=state.num_flow_runs + 1, flow_run_id=run_id, flow_run_url=url)


def with_plan(state: JobState, *, plan: dict[str, Any], reason: str, usd_per_hr: float,
              throughput_samples_per_s: float, now_unix_s: float | None = None) -> JobState:
    """A new attempt under ``plan``; the reason is kept for the re-plan history."""
    attempt = state.attempt + 1
    record = ReplanRecord(
        attempt=attempt,
        steps_done_before=state.steps_done,
        at_step=state.last_checkpoint_step or 0,
        reason=reason,
        plan=plan,
        usd_per_hr=usd_per_hr,
        throughput_samples_per_s=throughput_samples_per_s,
        at_unix_s=time.time() if now_unix_s is None else now_unix_s,
    )
    return _touch(state, attempt=attempt, plan=plan, replans=state.replans + (record,))


def plan_with_zones(plan: dict[str, Any], zones: dict[tuple[int, int], str]) -> dict[str, Any]:
    """A copy of the plan document ``plan`` with replicas ``(stage, replica) -> zone`` moved."""
    plan = json.loads(json.dumps(plan))
    for (s, r), zone in zones.items():
        plan["stages"][s]["replicas"][r]["zone"] = zone
    return plan


def with_plan_zones(state: JobState, zones: dict[tuple[int, int], str]) -> JobState:
    """Move replicas ``(stage, replica) -> zone`` (the provisioner's zone failover placed them there)."""
    if not zones or state.plan is None:
        return state
    plan = plan_with_zones(state.plan, zones)
    replans = state.replans
    if replans and replans[-1].attempt == state.attempt:
        replans = replans[:-1] + (dataclasses.replace(replans[-1], plan=plan),)
    return _touch(state, plan=plan, replans=replans)


def with_instances_launched(state: JobState, records: tuple[InstanceRecord, ...]) -> JobState:
    known = {i.instance_id for i in state.instances}
    return _touch(state, instances=state.instances + tuple(r for r in records if r.instance_id not in known))


def with_instances_ended(state: JobState, instance_ids: set[str] | frozenset[str], reason: str,
                         now_unix_s: float | None = None) -> JobState:
    """Close the records of ``instance_ids`` that are still open; preemptions are counted."""
    now = time.time() if now_unix_s is None else now_unix_s
    num_new_preemptions = 0
    out = []
    for i in state.instances:
        if i.instance_id in instance_ids and i.running:
            i = dataclasses.replace(i, ended_unix_s=now, end_reason=reason)
            num_new_preemptions += reason == "preempted"
        out.append(i)
    return _touch(state, instances=tuple(out), num_preemptions=state.num_preemptions + num_new_preemptions)


def with_first_step(state: JobState, now_unix_s: float, **restart: Any) -> JobState:
    """Note when the current attempt completed its first step (once), and how its workers came
    back (``restart``: ``ReplanRecord``'s ``num_ranks``, ``num_ranks_rejoined``, ``ready_s``,
    ``state_from``)."""
    if not state.replans or state.replans[-1].first_step_unix_s is not None:
        return state
    last = dataclasses.replace(state.replans[-1], first_step_unix_s=now_unix_s, **restart)
    return _touch(state, replans=state.replans[:-1] + (last,))


def with_injected_preemption(state: JobState, step: int) -> JobState:
    return _touch(state, injected_preemption_steps=state.injected_preemption_steps + (step,))


def with_progress(state: JobState, *, steps_done: int | None = None,
                  last_checkpoint_step: int | None = None,
                  losses: list[tuple[int, float]] | tuple[tuple[int, float], ...] = (),
                  val_losses: list[tuple[int, float]] | tuple[tuple[int, float], ...] = ()) -> JobState:
    """Record progress; (validation) losses of re-done steps replace the earlier ones (same step, same samples)."""
    merged = _merge_by_step(state.losses, losses)
    changes: dict[str, Any] = {"losses": merged, "val_losses": _merge_by_step(state.val_losses, val_losses)}
    if merged:
        changes["last_loss"] = merged[-1][1]
    if steps_done is not None:
        changes["steps_done"] = steps_done
        changes["step_times"] = with_step_time(state.step_times, time.time(), steps_done)
    if last_checkpoint_step is not None:
        changes["last_checkpoint_step"] = last_checkpoint_step
    return _touch(state, **changes)


def with_checkpoint(state: JobState, record: CheckpointRecord) -> JobState:
    """The job's newest checkpoint is ``record`` (its workers reported it, or the storage lists it)."""
    if state.last_checkpoint == record and state.last_checkpoint_step == record.step:
        return state
    return _touch(state, last_checkpoint_step=record.step, last_checkpoint=record)


def with_egress(state: JobState, reports, *, usd_per_byte, now_unix_s: float) -> JobState:
    """The egress the agents reported (``AgentStatus``es, each with the running totals of its
    generation), charged at ``usd_per_byte(src_zone, dst_zone)``: a total larger than the one
    recorded for its instance, generation and pair replaces it, so a report read twice is charged once."""
    records = {(e.instance_id, e.generation, e.src_zone, e.dst_zone): e for e in state.egress}
    changed = False
    for st in reports:
        for src, dst, num_bytes in st.egress:
            key = (st.instance_id, st.generation, src, dst)
            old = records.get(key)
            if old is None or num_bytes > old.num_bytes:
                records[key] = EgressRecord(instance_id=st.instance_id, generation=st.generation, src_zone=src,
                                            dst_zone=dst, num_bytes=num_bytes, usd=num_bytes * usd_per_byte(src, dst),
                                            at_unix_s=now_unix_s)
                changed = True
    return _touch(state, egress=tuple(records.values())) if changed else state


def _merge_by_step(old, new) -> tuple[tuple[int, float], ...]:
    by_step = dict(old)
    by_step.update((int(s), float(v)) for s, v in new)
    return tuple(sorted(by_step.items()))


# ---- a person's request to stop ----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StopRequest:
    """Someone asked the job to stop: its workers take a final checkpoint, its instances end, and
    it is saved as cancelled (continued later with ``sailor train --job-id``).  Written by
    ``sailor stop``, by the first Ctrl-C of ``sailor train`` (also with ``--deployment``); the
    flow run of the job reads it while it watches the workers (``JobStore.stop_request``)."""

    by: str  # who asked, as the job's reason says it: "Ctrl-C", "`sailor stop`", ...
    at_unix_s: float


def stopped_reason(state: JobState, by: str) -> str:
    """Why a stopped job ended, and how to go on: "stopped by the user (Ctrl-C) at step 547;
    checkpoint 545 saved; continue with `sailor train --job-id J`"."""
    saved = (f"checkpoint {state.last_checkpoint_step} saved" if state.last_checkpoint_step is not None
             else "no checkpoint yet (a continued job starts from step 0)")
    return (f"stopped by the user ({by}) at step {state.steps_done}; {saved}; "
            f"continue with `sailor train --job-id {state.job_id}`")


# ---- serialisation -----------------------------------------------------------


def state_to_dict(state: JobState) -> dict[str, Any]:
    return dataclasses.asdict(state)


def state_from_dict(data: Any) -> JobState:
    """Rebuild a JobState from its JSON form; InputError when it is not one."""
    try:
        if data.get("version") != STATE_VERSION:
            raise InputError(f"job state version {data.get('version')!r} is not {STATE_VERSION}")
        spec_raw = dict(data["spec"])
        # States written before --on-demand-gpus carry on_demand_fallback, an option that never
        # did anything and is gone: those jobs still resume.
        spec_raw.pop("on_demand_fallback", None)
        for key in ("clouds", "zones", "gpus", "preempt_at_steps"):
            spec_raw[key] = tuple(spec_raw.get(key) or ())
        spec = JobSpec(**spec_raw)
        return JobState(
            **{
                **data,
                "spec": spec,
                "instances": tuple(InstanceRecord(**i) for i in data["instances"]),
                "replans": tuple(ReplanRecord(**r) for r in data["replans"]),
                "last_checkpoint": (CheckpointRecord(**data["last_checkpoint"])
                                    if data.get("last_checkpoint") else None),
                "losses": tuple((int(s), float(v)) for s, v in data["losses"]),
                "val_losses": tuple((int(s), float(v)) for s, v in data.get("val_losses", ())),
                "step_times": tuple((float(t), int(s)) for t, s in data.get("step_times", ())),
                "injected_preemption_steps": tuple(int(s) for s in data.get("injected_preemption_steps", ())),
                "egress": tuple(EgressRecord(**e) for e in data.get("egress", ())),
            }
        )
    except InputError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise InputError(f"corrupt job state: {type(exc).__name__}: {exc}") from None


class JobStore:
    """One ``<root>/<job_id>/state.json`` per job; ``root`` is a path, ``file://`` or ``s3://`` URL
    (the engine's checkpoint storage, so one set of URL schemes serves jobs and checkpoints)."""

    def __init__(self, root: str | None = None) -> None:
        self.root = (root or jobs_url()).rstrip("/")

    def _storage(self):
        return open_storage(self.root)

    def job_url(self, job_id: str) -> str:
        return f"{self.root}/{job_id}"

    def save(self, state: JobState) -> None:
        # Written aside then renamed (locally), one whole object (S3): a reader never sees half a state.
        self._storage().put_atomic(f"{state.job_id}/state.json",
                                   json.dumps(state_to_dict(state), indent=1).encode())

    def load(self, job_id: str) -> JobState:
        storage = self._storage()
        key = f"{job_id}/state.json"
        if not storage.exists(key):
            raise InputError(f"no job {job_id!r} under {self.root}")
        try:
            data = json.loads(storage.get(key))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"job state of {job_id!r} is not valid JSON: {exc}") from None
        return state_from_dict(data)

    def request_stop(self, job_id: str, request: StopRequest) -> None:
        self._storage().put_atomic(f"{job_id}/{STOP_FILE}", json.dumps(dataclasses.asdict(request)).encode())

    def stop_request(self, job_id: str) -> StopRequest | None:
        """The job's pending stop request; None when there is none (or it cannot be read)."""
        storage = self._storage()
        key = f"{job_id}/{STOP_FILE}"
        try:
            if not storage.exists(key):
                return None
            data = json.loads(storage.get(key))
            return StopRequest(by=str(data["by"]), at_unix_s=float(data["at_unix_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def clear_stop(self, job_id: str) -> None:
        """A new flow run of the job starts: an old request (it stopped the last run) is done."""
        self._storage().delete(f"{job_id}/{STOP_FILE}")

    def exists(self, job_id: str) -> bool:
        return self._storage().exists(f"{job_id}/state.json")

    def save_lease(self, lease: JobLease) -> None:
        self._storage().put_atomic(f"{lease.job_id}/lease.json", lease_to_json(lease))

    def load_lease(self, job_id: str) -> JobLease | None:
        """The job's lease (``sailor_core.job.lease``), None when no controller ever held one."""
        storage = self._storage()
        key = f"{job_id}/lease.json"
        return lease_from_json(storage.get(key)) if storage.exists(key) else None

    def list(self) -> list[JobState]:
        """Every readable job, newest first; unreadable ones are skipped (a listing must not fail)."""
        out = []
        for job_id in self._storage().list_dirs():
            try:
                out.append(self.load(job_id))
            except InputError:
                continue
        return sorted(out, key=lambda s: s.created_unix_s, reverse=True)
