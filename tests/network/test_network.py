import json
import math
from pathlib import Path

import pytest

from sailor_core.network import Endpoint, LinkClass, default_network, link_class
from sailor_core.network.fits import MAX_FIT_BYTES, MIN_FIT_BYTES, BandwidthFit
from sailor_core.source_data import SAILOR_DATA_DIR
from tests.simulator.helpers import flat_network

SAILOR_HET = SAILOR_DATA_DIR / "providers" / "multizone_bandwidths_het.json"


def _raw_fit(src_zone, gpu, count, dst_zone):
    data = json.loads(SAILOR_HET.read_text())
    return data[src_zone][gpu][str(count)][dst_zone][gpu][str(count)]


def test_fit_matches_the_published_formula_inside_its_range():
    (a, b, c), max_bw = _raw_fit("us-central1-a", "A100-40", 1, "us-central1-b")
    net = default_network()
    src = Endpoint(zone="us-central1-a", gpu="A100-40")
    dst = Endpoint(zone="us-central1-b", gpu="A100-40")
    size = 16e6
    x = math.log2(size / 1e6)
    expected_bw = min((a * x * x + b * x + c) * 1e9, max_bw)
    assert net.p2p_time_s(size, src, dst) == pytest.approx(size / expected_bw)


def test_fits_are_clamped_to_their_measured_range_and_stay_positive():
    net = default_network()
    for fit in set(net.inter_fits.values()):
        tiny, small = fit.bandwidth_bytes_per_s(10e3), fit.bandwidth_bytes_per_s(MIN_FIT_BYTES)
        huge, big = fit.bandwidth_bytes_per_s(8 * MAX_FIT_BYTES), fit.bandwidth_bytes_per_s(MAX_FIT_BYTES)
        assert tiny == small > 0  # below 64 KiB: no better per byte than 64 KiB, never <= 0
        assert huge == big <= fit.max_bw_bytes_per_s


def test_collapsing_quadratic_is_floored():
    fit = BandwidthFit(a=-1.0, b=0.0, c=0.5, max_bw_bytes_per_s=1e9)
    assert fit.bandwidth_bytes_per_s(1e8) > 0


def test_least_time_never_falls_with_message_size():
    """A100-40's NVLink fit is below zero under ~210 KB per pair: bytes / bandwidth there made a
    16 KB TP all-reduce slower than a 400 KB one; the least time over larger messages does not."""
    net = default_network()
    for fit in {*net.intra_fits.values(), *net.inter_fits.values()}:
        sizes = [2 ** (k / 8) for k in range(8 * 33)]
        times = [fit.least_time_s(b) for b in sizes]
        assert all(t0 <= t1 * (1 + 1e-12) for t0, t1 in zip(times, times[1:]))
        assert all(t <= b / fit.bandwidth_bytes_per_s(b) * (1 + 1e-12) for b, t in zip(sizes, times))
    fit = net.intra_fits[("A100-40", 2)]
    assert fit.least_time_s(16e3) < 400e3 / fit.bandwidth_bytes_per_s(400e3)
    assert fit.least_time_s(64e6) == 64e6 / fit.bandwidth_bytes_per_s(64e6)  # rising there: as fitted


def test_link_classes():
    assert link_class("us-central1-a", "us-central1-a") is LinkClass.SAME_ZONE
    assert link_class("us-central1-a", "us-central1-b") is LinkClass.CROSS_ZONE
    assert link_class("us-east-1a", "us-west-2b") is LinkClass.CROSS_REGION
    assert link_class("us-east-1a", "us-central1-a") is LinkClass.CROSS_CLOUD
    assert link_class("local", "local") is LinkClass.LOCAL


def test_unmeasured_gpus_get_class_defaults_ordered_by_distance():
    net = default_network()
    size = 64e6
    h = lambda z: Endpoint(zone=z, gpu="H100-80")  # noqa: E731
    same = net.p2p_time_s(size, h("us-east-1a"), h("us-east-1a"))
    zone = net.p2p_time_s(size, h("us-east-1a"), h("us-east-1b"))
    region = net.p2p_time_s(size, h("us-east-1a"), h("us-west-2a"))
    cloud = net.p2p_time_s(size, h("us-east-1a"), h("us-central1-a"))
    assert 0 < same < zone < region < cloud


