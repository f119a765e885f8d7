"""The embedded cloud's buckets live on disk under the Sailor home: what one cloud wrote, a cloud
started later over the same folder serves (S3 and GCS alike), a process with no cloud reaches them
from a clean environment, a job's scoped keys still reach only its prefixes, and GCS answers a
VM's own token but no made-up one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from infra.local.cloud import EmbeddedCloud
from infra.local.machines import reap_dead_runs
from infra.local.object_store import DiskBuckets
from sailor_core.storage import StorageError, open_storage
from tests.infra.conftest import wait_until
from tests.instance_calls import metadata

ROOT = Path(__file__).resolve().parents[2]


def _point_at(monkeypatch, tmp_path, s3: str, gcs: str, keys: tuple[str, str] = ("testing", "testing")) -> None:
    key = tmp_path / "gcs-no-oauth.json"
    key.write_text(json.dumps({"gcs_base_url": gcs, "disable_oauth": True, "client_email": "",
                               "private_key": "", "private_key_id": ""}))
    for name, value in (("AWS_ENDPOINT_URL_S3", s3), ("AWS_ACCESS_KEY_ID", keys[0]),
                        ("AWS_SECRET_ACCESS_KEY", keys[1]), ("GOOGLE_BASE_URL", gcs),
                        ("GOOGLE_SERVICE_ACCOUNT", str(key))):
        monkeypatch.setenv(name, value)


def test_buckets_written_by_one_cloud_are_served_by_the_next_over_the_same_folder(tmp_path, monkeypatch):
    buckets = tmp_path / "home" / "cloud" / "buckets"
    first = EmbeddedCloud(state_dir=tmp_path / "run1", buckets_dir=buckets, network="host").start()
    try:
        from infra.buckets import ensure_private_bucket
        from tasks.embedded_bucket import embedded_s3_client

        ensure_private_bucket("s3://durable-jobs/j", client=embedded_s3_client(
            {"aws_endpoint": first.s3_endpoint, "aws_keys": first.aws_keys}))
        _point_at(monkeypatch, tmp_path, first.s3_endpoint, first.gcs_endpoint, first.aws_keys)
        open_storage("s3://durable-jobs/job-a").put("checkpoints/step-5/rank-0.pt", b"weights")
        open_storage("gs://durable-jobs/job-b").put("checkpoints/step-7/rank-0.pt", b"more weights")
    finally:
        first.stop()
    # the objects are files under the Sailor home, readable without any server
    assert (buckets / "durable-jobs" / "job-a" / "checkpoints" / "step-5" / "rank-0.pt").read_bytes() == b"weights"
    second = DiskBuckets(buckets).start()  # what a later command starts: the buckets only
    try:
        _point_at(monkeypatch, tmp_path, second.endpoint, second.gcs_endpoint)
        assert open_storage("s3://durable-jobs/job-a").get("checkpoints/step-5/rank-0.pt") == b"weights"
        # s3:// and gs:// name the same folders on the embedded cloud
        assert open_storage("s3://durable-jobs/job-b").get("checkpoints/step-7/rank-0.pt") == b"more weights"
        assert open_storage("gs://durable-jobs/job-a/checkpoints").list_dirs() == ["step-5"]
        assert open_storage("gs://durable-jobs/job-a").get_range("checkpoints/step-5/rank-0.pt", 1, 4) == b"eig"
    finally:
        second.stop()


def test_a_process_with_a_clean_environment_reaches_the_buckets_of_its_sailor_home(tmp_path):
    home = tmp_path / "home"
    folder = home / "cloud" / "buckets" / "sailor-jobs" / "job-c" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "latest.json").write_text('{"step": 9}')
    code = ("from infra.config import use_embedded_storage\n"
            "from sailor_core.storage import open_storage\n"
            "use_embedded_storage()\n"
            "print(open_storage('s3://sailor-jobs/job-c/checkpoints').get('latest.json').decode())\n"
            "print(open_storage('gs://sailor-jobs/job-c/checkpoints').get('latest.json').decode())\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SAILOR_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ['{"step":', '9}', '{"step":', '9}']
    assert not list((home / "cloud").glob("rclone-*.pid")), "the process stopped the server it started"


def test_a_dead_clouds_instances_are_ended_by_the_next_cloud(tmp_path):
    runs = tmp_path / "runs"
    dead = subprocess.Popen(["true"])  # the process that ran the dead cloud
    dead.wait()
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)  # an instance the dead cloud left
    instance = runs / str(dead.pid) / "instances" / "i-0dead"
    instance.mkdir(parents=True)
    (instance / "pgid").write_text(str(leftover.pid))
    live = runs / str(os.getpid()) / "instances" / "i-0live"  # this process's cloud: left alone
    live.mkdir(parents=True)
    assert reap_dead_runs(runs) == ["i-0dead"]
    assert leftover.wait(timeout=10) == -9
    assert not (runs / str(dead.pid)).exists() and live.exists()


def test_gcs_answers_a_vms_own_token_and_refuses_a_made_up_one(cloud, providers):
    from infra.records import job_labels

    p = providers["gcp"]
    cloud.disk.ensure_bucket("gcs-token-bucket")
    p.create_job_identity("gcs-token", read_write=["gs://gcs-token-bucket/gcs-token"])
    (inst,) = p.run_instances(zone="us-central1-a", instance_type="n1-standard-4-t4x1", count=1,
                              labels=job_labels("gcs-token", 1), startup_script="#!/bin/bash\nsleep 60\n")
    p.wait_instances(job_labels("gcs-token", 1), instance_ids=[inst.instance_id], timeout_s=20)
    assert wait_until(lambda: cloud.machines.get(inst.instance_id) is not None, timeout_s=10)
    status, answer = metadata(cloud, inst.instance_id, "computeMetadata/v1/instance/service-accounts/default/token")
    assert status == 200
    token = json.loads(answer)["access_token"]

    def put(bearer: str | None) -> int:
        req = urllib.request.Request(f"{cloud.instance_gcs_endpoint}/gcs-token-bucket/gcs-token/x.txt", data=b"hi",
                                     method="PUT", headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
        try:
            return urllib.request.urlopen(req).status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert put(token) == 200
    assert put("ya29.made-up") == 403
    assert put(None) == 403
    p.terminate_instances(job_labels("gcs-token"))
    p.delete_job_identity("gcs-token")


def test_a_jobs_scoped_keys_reach_only_its_prefix_on_the_disk_buckets(cloud, providers, monkeypatch):
    """The guard holds in front of the disk: the metadata server's keys for job A's role write A's prefix
    and are refused B's (tests/infra/test_faithful_cloud.py checks the same through the instance)."""
    from tests.infra.test_faithful_cloud import _boot_one, _imds_credentials

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", cloud.s3_endpoint)
    cloud.disk.ensure_bucket("scoped-jobs")
    providers["aws"].create_job_identity("scoped-a", read_write=["s3://scoped-jobs/scoped-a"])
    try:
        inst = _boot_one(cloud, providers, "scoped-a", script="#!/bin/bash\nsleep 60\n")
        creds = _imds_credentials(cloud, inst.instance_id)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
        monkeypatch.setenv("AWS_SESSION_TOKEN", creds["Token"])
        open_storage("s3://scoped-jobs/scoped-a").put("ok.txt", b"mine")
        assert (cloud.disk.root / "scoped-jobs" / "scoped-a" / "ok.txt").read_bytes() == b"mine"
        with pytest.raises(StorageError, match="cannot write"):
            open_storage("s3://scoped-jobs/scoped-b").put("x.txt", b"not mine")
    finally:
        providers["aws"].terminate_instances({"sailor-job": "scoped-a"})
        providers["aws"].delete_job_identity("scoped-a")
