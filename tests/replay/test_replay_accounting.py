"""The replay's accounting on small hand-computed traces (linear planner: 10 samples/s per A100,
4 per V100; every GPU costs 1 USD/h)."""

import dataclasses
import math

import pytest

from sailor_core.catalog.layers import layer_shapes
from sailor_core.controller import ControllerConfig
from sailor_core.controller import controller_config
from sailor_core.network.model import Endpoint, default_network
from sailor_core.plan.types import Plan, Replica, Stage
from sailor_core.replay import ChangeCosts, Goal, Market, ReplayPolicy, controller_costs, replay
from sailor_core.controller.state_load import checkpoint_bytes_for
from sailor_core.traces import build_trace, derive_preset

from tests.controller.planners import linear_planner

A = ("A100-40", "us-central1-a")   # GCP: 30 s notice
V = ("V100-16", "us-east-1a")      # AWS: 120 s notice
ONE_USD = lambda gpu, zone, t: 1.0  # noqa: E731

# 4 A100s, 2 of them preempted at 1 h, back at 2 h.
DIP = build_trace([(0.0, {A: 4}), (3600.0, {A: 2}), (7200.0, {A: 4})])
# (workers that start once the VM runs: the start-up after the provisioning, as before standby workers)
FAST = ChangeCosts(standby_workers=False, provisioning_s=100, startup_s=50, rejoin_s=10, checkpoint_bytes=0,
                  checkpoint_interval_s=1e9, terminate_s=0)


def run(trace, policy, costs=FAST, target=288_000, budget=None, gpu="A100-40"):
    config = controller_config(policy, costs=controller_costs(costs), shutdown_s=costs.shutdown_s, gpu_type=gpu)
    return replay(trace, policy=ReplayPolicy(config=config, plan_fn=linear_planner, name=policy),
                  market=Market(price_fn=ONE_USD), goal=Goal(samples_target=target, budget_usd=budget), costs=costs)


def test_ours_replans_on_loss_and_grows_back():
    r = run(DIP, "ours")
    # 0-150 start-up; 150-3600 at 40/s (138000); 3600 lose 2, restart on the 2 left (no VMs to
    # provision: their parked workers rejoin, 10 s); 3610-7200 at 20/s (71800); 7200 grow back:
    # the 2 rejoin (10 s) and train on while the 2 new instances boot (90 s, 1800), then 50 s
    # start-up; 7350 + 76400/40 = 9260.  Billed: new VMs from when they run (the first 4 at 100,
    # the 2 grown back at 7300), the 2 kept through the loss and the growth without a break.
    assert r.finished and r.time_to_train_s == pytest.approx(9260)
    assert r.usd_spent == pytest.approx((4 * 3500 + 2 * 3600 + 2 * 2060 + 2 * 1960) / 3600)
    assert (r.num_replans, r.num_restarts, r.num_preemptions_hit, r.num_interims) == (2, 1, 1, 1)
    assert r.work_lost_samples == 0  # nothing to save: the emergency checkpoint fits the notice
    assert r.useful_work_fraction == pytest.approx(
        (4 * 3450 + 2 * 3590 + 2 * 90 + 4 * 1910) / (14000 + 7200 + 4120 + 3920))


def test_standby_workers_start_new_instances_as_a_rejoin():
    r = run(DIP, "ours", costs=dataclasses.replace(FAST, standby_workers=True))
    # As above, but new instances' workers started at boot, parked: once the VMs run they start
    # in the rejoin's 10 s, not the start-up's 50: 0-100 provisioning, 110-3600 at 40/s (139600);
    # 3610-7200 at 20/s (71800); the interim 7210-7300 (1800); the 4 ready at 7310, 74800 left at
    # 40/s: done at 9180 (80 s sooner: two start-ups of 40 s less).
    assert r.finished and r.time_to_train_s == pytest.approx(9180)
    assert r.gpu_s_by_activity["starting"] == pytest.approx(4 * 10 + 2 * 10 + 2 * 10 + 4 * 10)
    assert (r.num_replans, r.num_restarts, r.num_interims) == (2, 1, 1)


def test_standby_workers_start_what_the_provisioning_does_not_hide():
    assert ChangeCosts(provisioning_s=100, startup_s=50, rejoin_s=10).new_instance_start_s == 10
    assert ChangeCosts(provisioning_s=30, startup_s=60, rejoin_s=10).new_instance_start_s == 30
    assert ChangeCosts(provisioning_s=100, startup_s=50, rejoin_s=10, standby_workers=False).new_instance_start_s == 50
    # the controller weighs a start-up onto new instances as the replay runs it, the reload included
    for standby, start_s in ((True, 10 + 4), (False, 50 + 4)):
        costs = ChangeCosts(provisioning_s=100, startup_s=50, rejoin_s=10, checkpoint_bytes=4e9,
                            standby_workers=standby)
        assert controller_costs(costs).startup_s == pytest.approx(start_s)
        assert controller_costs(costs).restart_s == pytest.approx(100 + start_s)


