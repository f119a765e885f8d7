"""The job protocol: the documents the flow and the instance agents exchange.

The train-job flow (and the network-profile flow) and the agent on every instance
(``sailor_core.runtime.agent``) never talk over the network; they read and write small JSON
documents under the job's URL (a path, ``file://`` or ``s3://``: ``sailor_core.storage``):

- ``agents/<instance_id>/assignment.json``, flow -> agent: ``AgentAssignment`` (which ranks
  to run, the plan, data, checkpoint URL, steps, the generation, ...).  A higher generation
  replaces the current one: the agent stops its workers and starts the new ones.
- ``agents/<instance_id>/status.json``, agent -> flow: ``AgentStatus`` (its ``AgentState``,
  the workers' pids and exit codes, rank 0's losses and last ``WorkerEvent``, the lowest
  rank's error message (``WorkerError``), a heartbeat, and under ``previous`` the last
  report of the generation it replaced, and the newest checkpoint its workers committed).

This module is the only one that turns these documents into JSON and back: every document
carries ``version``; reading one of another version, or one that is not a document of this
protocol, raises ``ProtocolError`` with a one-line message.  A field added later is optional
and read with its default when missing (``AgentStatus.val_losses``), and readers ignore keys
they do not know, so such an addition keeps the version.  The workers' metrics lines the
agent forwards (``--metrics-file``, one JSON object a line) are read here too
(``read_metrics_line``).  The embedded cloud runs the agent from the same checkout as the
flow, so both sides always speak the same version; a real instance's image must hold the
same Sailor version as the flow.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sailor_core.errors import InputError
from sailor_core.storage import open_storage

PROTOCOL_VERSION = 1
# A worker's error message as the status carries it: its first line, at most this long.
MAX_ERROR_CHARS = 500
ASSIGNMENT_FILE = "assignment.json"
STATUS_FILE = "status.json"
# The modules an assignment may start: Sailor's own (the engine's worker, the network profiler).
MODULE_PREFIX = "sailor_core."


# How long an agent lets stopped workers save while they make progress (``runtime/agent.py``), and so
# how long the flow may wait for a stop's confirmation while the agent's heartbeat stays fresh.
STOP_MAX_S = 600.0
# The engine worker's exit codes (``sailor_core/runtime/worker.py``), as the agent reports them
# (``AgentStatus.exit_codes``) and the flow reads them (``sailor_core/job/attempts.py``).
EXIT_OK = 0  # finished all steps
EXIT_BAD_INPUT = 2  # bad input (plan, data, checkpoint, recipe)
EXIT_PREEMPTED = 75  # stopped on a preemption notice after an emergency checkpoint
EXIT_PREEMPTED_NO_CKPT = 76  # ... without a checkpoint (none asked, or the save failed)
EXIT_PEER_LOST = 77  # a peer died, a collective timed out, or this rank's checkpoint I/O failed


class ProtocolError(InputError):
    """A job document of another protocol version, or not a document of the protocol."""


class AgentState(StrEnum):
    """What an agent's workers are doing (``AgentStatus.state``)."""

    IDLE = "idle"  # no workers: no assignment yet, or one that stops them
    RUNNING = "running"
    EXITED = "exited"  # every worker of the generation exited 0
    FAILED = "failed"  # a worker exited non-zero
    PREEMPTING = "preempting"  # the agent got SIGTERM; its workers are checkpointing
    PREEMPTED = "preempted"  # ... and are gone: this report is the generation's last


class AgentAction(StrEnum):
    """What an assignment asks of the agent."""

    RUN = "run"  # start the workers of the assignment
    STOP = "stop"  # stop the current workers (SIGTERM: they checkpoint), stay up for the next
    SHUTDOWN = "shutdown"  # stop the workers and exit


# ---- reading JSON values into typed fields -------------------------------------------------

_REQUIRED: Any = object()


def _get(data: Mapping[str, Any], key: str, convert: Callable[[Any], Any], what: str,
         default: Any = _REQUIRED) -> Any:
    """``convert(data[key])``; ``default`` when missing or null; ProtocolError naming the key."""
    value = data.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ProtocolError(f"{what} has no {key!r}")
        return default
    try:
        return convert(value)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError(f"{what}: {key} = {_short(value)} is not valid ({exc})") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {type(value).__name__}")
    return value


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _rank_map(value: Any) -> dict[int, int]:
    """``{"0": 2, ...}`` (JSON object keys are strings) -> ``{0: 2, ...}``."""
    return {int(_str(rank)): _int(v) for rank, v in _object(value).items()}


