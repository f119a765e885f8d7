"""A change's restore from a checkpoint bucket outside its ranks' regions is in the controller's
expected cost of the change (controller/state_load.StateLoad.restore_egress), as the engine reads it:
rank 0's whole-checkpoint verification, and every rank that loads from storage its stage's files."""

from __future__ import annotations

import dataclasses

import pytest

from sailor_core.controller import ControllerConfig, ControllerState, Event, EventKind, PlanOption, decide
from sailor_core.controller.economics import Costs, change_usd
from sailor_core.controller.policy import _ranking
from sailor_core.controller.state_load import StateLoad, checkpoint_bytes_for, stage_state_bytes
from sailor_core.network.storage_egress import bucket_place
from sailor_core.objective import JobTerms, Objective
from tests.controller.test_state_load import CKPT, HALF, MODEL, NUM_LAYERS, STORAGE_BW, plan

A, B, C = ("V100-16", "us-east-1a"), ("V100-16", "us-east-1b"), ("T4", "us-east-1a")
FAR, NEAR = bucket_place("s3://b", "us-west-2"), bucket_place("s3://b", "us-east-1")
FAR_NAME = FAR.name


def load(bucket, handover: bool = True) -> StateLoad:
    return StateLoad(storage_load_s=CKPT / STORAGE_BW, storage_bw_bytes_per_s=STORAGE_BW, handover=handover,
                     bucket=bucket)


def last_stage_files(lo: int) -> float:
    """What a rank of the stage [lo, NUM_LAYERS) reads: its layers, and layer 0's (the model ties its head)."""
    return stage_state_bytes(MODEL, None, lo, NUM_LAYERS) + stage_state_bytes(MODEL, None, 0, 1)


def test_a_change_that_restores_from_a_far_bucket_reads_what_the_engine_reads():
    # stage 2 had one replica, in B, and B lost it: its layers only the checkpoint has
    held = plan((0, HALF, {A: 2}, 1), (HALF, NUM_LAYERS, {B: 1}, 1))
    new = plan((0, HALF, {A: 1}, 1), (HALF, NUM_LAYERS, {A: 1}, 1))
    got = load(FAR).restore_egress(new, holder=held, lost={B: 1})
    # rank 0 (in A) verifies the whole checkpoint; stage 2's rank (in A) reads its files
    want_bytes = checkpoint_bytes_for(MODEL) + last_stage_files(HALF)
    assert list(got) == [(FAR_NAME, A[1])]
    assert got[(FAR_NAME, A[1])] == pytest.approx((want_bytes, want_bytes * 0.02 / 1e9))
    assert load(NEAR).restore_egress(new, holder=held, lost={B: 1}) == {}
    assert load(None).restore_egress(new, holder=held, lost={B: 1}) == {}
    # the change's load egress: the restore's pairs beside the handover's (none here: same zone)
    assert load(FAR).load_egress(new, holder=held, lost={B: 1}) == got
    assert load(FAR).load_egress(new, holder=held, lost={B: 1}, restores=False) == {}


def test_without_a_holder_every_rank_reads_its_stage_whole_each_tp_rank_its_own_copy():
    new = plan((0, HALF, {A: 1}, 2), (HALF, NUM_LAYERS, {A: 1, B: 1}, 1))
    for got in (load(FAR).restore_egress(new, holder=None, lost={}),
                load(FAR, handover=False).restore_egress(new, holder=new, lost={})):
        first = checkpoint_bytes_for(MODEL) + 2 * stage_state_bytes(MODEL, None, 0, HALF) + last_stage_files(HALF)
        assert got[(FAR_NAME, A[1])][0] == pytest.approx(first)
        assert got[(FAR_NAME, B[1])][0] == pytest.approx(last_stage_files(HALF))


def test_a_handover_from_survivors_still_pays_rank_0_s_verification():
    held = plan((0, NUM_LAYERS, {A: 2}, 1))
    new = plan((0, NUM_LAYERS, {A: 1, B: 1}, 1))
    got = load(FAR).restore_egress(new, holder=held, lost={})
    assert {p: n for p, (n, _) in got.items()} == pytest.approx({(FAR_NAME, A[1]): checkpoint_bytes_for(MODEL)})
    both = load(FAR).load_egress(new, holder=held, lost={})
    assert both == {**load(FAR).handover_egress(new, holder=held, lost={}), **got} and len(both) == 2


