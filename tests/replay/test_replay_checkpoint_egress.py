"""The replay's checkpoint bucket: saves to and restores from a bucket outside the plans' region are
charged as the controller weighs them (controller/checkpoint_egress.py, StateLoad.restore_egress);
a bucket in the region (or none) changes nothing."""

import dataclasses

import pytest

from sailor_core.controller import controller_config
from sailor_core.controller.state_load import checkpoint_bytes_for
from sailor_core.errors import InputError
from sailor_core.network.storage_egress import BucketPlace, place_named
from sailor_core.replay import ChangeCosts, Goal, Market, ReplayPolicy, controller_costs, replay
from sailor_core.replay.run import _change_costs
from sailor_core.specs.fields import SpecError
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import build_trace
from tests.replay.test_replay_accounting import A, DIP, ONE_USD, _dp_planner

CKPT = checkpoint_bytes_for("opt-350m")
FAR, NEAR = place_named("gcp:us-east1"), place_named("gcp:us-central1")  # the GPUs are in us-central1-a


def run(trace, bucket, *, interval_s=1e9, target=288_000):
    costs = ChangeCosts(provisioning_s=100, startup_s=50, rejoin_s=10, checkpoint_bytes=CKPT,
                        checkpoint_interval_s=interval_s, terminate_s=0, bucket=bucket)
    config = controller_config("ours", costs=controller_costs(costs), shutdown_s=costs.shutdown_s)
    return replay(trace, policy=ReplayPolicy(config=config, plan_fn=_dp_planner, name="ours"),
                  market=Market(price_fn=ONE_USD), goal=Goal(samples_target=target), costs=costs)


def test_a_bucket_in_the_region_or_none_charges_nothing():
    for trace, interval_s in ((DIP, 1e9), (build_trace([(0.0, {A: 4})]), 1800.0)):
        none = run(trace, None, interval_s=interval_s).to_dict(with_timeline=True)
        assert run(trace, NEAR, interval_s=interval_s).to_dict(with_timeline=True) == none
        assert "egress_usd" not in none


def test_saves_to_a_far_bucket_are_charged_per_hour_of_training_as_the_controller_weighs_them():
    # 4 A100s from the start, nothing lost: 288 000 samples at 40/s train 7200 s, one save per
    # 1800 s of training; the first start reads no checkpoint
    r = run(build_trace([(0.0, {A: 4})]), FAR, interval_s=1800.0)
    save_usd = CKPT * FAR.usd_per_byte(A[1])  # one stage: the first replica writes the whole checkpoint
    assert r.finished and r.restore_egress_usd == 0.0
    assert r.egress_usd == pytest.approx(save_usd * 7200 / 1800)
    assert r.usd_spent == pytest.approx(run(build_trace([(0.0, {A: 4})]), None, interval_s=1800.0).usd_spent
                                        + r.egress_usd)


def test_restores_from_a_far_bucket_are_charged_at_each_change():
    # 3600: 2 of 4 lost, the 2 survivors rejoin (their own shards); 7200: they rejoin for the
    # interim, then all 4 once the new instances run (the new ranks' shards from a peer).  Each of
    # the three resumes has rank 0 verify the whole checkpoint from the far bucket.
    far, near = run(DIP, FAR), run(DIP, NEAR)
    assert (far.num_replans, far.num_interims) == (near.num_replans, near.num_interims) == (2, 1)
    assert far.restore_egress_bytes == pytest.approx(3 * CKPT)
    assert far.restore_egress_usd == pytest.approx(3 * CKPT * FAR.usd_per_byte(A[1]))
    saves_usd = far.egress_usd - far.restore_egress_usd  # (1e9 s between saves: next to nothing)
    assert 0 <= saves_usd < 1e-3 * far.restore_egress_usd
    assert far.to_dict()["restore_egress_usd"] == far.restore_egress_usd
    assert far.usd_spent == pytest.approx(near.usd_spent + far.egress_usd)


def test_the_replay_spec_names_the_bucket():
    spec = ReplaySpec(trace="derived:aws-3d", model="opt-350m", tokens=1e9, checkpoint_bucket="aws:us-west-2")
    assert _change_costs(spec, "opt-350m").bucket == BucketPlace(cloud="aws", region="us-west-2")
    assert _change_costs(dataclasses.replace(spec, checkpoint_bucket="local"), "opt-350m").bucket is None
    assert _change_costs(dataclasses.replace(spec, checkpoint_bucket="gcp"), "opt-350m").bucket == \
        BucketPlace(cloud="gcp", region=None)
    for bad in ("azure:eastus", "aws:not a region"):
        with pytest.raises(SpecError, match="checkpoint"):
            dataclasses.replace(spec, checkpoint_bucket=bad)
    with pytest.raises(InputError):
        place_named("aws:local")
