"""Checkpoint directories, manifest, keep-K on a local directory, S3 (moto's server) and GCS (tests/gcs_fake.py);
no worker processes."""

from __future__ import annotations

import json

import pytest
import torch

from sailor_core.runtime import checkpoint as ckpt
from sailor_core.storage import open_storage


def _write(url: str, step: int, keep: int = 0, commit: bool = True) -> None:
    storage = open_storage(url)
    files = {}
    for layer in range(3):
        state = {"params": {"w": torch.full((4, 4), float(step * 10 + layer))},
                 "exp_avg": {}, "exp_avg_sq": {}}
        files.update(ckpt.write_layer(storage, step, layer, state))
    if commit:
        ckpt.commit(storage, step, files, {"step": step, "next_sample": step * 8,
                                           "num_layer_indices": 3}, keep=keep)


def _check_store(url: str) -> None:
    assert ckpt.latest_valid_checkpoint(url) is None
    for step in (1, 2, 3):
        _write(url, step, keep=2)
    storage = open_storage(url)
    assert [d for d in storage.list_dirs()] == ["step_00000002", "step_00000003"]
    info = ckpt.latest_valid_checkpoint(url)
    assert info.step == 3 and info.meta["next_sample"] == 24
    assert float(ckpt.read_layer(storage, info, 2)["params"]["w"][0, 0]) == 32.0
    # a save that died before its manifest is not a checkpoint
    _write(url, 4, commit=False)
    assert ckpt.latest_valid_checkpoint(url).step == 3
    # a file that does not match its manifest disqualifies that step, the previous one is used
    storage.put("step_00000003/layer_0001.pt", b"garbage")
    assert ckpt.latest_valid_checkpoint(url).step == 2
    with pytest.raises(ckpt.CheckpointError):
        ckpt.read_layer(storage, ckpt.latest_valid_checkpoint(url, verify=ckpt.VERIFY_NONE) or info, 1)


def test_a_size_check_skips_a_torn_checkpoint_and_reads_no_file_but_manifest_and_meta(tmp_path):
    # the flow's check (tasks/jobs.note_checkpoint): it runs where the job does not train, so it
    # must not pull a whole checkpoint from the bucket; rank 0 hashes every file before training
    from sailor_core.runtime.storage_meter import MeteredStorage, take_moved_bytes

    url = str(tmp_path / "ck")
    for step in (1, 2):
        _write(url, step)
    storage = open_storage(url)
    take_moved_bytes()
    metered = MeteredStorage(storage, zone="here", bucket="there")
    assert ckpt.latest_valid_checkpoint(url, verify=ckpt.VERIFY_SIZES, storage=metered).step == 2
    read = take_moved_bytes()[("there", "here")]
    assert read == storage.size("step_00000002/MANIFEST.json") + storage.size("step_00000002/meta.json")
    layers = sum(storage.size(f"step_00000002/{name}") for name in storage.list_files("step_00000002")
                 if name.startswith("layer_"))
    ckpt.latest_valid_checkpoint(url, storage=metered)  # the contents' check reads every file
    assert layers > 0 and take_moved_bytes()[("there", "here")] >= read + layers
    # a file cut short: the size check skips its step, as the contents' check does
    layer = storage.get("step_00000002/layer_0001.pt")
    storage.put("step_00000002/layer_0001.pt", layer[:-1])
    assert ckpt.latest_valid_checkpoint(url, verify=ckpt.VERIFY_SIZES).step == 1
    assert ckpt.latest_valid_checkpoint(url).step == 1
    # a file of the right size and wrong bytes passes sizes (rank 0's hashes catch it) but not contents
    storage.put("step_00000002/layer_0001.pt", bytes(len(layer)))
    assert ckpt.latest_valid_checkpoint(url, verify=ckpt.VERIFY_SIZES).step == 2
    assert ckpt.latest_valid_checkpoint(url).step == 1


def test_local_store(tmp_path):
    _check_store(str(tmp_path / "ck"))
    manifest = json.loads((tmp_path / "ck" / "step_00000002" / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"layer_0000.pt", "layer_0001.pt", "layer_0002.pt", "meta.json"}


def test_s3_store_against_moto_server(moto_s3):
    import boto3

    endpoint = moto_s3
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="ckpts")
    _check_store("s3://ckpts/jobs/j1")
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=endpoint)
            .list_objects_v2(Bucket="ckpts")["Contents"]]
    assert "jobs/j1/step_00000002/MANIFEST.json" in keys
    assert not any(k.startswith("jobs/j1/step_00000001/") for k in keys)


def test_gs_store_against_the_local_gcs_fake(gcs_fake):
    gcs_fake.create_bucket("ckpts")
    _check_store("gs://ckpts/jobs/j1")
    keys = sorted(gcs_fake.buckets["ckpts"])
    assert "jobs/j1/step_00000002/MANIFEST.json" in keys
    assert not any(k.startswith("jobs/j1/step_00000001/") for k in keys)
