"""`sailor cloud up|status|preempt|down`: the embedded cloud as its own process (slow: ~3
Python start-ups of the SDKs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def sailor(*args, env):
    return subprocess.run([sys.executable, "-m", "flows.cli.app", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_standalone_cloud_up_status_preempt_down(tmp_path):
    env = {**os.environ, "SAILOR_HOME": str(tmp_path)}
    env.pop("SAILOR_CLOUDS", None)
    up = sailor("cloud", "up", "--notice-s", "0.5", env=env)
    assert up.returncode == 0, up.stderr
    try:
        state = json.loads((tmp_path / "cloud.json").read_text())
        # the embedded account's administrator keys are in it: the owner's alone
        assert (tmp_path / "cloud.json").stat().st_mode & 0o077 == 0
        # Another process provisions through the endpoints in the state file, signing with its keys.
        script = (
            "from infra.config import get_providers\n"
            "from infra.records import job_labels\n"
            "p = get_providers(['gcp'])['gcp']\n"
            "(i,) = p.run_instances(zone='us-central1-a', instance_type='a2-highgpu-1g', count=1,"
            " labels=job_labels('cli-1', 0), startup_script='sleep 60')\n"
            "p.wait_instances(job_labels('cli-1'), timeout_s=20)\n"
            "aws = get_providers(['aws'])['aws']\n"
            "aws.create_job_identity('cli-1', read_write=['s3://sailor-jobs/cli-1'])\n"
            "assert aws.delete_job_identity('cli-1')\n"
            "print(i.instance_id)\n"
        )
        launched = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert launched.returncode == 0, launched.stderr
        instance_id = launched.stdout.split()[-1]

        status = sailor("cloud", "status", "--json", env=env)
        data = json.loads(status.stdout)
        assert data["running"] and data["pid"] == state["pid"]
        assert "aws_keys" not in data and state["aws_keys"][1] not in status.stdout
        assert [i["instance_id"] for i in data["live_instances"]] == [instance_id]
        # The control API's secret: in its owner-only file, never in cloud.json nor printed.
        secret_file = Path(state["control_secret_file"])
        assert secret_file.stat().st_mode & 0o777 == 0o600
        secret = secret_file.read_text()
        assert secret not in (tmp_path / "cloud.json").read_text() and secret not in status.stdout
        with pytest.raises(urllib.error.HTTPError) as refused:  # without it: refused
            urllib.request.urlopen(f"{state['control_url']}/status", timeout=10)
        assert refused.value.code == 401

        pre = sailor("cloud", "preempt", instance_id, env=env)
        assert pre.returncode == 0 and instance_id in pre.stdout
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            data = json.loads(sailor("cloud", "status", "--json", env=env).stdout)
            if not data["live_instances"]:
                break
            time.sleep(0.5)
        assert data["live_instances"] == [] and data["preemptions"][0]["instance_id"] == instance_id
    finally:
        down = sailor("cloud", "down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not (tmp_path / "cloud.json").exists()
    assert sailor("cloud", "status", env=env).returncode == 1
