"""The instance agent: turns a job assignment into training worker processes.

Every instance a job rents runs this agent from its startup script
(``python -m sailor_core.runtime.agent --job-url URL``).  The agent and the
train-job flow talk through small JSON documents under the job's URL (a local
directory, ``file://`` or ``s3://bucket/jobs/<job>``), so neither needs to reach
the other over the network: the flow writes an ``AgentAssignment``, the agent
writes its ``AgentStatus`` (``sailor_core.job.protocol``, which also says what
each field means).  A higher generation replaces the current one: the agent
stops its workers and starts the new ones: the engine's workers park when stopped
(``runtime/park.py``) and the agent hands the next generation to them, so the ranks
of a surviving instance keep their processes and, where their shard stays, their
state (``--no-park``: new processes every time).  At boot the agent starts one standby
worker per GPU (``--standby``; ``auto``: as many as ``nvidia-smi`` lists), parked without state
before any assignment, so the first generation is a handover too: the imports and the device
context are paid while the instance waits for work, not after its assignment.  On the embedded cloud, an
assignment's ``inject_preemption`` asks the agent of rank 0 to have the cloud
preempt an instance once its workers reach a step (``--preempt-at``): the agent
sees each step as rank 0 writes it, the flow only some polls later, and a small
model runs tens of steps a second.  It asks its own metadata server (which lets an
instance preempt only an instance of its own job): the cloud's control API needs
the controller's secret, which no instance holds.

Workers are started in the agent's own process group, so a preemption (SIGTERM
to the group, the notice period, then SIGKILL) reaches them directly and they
can make their emergency checkpoint; the agent only waits for them and reports.
No torch import here: the agent must start fast and stay small.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sailor_core import settings
from sailor_core.errors import SailorError
from sailor_core.runtime import park, save_note
from sailor_core.runtime.agent_logs import AgentLogs
from sailor_core.job.protocol import (
    EXIT_PREEMPTED,
    STOP_MAX_S,
    AgentAction,
    AgentAssignment,
    AgentState,
    AgentStatus,
    CheckpointReport,
    InjectionReport,
    InjectPreemption,
    ProtocolError,
    StepReport,
    WorkerError,
    WorkerEvent,
    add_egress,
    one_line,
    read_assignment,
    read_metrics_line,
    write_status,
)

POLL_S = 0.2
INJECT_POLL_S = 0.02  # while a preemption waits for its step: land it within a step or two
MAX_LOSSES = 5000  # per generation, in status.json
# A stopped worker gets STOP_GRACE_S, and again after every piece of its stop's saves (plus twice
# the longest piece it has written: runtime/save_note.py), never more than STOP_MAX_S in all.
STOP_GRACE_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionAnswer:
    """The embedded cloud's answer to a preemption request."""

    ok: bool
    http_status: int | None = None  # a refusal's HTTP status (404: no such live instance)
    error: str | None = None


