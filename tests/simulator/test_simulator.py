"""Hand-computed cases: every expected number below is worked out from the profile in the comment."""

import json
import math
from pathlib import Path

import pytest

from sailor_core.errors import PlanError, ProfileError
from sailor_core.network import default_network
from sailor_core.regimes import get_regime
from sailor_core.simulator import BREAKDOWN_KEYS, simulate
from sailor_core.source_data import SAILOR_DATA_DIR
from tests.simulator.helpers import db_of, flat_network, hand_profile, plan

MS = 1e-3
SAILOR_HET = SAILOR_DATA_DIR / "providers" / "multizone_bandwidths_het.json"


def _one(gpu="A100-40", zone="local", tp=1):
    return {"gpu": gpu, "tp": tp, "zone": zone}


def test_two_stage_plan():
    # tiny: layers 0..3.  fwd (1, 2, 2, 3) ms, bwd (0, 4, 4, 3) ms.
    # stage 0 = [0, 2): 3 + 4 = 7 ms; stage 1 = [2, 4): 5 + 7 = 12 ms per micro-batch.
    # link: 4096 B forward + 4096 B back at 1 GB/s = 8.192 us.  4 micro-batches.
    # pipeline = 7 + 12 + 0.008192 (fill/drain) + 3 * 12 (stage 1 repeats) = 55.008192 ms
    # update = 3000 params * 1 us = 3 ms on each stage.
    # tiny ties its embeddings: after the pipeline the first and the last stage sum the matrix's
    # gradient (512 x 64 fp32 = 131,072 B) in a ring of the two: 2 x 1 step of half of it, 131.072 us.
    db = db_of(hand_profile("A100-40"))
    p = plan([{"layers": [0, 2], "replicas": [_one()]}, {"layers": [2, 4], "replicas": [_one()]}])
    r = simulate(p, profiles=db, network=flat_network(1e9))
    assert r.breakdown["compute"] == pytest.approx(48 * MS)  # 4 x 12 ms on stage 1
    assert r.breakdown["bubble"] == pytest.approx(7 * MS)
    assert r.breakdown["p2p"] == pytest.approx(2 * 4096 / 1e9)
    assert r.breakdown["dp_sync"] == pytest.approx(131072 / 1e9)
    assert r.breakdown["update"] == pytest.approx(3 * MS)
    assert r.iteration_time_s == pytest.approx(58.008192 * MS + 131072 / 1e9)
    assert r.throughput_samples_per_s == pytest.approx(4 / r.iteration_time_s)
    assert r.tokens_per_s == pytest.approx(64 * r.throughput_samples_per_s)
    assert r.bottleneck == "stage 1"
    assert r.egress_usd_per_iteration == 0.0
    assert r.stages[0].p2p_bytes_per_microbatch == 4096


def test_breakdown_parts_sum_to_the_iteration():
    db = db_of(hand_profile("A100-40"), hand_profile("V100-16", fwd_s=(0.002, 0.004, 0.004, 0.006)))
    p = plan([{"layers": [0, 1], "replicas": [_one(), _one("V100-16")]},
              {"layers": [1, 4], "replicas": [_one(), _one(), _one("V100-16")]}], gbs=12)
    r = simulate(p, profiles=db, network=flat_network(1e8, 1e-4))
    assert set(r.breakdown) == set(BREAKDOWN_KEYS)
    assert sum(r.breakdown.values()) == pytest.approx(r.iteration_time_s)
    assert all(v >= 0 for v in r.breakdown.values())
    d = r.to_dict()
    for key in ("iteration_time_s", "throughput_samples_per_s", "usd_per_iteration", "peak_memory_bytes",
                "fits", "breakdown", "stages"):
        assert key in d
    json.dumps(d)


def test_heterogeneous_stage_waits_for_its_straggler():
    # One stage [0, 4), replicas A100-40 (19 ms per micro-batch) and V100-16 (twice as slow, 38 ms).
    # 5 micro-batches: m mod 2 -> A100 gets 3 (57 ms of work), V100 gets 2 (76 ms): the V100 ends last.
    fast = hand_profile("A100-40")
    slow = hand_profile("V100-16", fwd_s=(0.002, 0.004, 0.004, 0.006), bwd_s=(0.0, 0.008, 0.008, 0.006))
    p = plan([{"layers": [0, 4], "replicas": [_one(), _one("V100-16")]}], gbs=5)
    r = simulate(p, profiles=db_of(fast, slow), network=flat_network(1e9))
    s = r.stages[0]
    assert [rep.num_microbatches for rep in s.replicas] == [3, 2]
    assert s.straggler == 1
    assert s.compute_s_per_microbatch == pytest.approx(38 * MS)
    assert r.breakdown["compute"] == pytest.approx(76 * MS)
    assert r.breakdown["bubble"] == 0.0
    # DP sync: 6000 params x 4 B = 24 kB; ring of 2: 2 x 1 step of 12 kB at 1 GB/s.
    assert s.dp_sync_bytes == 24000
    assert r.breakdown["dp_sync"] == pytest.approx(2 * 12000 / 1e9)
    assert r.breakdown["update"] == pytest.approx(6 * MS)  # 6000 params x 1 us, both GPUs
    assert r.iteration_time_s == pytest.approx(76 * MS + 24e-6 + 6 * MS)


def _fit_time(num_bytes, src_zone, dst_zone, gpu="A100-40"):
    (a, b, c), max_bw = json.loads(SAILOR_HET.read_text())[src_zone][gpu]["1"][dst_zone][gpu]["1"]
    x = math.log2(num_bytes / 1e6)
    return num_bytes / min((a * x * x + b * x + c) * 1e9, max_bw)


