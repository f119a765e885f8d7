"""A change's load (controller/state_load.py): what the new plan's ranks receive from the ranks
that hold the state, over the network model's links, and what only storage has."""

import pytest

from sailor_core.catalog.layers import layer_shapes
from sailor_core.controller import PlanOption
from sailor_core.controller.economics import Costs, change_s
from sailor_core.controller.state_load import StateLoad, checkpoint_bytes_for
from sailor_core.network.model import Endpoint, default_network
from sailor_core.plan.types import Plan, Replica, Stage
from sailor_core.regimes import DEFAULT_REGIME, get_regime
from sailor_core.replay.costs import ChangeCosts

MODEL = "opt-350m"
A, B = ("V100-16", "us-east-1a"), ("V100-16", "us-east-1b")
NUM_LAYERS = len(layer_shapes(MODEL, seq_len=1))
STORAGE_BW = 1e9
CKPT = checkpoint_bytes_for(MODEL)
LOAD = StateLoad(storage_load_s=CKPT / STORAGE_BW, storage_bw_bytes_per_s=STORAGE_BW)


def plan(*stages: tuple[int, int, dict, int]) -> Plan:
    """Stages as (layer start, end, {pool: replicas}, TP degree)."""
    return Plan(model=MODEL, global_batch_size=1024, micro_batch_size=1, stages=tuple(
        Stage(layer_start=lo, layer_end=hi, replicas=tuple(Replica(gpu=g, zone=z, tp_degree=tp)
                                                           for (g, z), n in pools.items() for _ in range(n)))
        for lo, hi, pools, tp in stages))


def shard_bytes(lo: int, hi: int, tp: int = 1) -> float:
    r = get_regime(DEFAULT_REGIME)
    params = sum(s.params for s in layer_shapes(MODEL, tp_degree=tp, seq_len=1)[lo:hi])
    return params * (r.weight_bytes_per_param + r.optimizer_bytes_per_param)


def p2p_s(num_bytes: float, src, dst) -> float:
    return default_network().p2p_time_s(num_bytes, Endpoint(gpu=src[0], zone=src[1]), Endpoint(gpu=dst[0], zone=dst[1]))


HALF = NUM_LAYERS // 2
OLD = plan((0, HALF, {A: 3}, 1), (HALF, NUM_LAYERS, {A: 3}, 1))


def test_survivors_that_keep_their_shards_load_nothing():
    # a replica of each stage lost in A (the most a GPU lost there can take): DP 3 -> 2, same layout
    new = plan((0, HALF, {A: 2}, 1), (HALF, NUM_LAYERS, {A: 2}, 1))
    assert LOAD.load_s(new, holder=OLD, lost={A: 1}) == 0.0


def test_a_moved_boundary_is_received_from_peers_over_the_network():
    new = plan((0, HALF - 1, {A: 2}, 1), (HALF - 1, NUM_LAYERS, {A: 2}, 1))
    got = LOAD.load_s(new, holder=OLD, lost={A: 1})
    # every rank receives its new shard from a holder in its zone, in parallel: the slowest
    slowest = max(p2p_s(shard_bytes(0, HALF - 1), A, A), p2p_s(shard_bytes(HALF - 1, NUM_LAYERS), A, A))
    assert got == pytest.approx(slowest)
    assert 0 < got < LOAD.storage_load_s


def test_new_instances_receive_their_shard_from_the_nearest_holder():
    held = plan((0, NUM_LAYERS, {A: 1, B: 1}, 1))
    new = plan((0, NUM_LAYERS, {A: 1, B: 2}, 1))  # one new instance in B
    assert LOAD.load_s(new, holder=held, lost={}) == pytest.approx(p2p_s(shard_bytes(0, NUM_LAYERS), B, B))


def test_state_no_survivor_holds_comes_from_storage():
    # stage 2 had one replica, in B, and B lost its GPU: its layers only the checkpoint has
    held = plan((0, HALF, {A: 2}, 1), (HALF, NUM_LAYERS, {B: 1}, 1))
    new = plan((0, HALF, {A: 1}, 1), (HALF, NUM_LAYERS, {A: 1}, 1))
    got = LOAD.load_s(new, holder=held, lost={B: 1})
    assert got == pytest.approx(max(p2p_s(shard_bytes(0, HALF), A, A), shard_bytes(HALF, NUM_LAYERS) / STORAGE_BW))
    assert got < LOAD.storage_load_s  # only the half no survivor holds