def test_the_paid_gpu_time_is_told_by_activity():
    r = run(DIP, "ours")
    # Start: 4 GPUs start up 100-150 (new instances are not paid while they boot); 3600: the 2
    # held rejoin, 10 s; 7200: the 2 held rejoin (10 s) and train on until the 2 new instances
    # run (100 s after), then 4 start up for 50 s; the rest trains.
    assert r.gpu_s_by_activity == pytest.approx({
        "training": 4 * 3450 + 2 * 3590 + 2 * 90 + 4 * 1910, "redone": 0.0, "checkpointing": 0.0,
        "provisioning": 0.0, "starting": 4 * 50 + 2 * 10 + 2 * 10 + 4 * 50, "other": 0.0})
    assert r.useful_work_fraction == pytest.approx(r.gpu_s_by_activity["training"] / sum(r.gpu_s_by_activity.values()))


def _one_of_two_v100s_lost_with_slow_saves():
    """2 V100s, one taken at 3000 s; 200 s saves, longer than AWS's 120 s notice; no parked workers."""
    trace = build_trace([(0.0, {V: 2}), (3000.0, {V: 1})])
    costs = ChangeCosts(standby_workers=False, provisioning_s=100, startup_s=50, rejoin_s=50, checkpoint_bytes=200e9,
                        storage_bw_bytes_per_s=1e9, checkpoint_interval_s=1000, terminate_s=0)
    return run(trace, "ours", costs=costs, target=20_400, gpu="V100-16")


def test_saves_and_work_redone_are_told_apart():
    r = _one_of_two_v100s_lost_with_slow_saves()
    by = r.gpu_s_by_activity
    # periodic saves: 2 GPUs x 2 x 200 s, then 1 GPU x 200 s; the 3600 samples lost at 3000 s
    # were 450 s of 2 GPUs (at 8/s); the survivor starts 50 s and reloads 200 s; the final save is
    # "other"
    assert by["checkpointing"] == pytest.approx(2 * 2 * 200 + 200)
    assert by["redone"] == pytest.approx(2 * 450) and by["starting"] == pytest.approx(2 * 50 + 250)
    assert by["other"] == pytest.approx(200)
    assert sum(by.values()) == pytest.approx(2 * 2900 + 1750)


def test_static_never_grows_back():
    r = run(DIP, "static")
    # After the loss it keeps 2 GPUs (rejoining in 10 s): 78200 samples left at 7200 take 3910 s more.
    assert r.time_to_train_s == pytest.approx(11110)
    assert r.usd_spent == pytest.approx((4 * 3500 + 2 * (11110 - 3600)) / 3600)
    assert (r.num_replans, r.num_restarts) == (1, 1)


def test_skypilot_waits_for_its_whole_request():
    r = run(DIP, "skypilot")
    # Needs 4 A100s in one zone: waits 3600-7200, restarts with 150 s start-up, 150000 left at 40/s
    # (billed 100-3600, then from 7300, when the new VMs run).
    assert r.time_to_train_s == pytest.approx(7350 + 3750)
    assert r.usd_spent == pytest.approx(4 * (3500 + 3800) / 3600)
    assert r.wait_s == pytest.approx(3600)
    assert (r.num_replans, r.num_restarts) == (1, 1)


def test_work_since_checkpoint_is_lost_when_the_notice_is_too_short():
    r = _one_of_two_v100s_lost_with_slow_saves()
    # Checkpoints at 1150 (8000) and 2350 (16000), each pausing 200 s; 19600 at 3000 when 1 GPU goes:
    # 3600 samples lost.  Restart on the survivor: 50 s start-up + 200 s load, ready at 3250;
    # checkpoint at 4250 (20000) pauses till 4450; 400 more at 4/s: done at 4550, then a 200 s final save.
    assert r.work_lost_samples == pytest.approx(3600)
    assert r.time_to_train_s == pytest.approx(4550)
    assert r.end_s == pytest.approx(4750)
    assert r.usd_spent == pytest.approx(2 * 2900 / 3600 + 1750 / 3600)
    assert r.useful_work_fraction == pytest.approx((4900 + 1100 - 900) / 7550)


