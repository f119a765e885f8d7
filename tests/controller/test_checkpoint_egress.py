"""The controller weighs a plan's saves to a bucket in another region, and keeps one in reserve."""

from __future__ import annotations

import pytest

from sailor_core.catalog.models import get_model
from sailor_core.controller.checkpoint_egress import CheckpointEgress
from sailor_core.controller.options import plan_option
from sailor_core.controller.state_load import checkpoint_bytes_for
from sailor_core.network.storage_egress import bucket_place
from sailor_core.plan.types import plan_from_dict

A, B = "us-east-1a", "us-west-2a"


def _plan(zone_first: str, zone_last: str):
    last = get_model("tiny").num_layer_indices
    rep = lambda z: {"gpu": "T4", "tp": 1, "zone": z}  # noqa: E731
    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2, "stages": [
        {"layers": [0, 2], "replicas": [rep(zone_first), rep(zone_last)]},
        {"layers": [2, last], "replicas": [rep(zone_last)]}]})


def test_one_save_sends_each_stages_share_from_its_first_replicas_zone():
    ckpt = CheckpointEgress(place=bucket_place("s3://b", "us-west-2"), every_steps=5)
    plan = _plan(A, B)
    egress = ckpt.save_egress(plan)
    assert list(egress) == [(A, "bucket:aws:us-west-2")]  # the second stage writes from the bucket's region
    num_bytes, usd = egress[(A, "bucket:aws:us-west-2")]
    assert 0 < num_bytes < checkpoint_bytes_for("tiny")
    assert usd == pytest.approx(num_bytes * ckpt.place.usd_per_byte(A))
    whole = sum(b for b, _ in CheckpointEgress(place=bucket_place("gs://b"), every_steps=5).save_egress(plan).values())
    assert whole == pytest.approx(checkpoint_bytes_for("tiny"))  # a region not known: every stage's bytes


def test_saves_are_weighed_per_hour_of_training_and_one_is_kept_in_reserve():
    ckpt = CheckpointEgress(place=bucket_place("s3://b", "us-west-2"), every_steps=5)
    plan = _plan(A, B)
    option = plan_option(plan, throughput_samples_per_s=16.0, usd_per_hr=1.0, egress_usd_per_hr=0.5)
    weighed = ckpt.with_egress(option)
    saves_per_hr = 16.0 / 8 * 3600 / 5
    assert weighed.egress_usd_per_hr == pytest.approx(0.5 + ckpt.save_usd(plan) * saves_per_hr)
    assert ckpt.reserve_usd(option) == ckpt.save_usd(plan) > 0 and ckpt.reserve_usd(None) == 0.0
    near = CheckpointEgress(place=bucket_place("s3://b", "us-east-1"), every_steps=5)
    assert near.with_egress(plan_option(_plan(A, A), throughput_samples_per_s=16.0, usd_per_hr=1.0)
                            ).egress_usd_per_hr == 0.0