def test_without_the_handover_or_a_holder_every_change_reloads_the_checkpoint():
    new = plan((0, HALF, {A: 2}, 1), (HALF, NUM_LAYERS, {A: 2}, 1))
    off = StateLoad(storage_load_s=LOAD.storage_load_s, storage_bw_bytes_per_s=STORAGE_BW, handover=False)
    assert off.load_s(new, holder=OLD, lost={A: 1}) == LOAD.storage_load_s
    assert LOAD.load_s(new, holder=None, lost={}) == LOAD.storage_load_s
    assert LOAD.load_s(None, holder=OLD, lost={}) == LOAD.storage_load_s


def test_a_hit_costs_the_replacement_its_shard():
    # a hit takes one replica; the replacement receives the largest stage's shard from a peer
    assert LOAD.hit_load_s(OLD) == pytest.approx(max(p2p_s(shard_bytes(0, HALF), A, A),
                                                     p2p_s(shard_bytes(HALF, NUM_LAYERS), A, A)))
    single = plan((0, NUM_LAYERS, {A: 1}, 1))  # no other replica: the checkpoint
    assert LOAD.hit_load_s(single) == pytest.approx(shard_bytes(0, NUM_LAYERS) / STORAGE_BW)


def test_the_controller_weighs_the_replay_s_load():
    """One model: the controller's change onto the GPUs held costs the rejoin and the load the
    replay charges for the same change."""
    costs = ChangeCosts(provisioning_s=90, startup_s=60, rejoin_s=10, checkpoint_bytes=CKPT,
                        storage_bw_bytes_per_s=STORAGE_BW)
    ctl = Costs(save_s=costs.save_s, provisioning_s=costs.provisioning_s,
                startup_s=costs.new_instance_start_s + costs.load_s, rejoin_s=costs.rejoin_s + costs.load_s,
                work_lost_s=0.0, state_load=costs.state_load)
    old_opt = PlanOption(gpus={A: 6}, throughput_samples_per_s=6.0, usd_per_hr=6.0, plan=OLD)
    for new in (plan((0, HALF, {A: 2}, 1), (HALF, NUM_LAYERS, {A: 2}, 1)),
                plan((0, HALF - 1, {A: 2}, 1), (HALF - 1, NUM_LAYERS, {A: 2}, 1))):
        opt = PlanOption(gpus={A: 4}, throughput_samples_per_s=4.0, usd_per_hr=4.0, plan=new)
        got = change_s(opt, running=None, held={A: 5}, held_on_demand={}, costs=ctl, holder=old_opt, lost={A: 1})
        assert got == pytest.approx(costs.rejoin_s + costs.load_for_s(new, holder=OLD, lost={A: 1}))
    # without the handover: the rejoin and the whole reload, as before
    no = ChangeCosts(provisioning_s=90, startup_s=60, rejoin_s=10, checkpoint_bytes=CKPT, handover=False)
    assert no.load_for_s(OLD, holder=OLD, lost={}) == no.load_s == CKPT / 1e9


def test_instances_the_new_plan_releases_take_their_state_with_them():
    # moved to another zone (a failover): the old instances end with the change, nothing is handed over
    held = plan((0, NUM_LAYERS, {A: 2}, 1))
    assert LOAD.load_s(plan((0, NUM_LAYERS, {B: 2}, 1)), holder=held, lost={}) == pytest.approx(LOAD.storage_load_s)
    # keeping one of the two: the one kept holds the state, the new instance in B receives it
    got = LOAD.load_s(plan((0, NUM_LAYERS, {A: 1, B: 1}, 1)), holder=held, lost={})
    assert got == pytest.approx(p2p_s(shard_bytes(0, NUM_LAYERS), A, B))