def test_the_controller_s_cost_of_a_change_counts_the_restore_only_from_a_far_bucket():
    held = PlanOption(gpus={A: 2}, throughput_samples_per_s=2.0, usd_per_hr=2.0, plan=plan((0, NUM_LAYERS, {A: 2}, 1)))
    new = PlanOption(gpus={C: 2}, throughput_samples_per_s=2.0, usd_per_hr=1.0, plan=plan((0, NUM_LAYERS, {C: 2}, 1)))

    def usd(bucket, **kw) -> float:
        costs = Costs(save_s=0.0, provisioning_s=90.0, startup_s=70.0, work_lost_s=0.0, state_load=load(bucket))
        return change_usd(new, running=held, costs=costs, holder=held, lost={}, **kw)

    assert usd(NEAR) == 0.0  # the bucket in the zones' region
    assert usd(FAR) == pytest.approx(load(FAR).restore_egress(new.plan, holder=held.plan, lost={})[(FAR_NAME, A[1])][1])
    # A's instances go with the change and take their state with them: rank 0 verifies the whole
    # checkpoint, then each of the two new ranks reads its stage's files (the whole model)
    assert usd(FAR) == pytest.approx(3 * checkpoint_bytes_for(MODEL) * 0.02 / 1e9)
    assert usd(FAR, restores=False) == 0.0  # no checkpoint yet: nothing to read


def test_a_switch_that_pays_near_the_bucket_does_not_pay_its_restore_from_a_far_one():
    """Finishing cheapest, a cheaper plan on new instances beside the running one: from a bucket in
    the zones' region the switch pays; from a far one the restore's egress (rank 0's verification
    of the whole checkpoint, and each new rank's stage: the running plan's instances go with the
    change) is in the new plan's expected cost, which then exceeds the running
    plan's, so the controller keeps it.  The work left is set so that the switch saves half the
    restore's egress."""
    now = PlanOption(gpus={A: 2}, throughput_samples_per_s=2.0, usd_per_hr=2.0, plan=plan((0, NUM_LAYERS, {A: 2}, 1)))
    new = PlanOption(gpus={C: 2}, throughput_samples_per_s=2.0, usd_per_hr=1.6, plan=plan((0, NUM_LAYERS, {C: 2}, 1)))
    restore_usd = 3 * checkpoint_bytes_for(MODEL) * FAR.usd_per_byte(A[1])

    def config(bucket) -> ControllerConfig:
        return ControllerConfig(provisioning_s=30.0, startup_s=20.0, rejoin_s=10.0, state_load=load(bucket),
                                terms=JobTerms(objective=Objective.COST))

    def ranking(bucket, remaining: float):
        state = ControllerState(plan=now, available={A: 2, C: 2}, samples_done=1.0, samples_target=1.0 + remaining,
                                planned_on={A: 2})
        return state, _ranking(state, config(bucket), remaining, lost={}, broken=False)

    change_s = ranking(NEAR, 1e4)[1].of(new).change_s
    # saved: the rent's difference over the training, less the new plan's rent over its change
    remaining = (restore_usd / 2 + new.usd_per_hr * change_s / 3600) * 3600 * 2.0 / (now.usd_per_hr - new.usd_per_hr)
    state, near_rank = ranking(NEAR, remaining)
    far_rank = ranking(FAR, remaining)[1]
    assert near_rank.of(now).cost_usd - near_rank.of(new).cost_usd == pytest.approx(restore_usd / 2)
    assert far_rank.of(new).cost_usd - near_rank.of(new).cost_usd == pytest.approx(restore_usd)
    assert far_rank.of(now).cost_usd == near_rank.of(now).cost_usd  # the running plan loads nothing

    plans = lambda avail: [o for o in (now, new) if o.fits_in(avail)]  # noqa: E731
    event = Event(kind=EventKind.CAPACITY)
    near = decide(state, event, config=config(NEAR), plan_fn=plans)
    far = decide(state, event, config=config(FAR), plan_fn=plans)
    assert near.changes_plan and near.plan is new
    assert not far.changes_plan and far.plan is now
    # a first start reads no checkpoint: nothing to restore, the far bucket weighs nothing
    first = dataclasses.replace(state, plan=None, samples_done=0.0, last_plan=None, planned_on=None)
    assert _ranking(first, config(FAR), remaining, lost={}, broken=False).of(new).load_egress_usd == 0.0
    resumed = dataclasses.replace(first, samples_done=1.0)  # a job picked up again: its checkpoint is read
    assert _ranking(resumed, config(FAR), remaining, lost={}, broken=False).of(new).load_egress_usd == \
        pytest.approx(restore_usd)