def test_cross_zone_p2p_uses_the_measured_link_and_pays_egress():
    # 8 MB activations between us-central1-a and us-west1-b (Sailor measured this A100 pair).
    act = 8_000_000
    prof = hand_profile("A100-40", output_bytes=(act, act, act, 0))
    stages = lambda z1: [{"layers": [0, 2], "replicas": [_one(zone="us-central1-a")]},  # noqa: E731
                         {"layers": [2, 4], "replicas": [_one(zone=z1)]}]
    net = default_network()
    far = simulate(plan(stages("us-west1-b"), gbs=4), profiles=db_of(prof), network=net)
    near = simulate(plan(stages("us-central1-a"), gbs=4), profiles=db_of(prof), network=net)
    expected = _fit_time(act, "us-central1-a", "us-west1-b") + _fit_time(act, "us-west1-b", "us-central1-a")
    assert far.stages[0].p2p_s_per_microbatch == pytest.approx(expected)
    assert near.stages[0].p2p_s_per_microbatch < expected / 3
    # 4 micro-batches x (activation out + gradient back) x 0.02 USD/GB (Sailor's table), and tiny's
    # tied 512 x 64 fp32 matrix summed between the two stages: a ring of 2 whose both hops cross.
    tied = 512 * 64 * 4
    assert far.egress_usd_per_iteration == pytest.approx((4 * 2 * act + 2 * tied) * 0.02 / 1e9)
    assert near.egress_usd_per_iteration == 0.0
    assert far.usd_per_iteration == pytest.approx(far.gpu_usd_per_iteration + far.egress_usd_per_iteration)


def test_first_stage_holds_more_microbatches_than_the_last():
    # 4 stages of one layer each, 8 micro-batches: stage i keeps min(4 - i, 8) in flight.
    # torch-bf16-autocast-adamw: 16 B per parameter, 1e9 B constant overhead.
    db = db_of(hand_profile("A100-40", activation_bytes=(100, 1000, 1000, 500)))
    p = plan([{"layers": [i, i + 1], "replicas": [_one()]} for i in range(4)], gbs=8)
    r = simulate(p, profiles=db, network=flat_network())
    regime = get_regime("torch-bf16-autocast-adamw")
    first, last = r.stages[0].replicas[0].memory, r.stages[3].replicas[0].memory
    assert first.num_inflight == 4 and last.num_inflight == 1
    # each micro-batch in flight keeps its 4096 B output too; the gradient's receive buffer; a later
    # backward makes the embedding's dense gradient (512 x 64, fp32) before adding it to the kept one
    assert first.backward_working_bytes == 512 * 64 * 4
    assert first.peak_bytes == (1000 * 16 + 4 * (100 + 4096) + 4096 + 512 * 64 * 4
                                + regime.constant_overhead_bytes)
    assert first.comm_bytes == 4096
    # the head also needs the loss's working memory: the bf16 logits its output references and the
    # fp32 gradients, 10 B x (1 sequence x 64 tokens x 512 vocab).
    assert last.loss_working_bytes == regime.loss_working_bytes_per_logit * 64 * 512 == 10 * 64 * 512
    # tiny ties its head to the embedding: the last stage also holds a copy of the 512 x 64 matrix
    # (and the next input's receive buffer, 4096 B)
    assert last.peak_bytes == ((1000 + 512 * 64) * 16 + 1 * 500 + 10 * 64 * 512 + 4096
                               + regime.constant_overhead_bytes)
    assert r.stages[1].replicas[0].memory.num_inflight == 3
    assert r.peak_memory_bytes == max(s.peak_memory_bytes for s in r.stages)


def test_plan_that_does_not_fit_says_why():
    huge = hand_profile("V100-16", params=(2_000_000_000, 10, 10, 10))
    p = plan([{"layers": [0, 4], "replicas": [_one("V100-16")]}])
    r = simulate(p, profiles=db_of(huge), network=flat_network())
    assert not r.fits
    assert "stage 0 replica 0 (V100-16" in r.why_not and "needs" in r.why_not


def test_invalid_plans_are_rejected_with_the_problem():
    db = db_of(hand_profile("A100-40"))
    with pytest.raises(PlanError, match="not covered"):
        simulate(plan([{"layers": [0, 3], "replicas": [_one()]}], validate=False), profiles=db)
    with pytest.raises(PlanError, match="unknown GPU"):
        plan([{"layers": [0, 4], "replicas": [_one("B300")]}])


def test_corrupt_profile_is_a_profile_error():
    bad = hand_profile("A100-40", fwd_s=(0.001, 0.001, 0.001), bwd_s=(0, 0, 0), params=(1, 1, 1),
                       activation_bytes=(1, 1, 1), output_bytes=(1, 1, 0))
    with pytest.raises(ProfileError):
        db_of(bad)


def test_spot_is_cheaper_than_on_demand():
    db = db_of(hand_profile("A100-40"))
    p = plan([{"layers": [0, 4], "replicas": [_one(zone="us-central1-a")]}])
    spot = simulate(p, profiles=db, network=flat_network())
    od = simulate(p, profiles=db, network=flat_network(), spot=False)
    assert 0 < spot.usd_per_hour < od.usd_per_hour
    assert spot.gpu_usd_per_iteration == pytest.approx(spot.usd_per_hour * spot.iteration_time_s / 3600)