def test_more_gpus_per_side_move_data_faster():
    net = default_network()
    one = net.p2p_time_s(64e6, Endpoint(zone="us-central1-a", gpu="A100-40", num_gpus=1),
                         Endpoint(zone="us-central1-a", gpu="A100-40", num_gpus=1))
    four = net.p2p_time_s(64e6, Endpoint(zone="us-central1-a", gpu="A100-40", num_gpus=4),
                          Endpoint(zone="us-central1-a", gpu="A100-40", num_gpus=4))
    assert four < one


def test_same_node_uses_the_intra_node_fit():
    net = default_network()
    a = Endpoint(zone="us-central1-a", gpu="A100-40", node="n1")
    b = Endpoint(zone="us-central1-a", gpu="A100-40", node="n1")
    c = Endpoint(zone="us-central1-a", gpu="A100-40", node="n2")
    assert net.link_class(a, b) is LinkClass.INTRA_NODE
    assert net.p2p_time_s(64e6, a, b) < net.p2p_time_s(64e6, a, c) / 10


def test_ring_allreduce_is_bucketed_and_hand_computable():
    net = flat_network(bw_bytes_per_s=1e9)
    eps = [Endpoint(zone="us-central1-a", gpu="A100-40")] * 4
    # 1.2e9 bytes -> buckets 5e8, 5e8, 2e8; each bucket 2(N-1) steps of bucket/N bytes.
    expected = sum(2 * 3 * (b / 4) / 1e9 for b in (5e8, 5e8, 2e8))
    assert net.allreduce_time_s(1.2e9, eps) == pytest.approx(expected)
    assert net.allreduce_time_s(1.2e9, eps[:1]) == 0.0


def test_ring_allreduce_is_paced_by_the_slowest_link():
    net = default_network()
    near = [Endpoint(zone="us-central1-a", gpu="A100-40")] * 3
    far = near[:2] + [Endpoint(zone="us-west1-b", gpu="A100-40")]
    assert net.allreduce_time_s(4e8, far) > 2 * net.allreduce_time_s(4e8, near)


def test_egress_prices():
    net = default_network()
    per_gb = lambda a, b: net.egress_usd_per_byte(a, b) * 1e9  # noqa: E731
    assert per_gb("us-central1-a", "us-central1-a") == 0.0
    assert per_gb("us-central1-a", "us-central1-b") == pytest.approx(0.01)
    assert per_gb("us-central1-a", "us-west1-b") == pytest.approx(0.02)  # Sailor's table
    assert per_gb("us-east-1a", "us-east-1b") == pytest.approx(0.01)  # class default
    assert per_gb("us-east-1a", "us-west-2a") == pytest.approx(0.02)
    assert per_gb("us-east-1a", "eu-west-1a") == pytest.approx(0.05)
    assert per_gb("us-east-1a", "us-central1-a") == pytest.approx(0.09)
    assert per_gb("local", "local") == 0.0


def test_same_node_without_a_fit_uses_the_catalog_link():
    from sailor_core.catalog.gpus import get_gpu

    net = default_network()
    a = Endpoint(zone="us-east-1a", gpu="H100-80", node="n1")
    b = Endpoint(zone="us-east-1a", gpu="H100-80", node="n1")
    size = 1e9
    expected = 5e-6 + size / get_gpu("H100-80").intra_node_bw_bytes_per_s
    assert net.p2p_time_s(size, a, b) == pytest.approx(expected)


def test_vectorised_uniform_ring_equals_the_general_all_reduce():
    # The planner's bounds time thousands of rings at once (uniform_allreduce_times_s); they
    # must be the rings allreduce_time_s gives for n copies of one endpoint, fits and defaults.
    import random

    import numpy as np

    net = default_network()
    rng = random.Random(5)
    for _ in range(60):
        e = Endpoint(zone=rng.choice(["us-central1-a", "us-east-1a", "europe-west4-a"]),
                     gpu=rng.choice(["A100-40", "V100-16", "T4", "H100-80"]))
        n = rng.randint(1, 200)
        sizes = np.array([0.0, 1e3, 6e4, 2e7, 5e8, 7.5e8, 3e9]) * rng.uniform(0.5, 2.0)
        got = net.uniform_allreduce_times_s(sizes, e, n)
        want = [net.allreduce_time_s(float(b), [e] * n) for b in sizes]
        assert got.tolist() == want


