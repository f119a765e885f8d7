"""Bandwidth and egress price between GPU endpoints.

Where Sailor measured a link (``multizone_bandwidths_het.json``: A100-40,
V100-16, GH-96 and RTX cards in five GCP zones; ``intra_node_bandwidths.json``
inside a node) its fitted curve is used, inside its measured range.  Every
other pair (H100, H200, L4, T4, AWS zones, local processes, mixed pairs that
were never measured) gets a default for its link class: a latency plus a
bandwidth, so small messages stay latency-bound like the measured ones.

Egress is charged per byte leaving a zone: Sailor's GCP table where it has the
pair, otherwise the usual list prices by class (same zone free, cross-zone
0.01, cross-region 0.02, intercontinental 0.05, across clouds over the
internet 0.09 USD/GB).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from typing import Sequence

from sailor_core.catalog.gpus import get_gpu
from sailor_core.network._data import load_egress_table, load_inter_fits, load_intra_fits, load_user_inter_fits
from sailor_core.network.fits import BandwidthFit, fitted_bandwidths_bytes_per_s
from sailor_core.zones import Zone, parse_zone

# Sailor's data-parallel sync splits gradients into buckets of this size (DeepSpeed's default).
ALLREDUCE_BUCKET_BYTES = 5e8


class LinkClass(str, Enum):
    INTRA_NODE = "intra_node"
    LOCAL = "local"  # processes of one machine (zone "local"), e.g. gloo over loopback
    SAME_ZONE = "same_zone"
    CROSS_ZONE = "cross_zone"  # same region, another zone
    CROSS_REGION = "cross_region"  # same cloud
    CROSS_CLOUD = "cross_cloud"


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One side of a transfer: ``num_gpus`` GPUs of one node sending (or receiving) at once."""

    zone: str
    gpu: str
    num_gpus: int = 1
    node: str | None = None  # equal non-None ids mean the same physical node


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkDefault:
    """A link without a measured curve: ``time = latency_s + bytes / (bw_1gpu * k**count_exponent)``."""

    bw_1gpu_bytes_per_s: float
    latency_s: float


# Defaults for one GPU per side, read off Sailor's own measurements where the
# class has them (A100-40 in us-central1: ~2.4 GB/s same zone, ~2.2 GB/s across
# zones, ~0.5 GB/s to us-west1; ~0.1 ms to move 64 KiB in a zone) and public
# cloud figures elsewhere (cross-cloud over the internet, loopback TCP).
DEFAULT_LINKS: dict[LinkClass, LinkDefault] = {
    LinkClass.LOCAL: LinkDefault(bw_1gpu_bytes_per_s=3e9, latency_s=50e-6),
    LinkClass.SAME_ZONE: LinkDefault(bw_1gpu_bytes_per_s=2.4e9, latency_s=0.1e-3),
    LinkClass.CROSS_ZONE: LinkDefault(bw_1gpu_bytes_per_s=2.2e9, latency_s=0.3e-3),
    LinkClass.CROSS_REGION: LinkDefault(bw_1gpu_bytes_per_s=0.5e9, latency_s=5e-3),
    LinkClass.CROSS_CLOUD: LinkDefault(bw_1gpu_bytes_per_s=0.25e9, latency_s=10e-3),
}
# Aggregate bandwidth of k concurrent GPU pairs grows like k**0.65: Sailor's
# A100-40 same-zone fits give 2.4 / 3.7 / 6.0 GB/s for k = 1 / 2 / 4.
COUNT_EXPONENT = 0.65
INTRA_NODE_LATENCY_S = 5e-6

# USD per GB (1e9 bytes) leaving a zone, by class, where no table entry exists.
DEFAULT_EGRESS_USD_PER_GB: dict[str, float] = {
    "same_zone": 0.0,
    "local": 0.0,
    "cross_zone": 0.01,
    "cross_region": 0.02,
    "cross_continent": 0.05,
    "cross_cloud": 0.09,
}


def link_class(src_zone: str, dst_zone: str) -> LinkClass:
    a, b = parse_zone(src_zone), parse_zone(dst_zone)
    if a.cloud == "local" and b.cloud == "local":
        return LinkClass.LOCAL
    if a.cloud != b.cloud:
        return LinkClass.CROSS_CLOUD
    if a.name == b.name:
        return LinkClass.SAME_ZONE
    if a.region == b.region:
        return LinkClass.CROSS_ZONE
    return LinkClass.CROSS_REGION


