"""Security: no credential leaks, private listening addresses, private encrypted buckets.

Real parts: torch workers (gloo) whose listening sockets are read from /proc, moto's
S3 server for buckets, the embedded cloud's machines, and (slow) a whole train job on
the embedded cloud under a real Prefect server with canary secrets planted.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sailor_core.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WILDCARDS = {"0.0.0.0", "::"}


# ---- listening sockets from /proc ---------------------------------------------------------


def _decode(addr_hex: str) -> str:
    if len(addr_hex) == 8:
        return socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr_hex)[::-1])
    raw = bytes.fromhex(addr_hex)
    # /proc/net/tcp6 prints four host-order 32-bit words
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                addr, port = parts[1].split(":")
                out.append((_decode(addr), int(port, 16)))
    return out


def test_rendezvous_and_worker_ports_listen_on_the_private_address_only(tmp_path):
    """Workers as an instance's agent starts them (rank 0 hosts the store): nothing listens on 0.0.0.0/::."""
    plan = {"model": "tiny", "global_batch_size": 4, "micro_batch_size": 2,
            "stages": [{"layers": [0, 4], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local"},
                                                       {"gpu": "cpu", "tp": 1, "zone": "local"}]}]}
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.runtime.launch import ensure_corpus

    data = ensure_corpus(tmp_path, plan_from_dict(plan))
    port, stop_file, metrics = free_port(), tmp_path / "stop", tmp_path / "metrics.jsonl"
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_USE_AGENT_STORE"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", SAILOR_PREEMPT_FILE=str(stop_file),
                   PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sailor_core.runtime.worker", "--plan", str(plan_path), "--steps", "100000",
             "--data", str(data), "--threads", "1", "--timeout-s", "60", "--metrics-file", str(metrics)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
            assert all(p.poll() is None for p in procs), "a worker exited before training"
            time.sleep(0.2)
        assert metrics.exists(), "the workers did not start training"
        found = {rank: listening_sockets(p.pid) for rank, p in enumerate(procs)}
    finally:
        stop_file.write_text("stop")
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    every = [a for socks in found.values() for a in socks]
    assert ("127.0.0.1", port) in found[0], f"rank 0 hosts the rendezvous store on MASTER_ADDR: {found}"
    assert every, "no listening socket seen"
    assert not [a for a in every if a[0] in WILDCARDS], f"a port listens on every interface: {found}"


# ---- buckets (moto's S3 server) --------------------------------------------------------------