def test_rings_paced_by_many_pairs_at_once_equal_each_pair_alone():
    # The ring bounds time every pair of zones in one numpy pass (paced_allreduce_times_s):
    # each row is, bit for bit, the ring that pair alone paces, links with fits and without mixed.
    import random

    import numpy as np

    net = default_network()
    rng = random.Random(7)
    zones = ["us-central1-a", "us-central1-b", "us-east1-b", "us-east-1a", "europe-west4-a", "asia-east1-a"]
    for _ in range(30):
        gpu = rng.choice(["A100-40", "V100-16", "T4"])
        pairs = [(Endpoint(zone=rng.choice(zones), gpu=gpu), Endpoint(zone=rng.choice(zones), gpu=gpu))
                 for _ in range(rng.randint(1, 9))]
        n = rng.randint(2, 64)
        sizes = np.array([0.0, 1e3, 6e4, 2e7, 5e8, 7.5e8, 3e9]) * rng.uniform(0.5, 2.0)
        got = net.paced_allreduce_times_s(sizes, pairs, n)
        assert got.shape == (len(pairs), len(sizes))
        for row, (a, b) in zip(got, pairs):
            assert row.tobytes() == net.uniform_allreduce_times_s(sizes, a, n, to=b).tobytes()
            if a == b:
                assert row.tolist() == [net.allreduce_time_s(float(x), [a] * n) for x in sizes]


def test_a_rings_full_buckets_kept_between_calls_time_it_as_a_fresh_network_does():
    # paced_allreduce_times_s keeps a ring's full-bucket time per (links, members): the same
    # rings asked again at other sizes are, bit for bit, what a network asked once gives.
    import numpy as np

    net = default_network()
    a, b = Endpoint(zone="us-central1-a", gpu="A100-40"), Endpoint(zone="us-east1-b", gpu="A100-40")
    for scale in (1.0, 3.7, 0.2):
        sizes = np.array([0.0, 5e5, 3e7, 2.1e8, 9e8]) * scale
        for n in (2, 5, 32):
            got = net.paced_allreduce_times_s(sizes, [(a, a), (a, b)], n)
            assert got.tobytes() == default_network().paced_allreduce_times_s(sizes, [(a, a), (a, b)], n).tobytes()


def test_rings_of_several_sizes_at_once_are_each_size_alone_bit_for_bit():
    # paced_allreduce_times_many: the planner times every DP degree of a segment list at once
    import random

    import numpy as np

    net = default_network()
    rng = random.Random(11)
    zones = ["us-central1-a", "us-central1-b", "us-west1-b", "us-east-1a", "europe-west4-a"]
    for _ in range(40):
        gpu = rng.choice(["A100-40", "V100-16", "T4", "L4"])
        pairs = [(Endpoint(zone=rng.choice(zones), gpu=gpu), Endpoint(zone=rng.choice(zones), gpu=gpu))
                 for _ in range(rng.randint(1, 12))]
        ns = [rng.randint(2, 200) for _ in range(rng.randint(1, 12))]
        sizes = 1.6e9 / np.arange(1, rng.randint(2, 17), dtype=float) if rng.random() < 0.5 else \
            np.array([0.0, 1e3, 6e4, 2e7, 5e8, 3e9]) * rng.uniform(0.5, 2.0)
        many = net.paced_allreduce_times_many(sizes, pairs, ns)
        assert many.shape == (len(pairs), len(ns), len(sizes))
        for j, n in enumerate(ns):
            assert many[:, j].tobytes() == net.paced_allreduce_times_s(sizes, pairs, n).tobytes()


