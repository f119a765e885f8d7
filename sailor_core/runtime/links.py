"""The engine's point-to-point transfers and gradient all-reduces, and a test-only slow link
(and compute pace).

The engine (``runtime/p2p.py``, ``runtime/allreduce.py``, ``runtime/trainer.py``) moves
activations, gradients and the data-parallel gradient sums only through ``isend``, ``irecv``
and ``all_reduce`` here.  In every real run they are
``torch.distributed``'s own.  A test or benchmark can instead give the workers a link of fixed
latency and bandwidth (``LinkShim.to_env``; the variable is named in ``sailor_core.settings``),
to compare the engine's step time over slow links with what the simulator predicts for the
same link figures (``benchmarks/bench_slow_links.py``).  Under the shim every message still
travels over the real backend, and the receiver then waits until it would have arrived:

* point to point, as a rendezvous (what NCCL and gloo do): a message sent at ``s`` whose
  receive was posted at ``p``, over a link (one FIFO per direction of each rank pair) free
  from ``f``, starts at ``max(s, p, f)``, holds the link ``bytes / bandwidth`` and arrives
  ``latency`` after that.  The sender stamps each message with its send time (a small message
  of its own); workers of one machine share one clock.
* an all-reduce of ``bytes`` over ``n`` ranks takes a ring's ``2 (n - 1) (latency + bytes / n /
  bandwidth)`` from when its last rank joined (each rank's join time travels in a MAX
  all-reduce beside it); a group's all-reduces run one after another.

The same three calls meter egress (``meter_zones``): each rank counts the bytes it sends to a
rank of another zone, by destination zone, with no message of its own: a point-to-point send
its tensor's bytes, an all-reduce of ``bytes`` over ``n`` ranks a ring's ``2 (n - 1) / n x
bytes`` to its ring neighbour (the next rank of the group, as NCCL's ring and the simulator's
``compose.ring_hop_bytes`` count it).  The worker sums the counts over the ranks in the step's
status all-reduce (``runtime/worker.py``); the flow prices them per pair.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_core import settings
from sailor_core.errors import InputError

# Stamps travel beside their message with this added to its tag (the engine's tags stay below).
_STAMP_TAG = 1 << 24


def _two_numbers(text: str, env: str, form: str) -> tuple[float, float] | None:
    """``A:B`` of a test-only variable as two floats; None when it is unset."""
    if not text:
        return None
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise InputError(f"{env} must be {form}, got {text!r}") from None
    return a, b


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkShim:
    """A link of ``latency_s`` and ``bandwidth_bytes_per_s`` between every two ranks."""

    latency_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.bandwidth_bytes_per_s <= 0:
            raise InputError(f"a link needs latency >= 0 and bandwidth > 0, got {self.latency_s} s and "
                             f"{self.bandwidth_bytes_per_s} B/s")

    def to_env(self) -> dict[str, str]:
        return {settings.LINK_SHIM_ENV: f"{self.latency_s!r}:{self.bandwidth_bytes_per_s!r}"}

    @classmethod
    def from_env(cls) -> LinkShim | None:
        pair = _two_numbers(settings.link_shim(), settings.LINK_SHIM_ENV, "LATENCY_S:BYTES_PER_S")
        return None if pair is None else cls(latency_s=pair[0], bandwidth_bytes_per_s=pair[1])

    def wire_s(self, num_bytes: int) -> float:
        return num_bytes / self.bandwidth_bytes_per_s

    def ring_s(self, num_bytes: int, num_ranks: int) -> float:
        if num_ranks <= 1:
            return 0.0
        return 2 * (num_ranks - 1) * (self.latency_s + self.wire_s(num_bytes) / num_ranks)


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputePace:
    """Test-only: each forward of a micro-batch lasts at least ``fwd_s_per_layer`` per layer of
    the stage, each backward ``bwd_s_per_layer`` (the rank sleeps out the rest of the op).  With
    ops paced longer than they compute, ranks that share a few cores no longer stretch each
    other's ops, so a benchmark checks the schedule and the links against a profile it knows
    exactly (``bench_slow_links.py --pace-ms``)."""

    fwd_s_per_layer: float
    bwd_s_per_layer: float

    def __post_init__(self) -> None:
        if self.fwd_s_per_layer < 0 or self.bwd_s_per_layer < 0:
            raise InputError(f"a compute pace needs seconds >= 0, got {self.fwd_s_per_layer} and "
                             f"{self.bwd_s_per_layer}")

    def to_env(self) -> dict[str, str]:
        return {settings.COMPUTE_PACE_ENV: f"{self.fwd_s_per_layer!r}:{self.bwd_s_per_layer!r}"}

    @classmethod
    def from_env(cls) -> ComputePace | None:
        pair = _two_numbers(settings.compute_pace(), settings.COMPUTE_PACE_ENV, "FWD_S:BWD_S")
        return None if pair is None else cls(fwd_s_per_layer=pair[0], bwd_s_per_layer=pair[1])

    def op_s(self, kind: str, num_layers: int) -> float:
        """The least seconds of one op (``"F"`` or ``"B"``) of a stage of ``num_layers`` layers."""
        return (self.fwd_s_per_layer if kind == "F" else self.bwd_s_per_layer) * num_layers

    def hold(self, kind: str, num_layers: int, started_s: float) -> None:
        """Sleep until the op begun at ``started_s`` (``time.time()``) has lasted its pace."""
        _sleep_until(started_s + self.op_s(kind, num_layers))


_zone_of_rank: tuple[str, ...] = ()  # each global rank's zone; empty: no metering
_sent_bytes: dict[str, float] = {}  # destination zone -> bytes this rank sent there since the last take
_ring_next: dict[int, int] = {}  # id(group) -> this rank's ring neighbour in it


def meter_zones(zones) -> None:
    """Count from now on the bytes this rank sends to ranks of another zone (``zones[r]``: global
    rank r's zone, ``plan.layout.rank_layout``'s)."""
    global _zone_of_rank
    _zone_of_rank = tuple(zones)
    _sent_bytes.clear()
    _ring_next.clear()


def take_sent_bytes() -> dict[str, float]:
    """Bytes sent to each other zone since the last call (this rank's), and start over."""
    out = dict(_sent_bytes)
    _sent_bytes.clear()
    return out


def _count(dst: int, num_bytes: float) -> None:
    zone = _zone_of_rank[dst]
    if zone != _zone_of_rank[dist.get_rank()]:
        _sent_bytes[zone] = _sent_bytes.get(zone, 0.0) + num_bytes


def meter_ring(num_bytes: float, group, *, passes: int = 2) -> None:
    """Count what a ring collective of ``num_bytes`` over ``group`` sends to this rank's ring
    neighbour: ``passes x (n - 1) / n`` of them (an all-reduce 2, a reduce-scatter or an
    all-gather 1).  A collective outside this module (ZeRO's) calls it beside its own."""
    if not _zone_of_rank:
        return
    key = id(group)
    nxt = _ring_next.get(key)
    if nxt is None:
        members = dist.get_process_group_ranks(group)
        nxt = _ring_next[key] = members[(members.index(dist.get_rank()) + 1) % len(members)]
    n = dist.get_world_size(group)
    if n > 1:
        _count(nxt, passes * (n - 1) / n * num_bytes)


_UNREAD = object()
_shim: LinkShim | None | object = _UNREAD
_link_free: dict[tuple, float] = {}  # (src, dst) -> when that direction's link is free again
_ring_free: dict[int, float] = {}  # id(group) -> when its last all-reduce ends


def shim() -> LinkShim | None:
    """The configured slow link, or None (every real run); read once per process."""
    global _shim
    if _shim is _UNREAD:
        _shim = LinkShim.from_env()
    return _shim  # type: ignore[return-value]


def _sleep_until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


class _Sent:
    def __init__(self, works, stamp: torch.Tensor) -> None:
        self.works, self.stamp = works, stamp  # the stamp lives until its send is waited for

    def wait(self) -> None:
        for w in self.works:
            w.wait()

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


class _Received:
    """A receive under the shim: its wait returns when the message would have arrived."""

    def __init__(self, link: LinkShim, key: tuple, tensor: torch.Tensor, group) -> None:
        src, dst, tag = key
        self.link, self.key, self.tensor = link, (src, dst), tensor
        self.posted = time.time()
        self.stamp = torch.zeros(1, dtype=torch.float64, device=tensor.device)
        self.works = [dist.irecv(self.stamp, src=src, tag=tag + _STAMP_TAG, group=group),
                      dist.irecv(tensor, src=src, tag=tag, group=group)]
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        for w in self.works:
            w.wait()
        nbytes = self.tensor.numel() * self.tensor.element_size()
        start = max(float(self.stamp), self.posted, _link_free.get(self.key, 0.0))
        _link_free[self.key] = start + self.link.wire_s(nbytes)
        _sleep_until(start + self.link.wire_s(nbytes) + self.link.latency_s)
        self.done = True


def isend(tensor: torch.Tensor, dst: int, tag: int, group):
    """``dist.isend``, or under the shim the message and its send time."""
    if _zone_of_rank:
        _count(dst, tensor.numel() * tensor.element_size())
    link = shim()
    if link is None:
        return dist.isend(tensor, dst=dst, tag=tag, group=group)
    stamp = torch.tensor([time.time()], dtype=torch.float64, device=tensor.device)
    return _Sent([dist.isend(stamp, dst=dst, tag=tag + _STAMP_TAG, group=group),
                  dist.isend(tensor, dst=dst, tag=tag, group=group)], stamp)


def irecv(tensor: torch.Tensor, src: int, tag: int, group):
    """``dist.irecv``, or under the shim a receive whose ``wait`` lasts until the message's
    arrival over the slow link (see the module doc)."""
    link = shim()
    if link is None:
        return dist.irecv(tensor, src=src, tag=tag, group=group)
    return _Received(link, (src, dist.get_rank(), tag), tensor, group)


def recv(tensor: torch.Tensor, src: int, tag: int, group) -> None:
    irecv(tensor, src, tag, group).wait()


class _Reduced:
    def __init__(self, link: LinkShim, tensor: torch.Tensor, group) -> None:
        self.link, self.tensor, self.group = link, tensor, group
        self.joined = torch.tensor([time.time()], dtype=torch.float64, device=tensor.device)
        self.works = [dist.all_reduce(self.joined, op=dist.ReduceOp.MAX, group=group, async_op=True),
                      dist.all_reduce(tensor, group=group, async_op=True)]
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        for w in self.works:
            w.wait()
        key = id(self.group)
        nbytes = self.tensor.numel() * self.tensor.element_size()
        start = max(float(self.joined), _ring_free.get(key, 0.0))
        end = start + self.link.ring_s(nbytes, dist.get_world_size(self.group))
        _ring_free[key] = end
        _sleep_until(end)
        self.done = True


def all_reduce(tensor: torch.Tensor, group, *, async_op: bool = False):
    """``dist.all_reduce`` (a sum) of a data-parallel group, or under the shim one that lasts a
    ring's time over the slow link."""
    meter_ring(tensor.numel() * tensor.element_size(), group)
    link = shim()
    if link is None:
        return dist.all_reduce(tensor, group=group, async_op=async_op)
    work = _Reduced(link, tensor, group)
    if not async_op:
        work.wait()
        return None
    return work