def _losses(value: Any) -> tuple[tuple[int, float], ...]:
    out = []
    for pair in _list(value):
        step, loss = _list(pair)
        out.append((_int(step), _float(loss)))
    return tuple(out)


def one_line(text: str, max_chars: int = MAX_ERROR_CHARS) -> str:
    """``text``'s first non-empty line, cut to ``max_chars`` (ending in "...") when longer."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= max_chars else line[:max_chars - 3] + "..."


def _check_version(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} is not a JSON object (got {type(data).__name__})")
    version = data.get("version")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"{what} is of protocol version {version!r}, this Sailor speaks {PROTOCOL_VERSION}")
    return data


# ---- the documents ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectPreemption:
    """Ask rank 0's agent to have the embedded cloud preempt ``instance_id`` once its workers
    reach ``at_step`` (``--preempt-at``): the agent sees every step as rank 0 writes it, the
    flow only some polls later, and a small model runs tens of steps a second."""

    at_step: int
    instance_id: str
    control_url: str  # the embedded cloud's control surface

    def to_dict(self) -> dict[str, Any]:
        return {"at_step": self.at_step, "instance_id": self.instance_id, "control_url": self.control_url}

    @classmethod
    def from_dict(cls, data: Any) -> InjectPreemption:
        what = "inject_preemption"
        data = _object(data)
        return cls(at_step=_get(data, "at_step", _int, what), instance_id=_get(data, "instance_id", _str, what),
                   control_url=_get(data, "control_url", _str, what))


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectionReport:
    """What became of an ``InjectPreemption``: posted at ``step``; the cloud's answer."""

    at_step: int
    step: int
    instance_id: str
    ok: bool
    http_status: int | None = None  # the refusal's HTTP status (404: no such live instance)
    error: str | None = None  # why not, when not ok

    def to_dict(self) -> dict[str, Any]:
        return {"at_step": self.at_step, "step": self.step, "instance_id": self.instance_id, "ok": self.ok,
                "http_status": self.http_status, "error": self.error}

    @classmethod
    def from_dict(cls, data: Any) -> InjectionReport:
        what = "injected_preemption"
        data = _object(data)
        return cls(at_step=_get(data, "at_step", _int, what), step=_get(data, "step", _int, what),
                   instance_id=_get(data, "instance_id", _str, what), ok=_get(data, "ok", _bool, what),
                   http_status=_get(data, "http_status", _int, what, None),
                   error=_get(data, "error", _str, what, None))


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointReport:
    """A checkpoint the workers committed: rank 0's ``{"event": "checkpoint", "step", "url", "unix_s"}``
    line, as the agent forwards the newest (``AgentStatus.checkpoint``) and the job records it."""

    step: int
    url: str  # the checkpoint's folder (``<checkpoint url>/step_<N>``)
    unix_s: float  # when its manifest was committed

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "url": self.url, "unix_s": self.unix_s}

    @classmethod
    def from_dict(cls, data: Any) -> CheckpointReport:
        what = "checkpoint"
        data = _object(data)
        return cls(step=_get(data, "step", _int, what), url=_get(data, "url", _str, what),
                   unix_s=_get(data, "unix_s", _float, what))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEvent:
    """A ``{"event": KIND, ...}`` line of a worker's metrics file, forwarded as the agent got it.

    Kinds: the engine's ``done``, ``preempted``, ``peer_lost``, ``error``, ``egress`` (any rank's
    bytes across zones that no step line carried, ``egress_bytes``: docs/engine.md); the
    network profiler's progress ``p2p`` and ``allreduce`` (with ``bytes``) and its last line,
    ``result`` (with ``result``, the measured points).
    """

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)  # the line's other keys

    @property
    def num_bytes(self) -> int | None:
        """The message size a profiler progress event is about."""
        value = self.fields.get("bytes")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def result(self) -> Any:
        """The payload of a ``result`` event (the network profiler's points)."""
        return self.fields.get("result")

    @property
    def egress_bytes(self) -> tuple[tuple[str, str, float], ...]:
        """An ``egress`` event's ``(source zone, destination zone, bytes)``; ProtocolError when malformed."""
        try:
            return _egress_pairs(self.fields.get("egress_bytes", []))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"worker event egress_bytes: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, **self.fields}

    @classmethod
    def from_dict(cls, data: Any) -> WorkerEvent:
        data = _object(data)
        kind = _get(data, "event", _str, "worker event")
        return cls(kind=kind, fields={k: v for k, v in data.items() if k != "event"})


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerError:
    """A worker's ``error`` metrics line: why it refused its inputs (exit 2) or its checkpoint I/O
    failed (exit 77), as the agent forwards it (``message``: one line, ``one_line``)."""

    rank: int  # the global rank that wrote it
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "message": self.message}

    @classmethod
    def from_dict(cls, data: Any) -> WorkerError:
        what = "worker_error"
        data = _object(data)
        return cls(rank=_get(data, "rank", _int, what), message=_get(data, "message", _str, what))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    """A step line of rank 0's metrics file (``{"step", "loss", "samples_per_s", ...}``; ``val_loss``
    after a step that ran the validation).  The line holds more than the agent forwards (``lr``,
    ``grad_norm``, ``grad_norm_clipped``, ``clipped``, ``tokens_per_s``, ``model_flops_per_s``,
    ``mfu`` or ``mfu_nominal``, ``peak_memory_bytes_by_rank``, ``val_perplexity``:
    ``runtime/worker.py``); their history is in the job's TensorBoard files
    (``<job url>/tensorboard``, docs/engine.md#metrics), not in the agent's status."""

    step: int
    loss: float
    samples_per_s: float | None = None
    val_loss: float | None = None
    egress_bytes: tuple[tuple[str, str, float], ...] = ()  # the step's (source zone, destination zone, bytes)