def test_checkpoint_bucket_is_created_private_and_encrypted(moto_s3):
    import boto3

    from infra.buckets import ensure_private_bucket
    from sailor_core.storage import open_storage

    report = ensure_private_bucket("s3://sailor-ckpt-sec/jobs/j1/checkpoints")
    assert report.created and report.public_access_blocked and report.encryption == "AES256"
    s3 = boto3.client("s3")
    block = s3.get_public_access_block(Bucket="sailor-ckpt-sec")["PublicAccessBlockConfiguration"]
    assert block == {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                     "RestrictPublicBuckets": True}
    rule = s3.get_bucket_encryption(Bucket="sailor-ckpt-sec")["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    owner = s3.get_bucket_ownership_controls(Bucket="sailor-ckpt-sec")["OwnershipControls"]["Rules"][0]
    assert owner["ObjectOwnership"] == "BucketOwnerEnforced"
    # The engine's own S3 client then writes checkpoints into it.
    store = open_storage("s3://sailor-ckpt-sec/jobs/j1/checkpoints")
    store.put("step_00000001/x", b"data")
    assert store.get("step_00000001/x") == b"data"
    # A second call finds it and only checks it.
    again = ensure_private_bucket("s3://sailor-ckpt-sec/other")
    assert not again.created and again.public_access_blocked


def test_an_existing_bucket_open_to_the_public_is_refused(moto_s3):
    import boto3

    from infra.buckets import ensure_private_bucket
    from infra.errors import CloudConfigError

    boto3.client("s3").create_bucket(Bucket="someone-elses-open-bucket")
    with pytest.raises(CloudConfigError, match="does not block public access"):
        ensure_private_bucket("s3://someone-elses-open-bucket/ckpt")
    assert ensure_private_bucket("/local/dir") is None and ensure_private_bucket("file:///x") is None


def test_the_train_job_session_makes_its_s3_checkpoint_bucket_private(moto_s3):
    """The flow's session opening is where buckets get made: any s3:// checkpoint or job URL."""
    import boto3

    from sailor_core.job.spec import JobSpec
    from sailor_core.storage import open_storage
    from tasks.cloud import close_session, open_session
    from tasks.embedded_bucket import stray_objects

    spec = JobSpec(model="tiny", budget_usd=1.0, steps=2, checkpoint_url="s3://sailor-flow-ckpt/j/ckpt")
    session = open_session("embedded", job_id="sec-job", jobs_url="/tmp/unused-jobs/sec-job", spec=spec)
    close_session(session)
    # The session uploaded Sailor's wheel under sec-job/ in the embedded jobs bucket, which other
    # tests' jobs share (they check that no object lies outside a known job): remove it.
    open_storage(session.jobs_url.rsplit("/", 1)[0]).delete_dir("sec-job")
    assert "sec-job/" not in stray_objects([])
    # the embedded cloud's administrator keys, which the session put in the environment (boto3's default
    # session keeps the keys it first read: an earlier test's)
    s3 = boto3.client("s3", aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    block = s3.get_public_access_block(Bucket="sailor-flow-ckpt")
    assert all(block["PublicAccessBlockConfiguration"].values())


# ---- the embedded cloud's instances start without the user's secrets -------------------------


CANARY_AWS = "canaryAWSsecret" + secrets.token_hex(6)
CANARY_GCP = "canaryGCPkey" + secrets.token_hex(6)


def _plant_canaries(monkeypatch, tmp_path) -> Path:
    creds = tmp_path / "gcp-canary.json"
    creds.write_text(json.dumps({"type": "service_account", "project_id": "canary-project",
                                 "private_key_id": "canary", "private_key": CANARY_GCP,
                                 "client_email": "canary@canary-project.iam.gserviceaccount.com"}))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIACANARY0000000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY_AWS)
    monkeypatch.setenv("AWS_SESSION_TOKEN", CANARY_AWS + "token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    return creds


def test_instances_of_the_embedded_cloud_do_not_inherit_credentials(monkeypatch, tmp_path):
    from infra.local.machines import Machines

    creds = _plant_canaries(monkeypatch, tmp_path)
    machines = Machines(tmp_path / "instances")
    m = machines.boot(instance_id="i-canary", cloud="aws", zone="us-east-1a",
                      script="#!/bin/bash\nenv > \"$SAILOR_INSTANCE_DIR/env.txt\"\n")
    deadline = time.monotonic() + 30
    out = m.root / "env.txt"  # SAILOR_INSTANCE_DIR: the instance's own root
    while time.monotonic() < deadline and not (out.exists() and "SAILOR_INSTANCE_ID" in out.read_text()):
        time.sleep(0.1)
    env = out.read_text()
    machines.halt_all()
    assert not m.directory.exists()  # an ended instance's disk goes with it
    assert "SAILOR_INSTANCE_ID=i-canary" in env
    assert CANARY_AWS not in env and "AKIACANARY" not in env and str(creds) not in env


@pytest.mark.slow
def test_canary_secrets_never_leak_from_a_train_job(monkeypatch, tmp_path):
    """A job on the embedded cloud under a real Prefect server, with canary credentials in the
    environment: none may appear in logs, job state, Prefect's database (parameters, logs,
    artifacts), instance startup scripts / metadata, or the instances' processes."""
    from tests.reliability.chaos import ChaosEnv, run_trial

    creds = _plant_canaries(monkeypatch, tmp_path)
    canaries = [CANARY_AWS.encode(), CANARY_GCP.encode(), b"AKIACANARY", str(creds).encode()]
    leaked_env: set[str] = set()

    def observe(pids: list[int]) -> None:
        for pid in pids:
            for p in (pid, _ppid(pid)):
                try:
                    environ = Path(f"/proc/{p}/environ").read_bytes()
                except OSError:
                    continue
                leaked_env.update(c.decode() for c in canaries if c in environ)

    with ChaosEnv(tmp_path / "home") as env:
        result = run_trial(env, seed=5, steps=6, ckpt_every=3, num_faults=0, observer=observe)
        aws_user_data = _aws_user_data(env, result.job_id)
        gce_metadata = _gce_metadata(env)
    assert result.status == "succeeded", result.failures
    assert not leaked_env, f"canary in an instance process environment: {leaked_env}"
    scanned, hits = 0, []
    for path in (tmp_path / "home").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            scanned += 1
            hits += [f"{path}: {c[:12]!r}" for c in canaries if c in data]
    assert not hits, hits
    assert list((tmp_path / "home").rglob("prefect.db")), "Prefect's database (parameters, logs, artifacts) scanned"
    assert list((tmp_path / "home" / "cloud").rglob("startup-script")), "instance startup scripts scanned"
    assert scanned > 20
    for blob in aws_user_data + gce_metadata:
        assert not [c for c in canaries if c in blob.encode()], blob[:200]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return pid


def _aws_user_data(env, job_id: str) -> list[str]:
    import base64

    import boto3

    out = []
    session = boto3.Session(aws_access_key_id=env.cloud["aws_keys"][0], aws_secret_access_key=env.cloud["aws_keys"][1])
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        ec2 = session.client("ec2", endpoint_url=env.cloud["aws_endpoint"], region_name=region)
        for res in ec2.describe_instances()["Reservations"]:
            for inst in res["Instances"]:
                attr = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
                value = attr.get("UserData", {}).get("Value")
                if value:
                    out.append(base64.b64decode(value).decode(errors="replace"))
    return out


def _gce_metadata(env) -> list[str]:
    import urllib.request

    from infra.local.cloud import admin_gcp_token

    req = urllib.request.Request(f"{env.cloud['gce_endpoint']}/compute/v1/projects/sailor-local/aggregated/instances",
                                 headers={"Authorization": f"Bearer {admin_gcp_token(tuple(env.cloud['aws_keys']))}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return [resp.read().decode(errors="replace")]
