"""The routing rule (plan/routing.py) against a plain walk over micro-batches: m -> replica m mod D."""

import itertools

from sailor_core.plan import routing


def _walk(num_mb: int, src_dp: int, dst_dp: int) -> dict[tuple[int, int], int]:
    pairs: dict[tuple[int, int], int] = {}
    for m in range(num_mb):
        key = (routing.replica_of(m, src_dp), routing.replica_of(m, dst_dp))
        pairs[key] = pairs.get(key, 0) + 1
    return pairs


def test_replicas_get_their_micro_batches_in_order():
    for num_mb, dp in itertools.product(range(1, 20), range(1, 7)):
        local = [routing.local_microbatches(num_mb, dp, r) for r in range(dp)]
        assert sorted(m for ms in local for m in ms) == list(range(num_mb))
        assert all(routing.replica_of(m, dp) == r for r, ms in enumerate(local) for m in ms)
        assert routing.microbatches_per_replica(num_mb, dp) == [len(ms) for ms in local]


def test_pairs_and_busiest_link_follow_the_walk():
    for num_mb, src, dst in itertools.product(range(1, 25), range(1, 6), range(1, 6)):
        walk = _walk(num_mb, src, dst)
        assert routing.p2p_pairs(num_mb, src, dst) == walk
        assert list(routing.p2p_pairs(num_mb, src, dst)) == list(walk)  # first-met order
        per_replica = [sum(n for (a, _), n in walk.items() if a == r) for r in range(src)]
        per_replica += [sum(n for (_, b), n in walk.items() if b == r) for r in range(dst)]
        assert routing.link_microbatches(num_mb, src, dst) == max(per_replica)


def test_group_pairs_sum_replica_pairs_in_first_met_order():
    for num_mb in (1, 3, 7, 12, 30):
        for src_sizes in ((1,), (2,), (1, 2), (3, 1, 2)):
            for dst_sizes in ((1,), (3,), (2, 2), (1, 1, 3)):
                src_of = [g for g, n in enumerate(src_sizes) for _ in range(n)]
                dst_of = [g for g, n in enumerate(dst_sizes) for _ in range(n)]
                want: dict[tuple[int, int], int] = {}
                for (a, b), n in routing.p2p_pairs(num_mb, len(src_of), len(dst_of)).items():
                    key = (src_of[a], dst_of[b])
                    want[key] = want.get(key, 0) + n
                got = routing.group_p2p_pairs(num_mb, src_sizes, dst_sizes)
                assert got == want and list(got) == list(want)