def test_the_controller_loads_from_whoever_holds_the_state_during_a_change():
    """A hit while a plan starts: its ranks do not hold the state yet, the interim's do (the
    replay's ``holder``, passed as ``ControllerState.state_holder``); the controller weighs the
    load the replay charges for the change, from the interim."""
    from sailor_core.controller import ControllerConfig, ControllerState
    from sailor_core.controller.policy import _ranking

    costs = ChangeCosts(provisioning_s=90, startup_s=60, rejoin_s=10, checkpoint_bytes=CKPT,
                        storage_bw_bytes_per_s=STORAGE_BW)
    config = ControllerConfig(provisioning_s=costs.provisioning_s, startup_s=costs.new_instance_start_s + costs.load_s,
                              rejoin_s=costs.rejoin_s + costs.load_s, save_s=costs.save_s, state_load=costs.state_load)
    starting = PlanOption(gpus={A: 4}, throughput_samples_per_s=4.0, usd_per_hr=4.0, plan=plan((0, NUM_LAYERS, {A: 4}, 1)))
    interim = PlanOption(gpus={A: 3}, throughput_samples_per_s=3.0, usd_per_hr=3.0, plan=plan((0, NUM_LAYERS, {A: 3}, 1)))
    new = PlanOption(gpus={A: 3}, throughput_samples_per_s=3.0, usd_per_hr=3.0, plan=plan((0, NUM_LAYERS, {A: 3}, 1)))
    lost = {A: 1}

    def weighed(state_holder):
        state = ControllerState(plan=starting, available={A: 3}, samples_target=1e6, state_holder=state_holder)
        return _ranking(state, config, 1e6, lost=lost, broken=True).of(new).change_s

    # the interim's 3 ranks less the one lost: two adopt their shards, the third receives its own
    from_interim = costs.load_for_s(new.plan, holder=interim.plan, lost=lost)
    assert from_interim == pytest.approx(p2p_s(shard_bytes(0, NUM_LAYERS), A, A)) and from_interim > 0
    assert weighed(interim) == pytest.approx(costs.rejoin_s + from_interim)
    # read from the plan starting instead (3 of its 4 replicas left, all kept): no load at all
    assert weighed(None) == pytest.approx(costs.rejoin_s)


# ---- the handover's bytes across zones and what they cost (StateLoad.handover_egress)

def price(src, dst) -> float:
    return default_network().egress_usd_per_byte(src[1], dst[1])


def test_a_new_rank_in_a_zone_without_holders_is_charged_its_shard_across_zones():
    held = plan((0, NUM_LAYERS, {A: 2}, 1))
    got = LOAD.handover_egress(plan((0, NUM_LAYERS, {A: 1, B: 1}, 1)), holder=held, lost={})
    num_bytes = shard_bytes(0, NUM_LAYERS)
    assert got == {(A[1], B[1]): (pytest.approx(num_bytes), pytest.approx(num_bytes * price(A, B)))}
    assert LOAD.handover_usd(plan((0, NUM_LAYERS, {A: 1, B: 1}, 1)), holder=held, lost={}) > 0
    # a TP-2 replica's two ranks each receive their half
    held_tp = plan((0, NUM_LAYERS, {A: 2}, 2))
    got_tp = LOAD.handover_egress(plan((0, NUM_LAYERS, {A: 1, B: 1}, 2)), holder=held_tp, lost={})
    assert got_tp[(A[1], B[1])][0] == pytest.approx(2 * shard_bytes(0, NUM_LAYERS, 2))


def test_nothing_crosses_zones_where_a_holder_shares_the_receiver_s_zone():
    held = plan((0, NUM_LAYERS, {A: 1, B: 1}, 1))
    assert LOAD.handover_egress(plan((0, NUM_LAYERS, {A: 1, B: 2}, 1)), holder=held, lost={}) == {}
    # from storage (no survivor holds the layers) or without the handover: no egress either
    assert LOAD.handover_egress(plan((0, NUM_LAYERS, {B: 2}, 1)), holder=plan((0, NUM_LAYERS, {A: 1}, 1)),
                                lost={A: 1}) == {}
    off = StateLoad(storage_load_s=LOAD.storage_load_s, storage_bw_bytes_per_s=STORAGE_BW, handover=False)
    assert off.handover_egress(plan((0, NUM_LAYERS, {A: 1, B: 1}, 1)), holder=plan((0, NUM_LAYERS, {A: 2}, 1)),
                               lost={}) == {}


def test_a_same_zone_holder_is_preferred_even_where_the_model_s_cross_zone_link_is_faster():
    # Sailor's measured fits make an A100's link from us-central1-b to us-central1-a faster than
    # within us-central1-a; the runtime still takes the same-zone holder (no egress), and so does the load
    a, b = ("A100-40", "us-central1-a"), ("A100-40", "us-central1-b")
    num_bytes = shard_bytes(0, NUM_LAYERS)
    assert p2p_s(num_bytes, b, a) < p2p_s(num_bytes, a, a)
    held, new = plan((0, NUM_LAYERS, {a: 1, b: 1}, 1)), plan((0, NUM_LAYERS, {a: 2, b: 1}, 1))
    assert LOAD.load_s(new, holder=held, lost={}) == pytest.approx(p2p_s(num_bytes, a, a))
    assert LOAD.handover_egress(new, holder=held, lost={}) == {}


