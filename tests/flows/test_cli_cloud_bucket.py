"""`sailor cloud bucket create gs://NAME` (or s3://NAME): a bucket of the embedded cloud, served over both
protocols; a bad URL or name is refused in one line, naming the rule."""

from __future__ import annotations

import urllib.request

import pytest

from infra.local.object_store import DiskBuckets


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SAILOR_HOME", str(tmp_path))
    monkeypatch.delenv("SAILOR_CLOUDS", raising=False)
    return tmp_path


def test_a_created_bucket_is_served_as_gs_and_s3(home, sailor_cli):
    r = sailor_cli("cloud", "bucket", "create", "gs://my-checkpoints")
    assert r.returncode == 0, r.stderr
    assert "created gs://my-checkpoints" in r.stdout and "s3://my-checkpoints is the same bucket" in r.stdout
    disk = DiskBuckets(home / "cloud" / "buckets").start()
    try:
        put = urllib.request.Request(f"{disk.gcs_endpoint}/my-checkpoints/run/x.txt", data=b"hi", method="PUT")
        assert urllib.request.urlopen(put).status == 200
        assert urllib.request.urlopen(f"{disk.endpoint}/my-checkpoints/run/x.txt").read() == b"hi"
    finally:
        disk.stop()
    again = sailor_cli("cloud", "bucket", "create", "s3://my-checkpoints")
    assert again.returncode == 1 and again.stderr.startswith("error: s3://my-checkpoints already exists")


@pytest.mark.parametrize(("url", "says"), [
    ("my-bucket", "is not a bucket URL"),
    ("http://my-bucket", "is not a bucket URL"),
    ("gs://my-bucket/prefix", "a bucket URL has no path"),
    ("gs://ab", "3 to 63 characters"),
    ("gs://" + "a" * 64, "3 to 63 characters"),
    ("gs://My-Bucket", "only lower-case letters"),
    ("s3://my_bucket", "only lower-case letters"),
    ("gs://-bucket", "a letter or digit at each end"),
    ("gs://my..bucket", "no '..'"),
    ("gs://10.0.0.1", "not an IP address"),
    ("gs://google-data", "'google'"),
])
def test_a_bad_url_or_name_is_refused_in_one_line(home, sailor_cli, url, says):
    r = sailor_cli("cloud", "bucket", "create", url)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert not (home / "cloud" / "buckets").exists() or not any((home / "cloud" / "buckets").iterdir())


def test_on_real_clouds_it_says_how_to_make_one_there(home, sailor_cli, monkeypatch):
    monkeypatch.setenv("SAILOR_CLOUDS", "real")
    r = sailor_cli("cloud", "bucket", "create", "gs://my-bucket")
    assert r.returncode == 2 and "gcloud storage buckets create" in r.stderr
