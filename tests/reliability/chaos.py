"""Chaos harness: train-job flows on the embedded local cloud, faults at seeded random points.

One ``ChaosEnv`` holds a Prefect server and a standalone embedded cloud (both outlive
any flow process, as they would in production); each trial runs the ``train_job``
flow in its own process (``python -m tests.reliability.chaos flow PARAMS``) so the harness can
SIGKILL it and start it again with the same job id.  Faults, fired one at a time
when the job's live step reaches a seeded random step, each after the previous one
has recovered:

- ``preempt``          one of the job's instances (notice, SIGTERM, SIGKILL) through the cloud's control API
- ``preempt_zone``     every instance in the zone of one of the job's instances
- ``kill_worker``      SIGKILL one training worker process
- ``kill_flow``        SIGKILL the flow process, then start a new one for the same job
- ``delay_upload``     one rank's next checkpoint file upload waits ``UPLOAD_DELAY_S``
- ``fail_upload``      one rank's next checkpoint file upload fails (a partial checkpoint)
- ``corrupt_checkpoint`` flip bytes in the newest committed checkpoint, then SIGKILL a worker:
                       the restart must skip it (manifest checksum) and use the previous one

A trial passes when the job succeeds with final parameters equal to an uninterrupted
run of the same plan on the same samples, redoes at most one checkpoint interval of
steps per fault, spends within its budget, leaves no instance of its label running,
and never resumes from a corrupted checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.local.confine import host_pid
from sailor_core import settings
from sailor_core.errors import SailorError
from sailor_core.runtime import faults
from sailor_core.runtime.faults import FaultConfig
from sailor_core.storage import open_storage

KINDS = ("preempt", "preempt_zone", "kill_worker", "kill_flow", "delay_upload", "fail_upload",
         "corrupt_checkpoint")
# Faults that break the running attempt: each may cost up to one checkpoint interval of steps.
BREAKING = frozenset({"preempt", "preempt_zone", "kill_worker", "kill_flow", "fail_upload"})
UPLOAD_DELAY_S = 3.0
POLL_S = 0.2
ROOT = Path(__file__).resolve().parents[2]  # the repository: flow processes run from it


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    kind: str
    at_step: int


@dataclass(slots=True, kw_only=True)
class FaultRecord:
    kind: str
    at_step: int
    fired_step: int
    fired_unix_s: float
    generation: int  # highest agent generation when it fired
    detail: str = ""
    recovered_unix_s: float | None = None

    @property
    def recover_s(self) -> float | None:
        return None if self.recovered_unix_s is None else self.recovered_unix_s - self.fired_unix_s


@dataclass(slots=True, kw_only=True)
class TrialResult:
    seed: int
    job_id: str
    passed: bool
    failures: list[str]
    status: str
    faults: list[FaultRecord]
    steps: int
    steps_executed: int
    steps_redone: int
    redo_bound: int
    usd_spent: float
    budget_usd: float
    instances_left_running: int
    max_abs_param_diff: float | None
    bitwise_equal: bool | None
    wall_s: float
    num_flow_runs: int
    resumed_from: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = [{**asdict(f), "recover_s": f.recover_s} for f in self.faults]
        return d


def plan_faults(seed: int, *, steps: int, ckpt_every: int, num_faults: int,
                kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """Seeded fault kinds at distinct random steps, spread over the run (not the very end)."""
    rng = random.Random(seed)
    lo, hi = 2, max(3, steps - 2)
    at = sorted(rng.sample(range(lo, hi), k=min(num_faults, hi - lo)))
    return [Fault(kind=rng.choice(kinds), at_step=s) for s in at]


# ---- the environment: a Prefect server and a standalone embedded cloud ----------------


class ChaosEnv:
    """SAILOR_HOME in a temp dir, a Prefect server and ``python -m infra.local.daemon`` in it."""

    def __init__(self, home: str | Path | None = None, *, notice_s: float = 2.0) -> None:
        self.home = Path(home or tempfile.mkdtemp(prefix="sailor-chaos-"))
        self.notice_s = notice_s
        self.fault_file = self.home / "upload_fault.json"
        self.cloud_proc: subprocess.Popen | None = None
        self.api_url: str | None = None
        self.cloud: dict[str, Any] = {}
        self._saved_env: dict[str, str | None] = {}

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({settings.HOME_ENV: str(self.home), settings.CLOUDS_ENV: "embedded"}, PYTHONPATH=str(ROOT),
                   PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING",
                   PREFECT_HOME=str(self.home / "prefect"), **self.faults().to_env())
        # A killed flow's restart waits out its lease (sailor_core/job/lease.py): short here, as trials restart at once.
        env[settings.JOB_LEASE_S_ENV] = "10"
        if self.api_url:
            env["PREFECT_API_URL"] = self.api_url
        return env

    def faults(self) -> FaultConfig:
        """What every worker of the trials may take: the upload faults ``_fire`` arms."""
        return FaultConfig(upload_file=str(self.fault_file))

    def start(self) -> ChaosEnv:
        self.home.mkdir(parents=True, exist_ok=True)
        self._saved_env = {k: os.environ.get(k) for k in (settings.HOME_ENV, settings.CLOUDS_ENV, "AWS_ENDPOINT_URL_S3",
                                                          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ[settings.HOME_ENV] = str(self.home)  # this process queries the same cloud and jobs
        os.environ[settings.CLOUDS_ENV] = "embedded"
        from flows.cli.prefect_server import start_local_server

        self.api_url = start_local_server(port=0, timeout_s=300.0)  # slow on a loaded machine
        log = open(self.home / "cloud.log", "ab")
        self.cloud_proc = subprocess.Popen(
            # the audit reads rank 0's step records from the ended instances' disks (_executed_steps)
            [sys.executable, "-m", "infra.local.daemon", "--notice-s", str(self.notice_s), "--keep-ended-disks"],
            env=self.env(), cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        from infra.config import standalone_state

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = standalone_state()
            if state is not None and state.get("pid") == self.cloud_proc.pid:
                self.cloud = state
                # This process reads the jobs' prefixes of the cloud's bucket, with its administrator's keys.
                os.environ.update(AWS_ENDPOINT_URL_S3=state["aws_endpoint"], AWS_ACCESS_KEY_ID=state["aws_keys"][0],
                                  AWS_SECRET_ACCESS_KEY=state["aws_keys"][1])
                return self
            if self.cloud_proc.poll() is not None:
                raise SailorError(f"embedded cloud exited; see {self.home / 'cloud.log'}")
            time.sleep(0.3)
        raise SailorError("embedded cloud did not start within 60 s")

    def stop(self) -> None:
        from flows.cli.prefect_server import stop_local_server

        if self.cloud_proc is not None and self.cloud_proc.poll() is None:
            self.cloud_proc.send_signal(signal.SIGTERM)
            try:
                self.cloud_proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.cloud_proc.pid, signal.SIGKILL)
        stop_local_server()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __enter__(self) -> ChaosEnv:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the cloud, as the harness sees it --
    def providers(self) -> dict:
        from infra.local.cloud import providers_for

        return providers_for(self.cloud["aws_endpoint"], self.cloud["gce_endpoint"], aws_keys=self.cloud["aws_keys"])

    def live_instances(self, job_id: str) -> list:
        from infra.records import job_labels

        return [i for p in self.providers().values() for i in p.query_instances(job_labels(job_id)) if i.live]

    def control(self, route: str, body: dict) -> dict:
        from infra.config import control_headers

        req = urllib.request.Request(f"{self.cloud['control_url']}/{route}", method="POST",
                                     data=json.dumps(body).encode(), headers=control_headers(self.cloud))
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:  # e.g. 404: the instance ended meanwhile
            return {"error": exc.code}

    def instance_dir(self, instance_id: str) -> Path:
        return Path(self.cloud["state_dir"]) / "instances" / instance_id

    def jobs_url(self) -> str:
        return str(self.home / "jobs")


# ---- one trial --------------------------------------------------------------------------


def _flow_params(job_id: str, *, steps: int, ckpt_every: int, budget_usd: float, seed: int) -> dict:
    return dict(model="tiny", budget_usd=budget_usd, steps=steps, checkpoint_every_steps=ckpt_every,
                global_batch_size=64, cloud="embedded", max_gpus=2, max_gpus_per_zone=2, job_id=job_id,
                seed=seed)


def _start_flow(env: ChaosEnv, params: dict, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "tests.reliability.chaos", "flow", json.dumps(params)],
                                env=env.env(), cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()


class _Watcher:
    """What the agents report (in the job's prefix of the cloud's bucket): their generations, live steps
    and worker pids."""

    def __init__(self, env: ChaosEnv, job_id: str) -> None:
        self.cloud, self.job_id = env.cloud, job_id

    def statuses(self) -> list[dict]:
        from tasks.embedded_bucket import agent_reports

        return agent_reports(self.job_id, ends=self.cloud)

    def snapshot(self) -> tuple[int, int | None, list[int]]:
        """(highest generation, live step of it, its worker pids on this machine: an instance's own
        numbers are of its PID namespace when confined)."""
        sts = self.statuses()
        if not sts:
            return -1, None, []
        gen = max(int(s.get("generation", -1)) for s in sts)
        of_gen = [s for s in sts if int(s.get("generation", -1)) == gen]
        cur = [s for s in of_gen if s.get("state") == "running"]
        # Its step even once it has ended: a short attempt may run to its end between two polls of the bucket.
        steps = [int(s["step"]) for s in of_gen if s.get("step") is not None]
        pids = [hp for s in cur for p in (s.get("pids") or {}).values() if (hp := host_pid(s["instance_id"], int(p)))]
        return gen, (max(steps) if steps else None), pids


def _newest_committed(ckpt_url: str) -> str | None:
    """The newest checkpoint directory with a manifest, in the job's bucket (where the instances keep them)."""
    store = open_storage(ckpt_url)
    dirs = sorted((d for d in store.list_dirs() if d.startswith("step_") and store.exists(f"{d}/MANIFEST.json")),
                  reverse=True)
    return dirs[0] if dirs else None