def post_preemption(control_url: str, instance_id: str, timeout_s: float = 10.0, *,
                    secret: str | None = None) -> PreemptionAnswer:
    """Ask the embedded cloud's control surface (with its ``secret``: the controller) or an
    instance's metadata server (``<metadata URL>/sailor``: its own job's instances) to preempt
    ``instance_id``; an injected preemption that cannot be had is an answer, never raised."""
    headers = {"Content-Type": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    request = urllib.request.Request(f"{control_url.rstrip('/')}/preempt", method="POST",
                                     data=json.dumps({"instance_id": instance_id}).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            resp.read()
        return PreemptionAnswer(ok=True)
    except urllib.error.HTTPError as exc:
        body = exc.read()[:200].decode(errors="replace")
        return PreemptionAnswer(ok=False, http_status=exc.code, error=f"HTTP {exc.code} {body}".strip())
    except OSError as exc:  # refused, unreachable, timed out
        return PreemptionAnswer(ok=False, error=f"{control_url} did not answer: {exc}")


def worker_command(assignment: AgentAssignment, plan_path: Path, metrics_path: Path,
                   python: str = sys.executable, data_cache_dir: Path | None = None) -> list[str]:
    """The engine's worker command line (``sailor_core/runtime/worker.py``), or with ``module`` in the
    assignment another of Sailor's jobs on the same instances (the network profiler's
    ``sailor_core.profiler.net_worker``): ``python -m MODULE --metrics-file PATH`` + extra_worker_args.
    ``data_cache_dir``: where the workers keep what they read of remote data (every generation's
    workers on this instance share it)."""
    if assignment.module:
        return [python, "-m", assignment.module, "--metrics-file", str(metrics_path),
                *assignment.extra_worker_args]
    cmd = [
        python, "-m", "sailor_core.runtime.worker",
        "--plan", str(plan_path),
        "--steps", str(assignment.steps),
        "--data", assignment.data,
        "--ckpt-dir", assignment.ckpt_url,
        "--ckpt-every", str(assignment.ckpt_every),
        "--seed", str(assignment.seed),
        "--metrics-file", str(metrics_path),  # rank 0 writes it; the agent forwards it in status.json
    ]
    if assignment.resume:
        cmd.append("--resume")
    if data_cache_dir is not None:
        cmd += ["--data-cache-dir", str(data_cache_dir)]
    cmd += assignment.extra_worker_args
    return cmd


# ---- the agent -----------------------------------------------------------------


@dataclass(slots=True)
class _Generation:
    number: int
    attempt: int = 0  # the job's attempt it trains for (where its logs are uploaded)
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # global rank -> process
    local_ranks: dict[int, int] = field(default_factory=dict)  # global rank -> its GPU on this instance
    exit_codes: dict[int, int] = field(default_factory=dict)  # a parked worker's: 75, as if it exited
    log_dir: Path | None = None
    metrics_offset: int = 0
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) as rank 0 reported them
    val_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    last_event: WorkerEvent | None = None
    started: WorkerEvent | None = None  # rank 0's "started" line
    checkpoint: CheckpointReport | None = None  # rank 0's newest "checkpoint" line
    rejoined: list[int] = field(default_factory=list)  # ranks handed to parked workers of a generation before
    standby: list[int] = field(default_factory=list)  # ranks handed to standby workers (parked at boot, no state)
    errors: dict[int, str] = field(default_factory=dict)  # global rank -> its first error line's message
    samples_per_s: float | None = None
    egress: dict[tuple[str, str], float] = field(default_factory=dict)  # bytes per zone pair: steps' and egress lines
    inject: InjectPreemption | None = None  # the assignment's, until posted
    injected: InjectionReport | None = None  # what became of it


def _worker_env(assignment: AgentAssignment, generation: int, rank: int, local_rank: int,
                log_dir: Path) -> dict[str, str]:
    """What a worker's environment adds to the agent's (a parked worker is handed just this)."""
    return {
        **assignment.env,
        "MASTER_ADDR": assignment.master_addr,
        "MASTER_PORT": str(assignment.master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(assignment.world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(len(assignment.ranks)),
        settings.ATTEMPT_ENV: str(assignment.attempt),
        settings.GENERATION_ENV: str(generation),
        settings.STARTED_UNIX_S_ENV: repr(time.time()),
        settings.AGENT_PID_ENV: str(os.getpid()),
        settings.SAVE_NOTE_ENV: str(save_note.note_path(log_dir, rank)),
    }


class Agent:
    def __init__(self, job_url: str, instance_id: str, work_dir: Path, *, park_workers: bool = True,
                 num_standby: int = 0) -> None:
        self.job_url = job_url
        self.instance_id = instance_id
        self.work_dir = work_dir
        self.park_dir = work_dir / "parked" if park_workers else None
        self.parked: dict[int, subprocess.Popen] = {}  # local rank -> a parked worker
        self.standby_pids: set[int] = set()  # parked workers started at boot, not yet handed a generation
        self.standby_ready: set[int] = set()  # those of them that parked (imports done) before a handover
        self._standby_started_s = time.monotonic()
        self.num_standby = num_standby if park_workers else 0  # workers started at boot (parked, no state)
        self.current: _Generation | None = None
        self.previous: AgentStatus | None = None  # the replaced generation's last report
        self.terminating = False
        self.final = False
        self._last_status: AgentStatus | None = None
        self._last_status_s = 0.0
        self.logs = AgentLogs(job_url, instance_id, work_dir)
        self._logs_due = False  # a worker exited: its last lines go up now, not in UPLOAD_EVERY_S

    # -- workers --
    def _start(self, assignment: AgentAssignment) -> _Generation:
        gen = _Generation(number=assignment.generation, attempt=assignment.attempt)
        if assignment.action != AgentAction.RUN:
            self.logs.say(f"generation {gen.number}: {assignment.action.value}")
            return gen
        self.logs.say(f"generation {gen.number} (attempt {gen.attempt}): starting ranks "
                      f"{', '.join(map(str, assignment.ranks))}")
        gen.inject = assignment.inject_preemption
        log_dir = self.work_dir / f"gen{gen.number}"
        log_dir.mkdir(parents=True, exist_ok=True)
        gen.log_dir = log_dir
        plan_path = log_dir / "plan.json"
        plan_path.write_text(json.dumps(dict(assignment.plan)))
        cmd = worker_command(assignment, plan_path, log_dir / "metrics.jsonl",
                             data_cache_dir=self.work_dir / "data-cache")
        parks = self.park_dir is not None and not assignment.module
        if parks:
            cmd += ["--park-dir", str(self.park_dir)]
        self._release_parked(keep=set(range(len(assignment.ranks))) if parks else set())
        for local_rank, rank in enumerate(assignment.ranks):
            gen.local_ranks[rank] = local_rank
            env, log_path = _worker_env(assignment, gen.number, rank, local_rank, log_dir), log_dir / f"rank{rank}.log"
            if local_rank in self.parked:
                gen.procs[rank] = self.parked.pop(local_rank)
                fresh = gen.procs[rank].pid in self.standby_pids
                self.standby_pids.discard(gen.procs[rank].pid)
                (gen.standby if fresh else gen.rejoined).append(rank)
                park.write_handover(self.park_dir, gen.procs[rank].pid,
                                    park.Handover(argv=tuple(cmd[3:]), env=env, log_path=str(log_path)))
                continue
            log = open(log_path, "ab")
            # Same process group as the agent: a preemption's SIGTERM reaches the workers.
            gen.procs[rank] = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, cwd=assignment.cwd or None)
            log.close()
        return gen

    def _start_standby(self) -> None:
        """Start the standby workers: each imports the engine, creates its device context and parks
        without state (``worker --standby``), in the agent's process group as every worker."""
        log_dir = self.work_dir / "standby"
        log_dir.mkdir(parents=True, exist_ok=True)
        for local_rank in range(self.num_standby):
            env = {**os.environ, "LOCAL_RANK": str(local_rank), settings.AGENT_PID_ENV: str(os.getpid())}
            with open(log_dir / f"local{local_rank}.log", "ab") as log:
                self.parked[local_rank] = subprocess.Popen(
                    [sys.executable, "-m", "sailor_core.runtime.worker", "--standby", "--park-dir", str(self.park_dir)],
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.standby_pids = {p.pid for p in self.parked.values()}
        if self.num_standby:
            self.logs.say(f"{self.num_standby} standby workers started (pids "
                          f"{', '.join(str(p.pid) for p in self.parked.values())})")
        self._standby_started_s = time.monotonic()

    def _note_standby_ready(self) -> None:
        """Note the standby workers that have parked (their note, until a handover answers it)."""
        waiting = self.standby_pids - self.standby_ready
        if not waiting:
            return
        self.standby_ready |= {pid for pid in waiting if park.read_parked(self.park_dir, pid) is not None}
        if len(self.standby_ready) == self.num_standby:
            self.logs.say(f"{self.num_standby} standby workers ready (imports done, parked) "
                          f"{time.monotonic() - self._standby_started_s:.2f} s after their start")

    def _release_parked(self, keep: set[int] = frozenset(), grace_s: float = STOP_GRACE_S) -> None:
        """Tell the parked workers not in ``keep`` (local ranks) to exit, and wait: their GPU memory
        is the next workers'."""
        self.parked = {local: p for local, p in self.parked.items() if p.poll() is None}  # none died meanwhile
        going = [self.parked.pop(local) for local in sorted(self.parked) if local not in keep]
        for p in going:
            park.write_handover(self.park_dir, p.pid, park.Handover(exit=True))
        _wait_or_kill(going, grace_s)

    def _parked_now(self, gen: _Generation) -> None:
        """Note the workers of ``gen`` that have parked: exited with 75 as far as the job is concerned."""
        if self.park_dir is None:
            return
        for rank, p in gen.procs.items():
            if rank in gen.exit_codes or p.poll() is not None:
                continue
            note = park.read_parked(self.park_dir, p.pid)
            if note is not None and note.rank != park.STANDBY_RANK:  # a standby's late note is no stop
                gen.exit_codes[rank] = EXIT_PREEMPTED
                self.parked[gen.local_ranks[rank]] = p

    def _stop(self, gen: _Generation, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the generation's workers: park them (they checkpoint together first) or, when
        the instance is going away or parking is off, SIGTERM (they checkpoint and exit).  The
        workers get ``grace_s``, and more while their saves progress (``runtime/save_note.py``):
        only a worker that makes no progress is killed, so a slow store costs a stop no checkpoint."""
        self._collect(gen)
        live = {r: p for r, p in gen.procs.items() if r not in gen.exit_codes and p.poll() is None}
        parks = self.park_dir is not None and not self.terminating
        paths = {r: save_note.note_path(gen.log_dir, r) for r in live} if gen.log_dir is not None else {}
        wait = save_note.StopWait(grace_s, STOP_MAX_S if grace_s > 0 else 0.0, _notes(paths))
        for p in live.values():
            p.send_signal(park.SIGNAL if parks else signal.SIGTERM)
        while any(r not in gen.exit_codes for r in live) and not wait.over(_notes(paths)):
            time.sleep(park.POLL_S)
            self._collect(gen)
            self._beat()
        unparked = [p for p in live.values() if all(p is not q for q in self.parked.values())]
        _wait_or_kill(unparked, 0.0)
        self._collect(gen)

    def _collect(self, gen: _Generation) -> None:
        self._parked_now(gen)
        for rank, p in gen.procs.items():
            code = p.poll()
            if code is not None and rank not in gen.exit_codes:
                gen.exit_codes[rank] = code
                self.logs.say(f"generation {gen.number}: rank {rank} exited with code {code}")
                self._logs_due = True
        self._read_metrics(gen)

    def _upload_logs(self, gen: _Generation | None, *, force: bool = False) -> None:
        if gen is not None and gen.log_dir is not None:
            self.logs.upload(gen.attempt, {r: gen.log_dir / f"rank{r}.log" for r in gen.procs}, force=force)

    @staticmethod
    def _read_metrics(gen: _Generation) -> None:
        """The new metrics lines: rank 0's steps, losses and last event; any rank's error and egress."""
        if gen.log_dir is None:
            return
        path = gen.log_dir / "metrics.jsonl"
        try:
            with open(path, "rb") as fh:
                fh.seek(gen.metrics_offset)
                chunk = fh.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
        gen.metrics_offset += end
        for line in chunk[:end].splitlines():
            record = read_metrics_line(line)
            if isinstance(record, WorkerEvent) and record.kind == "started":
                gen.started = record
            elif isinstance(record, WorkerEvent) and record.kind == "checkpoint":
                try:
                    gen.checkpoint = CheckpointReport.from_dict(record.fields)
                except ProtocolError:  # a line of another Sailor: the job finds the checkpoint by listing
                    continue
            elif isinstance(record, WorkerEvent) and record.kind == "egress":  # any rank's, no step carried
                try:
                    gen.egress = add_egress(gen.egress, record.egress_bytes)
                except ProtocolError:
                    continue
            elif isinstance(record, WorkerEvent):
                rank = record.fields.get("rank", 0)  # lines without one are rank 0's (it alone writes those)
                message = one_line(str(record.fields.get("message") or "")) if record.kind == "error" else ""
                if message and isinstance(rank, int):
                    gen.errors.setdefault(rank, message)
                if rank == 0:
                    gen.last_event = record
            elif isinstance(record, StepReport):
                gen.losses.append((record.step, record.loss))
                if record.val_loss is not None:
                    gen.val_losses.append((record.step, record.val_loss))
                gen.samples_per_s = record.samples_per_s
                if record.egress_bytes:
                    gen.egress = add_egress(gen.egress, record.egress_bytes)

    def _maybe_inject(self, gen: _Generation) -> None:
        """Post the assignment's injected preemption once rank 0 has reached its step."""
        want = gen.inject
        if want is None or not gen.losses or gen.losses[-1][0] < want.at_step:
            return
        gen.inject = None
        metadata = settings.metadata_url()  # on an embedded instance: its own metadata server
        answer = post_preemption(f"{metadata}/sailor" if metadata else want.control_url, want.instance_id)
        gen.injected = InjectionReport(at_step=want.at_step, step=gen.losses[-1][0], instance_id=want.instance_id,
                                       ok=answer.ok, http_status=answer.http_status, error=answer.error)

    def _state(self) -> AgentState:
        gen = self.current
        if self.terminating:
            return AgentState.PREEMPTED if self.final else AgentState.PREEMPTING
        if gen is None or not gen.procs:
            return AgentState.IDLE
        if any(code != 0 for code in gen.exit_codes.values()):
            return AgentState.FAILED
        if len(gen.exit_codes) == len(gen.procs):
            return AgentState.EXITED
        return AgentState.RUNNING

    def _report(self, force: bool = False) -> None:
        status = self._status_body()
        now = time.time()
        if force or status != self._last_status or now - self._last_status_s > 1.0:
            write_status(self.job_url, self.instance_id, dataclasses.replace(status, heartbeat_unix_s=now))
            self._last_status, self._last_status_s = status, now

    def _beat(self) -> None:
        """The last report again, with a fresh heartbeat: while its workers save for a stop the agent
        stays alive to the flow, and the generation's state stays what it was until the stop ends."""
        now = time.time()
        if self._last_status is not None and now - self._last_status_s > 1.0:
            write_status(self.job_url, self.instance_id, dataclasses.replace(self._last_status, heartbeat_unix_s=now))
            self._last_status_s = now

    def _status_body(self) -> AgentStatus:
        """The report without its heartbeat (what changed since the last one is what matters)."""
        gen = self.current
        if gen is None:
            return AgentStatus(instance_id=self.instance_id, generation=-1, state=self._state(),
                               previous=self.previous, num_standby=self.num_standby,
                               num_standby_ready=len(self.standby_ready))
        return AgentStatus(
            instance_id=self.instance_id,
            generation=gen.number,
            state=self._state(),
            exit_codes=dict(sorted(gen.exit_codes.items())),
            pids={r: p.pid for r, p in gen.procs.items()},
            log_dir=str(gen.log_dir) if gen.log_dir else None,
            step=gen.losses[-1][0] if gen.losses else None,
            losses=tuple((step, loss) for step, loss in gen.losses[-MAX_LOSSES:]),
            val_losses=tuple(gen.val_losses[-MAX_LOSSES:]),
            samples_per_s=gen.samples_per_s,
            event=gen.last_event,
            injected_preemption=gen.injected,
            previous=self.previous,
            rejoined=tuple(gen.rejoined),
            standby=tuple(gen.standby),
            num_standby=self.num_standby,
            num_standby_ready=len(self.standby_ready),
            started=gen.started,
            worker_error=_lowest_rank_error(gen.errors),
            checkpoint=gen.checkpoint,
            egress=tuple((src, dst, n) for (src, dst), n in sorted(gen.egress.items())),
        )

    # -- main loop --
    def run(self, *, max_idle_s: float | None = None) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._start_standby()
        idle_since = time.monotonic()
        self._report(force=True)
        while not self.terminating:
            assignment = read_assignment(self.job_url, self.instance_id)
            if assignment is not None and (self.current is None or assignment.generation > self.current.number):
                if self.current is not None:
                    self.logs.say(f"generation {self.current.number}: stopping for generation {assignment.generation}")
                    self._stop(self.current)
                    self._upload_logs(self.current, force=True)
                    self.previous = dataclasses.replace(self._status_body(), previous=None)
                self.current = self._start(assignment)
                self._report(force=True)
                if assignment.action == AgentAction.SHUTDOWN:
                    self._release_parked()
                    self._upload_logs(self.current, force=True)
                    return 0
            if self.current is not None:
                self._collect(self.current)
                self._maybe_inject(self.current)
                idle_since = time.monotonic() if self._state() == AgentState.RUNNING else idle_since
            self._note_standby_ready()
            if max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                self._release_parked()
                self._upload_logs(self.current, force=True)
                return 0
            self._report()
            self._upload_logs(self.current, force=self._logs_due)
            self._logs_due = False
            pending = self.current is not None and self.current.inject and self._state() == AgentState.RUNNING
            time.sleep(INJECT_POLL_S if pending else POLL_S)
        # Preempted: the workers got the same SIGTERM and checkpoint within the notice period.
        # Keep forwarding their metrics meanwhile: the SIGKILL may come before they are done.
        gen = self.current
        self.logs.say(f"SIGTERM (a preemption or the instance's end): the workers checkpoint within "
                      f"{settings.notice_s():.0f} s")
        deadline = time.monotonic() + settings.notice_s()
        self._upload_logs(gen, force=True)  # now: the SIGKILL may end the instance before the loop below does
        while gen is not None and time.monotonic() < deadline and any(p.poll() is None for p in gen.procs.values()):
            self._collect(gen)
            self._report()
            self._upload_logs(gen, force=self._logs_due)
            self._logs_due = False
            time.sleep(POLL_S / 2)
        if gen is not None:
            self._stop(gen, grace_s=0.0)
        _wait_or_kill(list(self.parked.values()), 0.0)  # they had the SIGTERM too
        self.final = True
        self._report(force=True)
        self._upload_logs(gen, force=True)
        return 128 + signal.SIGTERM

    def _on_sigterm(self, signum, frame) -> None:
        self.terminating = True


def _notes(paths: dict[int, Path]) -> dict[int, save_note.SaveNote | None]:
    return {rank: save_note.read_note(path) for rank, path in paths.items()}


def _lowest_rank_error(errors: dict[int, str]) -> WorkerError | None:
    """Rank 0's error when it wrote one, else the lowest rank's (ranks refusing the same input say the same)."""
    if not errors:
        return None
    rank = min(errors)
    return WorkerError(rank=rank, message=errors[rank])


def num_gpus() -> int:
    """The GPUs ``nvidia-smi`` lists (the embedded cloud's image has one that lists its instance's);
    0 without it or when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        proc = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in proc.stdout.splitlines() if line.strip()) if proc.returncode == 0 else 0


def _wait_or_kill(procs: list[subprocess.Popen], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sailor_core.runtime.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--job-url", required=True, help="the job's directory, file:// or s3:// URL")
    parser.add_argument("--instance-id", default=settings.instance_id())
    parser.add_argument("--work-dir", default=None, help="local directory for plans and worker logs")
    parser.add_argument("--max-idle-s", type=float, default=None,
                        help="exit after this long with no running workers (default: never)")
    parser.add_argument("--no-park", action="store_true",
                        help="stop workers with SIGTERM and start new processes for every generation")
    parser.add_argument("--standby", default="auto",
                        help="workers to start at boot, parked until the first assignment (auto: one per GPU "
                             "nvidia-smi lists; 0: none, the first generation starts new processes)")
    args = parser.parse_args(argv)
    if not args.instance_id:
        sys.stderr.write(f"error: no instance id (--instance-id or {settings.INSTANCE_ID_ENV})\n")
        return 2
    # The embedded cloud gives each instance a directory; elsewhere the temp dir.
    instance_dir = settings.instance_dir()
    default_dir = (instance_dir / "agent" if instance_dir
                   else Path(os.environ.get("TMPDIR", "/tmp")) / f"sailor-agent-{args.instance_id}")
    work_dir = Path(args.work_dir or default_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    num_standby = num_gpus() if args.standby == "auto" else int(args.standby) if args.standby.isdigit() else -1
    if num_standby < 0:
        sys.stderr.write(f"error: --standby must be auto or a count, got {args.standby!r}\n")
        return 2
    try:
        return Agent(args.job_url, args.instance_id, work_dir, park_workers=not args.no_park,
                     num_standby=num_standby).run(max_idle_s=args.max_idle_s)
    except SailorError as exc:  # an assignment of another protocol version, a bad job URL
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
