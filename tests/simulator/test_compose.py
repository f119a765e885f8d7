"""The composition of time, egress and cost (simulator/compose.py) that simulate and fastsim share."""

import random

import pytest

from sailor_core.simulator import compose, simulate
from sailor_core.simulator.pipeline_time import PipelineTime
from tests.simulator.helpers import db_of, flat_network, hand_profile, plan

A, B, C = "us-central1-a", "us-central1-b", "us-west1-b"


def _pipe(compute, bubble, p2p):
    return PipelineTime(compute_s=compute, bubble_s=bubble, p2p_s=p2p, busiest_stage=0, bottleneck="stage 0")


def test_the_breakdown_adds_up_to_the_iteration_exactly():
    rng = random.Random(3)
    for _ in range(1000):
        pipe = _pipe(rng.random(), rng.random() * 1e-3, rng.random() * 1e-2)
        sync, update = rng.random() * 1e-1, rng.random() * 1e-2
        total = 0.0
        for part in compose.iteration_breakdown(pipe, sync, update).values():
            total += part
        assert compose.iteration_s(pipe, sync, update) == total


def test_the_slowest_end_is_the_first_of_equals():
    assert compose.slowest_end([0.1, 0.3, 0.3, 0.2]) == 1
    assert compose.slowest_end([0.0]) == 0


def test_the_ring_bound_is_the_search_s_formula_to_the_bit():
    # search's ring_usd_per_byte wrote 2 * 2 * (d - 1) / d * price: the bound must equal it exactly.
    rng = random.Random(5)
    for d in range(1, 600):
        price = rng.random() * 1e-10
        assert compose.ring_egress_usd_per_byte_lb(d, price) == 2 * 2 * (d - 1) / d * price


def test_ring_hops_follow_the_ring_order():
    # A ring visits its members in the order given (a stage's replicas: plan.types.Stage), the
    # last sending back to the first; every change of zone on the way is a hop that pays.
    net = flat_network()
    assert compose.ring_hop_usd_per_byte(net, [A, A, A]) == []
    grouped = compose.ring_hop_usd_per_byte(net, [A, A, B, C, C])
    assert grouped == [net.egress_usd_per_byte(A, B), net.egress_usd_per_byte(B, C), net.egress_usd_per_byte(C, A)]
    interleaved = compose.ring_hop_usd_per_byte(net, [C, A, C, B])
    assert interleaved == [net.egress_usd_per_byte(C, A), net.egress_usd_per_byte(A, C),
                           net.egress_usd_per_byte(C, B), net.egress_usd_per_byte(B, C)]


def test_only_routes_that_leave_a_zone_pay_egress_both_ways():
    net = flat_network()
    got = compose.boundary_crossings(net, [(3, A, A), (2, A, C)])
    assert got == [(2, net.egress_usd_per_byte(A, C) + net.egress_usd_per_byte(C, A))]
    terms = compose.stage_egress_terms(10.0, [1e-9, 2e-9], 100, got)
    assert terms == [10.0 * 1e-9, 10.0 * 2e-9, 2 * 100 * got[0][1]]


def test_simulate_charges_hops_inside_a_zone_nothing_whatever_the_egress_table():
    db = db_of(hand_profile("A100-40"))
    net = flat_network()
    net.egress_usd_per_gb = {(A, A): 1.0}  # a price on same-zone traffic: not egress, never charged
    one_zone = plan([{"layers": [0, 4], "replicas": [{"gpu": "A100-40", "tp": 1, "zone": A}] * 2}])
    assert simulate(one_zone, profiles=db, network=net).egress_usd_per_iteration == 0.0
    two_zones = plan([{"layers": [0, 4], "replicas": [{"gpu": "A100-40", "tp": 1, "zone": z} for z in (A, C)]}])
    r = simulate(two_zones, profiles=db, network=net)
    grad_bytes = 6000 * 4  # tiny's 6000 parameters, fp32 gradients
    hop = compose.ring_hop_bytes(2, grad_bytes, 1)
    assert r.egress_usd_per_iteration == pytest.approx(
        hop * (net.egress_usd_per_byte(A, C) + net.egress_usd_per_byte(C, A)))