@pytest.mark.parametrize("terminate_s", [0, 60])
def test_budget_stop_lands_exactly_on_the_budget(terminate_s):
    costs = ChangeCosts(standby_workers=False, provisioning_s=100, startup_s=50, checkpoint_bytes=0,
                        checkpoint_interval_s=1e9, terminate_s=terminate_s)
    r = run(build_trace([(0.0, {A: 4})]), "ours", costs=costs, budget=1.0)
    # 4 USD/h: the budget buys 900 s from when the VMs run (100 s), the last `terminate_s` of them
    # for the shutdown; training starts at 150 s.
    assert not r.finished and r.stop_reason.startswith("budget")
    assert r.usd_spent == pytest.approx(1.0)
    assert r.samples_done == pytest.approx(40 * (100 + 900 - terminate_s - 150))


@pytest.mark.parametrize("policy", ["ours", "skypilot", "single-type", "static"])
@pytest.mark.parametrize("budget", [3.0, 250.0])
def test_ledger_never_crosses_the_budget(policy, budget):
    trace = derive_preset("gcp-4d", seed=2)
    costs = ChangeCosts(provisioning_s=90, startup_s=60, checkpoint_bytes=4e9, terminate_s=30)
    config = controller_config(policy, costs=controller_costs(costs), shutdown_s=costs.shutdown_s,
                               gpu_type="A100-40")
    r = replay(trace, policy=ReplayPolicy(config=config, plan_fn=linear_planner),
               market=Market(price_fn=lambda g, z, t: 1.0 + 0.1 * len(z)),
               goal=Goal(samples_target=5e7, budget_usd=budget), costs=costs)
    assert r.usd_spent <= budget + 1e-6
    assert r.finished or r.stop_reason.startswith(("budget", "static", "horizon"))


def test_trivial_config_without_changes():
    trace = build_trace([(0.0, {A: 2})])
    r = replay(trace, policy=ReplayPolicy(config=ControllerConfig(), plan_fn=linear_planner),
               market=Market(price_fn=ONE_USD), goal=Goal(samples_target=72_000), costs=FAST)
    assert r.time_to_train_s == pytest.approx(150 + 3600)
    assert r.usd_spent == pytest.approx(2 * 3650 / 3600)  # billed from 100 s, when the VMs run
    assert r.num_replans == 0 and math.isclose(r.useful_work_fraction, 3600 / 3650)


def test_policy_counts_on_a_two_type_trace():
    B = ("V100-16", "us-central1-a")
    trace = build_trace([(0.0, {A: 4, B: 4}), (3600.0, {A: 0, B: 4}), (7200.0, {A: 4, B: 4})])
    ours = run(trace, "ours", target=2e6)
    # Loses the A100s at 1 h (restart on the V100s alone), grows back at 2 h.
    assert (ours.num_replans, ours.num_restarts, ours.num_preemptions_hit) == (2, 1, 1)
    assert ours.wait_s == 0
    single = run(trace, "single-type", target=2e6, gpu="A100-40")
    # A100s only: nothing to run between 1 h and 2 h.
    assert (single.num_replans, single.num_restarts) == (1, 1)
    assert single.wait_s == pytest.approx(3600)
    assert single.usd_spent < ours.usd_spent and single.time_to_train_s > ours.time_to_train_s
    assert set(single.usd_by_gpu_zone) == {"A100-40@us-central1-a"}


def test_spot_price_series_is_charged_as_it_changes(tmp_path):
    from sailor_core.replay import load_price_series

    p = tmp_path / "prices.csv"
    p.write_text(",Timestamp,A100-40_us-central1-a\n0,1000,1.0\n1,2800,2.0\n")
    series = load_price_series(p)
    trace = build_trace([(0.0, {A: 4})])
    r = replay(trace, policy=ReplayPolicy(config=controller_config("ours", costs=controller_costs(FAST), shutdown_s=FAST.shutdown_s), plan_fn=linear_planner),
               market=Market(price_fn=series.price_fn(fallback=ONE_USD), price_change_times=series.change_times()),
               goal=Goal(samples_target=40 * 3600), costs=FAST)
    # 4 GPUs, running from 100 s: 1700 s at 1 USD/h each, then 1950 s at 2 USD/h until the end
    # at 150 + 3600 s.
    assert r.time_to_train_s == pytest.approx(3750)
    assert r.usd_spent == pytest.approx(4 * (1700 / 3600 * 1.0 + 1950 / 3600 * 2.0))