def _running_instances(env: ChaosEnv, job_id: str) -> list[tuple[str, str]]:
    """(instance id, zone) of the job's instances that the job state and the cloud both call running."""
    from sailor_core.job import state as js

    try:
        state = js.JobStore(env.jobs_url()).load(job_id)
    except SailorError:
        return []
    live = {i.instance_id for i in env.live_instances(job_id)}
    return [(r.instance_id, r.zone) for r in state.running_instances() if r.instance_id in live]


def _fire(env: ChaosEnv, fault: Fault, job_id: str, pids: list[int], ckpt_dir: str,
          flow: subprocess.Popen, rng: random.Random) -> str | None:
    """Inject one fault; returns what was done, or None when it cannot be injected yet (retry later)."""
    if fault.kind in ("preempt", "preempt_zone"):
        live = _running_instances(env, job_id)
        if not live:
            return None
        victim, zone = rng.choice(live)
        if fault.kind == "preempt":
            out = env.control("preempt", {"instance_id": victim})
            return None if "error" in out else f"preempted {victim}"
        out = env.control("preempt", {"zone": zone})
        return f"preempted zone {zone}: {out.get('preempted')}" if out.get("preempted") else None
    if fault.kind == "kill_worker":
        pid = rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"SIGKILL worker pid {pid}"
    if fault.kind == "kill_flow":
        os.kill(flow.pid, signal.SIGKILL)
        flow.wait()
        return f"SIGKILL flow pid {flow.pid}"
    if fault.kind in ("delay_upload", "fail_upload"):
        armed = faults.arm_upload(env.fault_file, delay_s=UPLOAD_DELAY_S, fail=fault.kind == "fail_upload")
        return f"next upload: {armed}"
    if fault.kind == "corrupt_checkpoint":
        newest = _newest_committed(ckpt_dir)
        if newest is None or not pids:
            return None
        store = open_storage(f"{ckpt_dir}/{newest}")
        manifest = json.loads(store.get("MANIFEST.json"))
        names = sorted(n for n in manifest["files"] if n.startswith("layer_") and n.endswith(".pt"))
        if not names:
            return None
        data = bytearray(store.get(names[0]))
        for i in range(len(data) // 2, min(len(data), len(data) // 2 + 16)):
            data[i] ^= 0xFF
        store.put(names[0], bytes(data))
        os.kill(rng.choice(pids), signal.SIGKILL)
        return f"corrupted {newest}/{names[0]}"
    raise SailorError(f"unknown fault kind {fault.kind!r}")


def run_trial(env: ChaosEnv, seed: int, *, steps: int = 20, ckpt_every: int = 4, budget_usd: float = 0.05,
              num_faults: int = 2, kinds: tuple[str, ...] = KINDS, timeout_s: float = 420.0,
              references: dict | None = None, observer=None, flow_overrides: dict | None = None) -> TrialResult:
    """One seeded trial; ``observer(pids)``, if given, sees the live worker pids at every poll."""
    from sailor_core.job import state as js

    rng = random.Random(seed * 7919 + 1)
    faults = plan_faults(seed, steps=steps, ckpt_every=ckpt_every, num_faults=num_faults, kinds=kinds)
    job_id = f"chaos-{seed}-{os.urandom(2).hex()}"
    params = {**_flow_params(job_id, steps=steps, ckpt_every=ckpt_every, budget_usd=budget_usd, seed=seed),
              **(flow_overrides or {})}
    store = js.JobStore(env.jobs_url())
    from tasks.embedded_bucket import EMBEDDED_BUCKET  # lazy: Prefect, for the trials only

    ckpt_dir = f"s3://{EMBEDDED_BUCKET}/{job_id}/checkpoints"  # the job's prefix of the embedded cloud's bucket
    log_path = env.home / f"{job_id}.flow.log"
    watcher = _Watcher(env, job_id)
    env.fault_file.unlink(missing_ok=True)
    t0 = time.time()
    flow = _start_flow(env, params, log_path)
    records: list[FaultRecord] = []
    pending = list(faults)
    corrupted: list[tuple[str, int]] = []  # (dirname, generation when corrupted)
    failures: list[str] = []
    _watch(env, job_id, pending, records, corrupted, failures, params, log_path, watcher, ckpt_dir,
           rng, t0, timeout_s, observer, flow)
    wall_s = time.time() - t0
    return _verify(env, store, job_id, seed=seed, steps=steps, ckpt_every=ckpt_every, records=records,
                   corrupted=corrupted, failures=failures, wall_s=wall_s, references=references)


def _watch(env, job_id, pending, records, corrupted, failures, params, log_path, watcher, ckpt_dir,
           rng, t0, timeout_s, observer, flow) -> None:
    """Fire the faults as the job reaches their steps; return when the flow process has ended."""
    flows = [flow]
    try:
        _watch_loop(env, job_id, pending, records, corrupted, failures, params, log_path, watcher, ckpt_dir,
                    rng, t0, timeout_s, observer, flows)
    finally:  # an interrupted harness (Ctrl-C, a test timeout) must not leave a flow process behind
        killed = [f for f in flows if f.poll() is None]
        for f in killed:
            _kill_group(f)
        if killed:  # ... nor the instances that flow would have terminated
            from infra.records import job_labels

            for p in env.providers().values():
                p.terminate_instances(job_labels(job_id))


def _watch_loop(env, job_id, pending, records, corrupted, failures, params, log_path, watcher, ckpt_dir,
                rng, t0, timeout_s, observer, flows) -> None:
    flow = flows[-1]
    restart_at: float | None = None
    while True:
        if time.time() - t0 > timeout_s:
            failures.append(f"timed out after {timeout_s:.0f} s")
            _kill_group(flow)
            break
        gen, step, pids = watcher.snapshot()
        if observer is not None and pids:
            observer(pids)
        last = records[-1] if records else None
        if last is not None and last.recovered_unix_s is None and gen > last.generation and step is not None:
            last.recovered_unix_s = time.time()
        if restart_at is not None and time.time() >= restart_at:
            flow = _start_flow(env, params, log_path)
            flows.append(flow)
            restart_at = None
        ready = last is None or last.recovered_unix_s is not None or last.kind not in BREAKING | {"corrupt_checkpoint"}
        if pending and ready and step is not None and step >= pending[0].at_step and pids:
            fault = pending[0]
            detail = _fire(env, fault, job_id, pids, ckpt_dir, flow, rng)
            if detail is None:
                time.sleep(POLL_S)
                continue
            pending.pop(0)
            rec = FaultRecord(kind=fault.kind, at_step=fault.at_step, fired_step=step, fired_unix_s=time.time(),
                              generation=gen, detail=detail)
            if fault.kind not in BREAKING | {"corrupt_checkpoint"}:
                rec.recovered_unix_s = rec.fired_unix_s  # nothing to recover from
            if fault.kind == "corrupt_checkpoint" and detail.startswith("corrupted"):
                corrupted.append((detail.split()[1].split("/")[0], gen))
            records.append(rec)
            if fault.kind == "kill_flow":
                restart_at = time.time() + 1.0
            continue
        if restart_at is None and flow.poll() is not None:
            break
        time.sleep(POLL_S)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _executed_steps(env: ChaosEnv, state) -> tuple[int, list[str], dict[int, int]]:
    """Rank 0's step records over every generation on every instance of the job, its resume lines,
    and the highest step each generation trained."""
    executed = 0
    resumed: list[str] = []
    max_step: dict[int, int] = {}
    for rec in state.instances:
        agent = env.instance_dir(rec.instance_id) / "root" / "agent"  # the instance's own disk
        for gen_dir in sorted(agent.glob("gen*"), key=lambda p: int(p.name[3:])):
            metrics = gen_dir / "metrics.jsonl"
            if metrics.exists():
                for line in metrics.read_text().splitlines():
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    if "loss" in r and "step" in r:
                        executed += 1
                        gen = int(gen_dir.name[3:])
                        max_step[gen] = max(max_step.get(gen, 0), int(r["step"]))
            for log in gen_dir.glob("rank*.log"):
                for line in log.read_text(errors="replace").splitlines():
                    if "resumed from" in line and "rank 0]" in line:
                        resumed.append(f"{gen_dir.name}:{line.split('resumed from ')[1].split()[0]}")
    resumed.sort(key=lambda r: int(r.split(":")[0][3:]))
    return executed, resumed, max_step


def corrupt_resumes(corrupted: list[tuple[str, int]], resumed: list[str], max_step: dict[int, int]) -> list[str]:
    """The corrupted checkpoint directories the job resumed from while they still held corrupted data.

    ``resumed`` holds ``gen<N>:<dirname>`` in generation order. A generation that trained to the
    corrupted step again, after falling back to an older checkpoint, re-committed that directory
    with good data; a later resume from it is right.
    """
    bad = []
    for dirname, gen in corrupted:
        after = [r for r in resumed if int(r.split(":")[0][3:]) > gen]
        if not after or after[0].split(":")[1] != dirname:
            continue
        resume_gen, ckpt_step = int(after[0].split(":")[0][3:]), int(dirname.split("_")[-1])
        if not any(max_step.get(g, 0) >= ckpt_step for g in range(gen + 1, resume_gen)):
            bad.append(dirname)
    return bad


def _final_params_diff(ckpt_dir: str | Path, ref_dir: Path, steps: int) -> tuple[float | None, bool | None, str]:
    import torch

    from sailor_core.runtime import checkpoint as ckpt
    from sailor_core.storage import open_storage

    a = ckpt.latest_valid_checkpoint(str(ckpt_dir))
    b = ckpt.latest_valid_checkpoint(str(ref_dir))
    if a is None or b is None or a.step != steps or b.step != steps:
        return None, None, f"final checkpoints: job {a and a.step}, reference {b and b.step}, want {steps}"
    sa, sb = open_storage(str(ckpt_dir)), open_storage(str(ref_dir))
    names = sorted(n for n in a.files if n.startswith("layer_"))
    if names != sorted(n for n in b.files if n.startswith("layer_")):
        return None, None, "the checkpoints hold different layers"
    worst, bitwise = 0.0, True
    for name in names:
        idx = int(name[6:10])
        pa, pb = ckpt.read_layer(sa, a, idx)["params"], ckpt.read_layer(sb, b, idx)["params"]
        for key in pa:
            bitwise &= torch.equal(pa[key], pb[key])
            worst = max(worst, float((pa[key] - pb[key]).abs().max()))
    return worst, bitwise, ""


def _reference(env: ChaosEnv, plan_dict: dict, *, steps: int, seed: int,
               references: dict | None) -> tuple[Path, float]:
    """An uninterrupted run of the same plan on the same samples, with a final checkpoint (cached)."""
    from sailor_core.job import state as js
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.runtime.launch import launch_local

    key = json.dumps({"plan": plan_dict, "steps": steps, "seed": seed}, sort_keys=True)
    if references is not None and key in references:
        return references[key]
    work = Path(tempfile.mkdtemp(prefix="ref-", dir=env.home))
    data = settings.sailor_home() / "data" / f"synthetic-tiny-seed{seed}.npy"
    res = launch_local(plan_from_dict(plan_dict), steps, data=data, seed=seed, workdir=work,
                       ckpt_dir=str(work / "ckpt"), ckpt_every=0)
    if res.status != "ok":
        raise SailorError(f"reference run failed: {res.message}")
    if references is not None:
        references[key] = (work / "ckpt", res.losses[-1])
    return work / "ckpt", res.losses[-1]


def _numerics_key(plan: dict) -> str:
    """The parts of a plan that change the arithmetic (not where it runs)."""
    keep = {k: v for k, v in plan.items() if k not in ("stages",)}
    keep["stages"] = [{"layers": s.get("layers"), "replicas": [{"tp_degree": r.get("tp_degree"),
                                                               "micro_batch_size": r.get("micro_batch_size")}
                                                              for r in s["replicas"]]}
                      for s in plan["stages"]]
    return json.dumps(keep, sort_keys=True)


def _verify(env: ChaosEnv, store, job_id: str, *, seed: int, steps: int, ckpt_every: int,
            records: list[FaultRecord], corrupted: list[tuple[str, int]], failures: list[str],
            wall_s: float, references: dict | None) -> TrialResult:
    try:
        state = store.load(job_id)
    except SailorError as exc:
        return TrialResult(seed=seed, job_id=job_id, passed=False, failures=failures + [str(exc)], status="missing",
                           faults=records, steps=steps, steps_executed=0, steps_redone=0, redo_bound=0,
                           usd_spent=0.0, budget_usd=0.0, instances_left_running=-1, max_abs_param_diff=None,
                           bitwise_equal=None, wall_s=wall_s, num_flow_runs=0)
    if state.status != "succeeded":
        failures.append(f"job {state.status}: {state.status_reason}")
    # Instances end asynchronously after the flow's teardown; give the cloud a moment.
    deadline = time.monotonic() + 15
    live = env.live_instances(job_id)
    while live and time.monotonic() < deadline:
        time.sleep(0.5)
        live = env.live_instances(job_id)
    if live:
        failures.append(f"{len(live)} instances left running: {[i.instance_id for i in live]}")
        for p in env.providers().values():  # do not let one bad trial bill the next ones
            from infra.records import job_labels

            p.terminate_instances(job_labels(job_id))
    spent = state.usd_spent(state.updated_unix_s)
    if spent > state.spec.budget_usd:
        failures.append(f"spent {spent:.6f} > budget {state.spec.budget_usd:.6f} USD")
    executed, resumed, max_step = _executed_steps(env, state)
    redone = executed - steps
    num_breaking = sum(r.kind in BREAKING for r in records) + 2 * sum(r.kind == "corrupt_checkpoint" for r in records)
    bound = ckpt_every * num_breaking
    if redone > bound:
        failures.append(f"{redone} steps redone > {bound} (one interval of {ckpt_every} per fault)")
    failures.extend(f"resumed from corrupted checkpoint {d}" for d in corrupt_resumes(corrupted, resumed, max_step))
    diff = bitwise = None
    if state.status == "succeeded" and state.plan:
        plans = {_numerics_key(r.plan) for r in state.replans}
        try:
            ref, ref_loss = _reference(env, state.plan, steps=steps, seed=seed, references=references)
            diff, bitwise, why = _final_params_diff(state.spec.checkpoint_url, ref, steps)
            if state.steps_done != steps or state.last_loss is None or \
                    abs(state.last_loss - ref_loss) > 1e-5 * max(1.0, abs(ref_loss)):
                failures.append(f"job reports step {state.steps_done}, loss {state.last_loss}; "
                                f"the uninterrupted run ends at step {steps} with loss {ref_loss}")
        except SailorError as exc:
            why = str(exc)
        if diff is None:
            failures.append(f"final parameters not compared: {why}")
        elif len(plans) == 1 and not bitwise:
            failures.append(f"final parameters differ from the uninterrupted run (max |diff| {diff:.3g}) "
                            "although every attempt ran the same plan arithmetic")
        elif diff > PARAM_TOLERANCE:
            failures.append(f"final parameters differ by {diff:.3g} > {PARAM_TOLERANCE}")
    return TrialResult(seed=seed, job_id=job_id, passed=not failures, failures=failures, status=state.status,
                       faults=records, steps=steps, steps_executed=executed, steps_redone=redone,
                       redo_bound=bound, usd_spent=spent, budget_usd=state.spec.budget_usd,
                       instances_left_running=len(live), max_abs_param_diff=diff, bitwise_equal=bitwise,
                       wall_s=wall_s, num_flow_runs=state.num_flow_runs, resumed_from=resumed)


# When attempts ran under different plans (another DP/TP split sums in another order), fp32
# rounding differs: parameters of the tiny model (lr 1e-3) then agree to about this much.
PARAM_TOLERANCE = 1e-4


def _flow_main(params_json: str) -> int:
    from flows.cli.prefect_server import configure_prefect_env

    configure_prefect_env()
    from flows.train_job import train_job

    summary = train_job(**json.loads(params_json))
    print("SUMMARY " + json.dumps(summary), flush=True)
    return 0 if summary.get("status") == "succeeded" else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "flow":
        sys.exit(_flow_main(sys.argv[2]))
    sys.stderr.write("usage: python -m tests.reliability.chaos flow PARAMS_JSON\n")
    sys.exit(2)
