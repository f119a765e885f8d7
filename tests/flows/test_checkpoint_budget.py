"""The flow's controller weighs a job's saves to a bucket in another region: in each plan's cost per
hour and, one save kept back, in the budget left (the save a stop makes must fit too)."""

from __future__ import annotations

import dataclasses

import pytest

from sailor_core.catalog.instances import catalog_offers
from sailor_core.controller import Event, EventKind
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec
from tasks import control

ZONE = "us-east-1a"
FAR = JobSpec(model="tiny", budget_usd=0.05, steps=1000, global_batch_size=16, gpus=("T4",), zones=(ZONE,),
              max_gpus=1, checkpoint_url="s3://b/ckpt", checkpoint_region="us-west-2", checkpoint_every_steps=5)
NEAR = dataclasses.replace(FAR, checkpoint_region="us-east-1")


def _setup(spec: JobSpec):
    offers = catalog_offers(gpus=["T4"], zones=[ZONE])
    available = control.availability(offers, max_gpus_per_zone=1, max_gpus=1)
    planner = control.job_planner(spec, offers)
    return planner, available, planner(available)[0]


def test_a_far_buckets_saves_are_in_each_options_cost_per_hour():
    _, _, far = _setup(FAR)
    _, _, near = _setup(NEAR)
    assert near.egress_usd_per_hr == 0.0 and far.usd_per_hr == near.usd_per_hr
    save_usd = control.checkpoint_egress(FAR).save_usd(far.plan)
    saves_per_hr = far.throughput_samples_per_s / far.plan.global_batch_size * 3600 / FAR.checkpoint_every_steps
    assert far.egress_usd_per_hr == pytest.approx(save_usd * saves_per_hr) and save_usd > 0


def test_one_save_is_kept_back_from_the_budget_so_the_stop_comes_before_a_write_would_cross_it():
    for spec in (FAR, NEAR):
        planner, available, option = _setup(spec)
        state = js.new_job(spec, job_id="cb")
        now = state.created_unix_s
        reserve = control.checkpoint_egress(spec).reserve_usd(option)
        seen = control.controller_state(state, available=available, current=option, now_unix_s=now)
        assert seen.budget_left_usd == pytest.approx(spec.budget_usd - reserve)
        d = control.controller_decision(planner, state, available=available, event=Event(kind=EventKind.TIMER),
                                        current=option, shutdown_s=5.0, now_unix_s=now)
        # the stretch the controller allows leaves the shutdown's rent and one save unspent
        spent_by_stop = (option.cost_usd_per_hr * d.stop_in_s + option.usd_per_hr * 5.0) / 3600 + reserve
        assert spent_by_stop == pytest.approx(spec.budget_usd)
        assert (reserve > 0) == (spec is FAR)


def test_the_flows_costs_of_a_change_read_the_checkpoint_from_the_job_s_bucket():
    """A change's restore from the far bucket is in the controller's expected cost of the change
    (``StateLoad.restore_egress``); from the near one, and from a local folder, it costs nothing."""
    from sailor_core.network.storage_egress import BucketPlace

    _, _, option = _setup(FAR)
    far, near = control.flow_costs(FAR).state_load, control.flow_costs(NEAR).state_load
    assert far.bucket == BucketPlace(cloud="aws", region="us-west-2")
    assert near.bucket == BucketPlace(cloud="aws", region="us-east-1")
    assert control.flow_costs(dataclasses.replace(FAR, checkpoint_url="", checkpoint_region="")).state_load.bucket is None
    # a resume (nothing held): rank 0 verifies the whole checkpoint, then the one rank reads its stage's files
    assert far.load_usd(option.plan, holder=None, lost={}) > 0
    assert near.load_usd(option.plan, holder=None, lost={}) == 0.0
