"""A stage's last input-gradient send and its own DP ring share the node's NIC (issue 19).

The engine launches a stage's DP buckets during its last backward and posts that backward's
gradient send right after it (``runtime/trainer.py``: ``_OverlappedAllReduce.arm`` at the last
backward, ``_send``, then ``finish``), so the two leave the node together; the model gives each
a max-min fair share of the NIC (``compose.send_ring_contention_s``).  Where the engine does not
overlap them (one replica, mixed TP degrees, blocking sends, stage 0, which sends no gradient)
the time is what it was.
"""

import pytest

from sailor_core.network import LinkClass, LinkDefault, NetworkModel
from sailor_core.simulator import compose, simulate
from tests.simulator.helpers import db_of, flat_network, hand_profile, plan

ZA, ZB, WEST = "us-central1-a", "us-central1-b", "us-west1-b"
US = 1e-6


def _rep(zone, tp=1):
    return {"gpu": "A100-40", "tp": tp, "zone": zone}


def _two_stages(first, last):
    return plan([{"layers": [0, 2], "replicas": first}, {"layers": [2, 4], "replicas": last}])


def _without_contention(monkeypatch, p, db, net):
    """The same plan under the model without the shared-NIC term."""
    with monkeypatch.context() as m:
        m.setattr(compose, "drain_contention_s", lambda *args: 0.0)
        return simulate(p, profiles=db, network=net)


def test_last_send_shares_the_nic_with_its_dp_ring(monkeypatch):
    # tiny, 2 stages across zones, DP 2 each, every link 1 GB/s without latency.  Stage 1's last
    # backward sends the 4096 B gradient to stage 0 while its DP ring (12,000 B of gradients, 2
    # members: 12,000 B leave each node, 12 us) starts: equal rates, so each gets half the NIC
    # and the send, the shorter, ends 4096 B / 1 GB/s = 4.096 us later; stage 0's last backward,
    # which ends the pipeline, waits for it.
    db, net = db_of(hand_profile("A100-40")), flat_network(1e9)
    p = _two_stages([_rep(ZA), _rep(ZA)], [_rep(ZB), _rep(ZB)])
    got, base = simulate(p, profiles=db, network=net), _without_contention(monkeypatch, p, db, net)
    assert got.stages[1].dp_sync_bytes == 12000
    assert got.iteration_time_s - base.iteration_time_s == pytest.approx(4.096 * US, rel=1e-9)
    assert got.breakdown["p2p"] - base.breakdown["p2p"] == pytest.approx(4.096 * US, rel=1e-9)
    assert sum(got.breakdown.values()) == pytest.approx(got.iteration_time_s)


def test_a_ring_shorter_than_the_send_delays_it_by_the_ring(monkeypatch):
    # The same with a 1 MB activation (1 ms one way): the 12 us ring ends first, having held half
    # the NIC all along; the send loses those 12 us.
    db = db_of(hand_profile("A100-40", output_bytes=(4096, 1_000_000, 4096, 0)))
    net = flat_network(1e9)
    p = _two_stages([_rep(ZA), _rep(ZA)], [_rep(ZB), _rep(ZB)])
    got, base = simulate(p, profiles=db, network=net), _without_contention(monkeypatch, p, db, net)
    assert got.iteration_time_s - base.iteration_time_s == pytest.approx(12 * US, rel=1e-9)


@pytest.mark.parametrize("first, last", [
    ([_rep(ZA), _rep(ZA)], [_rep(ZB)]),  # DP degree 1 on the sending stage: no ring
    ([_rep(ZA)], [_rep(ZB)]),  # no DP at all
    ([_rep(ZA), _rep(ZA)], [_rep(ZB), _rep(ZB, tp=2)]),  # mixed TP: the engine syncs after every send
], ids=["last-stage-dp1", "dp1", "mixed-tp"])
def test_no_overlap_no_change(monkeypatch, first, last):
    db = db_of(hand_profile("A100-40"), hand_profile("A100-40", tp=2))
    net = flat_network(1e9)
    p = _two_stages(first, last)
    got = simulate(p, profiles=db, network=net)
    assert got.iteration_time_s == _without_contention(monkeypatch, p, db, net).iteration_time_s


def test_a_wan_bound_send_keeps_its_rate(monkeypatch):
    # Stage 0 in us-west1, stage 1 in us-central1: the send crosses regions at 0.5 GB/s, the
    # ring stays in a zone at 2.4 GB/s.  The NIC moves at least 2.4 GB/s; a fair half (1.2) is
    # more than the WAN lets the send use, so it keeps its 0.5 GB/s and the ring the rest.
    links = {LinkClass.SAME_ZONE: LinkDefault(bw_1gpu_bytes_per_s=2.4e9, latency_s=0.0),
             LinkClass.CROSS_REGION: LinkDefault(bw_1gpu_bytes_per_s=0.5e9, latency_s=0.0)}
    net = NetworkModel(defaults={**flat_network(1e9).defaults, **links})
    db = db_of(hand_profile("A100-40"))
    p = _two_stages([_rep(WEST), _rep(WEST)], [_rep(ZA), _rep(ZA)])
    got = simulate(p, profiles=db, network=net)
    assert got.stages[1].dp_sync_s > 0
    assert got.iteration_time_s == _without_contention(monkeypatch, p, db, net).iteration_time_s


def test_fair_share_of_the_nic():
    # equal rates: each at half, the shorter flow's time is added to the send
    assert compose.send_ring_contention_s(send_s=1.0, send_bytes=1.0, ring_s=5.0, ring_bytes=5.0) == 1.0
    assert compose.send_ring_contention_s(send_s=5.0, send_bytes=5.0, ring_s=1.0, ring_bytes=1.0) == 1.0
    # send at 2 B/s, ring at 2.4 B/s: each gets 1.2 B/s, the send 0.6 of its rate: 1 s takes 1/0.6
    assert compose.send_ring_contention_s(send_s=1.0, send_bytes=2.0, ring_s=10.0, ring_bytes=24.0) == (
        pytest.approx(1 / 0.6 - 1))
    # a slow ring (0.5 B/s) leaves a 2.4 B/s send 1.9 B/s
    assert compose.send_ring_contention_s(send_s=1.0, send_bytes=2.4, ring_s=10.0, ring_bytes=5.0) == (
        pytest.approx(2.4 / 1.9 - 1))
    assert compose.send_ring_contention_s(send_s=1.0, send_bytes=1.0, ring_s=0.0, ring_bytes=0.0) == 0.0


def test_only_the_prefetching_engine_overlaps():
    links, rings = [(2.0, 4, 2.0)], [(1.0, 1.0), (5.0, 5.0)]
    assert compose.drain_contention_s("prefetch", links, rings) == 1.0
    # DeepSpeed's blocking sends complete before its all-reduce starts
    assert compose.drain_contention_s("blocking", links, rings) == 0.0
    # stage 0 sends no gradient back: its ring meets no send of its own
    assert compose.drain_contention_s("prefetch", links, [(5.0, 5.0), (0.0, 0.0)]) == 0.0
