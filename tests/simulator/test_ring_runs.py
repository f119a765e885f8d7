"""A stage's rings given as runs of equal replicas (what fastsim passes) time and price exactly as
the rings listed replica by replica, their least time from a size up (the planner's bound) is
never more than their time at any larger size, and fastsim's peak memo key
(``memory.peak_inputs``) holds what the peak reads."""

import random

from sailor_core.network.model import Endpoint, default_network
from sailor_core.planner.kinds import shared_kind_cache
from sailor_core.profiles import default_profile_db
from sailor_core.regimes import get_regime
from sailor_core.simulator import compose
from sailor_core.simulator import stage as st
from sailor_core.simulator.memory import (
    dp_bucket_bytes, dp_synced_params, peak_inputs, stage_peak_bytes, profile_head_logits)
from sailor_core.simulator.tables import layer_table

ZONES = ("us-central1-a", "us-central1-b", "us-west1-b")


def _listed_sync_s(net, sync_bytes, replicas):
    """The rule of ``stage_dp_sync_s`` with every ring listed member by member."""
    if len(replicas) <= 1:
        return 0.0
    one = net.allreduce_time_s(sync_bytes, [Endpoint(zone=z, gpu=g, num_gpus=1) for z, g, _ in replicas])
    tp = replicas[0][2]
    if all(r[2] == tp for r in replicas):
        shared = one if tp == 1 else net.allreduce_time_s(
            sync_bytes * tp, [Endpoint(zone=z, gpu=g, num_gpus=t) for z, g, t in replicas])
    else:
        thinnest = min(r[2] for r in replicas)
        shared = net.allreduce_time_s(sync_bytes * thinnest, [
            Endpoint(zone=z, gpu=g, num_gpus=1) for z, g, t in replicas for _ in range(t)])
    return max(shared, one)


def _random_replicas(rng):
    groups = []
    for _ in range(rng.randint(1, 5)):
        groups.append(((rng.choice(ZONES), rng.choice(("A100-40", "V100-16")), rng.choice((1, 2, 4))),
                       rng.randint(1, 6)))
    return groups


def test_runs_time_and_price_a_ring_as_its_replicas_listed():
    net, rng = default_network(), random.Random(7)
    for _ in range(200):
        groups = _random_replicas(rng)
        replicas = [member for member, n in groups for _ in range(n)]
        runs = st.member_runs(groups)
        sync_bytes = rng.choice((3e6, 8 * 2**20, 5e7 + 17, 2.5e8))
        expected = _listed_sync_s(net, sync_bytes, replicas)
        assert st.stage_dp_sync_s(net, sync_bytes, replicas) == expected
        assert st.stage_dp_sync_runs_s(net, sync_bytes, runs) == expected
        assert st.tied_sync_runs_s(net, sync_bytes, runs) == st.tied_sync_s(net, sync_bytes, replicas)
        hops = compose.ring_hop_usd_per_byte(net, [z for z, _, _ in replicas])
        listed = compose.stage_egress_terms(compose.ring_hop_bytes(len(replicas), sync_bytes, min(
            t for _, _, t in replicas)), hops, 0, []) if hops else []
        assert st.tied_sync_egress_terms(net, sync_bytes, replicas) == listed
        assert st.tied_sync_egress_runs_terms(net, sync_bytes, runs) == listed


def test_least_sync_is_never_more_than_the_sync_from_that_size_up():
    # sizes from below the fits' measured range (where bytes / bandwidth falls as a message grows)
    # to several buckets (network.model.ALLREDUCE_BUCKET_BYTES)
    net, rng = default_network(), random.Random(11)
    for _ in range(150):
        runs = st.member_runs(_random_replicas(rng))
        least_bytes = 10 ** rng.uniform(3, 9.7)
        least = st.stage_dp_sync_runs_least_s(net, least_bytes, runs)
        for factor in (1.0, 1 + 1e-9, 1.3, 2.0, 7.0, 40.0, 10 ** rng.uniform(0, 3)):
            assert least <= st.stage_dp_sync_runs_s(net, least_bytes * factor, runs) * (1 + 1e-12)
        for whole in (1, 2, 3):  # a bucket's edges
            size = 5e8 * whole
            if size >= least_bytes:
                for edge in (size * (1 - 1e-9), size, size * (1 + 1e-9)):
                    if edge >= least_bytes:
                        assert least <= st.stage_dp_sync_runs_s(net, edge, runs) * (1 + 1e-12)
        if sum(n for _, n in runs) > 1:
            assert least > 0


def test_member_runs_merge_equal_neighbours_only():
    a, b = ("z1", "g", 1), ("z2", "g", 1)
    assert st.member_runs([(a, 2), (a, 1), (b, 1), (a, 3)]) == ((a, 3), (b, 1), (a, 3))


def test_equal_peak_inputs_give_equal_peaks():
    kinds = shared_kind_cache("opt-350m", None, None, default_profile_db())
    regime = get_regime("megatron-fp32-adamw")
    for tp, mbs in ((1, 4), (2, 8)):
        kind = kinds.get("A100-40", tp, mbs)
        table, logits = layer_table(kind.profile), profile_head_logits(kind.profile)
        seen: dict = {}
        for start, end in ((0, 5), (3, 17), (10, table.num_layers)):
            for inflight in (1, 2, 4):
                for count in (0, 1, 2, 4, 9):
                    for dp in (1, 2, 8, 32):
                        peak = stage_peak_bytes(table, start, end, inflight, regime, logits, count, dp, 0)
                        peak += dp_bucket_bytes(dp_synced_params(table, start, end), regime, dp, 0)
                        key = (start, end, peak_inputs(inflight, count, dp, 0))
                        assert seen.setdefault(key, peak) == peak
