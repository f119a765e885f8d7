"""A change's load (controller/state_load.py): what the new plan's ranks receive from the ranks
that hold the state, over the network model's links, and what only storage has."""

import pytest

from sailor_core.catalog.layers import layer_shapes
from sailor_core.controller import PlanOption
from sailor_core.controller.economics import Costs, change_s
from sailor_core.controller.state_load import StateLoad
from sailor_core.network.model import Endpoint, default_network
from sailor_core.plan.types import Plan, Replica, Stage
from sailor_core.regimes import DEFAULT_REGIME, get_regime
from sailor_core.replay.costs import ChangeCosts, checkpoint_bytes_for

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