def test_bad_price_series(tmp_path):
    from sailor_core.errors import InputError
    from sailor_core.replay import load_price_series

    p = tmp_path / "prices.csv"
    p.write_text(",Timestamp,A100-40_us-central1-a\n0,1000,-1\n")
    with pytest.raises(InputError, match=">= 0"):
        load_price_series(p)


def test_a_preempted_gpu_is_replaced_by_a_new_instance():
    from sailor_core.traces import PreemptionEvent

    # At 1 h one of our 4 A100s is taken and the pool refills at once: the plan on 4 GPUs again
    # needs a new instance (100 s provisioning) besides the start-up (50 s), as the controller expects.
    trace = build_trace([(0.0, {A: 4}), (7200.0, {A: 4})],
                        preemptions=[PreemptionEvent(time_s=3600.0, gpu=A[0], zone=A[1], num_gpus=1)])
    r = run(trace, "ours")
    # 0-150 start-up; 150-3600 at 40/s (138000); 3600: the 3 survivors rejoin (10 s) and train
    # at 30/s until the new instance runs at 3700 (2700), then 50 s start-up; 147300 / 40 = 3682.5.
    assert r.finished and r.num_preemptions_hit == 1 and r.num_interims == 1
    assert r.time_to_train_s == pytest.approx(7432.5)


def _two_hits(costs):
    from sailor_core.traces import PreemptionEvent

    trace = build_trace([(0.0, {A: 4}), (7200.0, {A: 4})],
                        preemptions=[PreemptionEvent(time_s=t, gpu=A[0], zone=A[1], num_gpus=1) for t in (3600.0, 3650.0)])
    return run(trace, "ours", costs=costs)


def test_no_interim_when_the_survivors_would_only_rejoin_and_save():
    # The rejoin takes as long as the new instance's provisioning: the survivors wait, as before.
    costs = ChangeCosts(provisioning_s=100, startup_s=50, rejoin_s=100, checkpoint_bytes=0,
                        checkpoint_interval_s=1e9, terminate_s=0)
    r = _two_hits(costs)
    assert r.num_interims == 0 and r.gpu_s_by_activity["provisioning"] > 0


def test_an_interim_cut_by_a_preemption_loses_its_unsaved_progress():
    # Saves of 40 s do not fit GCP's 30 s notice, and no periodic checkpoint comes: the hit at
    # 3600 loses all 134000 samples (0-250 start-up, then 40/s); the 3 survivors rejoin (10 s,
    # nothing to load) and train at 30/s from 3610 until the second hit at 3650 takes those 1200.
    costs = ChangeCosts(standby_workers=False, provisioning_s=200, startup_s=50, rejoin_s=10, checkpoint_bytes=40e9,
                        storage_bw_bytes_per_s=1e9, checkpoint_interval_s=1e9, terminate_s=0)
    r = _two_hits(costs)
    assert r.num_interims >= 1 and r.num_preemptions_hit == 2
    assert r.work_lost_samples == pytest.approx(134000 + 1200)
    assert r.gpu_s_by_activity["redone"] == pytest.approx(4 * 3350 + 3 * 40)


def _with_egress(usd_per_hr):
    """The linear planner whose options' bytes across zones cost ``usd_per_hr`` while they train."""
    import dataclasses

    return lambda available: [dataclasses.replace(o, egress_usd_per_hr=usd_per_hr) for o in linear_planner(available)]


@pytest.mark.parametrize("terminate_s", [0, 60])
def test_egress_is_charged_while_training_and_the_budget_stop_holds_with_it(terminate_s):
    costs = ChangeCosts(standby_workers=False, provisioning_s=100, startup_s=50, checkpoint_bytes=0,
                        checkpoint_interval_s=1e9, terminate_s=terminate_s)
    config = controller_config("ours", costs=controller_costs(costs), shutdown_s=costs.shutdown_s, gpu_type="A100-40")
    r = replay(build_trace([(0.0, {A: 4})]), policy=ReplayPolicy(config=config, plan_fn=_with_egress(2.0), name="ours"),
               market=Market(price_fn=ONE_USD), goal=Goal(samples_target=288_000, budget_usd=1.0), costs=costs)
    # 4 USD/h of rent from 100 s, 2 USD/h more of egress while training from 150 s: the budget
    # is spent at t with 4 (t - 100) + 2 (t - 150) = 3600, t = 700 s, of which the shutdown
    # (rent only) is the last `terminate_s`: training stops at t_stop with
    # 4 (t_stop + terminate_s - 100) + 2 (t_stop - 150) = 3600
    t_stop = (3600 + 400 + 300 - 4 * terminate_s) / 6
    assert not r.finished and r.stop_reason.startswith("budget")
    assert r.usd_spent == pytest.approx(1.0)
    assert r.egress_usd == pytest.approx(2.0 * (t_stop - 150) / 3600)
    assert r.samples_done == pytest.approx(40 * (t_stop - 150))
    assert r.to_dict()["egress_usd"] == r.egress_usd