# The version of ``AgentStatus.egress``'s meaning: the bytes the generation's ranks sent from one
# zone to another (sends' bytes; an all-reduce's ring share to each rank's ring neighbour,
# ``runtime/links.py``), summed over its steps.  A reader takes a field of another version as absent.
EGRESS_VERSION = 1


def _egress_pairs(value: Any) -> tuple[tuple[str, str, float], ...]:
    out = []
    for row in _list(value):
        src, dst, num_bytes = _list(row)
        out.append((_str(src), _str(dst), _float(num_bytes)))
    return tuple(out)


def _egress_field(value: Any) -> tuple[tuple[str, str, float], ...]:
    data = _object(value)
    if data.get("version") != EGRESS_VERSION:
        return ()
    return _egress_pairs(data.get("pairs", []))


def add_egress(total: Mapping[tuple[str, str], float], pairs) -> dict[tuple[str, str], float]:
    """``total`` bytes per (source, destination) zone plus ``pairs`` (``(src, dst, bytes)``)."""
    out = dict(total)
    for src, dst, num_bytes in pairs:
        out[(src, dst)] = out.get((src, dst), 0.0) + num_bytes
    return out


def read_metrics_line(line: bytes | str) -> StepReport | WorkerEvent | None:
    """One line of a worker's metrics file; None for a line that is neither (or not JSON)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    try:
        if "event" in record:
            return WorkerEvent.from_dict(record)
        if "step" in record and "loss" in record:
            rate, val = record.get("samples_per_s"), record.get("val_loss")
            return StepReport(step=int(record["step"]), loss=float(record["loss"]),
                              samples_per_s=None if rate is None else float(rate),
                              val_loss=None if val is None else float(val),
                              egress_bytes=_egress_pairs(record.get("egress_bytes", [])))
    except (ProtocolError, TypeError, ValueError):
        return None
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentAssignment:
    """``assignment.json``: what the flow asks of one instance's agent.

    ``action`` run starts ``ranks`` (global ranks of a world of ``world_size``, rendezvous at
    ``master_addr:master_port``) as the engine's workers training ``plan`` (a plan-file dict)
    to ``steps`` on ``data`` with checkpoints under ``ckpt_url``; with ``module`` set they run
    ``python -m MODULE --metrics-file F <extra_worker_args>`` instead (another of Sailor's
    jobs on the same instances: the network profiler).
    """

    generation: int
    attempt: int = 0  # the job's attempt (the workers get it as SAILOR_ATTEMPT)
    action: AgentAction = AgentAction.RUN
    plan: Mapping[str, Any] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    world_size: int = 0
    master_addr: str = ""
    master_port: int = 0
    steps: int = 0  # the job's total step count
    data: str = ""
    ckpt_url: str = ""
    ckpt_every: int = 0
    resume: bool = False
    seed: int = 0
    module: str | None = None
    extra_worker_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # added to the workers' environment
    cwd: str | None = None
    inject_preemption: InjectPreemption | None = None

    def __post_init__(self) -> None:
        if self.module is not None and not self.module.startswith(MODULE_PREFIX):
            # The documents may start Sailor's own jobs only.
            raise ProtocolError(f"assignment names module {self.module!r}, which is not one of Sailor's")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROTOCOL_VERSION, "generation": self.generation, "attempt": self.attempt,
            "action": self.action.value, "plan": dict(self.plan), "ranks": list(self.ranks),
            "world_size": self.world_size, "master_addr": self.master_addr, "master_port": self.master_port,
            "steps": self.steps, "data": self.data, "ckpt_url": self.ckpt_url, "ckpt_every": self.ckpt_every,
            "resume": self.resume, "seed": self.seed, "module": self.module,
            "extra_worker_args": list(self.extra_worker_args), "env": dict(self.env), "cwd": self.cwd,
            "inject_preemption": self.inject_preemption.to_dict() if self.inject_preemption else None,
        }

    @classmethod
    def from_dict(cls, data: Any) -> AgentAssignment:
        what = "assignment"
        data = _check_version(data, what)
        return cls(
            generation=_get(data, "generation", _int, what),
            attempt=_get(data, "attempt", _int, what, 0),
            action=_get(data, "action", AgentAction, what, AgentAction.RUN),
            plan=_get(data, "plan", _object, what, {}),
            ranks=_get(data, "ranks", lambda v: tuple(_int(r) for r in _list(v)), what, ()),
            world_size=_get(data, "world_size", _int, what, 0),
            master_addr=_get(data, "master_addr", _str, what, ""),
            master_port=_get(data, "master_port", _int, what, 0),
            steps=_get(data, "steps", _int, what, 0),
            data=_get(data, "data", _str, what, ""),
            ckpt_url=_get(data, "ckpt_url", _str, what, ""),
            ckpt_every=_get(data, "ckpt_every", _int, what, 0),
            resume=_get(data, "resume", _bool, what, False),
            seed=_get(data, "seed", _int, what, 0),
            module=_get(data, "module", _str, what, None),
            extra_worker_args=_get(data, "extra_worker_args", lambda v: tuple(_str(a) for a in _list(v)), what, ()),
            env=_get(data, "env", lambda v: {_str(k): _str(x) for k, x in _object(v).items()}, what, {}),
            cwd=_get(data, "cwd", _str, what, None),
            inject_preemption=_get(data, "inject_preemption", InjectPreemption.from_dict, what, None),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentStatus:
    """``status.json``: what one instance's agent reports about its current generation."""

    instance_id: str
    generation: int  # -1 before the first assignment
    state: AgentState
    exit_codes: Mapping[int, int] = field(default_factory=dict)  # global rank -> exit code
    pids: Mapping[int, int] = field(default_factory=dict)  # global rank -> worker process id
    log_dir: str | None = None  # the workers' logs (rank<R>.log), on the instance
    step: int | None = None  # the last step rank 0 reported
    losses: tuple[tuple[int, float], ...] = ()  # (step, loss) as rank 0 reported them, the last MAX_LOSSES
    val_losses: tuple[tuple[int, float], ...] = ()  # (step, validation loss after it), as rank 0 reported them
    samples_per_s: float | None = None
    event: WorkerEvent | None = None  # rank 0's last event line
    injected_preemption: InjectionReport | None = None
    previous: AgentStatus | None = None  # the replaced generation's last report (its own previous: None)
    heartbeat_unix_s: float | None = None  # when the agent wrote this; None inside ``previous``
    rejoined: tuple[int, ...] = ()  # ranks handed to parked workers (they kept their processes)
    standby: tuple[int, ...] = ()  # ranks handed to standby workers (started at boot, without state)
    # The standby workers the agent started at boot, and how many of them got ready (imports done,
    # parked) before any handover: the flow waits for them before a new instance's first assignment.
    # 0 and 0 from an agent without standby workers (``--standby 0``, or an image older than the field).
    num_standby: int = 0
    num_standby_ready: int = 0
    started: WorkerEvent | None = None  # rank 0's "started" line: state_from, ready_s
    worker_error: WorkerError | None = None  # the lowest rank's error line (rank 0's when it wrote one)
    checkpoint: CheckpointReport | None = None  # the newest checkpoint this generation committed
    # (source zone, destination zone, bytes) the generation sent across zones so far, as rank 0
    # reported them (``EGRESS_VERSION``); written only when not empty
    egress: tuple[tuple[str, str, float], ...] = ()

    @property
    def standby_starting(self) -> bool:
        """Before its first assignment, some of the agent's standby workers are still getting ready."""
        return self.generation < 0 and self.num_standby_ready < self.num_standby

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROTOCOL_VERSION, "instance_id": self.instance_id, "generation": self.generation,
            "state": self.state.value,
            "exit_codes": {str(r): c for r, c in sorted(self.exit_codes.items())},
            "pids": {str(r): p for r, p in sorted(self.pids.items())},
            "log_dir": self.log_dir, "step": self.step, "losses": [[s, v] for s, v in self.losses],
            "val_losses": [[s, v] for s, v in self.val_losses],
            "samples_per_s": self.samples_per_s, "event": self.event.to_dict() if self.event else None,
            "injected_preemption": self.injected_preemption.to_dict() if self.injected_preemption else None,
            "previous": self.previous.to_dict() if self.previous else None,
            "heartbeat_unix_s": self.heartbeat_unix_s, "rejoined": list(self.rejoined),
            "standby": list(self.standby),
            "num_standby": self.num_standby, "num_standby_ready": self.num_standby_ready,
            "started": self.started.to_dict() if self.started else None,
            "worker_error": self.worker_error.to_dict() if self.worker_error else None,
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
        } | ({"egress": {"version": EGRESS_VERSION, "pairs": [list(p) for p in self.egress]}} if self.egress else {})

    @classmethod
    def from_dict(cls, data: Any) -> AgentStatus:
        what = "agent status"
        data = _check_version(data, what)
        return cls(
            instance_id=_get(data, "instance_id", _str, what),
            generation=_get(data, "generation", _int, what),
            state=_get(data, "state", AgentState, what),
            exit_codes=_get(data, "exit_codes", _rank_map, what, {}),
            pids=_get(data, "pids", _rank_map, what, {}),
            log_dir=_get(data, "log_dir", _str, what, None),
            step=_get(data, "step", _int, what, None),
            losses=_get(data, "losses", _losses, what, ()),
            val_losses=_get(data, "val_losses", _losses, what, ()),
            samples_per_s=_get(data, "samples_per_s", _float, what, None),
            event=_get(data, "event", WorkerEvent.from_dict, what, None),
            injected_preemption=_get(data, "injected_preemption", InjectionReport.from_dict, what, None),
            previous=_get(data, "previous", AgentStatus.from_dict, what, None),
            heartbeat_unix_s=_get(data, "heartbeat_unix_s", _float, what, None),
            rejoined=_get(data, "rejoined", lambda v: tuple(_int(r) for r in _list(v)), what, ()),
            standby=_get(data, "standby", lambda v: tuple(_int(r) for r in _list(v)), what, ()),
            num_standby=_get(data, "num_standby", _int, what, 0),
            num_standby_ready=_get(data, "num_standby_ready", _int, what, 0),
            started=_get(data, "started", WorkerEvent.from_dict, what, None),
            worker_error=_get(data, "worker_error", WorkerError.from_dict, what, None),
            checkpoint=_get(data, "checkpoint", CheckpointReport.from_dict, what, None),
            egress=_get(data, "egress", _egress_field, what, ()),
        )