@dataclass(frozen=True, slots=True)
class _Link:
    """A resolved link: either a fit or a default, ready to time a message."""

    fit: BandwidthFit | None
    default_bw_bytes_per_s: float
    latency_s: float
    num_pairs: int
    link_class: LinkClass

    def time_s(self, num_bytes: float) -> float:
        if num_bytes <= 0:
            return 0.0
        if self.fit is not None:
            # Fits give aggregate bandwidth over k pairs for a per-pair message size.
            return num_bytes / self.fit.bandwidth_bytes_per_s(num_bytes / self.num_pairs)
        return self.latency_s + num_bytes / self.default_bw_bytes_per_s

    def least_time_s(self, num_bytes: float) -> float:
        """The least ``time_s`` of a message of ``num_bytes`` or more: a fit's time can fall as
        the message grows (``BandwidthFit.least_time_s``, per pair); a default's cannot."""
        if num_bytes <= 0:
            return 0.0
        if self.fit is not None:
            return self.num_pairs * self.fit.least_time_s(num_bytes / self.num_pairs)
        return self.time_s(num_bytes)


_NO_FIT = BandwidthFit(a=0.0, b=0.0, c=1.0, max_bw_bytes_per_s=1e12)  # a placeholder row, never read


def _link_columns(links: Sequence[_Link]) -> tuple:
    """What ``_columns_times_s`` reads of ``links``, as numpy columns (a row per link)."""
    import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

    def column(values) -> object:
        return np.array(values, dtype=float)[:, None]

    fitted = [link.fit is not None for link in links]
    fit_cols = plain_cols = None
    if any(fitted):
        fits = [link.fit or _NO_FIT for link in links]
        fit_cols = (column([f.a for f in fits]), column([f.b for f in fits]), column([f.c for f in fits]),
                    column([f.max_bw_bytes_per_s for f in fits]), column([link.num_pairs for link in links]))
    if not all(fitted):
        plain_cols = (column([link.latency_s for link in links]),
                      column([link.default_bw_bytes_per_s or 1.0 for link in links]), np.array(fitted)[:, None])
    return fit_cols, plain_cols


def _columns_times_s(columns: tuple, num_bytes):
    """``_Link.time_s`` of each of the sizes ``num_bytes`` (numpy) over links given as their
    ``_link_columns``: a row per link, the arithmetic of one link element by element."""
    import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

    fit_cols, plain_cols = columns
    nb = np.asarray(num_bytes, dtype=float)
    safe = np.maximum(nb, 1e-300)
    t = None
    if fit_cols is not None:
        a, b, c, max_bw, num_pairs = fit_cols
        t = nb / fitted_bandwidths_bytes_per_s(a, b, c, max_bw, safe / num_pairs)
    if plain_cols is not None:
        latency, bw, fitted = plain_cols
        plain = latency + nb / bw
        t = plain if t is None else np.where(fitted, t, plain)
    return np.where(nb > 0, t, 0.0)


class _PacedLinks:
    """Links a ring bound times together (``NetworkModel.paced_allreduce_times_many``): their
    ``_link_columns`` and their full-bucket times per (ring sizes, bucket bytes), kept with them."""

    __slots__ = ("columns", "num_links", "full")

    def __init__(self, links: Sequence[_Link]) -> None:
        self.columns = _link_columns(links)
        self.num_links = len(links)
        self.full: dict = {}


