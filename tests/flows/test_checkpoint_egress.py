"""Checkpoints to a bucket in another region are charged as egress, on the embedded cloud.

Real parts: the train-job flow under a real Prefect server, moto's S3 keeping the buckets'
regions (GetBucketLocation), the embedded object store holding the checkpoints, the agent and the
engine's gloo workers writing them.  The job trains in us-east-1a; the embedded jobs bucket, made
without a region, is this machine's (its bytes cost nothing), the far bucket was made in us-west-2
(each save's bytes are charged, as many as the store holds).
"""

from __future__ import annotations

import json

import pytest

from sailor_core.job import state as js
from sailor_core.network.model import DEFAULT_EGRESS_USD_PER_GB

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ZONE = "us-east-1a"
FAR = "sailor-far-checkpoints"


def _s3():
    from infra import config
    from tasks.embedded_bucket import embedded_s3_client

    return embedded_s3_client(config.embedded_endpoints())


def _stored_bytes(s3, bucket: str, prefix: str) -> int:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(o["Size"] for page in pages for o in page.get("Contents", []))


def _train(job_id: str, **extra) -> js.JobState:
    from flows.train_job import train_job

    summary = train_job(model="tiny", budget_usd=0.05, steps=10, checkpoint_every_steps=5, global_batch_size=16,
                        validation_fraction=0.0, validate_every_steps=0, cloud="embedded", gpus=("T4",),
                        zones=(ZONE,), max_gpus=1, job_id=job_id, **extra)
    assert summary["status"] == "succeeded", summary
    assert 0 < summary["usd_spent"] <= 0.05
    return js.JobStore().load(job_id)


def test_checkpoints_in_another_region_are_charged_their_bytes_and_in_the_same_region_nothing(prefect_api):
    from infra.buckets import ensure_private_bucket

    s3 = _s3()
    ensure_private_bucket(f"s3://{FAR}", client=s3, region="us-west-2")
    assert s3.get_bucket_location(Bucket=FAR)["LocationConstraint"] == "us-west-2"

    far = _train("ckpt-far", checkpoint_url=f"s3://{FAR}/ckpt-far")
    assert far.spec.checkpoint_region == "us-west-2"  # asked of the cloud
    pairs = far.ledger().egress_by_pair()
    num_bytes, usd = pairs[(ZONE, "bucket:aws:us-west-2")]
    # both saves (steps 5 and 10) are kept (two by default): every byte on the store was written once
    assert num_bytes == _stored_bytes(s3, FAR, "ckpt-far/")
    assert usd == pytest.approx(num_bytes * DEFAULT_EGRESS_USD_PER_GB["cross_region"] / 1e9)
    assert far.ledger().checkpoint_egress_usd() == pytest.approx(usd)
    assert far.ledger().egress_usd() == pytest.approx(usd)  # one zone: nothing else crossed

    near = _train("ckpt-near")  # the job's folder in the embedded jobs bucket, us-east-1
    assert near.spec.checkpoint_region == "local"  # the embedded cloud's jobs bucket: this machine's
    assert near.last_checkpoint_step == 10
    assert near.ledger().egress_by_pair() == {} and near.ledger().checkpoint_egress_usd() == 0.0


def test_a_restore_from_a_far_bucket_is_charged_the_bytes_it_reads(prefect_api):
    from infra.buckets import ensure_private_bucket

    s3 = _s3()
    ensure_private_bucket(f"s3://{FAR}", client=s3, region="us-west-2")
    state = _train("ckpt-far-restore", checkpoint_url=f"s3://{FAR}/ckpt-far-restore", preempt_at_steps=(5,))
    assert state.num_preemptions == 1 and state.replans[-1].state_from == "checkpoint"
    resumed = state.replans[-1].at_step
    pairs = state.ledger().egress_by_pair()
    read_bytes, usd = pairs[("bucket:aws:us-west-2", ZONE)]
    # what the worker reads of the checkpoint it resumes from, each object as large as on the store:
    # rank 0 verifies it (the manifest, every file it lists, the meta), the ranks agree on it (the
    # manifest and the meta again), then load their layers
    folder = f"ckpt-far-restore/step_{resumed:08d}"
    size = {o["Key"].rsplit("/", 1)[1]: o["Size"] for o in s3.list_objects_v2(Bucket=FAR, Prefix=folder)["Contents"]}
    listed = json.loads(s3.get_object(Bucket=FAR, Key=f"{folder}/MANIFEST.json")["Body"].read())["files"]
    layers = sum(n for name, n in size.items() if name.startswith("layer_"))
    assert layers > 0 and set(listed) <= set(size)
    verify = size["MANIFEST.json"] + sum(size[name] for name in listed) + size["meta.json"]
    assert read_bytes == verify + size["MANIFEST.json"] + size["meta.json"] + layers
    assert usd == pytest.approx(read_bytes * DEFAULT_EGRESS_USD_PER_GB["cross_region"] / 1e9)
    assert pairs[(ZONE, "bucket:aws:us-west-2")][0] >= _stored_bytes(s3, FAR, "ckpt-far-restore/")



def test_the_save_a_budget_stop_makes_is_charged_and_the_spend_stays_within_the_budget(prefect_api):
    """A budget for about 90 s of the instance: the controller stops the job with one save's egress
    kept back, the stop's save to the far bucket is charged, and the spend stays within the budget."""
    from flows.train_job import train_job
    from infra.buckets import ensure_private_bucket
    from sailor_core.catalog.instances import catalog_offers

    ensure_private_bucket(f"s3://{FAR}", client=_s3(), region="us-west-2")
    price = min(o.spot_usd_per_hr for o in catalog_offers(gpus=["T4"], zones=[ZONE]) if o.gpus_per_node == 1)
    budget = price * 90.0 / 3600.0
    summary = train_job(model="tiny", budget_usd=budget, steps=100_000, checkpoint_every_steps=1000,
                        global_batch_size=8, validation_fraction=0.0, validate_every_steps=0, cloud="embedded",
                        gpus=("T4",), zones=(ZONE,), max_gpus=1, job_id="ckpt-budget",
                        checkpoint_url=f"s3://{FAR}/ckpt-budget")
    state = js.JobStore().load(summary["job_id"])
    assert summary["status"] == "stopped_budget", summary
    ledger, end = state.ledger(), state.updated_unix_s
    assert 0 < summary["steps"] < 100_000 and state.last_checkpoint_step == summary["steps"]  # the stop's save
    assert ledger.spent_usd(end) <= budget and summary["usd_spent"] <= budget
    num_bytes, usd = ledger.egress_by_pair()[(ZONE, "bucket:aws:us-west-2")]
    assert num_bytes >= _stored_bytes(_s3(), FAR, "ckpt-budget/") > 0 and usd > 0  # older saves pruned
