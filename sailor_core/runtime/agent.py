"""The instance agent: turns a job assignment into training worker processes.

Every instance a job rents runs this agent from its startup script
(``python -m sailor_core.runtime.agent --job-url URL``).  The agent and the
train-job flow talk through small JSON documents under the job's URL (a local
directory, ``file://`` or ``s3://bucket/jobs/<job>``), so neither
needs to reach the other over the network:

- ``agents/<instance_id>/assignment.json`` (written by the flow): a generation
  number, ``action`` (``run`` or ``stop``), the plan, this instance's global
  ranks, the world size, the rendezvous address and port, the step target, the
  checkpoint URL and whether to resume.  A higher generation replaces the
  current one: the agent stops its workers and starts the new ones.  On the
  embedded cloud, ``inject_preemption`` (``at_step``, ``instance_id``,
  ``control_url``) asks the agent of rank 0 to have the cloud preempt that
  instance once its workers reach the step (``--preempt-at``): the agent sees
  each step as rank 0 writes it, the flow only some polls later, and a small
  model runs tens of steps a second.
- ``agents/<instance_id>/status.json`` (written by the agent): the generation it
  runs, its state, each rank's exit code, rank 0's per-step losses, a heartbeat,
  ``injected_preemption`` (what became of ``inject_preemption``) and under
  ``previous`` the last report of the generation it replaced.

Workers are started in the agent's own process group, so a preemption (SIGTERM
to the group, the notice period, then SIGKILL) reaches them directly and they
can make their emergency checkpoint; the agent only waits for them and reports.
No torch import here: the agent must start fast and stay small.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ASSIGNMENT = "assignment.json"
STATUS = "status.json"
POLL_S = 0.2
INJECT_POLL_S = 0.02  # while a preemption waits for its step: land it within a step or two
MAX_LOSSES = 5000  # per generation, in status.json
STOP_GRACE_S = 5.0

# Agent states in status.json
IDLE = "idle"
RUNNING = "running"
EXITED = "exited"  # every worker of the generation exited 0
FAILED = "failed"  # a worker exited non-zero
PREEMPTING = "preempting"  # the agent got SIGTERM; its workers are checkpointing
PREEMPTED = "preempted"  # ... and are gone: this report is the generation's last


# ---- the shared JSON documents (used by the flow too) --------------------------


def agent_url(job_url: str, instance_id: str) -> str:
    return f"{job_url.rstrip('/')}/agents/{instance_id}"


def write_json(url: str, data: dict[str, Any]) -> None:
    """Write a whole document at ``<root>/<key>`` (the engine's storage: path, file:// or s3://);
    readers see the old one or the new one, never half."""
    root, _, key = url.rpartition("/agents/")
    _storage(root).put_atomic(f"agents/{key}", json.dumps(data).encode())


def read_json(url: str) -> dict[str, Any] | None:
    """The document at ``url``, or None when it is missing or unreadable (being replaced)."""
    root, _, key = url.rpartition("/agents/")
    try:
        return json.loads(_storage(root).get(f"agents/{key}"))
    except (OSError, ValueError, KeyError):
        return None
    except Exception as exc:  # the storage's own not-found errors (S3 404)
        if "404" in str(exc) or "NoSuchKey" in str(exc) or "not found" in str(exc).lower():
            return None
        raise


def _storage(root: str):
    from sailor_core.storage import open_storage

    return open_storage(root)


def write_assignment(job_url: str, instance_id: str, assignment: dict[str, Any]) -> None:
    write_json(f"{agent_url(job_url, instance_id)}/{ASSIGNMENT}", assignment)


def read_status(job_url: str, instance_id: str) -> dict[str, Any] | None:
    return read_json(f"{agent_url(job_url, instance_id)}/{STATUS}")


def post_preemption(control_url: str, instance_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Ask the embedded cloud's control surface to preempt ``instance_id``.

    ``{"ok": True}``, or ``{"ok": False, "http_status": code or None, "error": why}``: an
    injected preemption that cannot be had is reported, never raised.
    """
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{control_url.rstrip('/')}/preempt", method="POST",
                                     data=json.dumps({"instance_id": instance_id}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            resp.read()
        return {"ok": True}
    except urllib.error.HTTPError as exc:
        body = exc.read()[:200].decode(errors="replace")
        return {"ok": False, "http_status": exc.code, "error": f"HTTP {exc.code} {body}".strip()}
    except OSError as exc:  # refused, unreachable, timed out
        return {"ok": False, "http_status": None, "error": f"{control_url} did not answer: {exc}"}


def worker_command(assignment: dict[str, Any], plan_path: Path, metrics_path: Path,
                   python: str = sys.executable) -> list[str]:
    """The engine's worker command line (``sailor_core/runtime/worker.py``), or with ``module`` in the
    assignment another of Sailor's jobs on the same instances (the network profiler's
    ``sailor_core.profiler.net_worker``): ``python -m MODULE --metrics-file PATH`` + extra_worker_args."""
    module = assignment.get("module")
    if module:
        if not str(module).startswith("sailor_core."):  # the documents may start Sailor's own jobs only
            raise ValueError(f"assignment names module {module!r}, which is not one of Sailor's")
        return [python, "-m", str(module), "--metrics-file", str(metrics_path),
                *(str(a) for a in assignment.get("extra_worker_args", ()))]
    cmd = [
        python, "-m", "sailor_core.runtime.worker",
        "--plan", str(plan_path),
        "--steps", str(int(assignment["steps"])),
        "--data", str(assignment["data"]),
        "--ckpt-dir", str(assignment["ckpt_url"]),
        "--ckpt-every", str(int(assignment["ckpt_every"])),
        "--seed", str(int(assignment.get("seed", 0))),
        "--metrics-file", str(metrics_path),  # rank 0 writes it; the agent forwards it in status.json
    ]
    if assignment.get("resume"):
        cmd.append("--resume")
    cmd += [str(a) for a in assignment.get("extra_worker_args", ())]
    return cmd


# ---- the agent -----------------------------------------------------------------


@dataclass(slots=True)
class _Generation:
    number: int
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # global rank -> process
    exit_codes: dict[int, int] = field(default_factory=dict)
    log_dir: Path | None = None
    metrics_offset: int = 0
    losses: list[list[float]] = field(default_factory=list)  # [step, loss] as rank 0 reported them
    last_event: dict[str, Any] | None = None
    samples_per_s: float | None = None
    inject: dict[str, Any] | None = None  # the assignment's inject_preemption, until done
    injected: dict[str, Any] | None = None  # what became of it


class Agent:
    def __init__(self, job_url: str, instance_id: str, work_dir: Path) -> None:
        self.job_url = job_url
        self.instance_id = instance_id
        self.base = agent_url(job_url, instance_id)
        self.work_dir = work_dir
        self.current: _Generation | None = None
        self.previous: dict[str, Any] | None = None  # the replaced generation's last report
        self.terminating = False
        self.final = False
        self._last_status: dict[str, Any] | None = None
        self._last_status_s = 0.0

    # -- workers --
    def _start(self, assignment: dict[str, Any]) -> _Generation:
        gen = _Generation(number=int(assignment["generation"]))
        if assignment.get("action", "run") != "run":
            return gen
        gen.inject = assignment.get("inject_preemption") or None
        log_dir = self.work_dir / f"gen{gen.number}"
        log_dir.mkdir(parents=True, exist_ok=True)
        gen.log_dir = log_dir
        plan_path = log_dir / "plan.json"
        plan_path.write_text(json.dumps(assignment["plan"]))
        ranks = [int(r) for r in assignment["ranks"]]
        cmd = worker_command(assignment, plan_path, log_dir / "metrics.jsonl")
        for local_rank, rank in enumerate(ranks):
            env = {
                **os.environ,
                **{str(k): str(v) for k, v in assignment.get("env", {}).items()},
                "MASTER_ADDR": str(assignment["master_addr"]),
                "MASTER_PORT": str(assignment["master_port"]),
                "RANK": str(rank),
                "WORLD_SIZE": str(int(assignment["world_size"])),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(len(ranks)),
                "SAILOR_ATTEMPT": str(assignment.get("attempt", 0)),
                "SAILOR_GENERATION": str(gen.number),
            }
            log = open(log_dir / f"rank{rank}.log", "ab")
            # Same process group as the agent: a preemption's SIGTERM reaches the workers.
            gen.procs[rank] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, cwd=assignment.get("cwd") or None)
            log.close()
        return gen

    def _stop(self, gen: _Generation, grace_s: float = STOP_GRACE_S) -> None:
        live = [p for p in gen.procs.values() if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._collect(gen)

    @staticmethod
    def _collect(gen: _Generation) -> None:
        for rank, p in gen.procs.items():
            code = p.poll()
            if code is not None:
                gen.exit_codes[rank] = code
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
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "event" in record:
                gen.last_event = record
            elif "step" in record and "loss" in record:
                gen.losses.append([int(record["step"]), float(record["loss"])])
                gen.samples_per_s = record.get("samples_per_s")

    def _maybe_inject(self, gen: _Generation) -> None:
        """Post the assignment's injected preemption once rank 0 has reached its step."""
        want = gen.inject
        if not want or not gen.losses or gen.losses[-1][0] < int(want["at_step"]):
            return
        gen.inject = None
        step = gen.losses[-1][0]
        gen.injected = {"at_step": int(want["at_step"]), "step": step, "instance_id": want["instance_id"],
                        **post_preemption(str(want["control_url"]), str(want["instance_id"]))}

    def _state(self) -> str:
        gen = self.current
        if self.terminating:
            return PREEMPTED if self.final else PREEMPTING
        if gen is None or not gen.procs:
            return IDLE
        if any(code != 0 for code in gen.exit_codes.values()):
            return FAILED
        if len(gen.exit_codes) == len(gen.procs):
            return EXITED
        return RUNNING

    def _report(self, force: bool = False) -> None:
        status = self._status_body()
        now = time.time()
        if force or status != self._last_status or now - self._last_status_s > 1.0:
            write_json(f"{self.base}/{STATUS}", {**status, "heartbeat_unix_s": now})
            self._last_status, self._last_status_s = status, now

    def _status_body(self) -> dict[str, Any]:
        gen = self.current
        return {
            "instance_id": self.instance_id,
            "generation": gen.number if gen else -1,
            "state": self._state(),
            "exit_codes": {str(r): c for r, c in sorted(gen.exit_codes.items())} if gen else {},
            "pids": {str(r): p.pid for r, p in gen.procs.items()} if gen else {},
            "log_dir": str(gen.log_dir) if gen and gen.log_dir else None,
            "step": gen.losses[-1][0] if gen and gen.losses else None,
            "losses": gen.losses[-MAX_LOSSES:] if gen else [],
            "samples_per_s": gen.samples_per_s if gen else None,
            "event": gen.last_event if gen else None,
            "injected_preemption": gen.injected if gen else None,
            "previous": self.previous,
        }

    # -- main loop --
    def run(self, *, max_idle_s: float | None = None) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        idle_since = time.monotonic()
        self._report(force=True)
        while not self.terminating:
            assignment = read_json(f"{self.base}/{ASSIGNMENT}")
            if assignment is not None and (self.current is None or int(assignment["generation"]) > self.current.number):
                if self.current is not None:
                    self._stop(self.current)
                    self.previous = {k: v for k, v in self._status_body().items() if k != "previous"}
                self.current = self._start(assignment)
                self._report(force=True)
                if assignment.get("action") == "shutdown":
                    return 0
            if self.current is not None:
                self._collect(self.current)
                self._maybe_inject(self.current)
                idle_since = time.monotonic() if self._state() == RUNNING else idle_since
            if max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                return 0
            self._report()
            pending = self.current is not None and self.current.inject and self._state() == RUNNING
            time.sleep(INJECT_POLL_S if pending else POLL_S)
        # Preempted: the workers got the same SIGTERM and checkpoint within the notice period.
        # Keep forwarding their metrics meanwhile: the SIGKILL may come before they are done.
        gen = self.current
        deadline = time.monotonic() + float(os.environ.get("SAILOR_NOTICE_S", "30"))
        while gen is not None and time.monotonic() < deadline and any(p.poll() is None for p in gen.procs.values()):
            self._collect(gen)
            self._report()
            time.sleep(POLL_S / 2)
        if gen is not None:
            self._stop(gen, grace_s=0.0)
        self.final = True
        self._report(force=True)
        return 128 + signal.SIGTERM

    def _on_sigterm(self, signum, frame) -> None:
        self.terminating = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sailor_core.runtime.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--job-url", required=True, help="the job's directory, file:// or s3:// URL")
    parser.add_argument("--instance-id", default=os.environ.get("SAILOR_INSTANCE_ID"))
    parser.add_argument("--work-dir", default=None, help="local directory for plans and worker logs")
    parser.add_argument("--max-idle-s", type=float, default=None,
                        help="exit after this long with no running workers (default: never)")
    args = parser.parse_args(argv)
    if not args.instance_id:
        sys.stderr.write("error: no instance id (--instance-id or SAILOR_INSTANCE_ID)\n")
        return 2
    # The embedded cloud gives each instance a directory; elsewhere the temp dir.
    default_dir = (Path(os.environ["SAILOR_INSTANCE_DIR"]) / "agent" if os.environ.get("SAILOR_INSTANCE_DIR")
                   else Path(os.environ.get("TMPDIR", "/tmp")) / f"sailor-agent-{args.instance_id}")
    work_dir = Path(args.work_dir or default_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    return Agent(args.job_url, args.instance_id, work_dir).run(max_idle_s=args.max_idle_s)


if __name__ == "__main__":
    sys.exit(main())
