"""``sailor doctor`` against moto and the GCE fake: what is there, what is missing and how to fix it."""

from __future__ import annotations

import json

import boto3

from infra import doctor
from infra.buckets import ensure_private_bucket


def _by_name(checks):
    return {(c.cloud, c.name): c for c in checks}


def test_a_ready_account_passes_and_a_missing_image_quota_or_account_says_how_to_fix_it(cloud, providers):
    aws, gcp = providers["aws"], providers["gcp"]
    ready = _by_name(doctor.check_aws(aws, gpus=["T4"], embedded=True) + doctor.check_gcp(gcp, gpus=["T4"], embedded=True))
    assert {c.status for c in ready.values()} == {doctor.OK}, [c for c in ready.values() if c.status != doctor.OK]
    assert "g4dn.xlarge needs 4" in ready[("aws", "quota T4")].detail
    assert "PREEMPTIBLE_NVIDIA_T4_GPUS" in ready[("gcp", "quota T4")].detail

    aws.ami_id, gcp._identities.project = None, "not-this-project"  # credentials that manage no accounts there
    for zone in cloud.gce.zones:  # every zone of the regions the check looks at
        cloud.set_capacity("T4", zone, 0)
    broken = _by_name(doctor.check_aws(aws, gpus=["T4"]) + doctor.check_gcp(gcp, gpus=["T4"]))
    assert broken[("aws", "image")].status == doctor.MISSING and "SAILOR_AWS_AMI" in broken[("aws", "image")].fix
    assert broken[("gcp", "job identity")].status == doctor.MISSING
    assert "roles/iam.serviceAccountAdmin" in broken[("gcp", "job identity")].fix
    assert broken[("gcp", "quota T4")].status == doctor.MISSING and "request more" in broken[("gcp", "quota T4")].fix


def test_the_jobs_bucket_must_be_remote_private_encrypted_and_writable(cloud, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", cloud.s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", cloud.aws_keys[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", cloud.aws_keys[1])
    s3 = boto3.client("s3", endpoint_url=cloud.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id=cloud.aws_keys[0], aws_secret_access_key=cloud.aws_keys[1])
    assert _by_name(doctor.check_bucket("/tmp/jobs"))[("storage", "jobs bucket")].status == doctor.MISSING
    ensure_private_bucket("s3://doctor-good/jobs", client=s3)
    good = _by_name(doctor.check_bucket("s3://doctor-good/jobs", s3_client=s3))
    assert {c.status for c in good.values()} == {doctor.OK}
    s3.create_bucket(Bucket="doctor-open")  # no public access block, no default encryption
    s3.delete_bucket_encryption(Bucket="doctor-open")
    bad = _by_name(doctor.check_bucket("s3://doctor-open/jobs", s3_client=s3))
    assert bad[("storage", "bucket private")].status == doctor.MISSING
    assert "Block Public Access" in bad[("storage", "bucket private")].fix
    assert bad[("storage", "bucket encrypted")].status == doctor.MISSING
    assert bad[("storage", "bucket writable")].status == doctor.OK
    assert _by_name(doctor.check_bucket("s3://no-such-bucket/jobs", s3_client=s3))[
        ("storage", "bucket writable")].status == doctor.MISSING


def test_sailor_doctor_on_the_embedded_cloud(sailor_cli):
    out = sailor_cli("doctor", "--gpu", "T4", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and {c["cloud"] for c in report["checks"]} == {"aws", "gcp", "storage"}
    assert all(c["status"] == "ok" for c in report["checks"])