def test_rings_of_kept_pair_tuples_time_as_a_fresh_network_does():
    # paced_allreduce_times_many keeps a tuple of pairs' link columns and full buckets by the
    # tuple's identity (the planner's ring bounds ask for the same tuples at every DP degree): every
    # call, fresh or kept, is bit for bit what a network asked once gives (links with fits and without)
    import random

    import numpy as np

    net = default_network()
    rng = random.Random(5)
    zones = ["us-central1-a", "us-central1-b", "us-west1-b", "us-east-1a", "europe-west4-a", "asia-east1-a"]
    asked = []
    for _ in range(8):
        gpu = rng.choice(["A100-40", "V100-16", "T4"])
        asked.append(tuple((Endpoint(zone=rng.choice(zones), gpu=gpu), Endpoint(zone=rng.choice(zones), gpu=gpu))
                           for _ in range(rng.randint(1, 9))))
    for _ in range(60):
        pairs = rng.choice(asked)
        ns = [rng.randint(2, 64) for _ in range(rng.randint(1, 4))]
        sizes = np.array([0.0, 1e3, 6e4, 2e7, 5e8, 7.5e8, 3e9]) * rng.uniform(0.5, 2.0)
        got = net.paced_allreduce_times_many(sizes, pairs, ns)
        want = default_network().paced_allreduce_times_many(sizes, list(pairs), ns)
        assert got.shape == want.shape == (len(pairs), len(ns), len(sizes))
        assert got.tobytes() == want.tobytes()


def test_a_ring_keyed_by_its_runs_is_timed_by_every_hop_of_the_whole_ring():
    # allreduce_time_s keys and paces a ring by its runs of equal members; the figure is the
    # bucketed ring paced by the slowest pair ring_hop_pairs gives for the whole member list
    import random

    from sailor_core.network.model import ALLREDUCE_BUCKET_BYTES, ring_hop_pairs

    net = default_network()
    rng = random.Random(11)
    ends = [Endpoint(zone=z, gpu=g) for z in ("us-central1-a", "us-central1-b", "us-east-1a") for g in ("A100-40", "T4")]
    for _ in range(80):
        members = [rng.choice(ends) for _ in range(rng.randint(2, 6)) for _ in range(rng.randint(1, 4))]
        members = [Endpoint(zone=e.zone, gpu=e.gpu) for e in members]  # equal, not identical
        if len(set(members)) == 1:
            continue
        n, size = len(members), rng.choice([3e6, 2.5e7, 9e8])

        def step(b: float) -> float:
            return max(net.p2p_time_s(b / n, a, c) for a, c in ring_hop_pairs(members))

        full, rest = divmod(size, ALLREDUCE_BUCKET_BYTES)
        want = full * (2 * (n - 1) * step(ALLREDUCE_BUCKET_BYTES)) + (2 * (n - 1) * step(rest) if rest > 0 else 0.0)
        assert net.allreduce_time_s(size, members) == want


def test_a_ring_is_paced_by_the_hops_of_its_order():
    from sailor_core.network.model import ring_hop_pairs

    a, b, c, d = "a", "b", "c", "d"
    # grouped: each member's neighbours, both ways, and a member beside its own kind
    assert set(ring_hop_pairs([a, a, b, c])) == {(a, a), (a, b), (b, a), (b, c), (c, b), (c, a), (a, c)}
    # four endpoints: the pairs that are not neighbours in the ring do not pace it
    pairs = set(ring_hop_pairs([a, b, c, d]))
    assert (a, c) not in pairs and (b, d) not in pairs and (d, a) in pairs
    # so a far endpoint between two near ones paces the ring, one at the end of a group the same
    net = default_network()
    near = Endpoint(zone="us-central1-a", gpu="A100-40")
    near_b = Endpoint(zone="us-central1-b", gpu="A100-40")
    far = Endpoint(zone="europe-west4-a", gpu="A100-40")
    grouped = net.allreduce_time_s(4e8, [near, near, near_b, far])
    assert grouped == net.allreduce_time_s(4e8, [near, near_b, far, near])  # the same ring, rotated
    assert grouped > net.allreduce_time_s(4e8, [near, near, near_b, near_b])
