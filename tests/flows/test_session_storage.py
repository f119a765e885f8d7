"""A job's session and its storage: where checkpoints go (a folder of this machine other than the
job's own is refused in one line), and what a continued job pays for instances of an embedded
cloud that died with the process that ran it."""

from __future__ import annotations

import dataclasses
import time

import pytest

from infra.errors import CloudConfigError
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec
from tasks.cloud import reconcile
from tasks.cloud_session import CloudSession


def _session(mode: str = "embedded") -> CloudSession:
    return CloudSession(mode=mode, job_id="j", jobs_url="s3://sailor-jobs/j", home_url="/home/u/.sailor/jobs/j",
                        providers={})


def test_the_jobs_own_folder_becomes_its_bucket_prefix_and_another_folder_is_refused():
    s = _session()
    assert s.checkpoint_url("/home/u/.sailor/jobs/j/checkpoints") == "s3://sailor-jobs/j/checkpoints"
    assert s.checkpoint_url("gs://ckpts/j") == "gs://ckpts/j"
    assert s.checkpoint_url("s3://ckpts/j") == "s3://ckpts/j"
    with pytest.raises(CloudConfigError) as err:
        s.checkpoint_url("/data/ckpt")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("--checkpoint-url /data/ckpt: a folder on this machine is out of the instances'")
    with pytest.raises(CloudConfigError, match="file:///data/ckpt"):
        s.checkpoint_url("file:///data/ckpt")


def test_instances_of_a_dead_embedded_cloud_are_billed_until_the_state_was_saved():
    spec = JobSpec(model="tiny", budget_usd=1.0, steps=20)
    launched = time.time() - 3600
    record = js.InstanceRecord(instance_id="i-gone", cloud="aws", zone="us-east-1a", instance_type="p3.2xlarge",
                               gpu="V100-16", num_gpus=1, usd_per_hr=3.6, spot=True, attempt=1,
                               launched_unix_s=launched)
    state = js.with_instances_launched(js.new_job(spec, job_id="j"), (record,))
    state = dataclasses.replace(state, updated_unix_s=launched + 60)  # the controller's last save; then it died
    ended = reconcile(_session("embedded"), state).instances[0]
    assert ended.end_reason == "lost" and ended.ended_unix_s == pytest.approx(launched + 60)
    on_real = reconcile(_session("real"), state).instances[0]  # a real cloud's API says when; here: now
    assert on_real.ended_unix_s > launched + 3000


def test_a_local_init_from_folder_is_copied_under_the_jobs_prefix_once(tmp_path):
    from sailor_core.storage import open_storage

    folder = tmp_path / "my-model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "sub" / "w.bin").write_bytes(b"\x00" * 10)
    jobs = tmp_path / "bucket" / "j"
    s = CloudSession(mode="embedded", job_id="j", jobs_url=str(jobs), providers={})
    url = s.folder_url(str(folder))
    assert url == f"{jobs}/inputs/my-model"
    store = open_storage(url)
    assert store.list_files() == ["config.json"] and store.list_files("sub") == ["w.bin"]
    assert store.get("config.json") == b'{"model_type": "llama"}'
    (folder / "config.json").write_text("changed")  # staged once a session: not copied again
    assert s.folder_url(f"file://{folder}") == url and store.get("config.json") == b'{"model_type": "llama"}'
    assert s.folder_url("s3://weights/m") == "s3://weights/m" and s.folder_url("") == ""