# ---- where they live ---------------------------------------------------------------------------


def agent_key(instance_id: str, name: str) -> str:
    """The document's key under the job's URL."""
    return f"agents/{instance_id}/{name}"


def _write(job_url: str, instance_id: str, name: str, data: dict[str, Any]) -> None:
    # Written whole (aside and renamed locally, one object on S3): readers see the old one or the new one.
    open_storage(job_url.rstrip("/")).put_atomic(agent_key(instance_id, name), json.dumps(data).encode())


def _read(job_url: str, instance_id: str, name: str) -> Any | None:
    """The parsed JSON at the document's key, or None when it is missing or unreadable."""
    try:
        return json.loads(open_storage(job_url.rstrip("/")).get(agent_key(instance_id, name)))
    except (OSError, ValueError, KeyError):
        return None
    except Exception as exc:  # the storage's own not-found errors (S3 404)
        if "404" in str(exc) or "NoSuchKey" in str(exc) or "not found" in str(exc).lower():
            return None
        raise


def write_assignment(job_url: str, instance_id: str, assignment: AgentAssignment) -> None:
    _write(job_url, instance_id, ASSIGNMENT_FILE, assignment.to_dict())


def read_assignment(job_url: str, instance_id: str) -> AgentAssignment | None:
    """The instance's assignment; None while there is none; ProtocolError when it is not one."""
    data = _read(job_url, instance_id, ASSIGNMENT_FILE)
    return None if data is None else AgentAssignment.from_dict(data)


def write_status(job_url: str, instance_id: str, status: AgentStatus) -> None:
    _write(job_url, instance_id, STATUS_FILE, status.to_dict())


def read_status(job_url: str, instance_id: str) -> AgentStatus | None:
    """The agent's last report; None while there is none; ProtocolError when it is not one."""
    data = _read(job_url, instance_id, STATUS_FILE)
    return None if data is None else AgentStatus.from_dict(data)

