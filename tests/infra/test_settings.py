"""sailor_core.settings: each accessor reads its variable when called, with its documented default."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailor_core import settings


def test_accessors_read_the_environment_at_call_time(monkeypatch, tmp_path: Path):
    monkeypatch.delenv(settings.HOME_ENV, raising=False)
    monkeypatch.delenv(settings.JOBS_URL_ENV, raising=False)
    assert settings.sailor_home() == Path.home() / ".sailor"
    monkeypatch.setenv(settings.HOME_ENV, str(tmp_path))
    assert settings.sailor_home() == tmp_path
    assert settings.jobs_url() == str(tmp_path / "jobs")
    monkeypatch.setenv(settings.JOBS_URL_ENV, "s3://bucket/jobs")
    assert settings.jobs_url() == "s3://bucket/jobs"
    monkeypatch.setenv(settings.HOME_ENV, "~/elsewhere")
    assert settings.sailor_home() == Path.home() / "elsewhere"


@pytest.mark.parametrize("name, accessor, unset, value, expected", [
    (settings.CLOUDS_ENV, settings.clouds, "embedded", " AWS,gcp ", "aws,gcp"),
    (settings.AWS_REGIONS_ENV, settings.aws_regions, [], "us-east-1,,us-west-2", ["us-east-1", "us-west-2"]),
    (settings.GCP_ZONES_ENV, settings.gcp_zones, [], "us-central1-a", ["us-central1-a"]),
    (settings.AWS_AMI_ENV, settings.aws_ami, None, "ami-1", "ami-1"),
    (settings.GCP_PROJECT_ENV, settings.gcp_project, None, "p", "p"),
    (settings.S3_KMS_KEY_ENV, settings.s3_kms_key, None, "k", "k"),
    (settings.INSTANCE_ID_ENV, settings.instance_id, None, "i-1", "i-1"),
    (settings.CLOUD_ENV, settings.instance_cloud, None, "gcp", "gcp"),
    (settings.INSTANCE_DIR_ENV, settings.instance_dir, None, "/x", Path("/x")),
    (settings.METADATA_URL_ENV, settings.metadata_url, None, "http://m", "http://m"),
    (settings.NOTICE_S_ENV, settings.notice_s, 30.0, "5", 5.0),
    (settings.PREEMPT_FILE_ENV, settings.preempt_file, None, "/f", "/f"),
    (settings.PREEMPT_URL_ENV, settings.preempt_url, None, "http://p", "http://p"),
    (settings.FAULT_KILL_ENV, settings.fault_kill, "", "1:3", "1:3"),
    (settings.FAULT_UPLOAD_ENV, settings.fault_upload, None, "/u", "/u"),
    (settings.DEBUG_ENV, settings.debug, False, "1", True),
    (settings.PREFECT_EPHEMERAL_ENV, settings.prefect_ephemeral, False, "1", True),
    (settings.FUZZ_EXAMPLES_ENV, settings.fuzz_examples, 6, "200", 200),
])
def test_each_variable_has_its_default_and_its_value(monkeypatch, name, accessor, unset, value, expected):
    monkeypatch.delenv(name, raising=False)
    assert accessor() == unset
    monkeypatch.setenv(name, value)
    assert accessor() == expected