def test_a_shard_spanning_holder_stages_is_charged_each_layer_once():
    held = plan((0, HALF, {A: 1}, 1), (HALF, NUM_LAYERS, {A: 1}, 1))
    new = plan((0, NUM_LAYERS, {A: 1, B: 1}, 1))  # PP 2 -> 1, one replica kept in A, one new in B
    got = LOAD.handover_egress(new, holder=held, lost={})
    # B's rank receives each half once, from its holder stage in A (the load weighs the whole over each link)
    assert got[(A[1], B[1])][0] == pytest.approx(shard_bytes(0, HALF) + shard_bytes(HALF, NUM_LAYERS))


def test_the_controller_s_expected_cost_includes_the_handover_it_charges():
    """The change's handover egress and each expected hit's are in an option's cost, and in the
    budget test, as the replay charges them."""
    from sailor_core.controller.economics import change_usd, outlook

    ctl = Costs(save_s=0.0, provisioning_s=90.0, startup_s=70.0, rejoin_s=10.0, work_lost_s=0.0, state_load=LOAD)
    held = PlanOption(gpus={A: 2}, throughput_samples_per_s=2.0, usd_per_hr=2.0, plan=plan((0, NUM_LAYERS, {A: 2}, 1)))
    new = PlanOption(gpus={A: 1, B: 1}, throughput_samples_per_s=2.0, usd_per_hr=2.0,
                     plan=plan((0, NUM_LAYERS, {A: 1, B: 1}, 1)))
    usd = change_usd(new, running=held, costs=ctl, holder=held, lost={})
    assert usd == pytest.approx(LOAD.handover_usd(new.plan, holder=held.plan, lost={})) and usd > 0
    assert change_usd(held, running=held, costs=ctl, holder=held, lost={}) == 0.0  # no change
    calm = dict(remaining=1e4, change=10.0, rates={}, shares={}, costs=ctl)
    assert outlook(new, change_usd=usd, **calm).cost_usd == pytest.approx(outlook(new, **calm).cost_usd + usd)
    # a hit on the two-zone plan takes its replica in A (its only stage's first); the replacement
    # receives from B across zones: each expected hit adds that
    hit_usd = LOAD.hit_load_usd(new.plan)
    assert hit_usd == pytest.approx(shard_bytes(0, NUM_LAYERS) * price(B, A))
    stormy = outlook(new, remaining=1e4, change=10.0, rates={A: 1e-3}, shares={A: 1.0}, costs=ctl)
    assert stormy.load_egress_usd == pytest.approx(stormy.hits_per_s * 1e4 / 2.0 * hit_usd)


def test_the_budget_test_counts_the_change_s_handover():
    """A budget that pays an option's rent and training egress to the end, but not the state it
    must receive across zones first, rules it out."""
    import dataclasses

    from sailor_core.controller import ControllerConfig, ControllerState
    from sailor_core.controller.policy import _ranking

    config = ControllerConfig(provisioning_s=90.0, startup_s=70.0, rejoin_s=10.0, save_s=4.0, state_load=LOAD)
    held = PlanOption(gpus={A: 2}, throughput_samples_per_s=2.0, usd_per_hr=2.0, plan=plan((0, NUM_LAYERS, {A: 2}, 1)))
    new = PlanOption(gpus={A: 1, B: 1}, throughput_samples_per_s=2.5, usd_per_hr=2.0,
                     plan=plan((0, NUM_LAYERS, {A: 1, B: 1}, 1)))
    state = ControllerState(plan=held, available={A: 2, B: 1}, samples_target=1e4)

    def finishes(budget_usd: float) -> bool:
        rank = _ranking(dataclasses.replace(state, budget_left_usd=budget_usd), config, 1e4, lost={}, broken=False)
        return rank.finishes(rank.of(new))

    o = _ranking(state, config, 1e4, lost={}, broken=False).of(new)
    assert o.load_egress_usd == pytest.approx(LOAD.handover_usd(new.plan, holder=held.plan, lost={})) and o.load_egress_usd > 0
    without = new.usd_for(o.time_s + config.shutdown_s, o.training_s)
    assert not finishes(without + o.load_egress_usd / 2)
    assert finishes(without + o.load_egress_usd * 1.01)