def _dp_planner(available):
    """``linear_planner``'s options, each with a ``Plan``: one stage of the whole model, a replica
    per GPU (so survivors of a loss keep their shards)."""
    num_layers = len(layer_shapes("opt-350m", seq_len=1))
    out = []
    for o in linear_planner(available):
        replicas = tuple(Replica(gpu=g, zone=z, tp_degree=1) for (g, z), n in o.gpus.items() for _ in range(n))
        p = Plan(model="opt-350m", global_batch_size=1024, micro_batch_size=1,
                 stages=(Stage(layer_start=0, layer_end=num_layers, replicas=replicas),))
        out.append(dataclasses.replace(o, plan=p))
    return out


@pytest.mark.parametrize("handover", [True, False])
def test_survivors_hand_the_state_over_instead_of_reloading_it(handover):
    ckpt = checkpoint_bytes_for("opt-350m")
    costs = ChangeCosts(provisioning_s=100, startup_s=50, rejoin_s=10, checkpoint_bytes=ckpt,
                        checkpoint_interval_s=1e9, terminate_s=0, handover=handover)
    config = controller_config("ours", costs=controller_costs(costs), shutdown_s=costs.shutdown_s)
    r = replay(DIP, policy=ReplayPolicy(config=config, plan_fn=_dp_planner, name="ours"),
               market=Market(price_fn=ONE_USD), goal=Goal(samples_target=288_000), costs=costs)
    # 0: 4 start (nothing to load); 3600: the 2 survivors rejoin; 7200: they rejoin for the
    # interim, then all 4 once the 2 new instances run.  With the handover the survivors keep
    # their shards (no load) and the new ranks receive theirs from a peer in the zone; without
    # it every one of those reloads the checkpoint.
    shard_s = default_network().p2p_time_s(ckpt, Endpoint(gpu=A[0], zone=A[1]), Endpoint(gpu=A[0], zone=A[1]))
    load_s, new_load_s = (0.0, shard_s) if handover else (costs.load_s, costs.load_s)
    assert (r.num_replans, r.num_restarts, r.num_interims) == (2, 1, 1)
    assert r.gpu_s_by_activity["starting"] == pytest.approx(4 * 10 + 2 * (10 + load_s) + 2 * (10 + load_s)
                                                          + 4 * (10 + new_load_s))


def test_after_an_interim_the_plan_it_stood_in_for_holds_the_state():
    from sailor_core.traces import PreemptionEvent

    # 3600: one of 4 GPUs taken, the pool refills: the 3 survivors train on an interim while a
    # new instance boots, then all 4 (the new rank receives its shard from a peer).  5000: the pool
    # shrinks to 3, taking one of ours: the 3 left rejoin on GPUs all held.  By then the 4-GPU plan trains and
    # its 3 survivors keep their shards: nothing to load (the interim, which ran on other ranks'
    # layout, holds nothing any more).
    ckpt = checkpoint_bytes_for("opt-350m")
    costs = ChangeCosts(provisioning_s=100, startup_s=50, rejoin_s=10, checkpoint_bytes=ckpt,
                        checkpoint_interval_s=1e9, terminate_s=0)
    trace = build_trace([(0.0, {A: 4}), (5000.0, {A: 3})],
                        preemptions=[PreemptionEvent(time_s=3600.0, gpu=A[0], zone=A[1], num_gpus=1)])
    config = controller_config("ours", costs=controller_costs(costs), shutdown_s=costs.shutdown_s)
    r = replay(trace, policy=ReplayPolicy(config=config, plan_fn=_dp_planner, name="ours"),
               market=Market(price_fn=ONE_USD), goal=Goal(samples_target=288_000), costs=costs)
    shard_s = default_network().p2p_time_s(ckpt, Endpoint(gpu=A[0], zone=A[1]), Endpoint(gpu=A[0], zone=A[1]))
    assert (r.num_replans, r.num_restarts, r.num_interims) == (2, 2, 1)
    # start: 4 x 10 s; the interim: 3 rejoin (10 s, their own shards); the 4: 10 s and the new
    # rank's shard; 5000: 3 rejoin, nothing to load
    assert r.gpu_s_by_activity["starting"] == pytest.approx(4 * 10 + 3 * 10 + 4 * (10 + shard_s) + 3 * 10)
