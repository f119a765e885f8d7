"""The micro-batch routing rule (DESIGN.md), in one place: pure, no torch.

Micro-batch ``m`` of an iteration is processed in stage ``i`` by replica ``m mod D_i``, so its
activations flow from replica ``m mod D_i`` to replica ``m mod D_{i+1}``.  Everything else here
follows from that: which micro-batches a replica gets, which replica pairs a boundary uses and
how many micro-batches each carries, and how many the busiest link carries.  The simulator,
the planner's fast path and the training engine all call these functions.
"""

from __future__ import annotations

from collections import Counter
from math import gcd
from typing import Sequence


def replica_of(microbatch: int, dp_degree: int) -> int:
    """The replica of a stage with ``dp_degree`` replicas that processes micro-batch ``microbatch``."""
    return microbatch % dp_degree


def local_microbatches(num_microbatches: int, dp_degree: int, replica: int) -> list[int]:
    """The micro-batches of an iteration that ``replica`` processes, in increasing order."""
    return list(range(replica, num_microbatches, dp_degree))


def replica_num_microbatches(num_microbatches: int, dp_degree: int, replica: int) -> int:
    """How many micro-batches ``replica`` gets: ceil((M - r) / D), 0 past the last one."""
    return max(0, -(-(num_microbatches - replica) // dp_degree))


def microbatches_per_replica(num_microbatches: int, dp_degree: int) -> list[int]:
    """``replica_num_microbatches`` of every replica, in replica order (replica 0 gets the most)."""
    return [replica_num_microbatches(num_microbatches, dp_degree, r) for r in range(dp_degree)]


def p2p_pairs(num_microbatches: int, src_dp: int, dst_dp: int) -> dict[tuple[int, int], int]:
    """Replica pairs (src, dst) micro-batches travel between and how many micro-batches each carries."""
    period = src_dp * dst_dp // gcd(src_dp, dst_dp)
    # m and m + period use the same pair, and within one period every m has a pair of its own
    # (m mod lcm is fixed by m mod src_dp and m mod dst_dp): micro-batch m's pair carries
    # ceil((M - m) / period) of them.
    return {(m % src_dp, m % dst_dp): (num_microbatches - m + period - 1) // period
            for m in range(min(period, num_microbatches))}


def group_p2p_pairs(num_microbatches: int, src_sizes: Sequence[int], dst_sizes: Sequence[int],
                    ) -> dict[tuple[int, int], int]:
    """``p2p_pairs`` summed over groups of consecutive replicas (``src_sizes`` replicas in each
    source group, ``dst_sizes`` in each destination group): {(src group, dst group): micro-batches},
    in the order ``p2p_pairs`` first meets each pair."""
    if len(src_sizes) == 1 and len(dst_sizes) == 1:  # one group each: every micro-batch
        return {(0, 0): num_microbatches}
    src_of = [g for g, n in enumerate(src_sizes) for _ in range(n)]
    dst_of = [g for g, n in enumerate(dst_sizes) for _ in range(n)]
    src_dp, dst_dp = len(src_of), len(dst_of)
    period = src_dp * dst_dp // gcd(src_dp, dst_dp)
    # Micro-batch m < min(period, M) opens pair (m mod src_dp, m mod dst_dp), which carries
    # ceil((M - m) / period) of them: q + 1 for m below M mod period, q above (q = M // period).
    n = min(period, num_microbatches)
    srcs = (src_of * -(-n // src_dp))[:n]
    dsts = (dst_of * -(-n // dst_dp))[:n]
    opened = Counter(zip(srcs, dsts))
    q, r = divmod(num_microbatches, period)
    if q == 0:  # every m < M carries one micro-batch
        return dict(opened)
    first = Counter(zip(srcs[:r], dsts[:r])) if r else {}
    return {k: q * c + first.get(k, 0) for k, c in opened.items()}


def link_microbatches(num_microbatches: int, src_dp: int, dst_dp: int) -> int:
    """Micro-batches the busiest NIC on a boundary carries: ceil(M / min(D_src, D_dst))."""
    return -(-num_microbatches // min(src_dp, dst_dp))
