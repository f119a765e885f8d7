"""Run a plan as local worker processes (gloo on 127.0.0.1) and collect what they report.

A worker that dies (killed by a signal, or any exit other than the worker's
documented codes for "done", "preempted" and "peer lost") is the dead rank;
the others must then exit on their own within ``grace_s`` (collective
timeouts + connection errors), else they are killed and listed as hung.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sailor_core.catalog.models import get_model
from sailor_core.plan.types import Plan
from sailor_core.runtime.data import generate_corpus
from sailor_core.plan.layout import world_size
from sailor_core.runtime.faults import FaultConfig
from sailor_core.job.protocol import EXIT_OK, EXIT_PEER_LOST, EXIT_PREEMPTED, EXIT_PREEMPTED_NO_CKPT

_EXPECTED_CODES = {EXIT_OK, EXIT_PREEMPTED, EXIT_PREEMPTED_NO_CKPT, EXIT_PEER_LOST}


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    status: str                       # "ok" | "preempted" | "failed" | "timeout"
    losses: list[float]               # per step of this run (step numbers in `steps`)
    steps: list[int]
    step_times_s: list[float]
    step_cpu_s: list[float]           # rank 0's CPU time per step (robust on a busy machine)
    samples_per_s: float              # median over steps after the first
    tokens_per_s: float
    wall_s: float
    exit_codes: dict[int, int | None]
    dead_rank: int | None = None
    hung_ranks: tuple[int, ...] = ()
    exit_times_s: dict[int, float] = field(default_factory=dict)  # since launch
    death_time_s: float | None = None
    message: str = ""
    stderr_tails: dict[int, str] = field(default_factory=dict)
    peak_memory_bytes: int | None = None  # rank 0's torch.cuda.max_memory_allocated; None on CPU
    val_losses: dict[int, float] = field(default_factory=dict)  # step -> validation loss after it

    def to_dict(self) -> dict:
        return {"status": self.status, "losses": self.losses, "steps": self.steps,
                "step_times_s": self.step_times_s, "throughput_samples_per_s": self.samples_per_s,
                "tokens_per_s": self.tokens_per_s, "wall_s": self.wall_s,
                "exit_codes": {str(k): v for k, v in self.exit_codes.items()},
                "dead_rank": self.dead_rank, "hung_ranks": list(self.hung_ranks),
                "message": self.message, "peak_memory_bytes": self.peak_memory_bytes,
                "val_losses": {str(k): v for k, v in self.val_losses.items()}}


def ensure_corpus(workdir: Path, plan: Plan, *, num_tokens: int | None = None, seed: int = 0) -> Path:
    spec = get_model(plan.model)
    n = num_tokens or max(200_000, 64 * plan.global_batch_size * plan.effective_seq_len())
    path = workdir / f"corpus-{spec.vocab_size}-{n}-{seed}.npy"
    if not path.exists():
        generate_corpus(path, vocab_size=spec.vocab_size, num_tokens=n, seed=seed)
    return path


def launch_local(plan: Plan, steps: int, *, data: str | Path | None = None,
                 ckpt_dir: str | None = None, ckpt_every: int = 0, keep: int = 2,
                 resume: bool = False, seed: int = 0,
                 workdir: str | Path | None = None, timeout_s: float = 600.0,
                 collective_timeout_s: float = 30.0, grace_s: float | None = None,
                 threads_per_rank: int = 1, env: dict[str, str] | None = None,
                 faults: FaultConfig | None = None, on_started=None,
                 worker_args: tuple[str, ...] = ()) -> LaunchResult:
    """Train ``plan`` up to step ``steps`` on local processes; never hangs past ``timeout_s``.

    ``data``: a path or URL (default: a synthetic corpus); ``faults``: what the workers inject
    (tests); ``env``: added to every worker's environment; ``worker_args``: more worker flags
    (the job's options, ``job/worker_args.worker_argv``: ``python -m sailor_core.runtime.worker --help``).
    """
    # lazy: torch; the launcher spawns the workers that train and needs it only for this check
    from sailor_core.runtime.model import check_plan_for_engine

    check_plan_for_engine(plan)
    workdir = Path(workdir or tempfile.mkdtemp(prefix="sailor-engine-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = str(data) if data else ensure_corpus(workdir, plan, seed=seed)
    plan_path = workdir / "plan.json"
    plan_path.write_text(plan.to_json())
    metrics_path = workdir / f"metrics-{time.time_ns()}.jsonl"
    grace_s = grace_s if grace_s is not None else collective_timeout_s + 10.0
    n = world_size(plan)
    # lazy: the store is torch's TCPStore; importing this module must not load torch
    from sailor_core.runtime.rendezvous import private_store

    # The launcher hosts the rendezvous store (as torchrun's agent does), so it outlives any
    # worker and survivors can still read the heartbeats of a dead rank 0.
    store = private_store("127.0.0.1", 0, n, is_master=True, timeout=datetime.timedelta(seconds=300))
    args = ["--plan", str(plan_path), "--steps", str(steps), "--data", str(data), "--seed", str(seed),
            "--metrics-file", str(metrics_path), "--timeout-s", str(collective_timeout_s),
            "--threads", str(threads_per_rank), "--keep", str(keep),
            "--data-cache-dir", str(workdir / "data-cache"), *worker_args]
    if ckpt_dir:
        args += ["--ckpt-dir", str(ckpt_dir), "--ckpt-every", str(ckpt_every)]
    if resume:
        args.append("--resume")
    worker_env = {**(env or {}), **(faults.to_env() if faults is not None else {})}
    t_start = time.monotonic()
    procs, logs = _start_workers(n, store.port, args, worker_env, threads_per_rank, workdir)
    if on_started is not None:
        on_started(procs, metrics_path)
    exits = _wait_for_workers(procs, t_start, timeout_s, grace_s)
    wall = time.monotonic() - t_start
    del store
    for f in logs.values():
        f.close()
    tails = {r: _tail(workdir / f"rank{r}.log") for r in range(n)}
    return _result(plan, exits, _read_metrics(metrics_path), wall, grace_s, tails)


def _start_workers(n: int, port: int, args: list[str], worker_env: dict[str, str], threads_per_rank: int,
                   workdir: Path) -> tuple[dict[int, subprocess.Popen], dict]:
    """One worker process per rank, each in its own session, its output in ``rank<r>.log``."""
    procs: dict[int, subprocess.Popen] = {}
    logs = {}
    for rank in range(n):
        e = dict(os.environ)
        e.update(worker_env)
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n),
                 LOCAL_RANK=str(rank), OMP_NUM_THREADS=str(threads_per_rank),
                 TORCHELASTIC_USE_AGENT_STORE="True")
        cmd = [sys.executable, "-m", "sailor_core.runtime.worker", *args]
        logs[rank] = open(workdir / f"rank{rank}.log", "w+")
        procs[rank] = subprocess.Popen(cmd, env=e, stdout=logs[rank], stderr=subprocess.STDOUT,
                                       start_new_session=True)
    return procs, logs


@dataclass(slots=True, kw_only=True)
class _Exits:
    """How the workers ended: exit codes and times, the first to die unexpectedly, any killed."""

    codes: dict[int, int | None]
    times_s: dict[int, float]
    dead_rank: int | None = None
    death_time_s: float | None = None
    hung: list[int] = field(default_factory=list)
    status: str = "ok"


def _wait_for_workers(procs: dict[int, subprocess.Popen], t_start: float, timeout_s: float,
                      grace_s: float) -> _Exits:
    """Poll until every worker exits; after an unexpected death (or ``timeout_s``) the rest get
    ``grace_s`` before they are killed."""
    ex = _Exits(codes={r: None for r in procs}, times_s={})
    deadline = t_start + timeout_s
    while True:
        now = time.monotonic()
        for r, p in procs.items():
            if ex.codes[r] is None and p.poll() is not None:
                ex.codes[r] = p.returncode
                ex.times_s[r] = now - t_start
                if ex.dead_rank is None and p.returncode not in _EXPECTED_CODES:
                    ex.dead_rank, ex.death_time_s = r, now - t_start
                    deadline = min(deadline, now + grace_s)
        if all(c is not None for c in ex.codes.values()):
            return ex
        if now > deadline:
            ex.hung = [r for r, c in ex.codes.items() if c is None]
            for r in ex.hung:
                _kill(procs[r])
            for r in ex.hung:
                procs[r].wait()
                ex.codes[r] = procs[r].returncode
            ex.status = "timeout" if ex.dead_rank is None else "failed"
            return ex
        time.sleep(0.05)


def _status_and_message(ex: _Exits, events: list[dict], grace_s: float) -> tuple[str, str]:
    status = ex.status
    if status == "ok":
        codes = set(ex.codes.values())
        if ex.dead_rank is not None or EXIT_PEER_LOST in codes:
            status = "failed"
        elif codes & {EXIT_PREEMPTED, EXIT_PREEMPTED_NO_CKPT}:
            status = "preempted"
        elif codes != {EXIT_OK}:
            status = "failed"
    message = ""
    if ex.dead_rank is not None:
        message = f"rank {ex.dead_rank} died (exit {ex.codes[ex.dead_rank]})"
        if ex.hung:
            message += f"; ranks {ex.hung} did not exit within {grace_s:.0f} s and were killed"
    elif status != "ok":
        message = "; ".join(_distinct_events(events)) or f"exit codes {ex.codes}"
    return status, message


def _distinct_events(events: list[dict]) -> list[str]:
    """The events that explain an end, each said once: every rank writes its own error line,
    most often the same one (bad input is the same for all)."""
    seen: set[str] = set()
    out = []
    for e in events:
        if e.get("event") in ("done", "started", "checkpoint"):
            continue
        key = json.dumps({k: v for k, v in e.items() if k != "rank"}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(json.dumps(e))
    return out


def _result(plan: Plan, ex: _Exits, records: list[dict], wall: float, grace_s: float,
            tails: dict[int, str]) -> LaunchResult:
    step_recs = [r for r in records if "step" in r and "loss" in r]
    status, message = _status_and_message(ex, [r for r in records if "event" in r], grace_s)
    times = [r["step_time_s"] for r in step_recs]
    steady = sorted(times[1:] or times)
    med = steady[len(steady) // 2] if steady else float("nan")
    gbs, seq = plan.global_batch_size, plan.effective_seq_len()
    return LaunchResult(
        status=status, losses=[r["loss"] for r in step_recs], steps=[r["step"] for r in step_recs],
        step_times_s=times, step_cpu_s=[r.get("cpu_time_s", 0.0) for r in step_recs],
        samples_per_s=gbs / med if steady else 0.0,
        tokens_per_s=gbs * seq / med if steady else 0.0, wall_s=wall, exit_codes=ex.codes,
        dead_rank=ex.dead_rank, hung_ranks=tuple(ex.hung), exit_times_s=ex.times_s,
        death_time_s=ex.death_time_s, message=message, stderr_tails=tails,
        peak_memory_bytes=max((r["peak_memory_bytes"] for r in step_recs if "peak_memory_bytes" in r),
                              default=None),
        val_losses={r["step"]: r["val_loss"] for r in step_recs if "val_loss" in r})


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