@dataclass(slots=True, kw_only=True)
class NetworkModel:
    """Transfer times and egress prices between endpoints; see the module docstring.

    ``inter_fits[(src_zone, src_gpu, k_src, dst_zone, dst_gpu, k_dst)]``,
    ``intra_fits[(gpu, world_size)]``, ``egress_usd_per_gb[(src_zone, dst_zone)]``.
    """

    inter_fits: dict[tuple[str, str, int, str, str, int], BandwidthFit] = field(default_factory=dict)
    intra_fits: dict[tuple[str, int], BandwidthFit] = field(default_factory=dict)
    egress_usd_per_gb: dict[tuple[str, str], float] = field(default_factory=dict)
    defaults: dict[LinkClass, LinkDefault] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    _links: dict = field(default_factory=dict, repr=False)
    _rings: dict = field(default_factory=dict, repr=False)
    _ring_parts: dict = field(default_factory=dict, repr=False)
    _pair_links: dict = field(default_factory=dict, repr=False)

    # ---- point to point -------------------------------------------------------

    def link(self, src: Endpoint, dst: Endpoint) -> _Link:
        key = (src, dst)
        found = self._links.get(key)
        if found is None:
            found = self._links[key] = self._resolve(src, dst)
        return found

    def p2p_time_s(self, num_bytes: float, src: Endpoint, dst: Endpoint) -> float:
        """Seconds to move ``num_bytes`` (in total, split over min(k_src, k_dst) GPU pairs)."""
        return self.link(src, dst).time_s(num_bytes)

    def link_class(self, src: Endpoint, dst: Endpoint) -> LinkClass:
        return self.link(src, dst).link_class

    def _resolve(self, src: Endpoint, dst: Endpoint) -> _Link:
        k = max(1, min(src.num_gpus, dst.num_gpus))
        if src.node is not None and src.node == dst.node:
            return self._intra_node(src.gpu, k)
        cls = link_class(src.zone, dst.zone)
        # Fits exist for 1, 2, 4 (and 8) GPUs per side: use the largest measured count <= k.
        for count in (c for c in (8, 4, 2, 1) if c <= k):
            fit = self.inter_fits.get((src.zone, src.gpu, count, dst.zone, dst.gpu, count))
            if fit is not None:
                return _Link(fit, 0.0, 0.0, count, cls)
        d = self.defaults[cls]
        return _Link(None, d.bw_1gpu_bytes_per_s * k**COUNT_EXPONENT, d.latency_s, k, cls)

    def _intra_node(self, gpu: str, k: int) -> _Link:
        # intra fits are keyed by the test's world size: k senders + k receivers.
        for count in (c for c in (4, 2, 1) if c <= k):
            fit = self.intra_fits.get((gpu, 2 * count))
            if fit is not None:
                return _Link(fit, 0.0, 0.0, count, LinkClass.INTRA_NODE)
        bw = get_gpu(gpu).intra_node_bw_bytes_per_s * k
        return _Link(None, bw, INTRA_NODE_LATENCY_S, k, LinkClass.INTRA_NODE)

    def tp_bandwidth_bytes_per_s(self, gpu: str, tp_degree: int, message_bytes: float) -> float:
        """What one GPU of a TP group of ``tp_degree`` inside a node moves per second in the
        group's ring all-reduce of ``message_bytes`` (a ring step's ``message / tp_degree`` per
        pair): Sailor's intra-node fit for that many GPUs where it was measured, else the
        catalog's link per GPU.  The fit is the aggregate of ``tp_degree / 2`` pairs: on NVLink
        each pair has links of its own, over PCIe the pairs share the host's bridges (as the
        TP profiles show: RTX-3090 at TP 8 moves 1.5 GB/s per GPU, the fit's aggregate / 4
        1.2; V100 at TP 8 70 GB/s, the aggregate 73)."""
        spec = get_gpu(gpu)
        for count in (c for c in (8, 4, 2) if c <= tp_degree):
            fit = self.intra_fits.get((gpu, count))
            if fit is not None:
                # from the least time, so a bigger message never takes less (BandwidthFit.least_time_s)
                pair_bytes = max(message_bytes / tp_degree, 1.0)
                bw = pair_bytes / fit.least_time_s(pair_bytes)
                return bw if spec.intra_node_link.startswith("nvlink") else bw / (count // 2)
        return spec.intra_node_bw_bytes_per_s

    # ---- collectives ----------------------------------------------------------

    def allreduce_time_s(
        self, num_bytes: float, endpoints: Sequence[Endpoint], *,
        bucket_bytes: float = ALLREDUCE_BUCKET_BYTES,
    ) -> float:
        """Bucketed ring all-reduce of ``num_bytes`` over ``endpoints`` in ring order (a stage's
        replicas in plan order: ``plan.types.Stage``), paced by the slowest of its hops
        (``ring_hop_pairs``).

        One bucket of B bytes over N members takes 2(N-1) steps of B/N bytes each.
        """
        n = len(endpoints)
        if n <= 1 or num_bytes <= 0:
            return 0.0
        if endpoints.count(endpoints[0]) == n:  # (count compares identity first: cheap on [e] * n)
            return self.uniform_allreduce_time_s(num_bytes, endpoints[0], n, bucket_bytes=bucket_bytes)
        return self.allreduce_runs_time_s(num_bytes, _runs(endpoints), bucket_bytes=bucket_bytes)

    def allreduce_runs_time_s(
        self, num_bytes: float, runs: tuple[tuple[Endpoint, int], ...], *,
        bucket_bytes: float = ALLREDUCE_BUCKET_BYTES,
    ) -> float:
        """``allreduce_time_s`` of the ring whose members are ``runs``: (endpoint, how many in a
        row) in ring order, neighbouring runs unequal (``_runs``).  A ring is its runs (a stage
        lists its replicas grouped): keyed by them, a ring of 37 replicas in 5 zones hashes 5
        endpoints, not 37, and a caller holding the runs never lists the 37."""
        n = sum(count for _, count in runs)
        if n <= 1 or num_bytes <= 0:
            return 0.0
        if len(runs) == 1:
            return self.uniform_allreduce_time_s(num_bytes, runs[0][0], n, bucket_bytes=bucket_bytes)
        key = (num_bytes, bucket_bytes, runs)
        hit = self._rings.get(key)
        if hit is None:
            if len(self._rings) > 65536:
                self._rings.clear()
            hit = self._rings[key] = self._ring_s(num_bytes, runs, n, bucket_bytes)
        return hit

    def uniform_allreduce_time_s(
        self, num_bytes: float, endpoint: Endpoint, n: int, *,
        bucket_bytes: float = ALLREDUCE_BUCKET_BYTES,
    ) -> float:
        """``allreduce_time_s`` over ``n`` members at one endpoint, without building the n of them
        (the planner's bounds ask for thousands of these)."""
        if n <= 1 or num_bytes <= 0:
            return 0.0
        key = (num_bytes, bucket_bytes, endpoint, n)
        hit = self._rings.get(key)
        if hit is None:
            if len(self._rings) > 65536:
                self._rings.clear()
            hit = self._rings[key] = _bucketed_ring_s(
                num_bytes, n, bucket_bytes, lambda size: self.p2p_time_s(size / n, endpoint, endpoint))
        return hit

    def uniform_allreduce_times_s(self, num_bytes, endpoint: Endpoint, n: int, *,
                                  bucket_bytes: float = ALLREDUCE_BUCKET_BYTES, to: Endpoint | None = None):
        """``uniform_allreduce_time_s`` of a numpy array of sizes at once (the planner's bounds
        ask for rings of every pipeline depth); ``to``: every hop as slow as ``endpoint`` to
        ``to`` (a ring paced by that pair)."""
        import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

        nb = np.asarray(num_bytes, dtype=float)
        if n <= 1:
            return np.zeros(nb.shape)
        # Planning calls in a row ask for the same rings (same model, so the same sizes).
        key = ("times", endpoint, to, n, bucket_bytes, nb.shape, nb.tobytes())
        hit = self._rings.get(key)
        if hit is not None:
            return hit
        out = self.paced_allreduce_times_s(nb, [(endpoint, to if to is not None else endpoint)], n,
                                           bucket_bytes=bucket_bytes)[0]
        out.flags.writeable = False
        if len(self._rings) > 65536:
            self._rings.clear()
        self._rings[key] = out
        return out

    def paced_allreduce_times_s(self, num_bytes, pairs: Sequence[tuple[Endpoint, Endpoint]], n: int, *,
                                bucket_bytes: float = ALLREDUCE_BUCKET_BYTES):
        """Rings of ``n`` members each paced by one (sender, receiver) pair of ``pairs``: a numpy
        array with a row per pair of the times of ``num_bytes`` (the planner's ring bounds time
        every pair of zones at once: ``planner/search/bounds.rings_s``)."""
        import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

        if n <= 1:
            return np.zeros((len(pairs), *np.shape(num_bytes)))
        return self.paced_allreduce_times_many(num_bytes, pairs, [n], bucket_bytes=bucket_bytes)[:, 0]

    def paced_allreduce_times_many(self, num_bytes, pairs: Sequence[tuple[Endpoint, Endpoint]], ns: Sequence[int],
                                   *, bucket_bytes: float = ALLREDUCE_BUCKET_BYTES):
        """``paced_allreduce_times_s`` for rings of each size of ``ns`` (each >= 2) at once, element
        by element the same arithmetic: an array indexed by pair, ring size, then ``num_bytes``'s
        shape (the planner's ring bounds time every data-parallel degree of a list at once)."""
        import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

        nb = np.asarray(num_bytes, dtype=float)
        n = np.asarray(ns, dtype=float).reshape(-1, *(1,) * nb.ndim)  # a ring size per row
        paced = self._paced_links(pairs)
        num_full = np.floor(nb / bucket_bytes)
        rest = nb - num_full * bucket_bytes
        steps = 2 * (n - 1)
        # One bucket per link and ring size, whatever the sizes: kept (the planner times the same
        # rings at the gradient sizes of every TP degree and depth); then the rest. Timed as flat
        # arrays, shaped back.
        key = (tuple(ns), bucket_bytes, nb.ndim)
        full = paced.full.get(key)
        if full is None:
            if len(paced.full) > 4096:
                paced.full.clear()
            full = steps * _columns_times_s(paced.columns, (bucket_bytes / n).ravel()).reshape(paced.num_links, *n.shape)
            full.flags.writeable = False
            paced.full[key] = full
        per_rest = rest / n
        part = steps * _columns_times_s(paced.columns, per_rest.ravel()).reshape(paced.num_links, *per_rest.shape)
        return np.where(nb > 0, num_full * full + part, 0.0)

    def least_allreduce_runs_time_s(self, num_bytes: float, runs: tuple[tuple[Endpoint, int], ...], *,
                                    bucket_bytes: float = ALLREDUCE_BUCKET_BYTES) -> float:
        """A lower bound on ``allreduce_runs_time_s`` of any size from ``num_bytes`` up over
        ``runs`` (the planner's bound on a stage's ring where only the least it may hold is
        known).  Below a bucket, a ring of B bytes takes 2(N-1) steps of B/N, each at least its
        slowest hop's least time from ``num_bytes``/N up (``_Link.least_time_s``); from a bucket
        up, at least ``num_bytes // bucket_bytes`` whole buckets, and never less than one below."""
        n = sum(count for _, count in runs)
        if n <= 1 or num_bytes <= 0:
            return 0.0
        key = ("least", num_bytes, bucket_bytes, runs)
        hit = self._rings.get(key)
        if hit is None:
            if num_bytes >= bucket_bytes:
                whole = self.allreduce_runs_time_s(bucket_bytes, runs, bucket_bytes=bucket_bytes)
                hit = (num_bytes // bucket_bytes) * whole
            else:
                step = max(link.least_time_s(num_bytes / n) for link in self._hop_links(runs))
                hit = 2 * (n - 1) * step
            if len(self._rings) > 65536:
                self._rings.clear()
            self._rings[key] = hit
        return hit

    def _hop_links(self, runs: tuple[tuple[Endpoint, int], ...]) -> tuple[_Link, ...]:
        """The distinct links of a ring given as ``runs`` (``_runs``): those of the runs' endpoints
        in ring order (``ring_hop_pairs``), plus a member's link with itself where a run holds two
        or more (the pairs ``ring_hop_pairs`` of the whole ring gives); one run: that link alone
        (``uniform_allreduce_time_s``)."""
        key = ("links", runs)
        links = self._ring_parts.get(key)
        if links is None:
            pairs = dict.fromkeys(ring_hop_pairs([e for e, _ in runs]))
            pairs.update(((e, e), None) for e, count in runs if count > 1)
            if len(self._ring_parts) > 4096:
                self._ring_parts.clear()
            links = self._ring_parts[key] = tuple(dict.fromkeys(self.link(a, b) for a, b in pairs))
        return links

    def _paced_links(self, pairs: Sequence[tuple[Endpoint, Endpoint]]) -> _PacedLinks:
        """The links of ``pairs`` as ``_PacedLinks``, kept: a tuple asked for again by identity (the
        planner's ring bounds ask for one tuple per GPU type and set of zones; hashing its endpoints
        and links cost more than the arithmetic), any other sequence by its pairs."""
        key = id(pairs) if type(pairs) is tuple else tuple(pairs)
        hit = self._pair_links.get(key)
        if hit is None or (type(pairs) is tuple and hit[0] is not pairs):
            if len(self._pair_links) > 4096:
                self._pair_links.clear()
            hit = self._pair_links[key] = (pairs, _PacedLinks([self.link(a, b) for a, b in pairs]))
        return hit[1]

    def _ring_s(self, num_bytes: float, runs: tuple[tuple[Endpoint, int], ...], n: int, bucket_bytes: float,
                ) -> float:
        """A ring of ``n`` members given as ``runs`` (``_runs``), paced by its slowest link
        (``_hop_links``)."""
        # One ring's slowest link per full bucket is the same whatever the gradient's size (the
        # planner asks for one ring at many sizes): keep it with the ring's pairs.
        key = (runs, bucket_bytes)
        ring = self._ring_parts.get(key)
        if ring is None:
            # equal links time a message alike: the slowest of the distinct ones paces the ring
            links = self._hop_links(runs)

            def step_s(size: float) -> float:
                per_pair = size / n
                return max(link.time_s(per_pair) for link in links)

            if len(self._ring_parts) > 4096:
                self._ring_parts.clear()
            ring = self._ring_parts[key] = (n, step_s, 2 * (n - 1) * step_s(bucket_bytes))
        n, step_s, full_s = ring
        num_full = int(num_bytes // bucket_bytes)
        rest = num_bytes - num_full * bucket_bytes
        return num_full * full_s + (2 * (n - 1) * step_s(rest) if rest > 0 else 0.0)

    # ---- money -----------------------------------------------------------------

    def egress_usd_per_byte(self, src_zone: str, dst_zone: str) -> float:
        return _egress_usd_per_gb(self.egress_usd_per_gb, src_zone, dst_zone) / 1e9


def _egress_usd_per_gb(table: dict[tuple[str, str], float], src_zone: str, dst_zone: str) -> float:
    price = table.get((src_zone, dst_zone))
    if price is not None:
        return price
    return _default_egress_usd_per_gb(src_zone, dst_zone)


@lru_cache(maxsize=4096)
def _default_egress_usd_per_gb(src_zone: str, dst_zone: str) -> float:
    cls = link_class(src_zone, dst_zone)
    if cls is LinkClass.CROSS_REGION:
        return regions_egress_usd_per_gb(parse_zone(src_zone), parse_zone(dst_zone))
    return DEFAULT_EGRESS_USD_PER_GB[cls.value]


def regions_egress_usd_per_gb(src: Zone, dst: Zone) -> float:
    """The class price between two regions (``Zone``s read for their cloud, region and continent):
    nothing inside a region (object storage there is reached free from its every zone), else across
    regions, continents or clouds as ``DEFAULT_EGRESS_USD_PER_GB`` says."""
    if src.cloud != dst.cloud:
        return DEFAULT_EGRESS_USD_PER_GB["cross_cloud"]
    if src.region == dst.region:
        return 0.0
    return DEFAULT_EGRESS_USD_PER_GB["cross_region" if src.continent == dst.continent else "cross_continent"]


@lru_cache(maxsize=1)
def default_network() -> NetworkModel:
    """The network built from Sailor's published measurements plus the class defaults, and the
    user's own measured links (``sailor profile network``), which win on equal keys."""
    return NetworkModel(
        inter_fits={**load_inter_fits(), **load_user_inter_fits()},
        intra_fits=load_intra_fits(),
        egress_usd_per_gb=load_egress_table(),
    )


def ring_hop_pairs(members: Sequence) -> list[tuple]:
    """The (sender, receiver) pairs a ring over ``members`` (in ring order, the last sending
    back to the first) uses, each distinct pair once, both ways: an all-reduce ring runs
    both directions (NCCL's channels, and the reduce-scatter and all-gather halves alike), so
    a hop is as slow as its slower direction.  Members that repeat side by side add the pair
    of a member with itself (two replicas at one endpoint: their link).  A ring grouped by
    endpoint over at most three endpoints uses every pair of them; beyond that the order
    decides which links pace it."""
    n = len(members)
    pairs: dict[tuple, None] = {}
    for i in range(n):
        a, b = members[i], members[(i + 1) % n]
        pairs[(a, b)] = None
        if a != b:
            pairs[(b, a)] = None
    return list(pairs)


def _runs(members: Sequence) -> tuple[tuple, ...]:
    """``members`` as (member, how many in a row) runs of equal neighbours."""
    runs: list[list] = []
    for m in members:
        if runs and (runs[-1][0] is m or runs[-1][0] == m):
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    return tuple((m, count) for m, count in runs)


def _bucketed_ring_s(num_bytes: float, n: int, bucket_bytes: float, step_s) -> float:
    """Buckets of ``bucket_bytes`` (and one of the rest), each 2(n-1) steps of ``step_s(bucket)``."""
    num_full = int(num_bytes // bucket_bytes)
    rest = num_bytes - num_full * bucket_bytes

    def one_bucket(size: float) -> float:
        return 2 * (n - 1) * step_s(size) if size > 0 else 0.0

    return num_full * one_bucket(bucket_bytes) + one_bucket(rest)
