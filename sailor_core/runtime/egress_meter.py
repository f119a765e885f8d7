"""The bytes a step sends across zones, summed over the ranks without a message of their own.

Each rank counts what it sends to ranks of other zones (``runtime/links.py``'s meter); the
worker adds its count to the step's status vector, whose all-reduce already runs every step,
in one slot per (source zone, destination zone) of the plan's zones.  After the all-reduce
every slot holds the job's bytes of that pair in the step; rank 0 writes them in its metrics
line (``egress_bytes``: ``[[src, dst, bytes], ...]``), which its agent forwards
(``job/protocol.py``, ``AgentStatus.egress``) and the flow prices per pair.  The first step's
slots also carry the state handed over at the resume (``runtime/handover.py``: the worker meters
from before it).  What no step's all-reduce carried (a generation that ends before its first step, a
validation after the last) each rank writes in its own ``{"event": "egress", "rank", "egress_bytes"}``
line as its generation ends (``worker._report_unsent_egress``); its agent adds those too.
Checkpoint bytes to and from a bucket outside a rank's region ride the same slots, the bucket one
more "zone" of the vector (``runtime/storage_meter.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sailor_core.network.storage_egress import BucketPlace
from sailor_core.plan.layout import rank_layout
from sailor_core.plan.types import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressSlots:
    """Where the (source, destination) zone pairs sit in a status vector, from ``offset`` on."""

    zones: tuple[str, ...]  # the plan's zones, sorted
    offset: int
    zone: str  # this rank's

    @classmethod
    def of(cls, plan: Plan, offset: int, rank: int, *, bucket: BucketPlace | None = None) -> EgressSlots:
        """The slots of ``plan``'s zones, and of its checkpoint ``bucket`` when that lies outside
        some zone's region (every rank decides alike: the vector's length must agree)."""
        layout = rank_layout(plan)
        zones = sorted({r.zone for r in layout})
        if bucket is not None and any(bucket.crosses(z) for z in zones):
            zones.append(bucket.name)
        return cls(zones=tuple(zones), offset=offset, zone=layout[rank].zone)

    @property
    def num_slots(self) -> int:
        """None for a plan in one zone: nothing leaves it."""
        n = len(self.zones)
        return n * n if n > 1 else 0

    def fill(self, status, sent_bytes: Mapping[str, float],
             moved_bytes: Mapping[tuple[str, str], float] | None = None) -> None:
        """Add this rank's bytes sent per destination zone (``links.take_sent_bytes``) and moved
        to and from its checkpoint bucket (``storage_meter.take_moved_bytes``) to ``status``."""
        for (src, dst), num_bytes in _all_pairs(self.zone, sent_bytes, moved_bytes).items():
            status[self.offset + self.zones.index(src) * len(self.zones) + self.zones.index(dst)] += num_bytes

    def own_pairs(self, sent_bytes: Mapping[str, float],
                  moved_bytes: Mapping[tuple[str, str], float] | None = None) -> list[list]:
        """This rank's bytes as ``[src, dst, bytes]`` (an ``egress`` line's), as ``fill`` takes them."""
        pairs = _all_pairs(self.zone, sent_bytes, moved_bytes)
        return [[src, dst, num_bytes] for (src, dst), num_bytes in sorted(pairs.items()) if num_bytes > 0]

    def pairs(self, values: Sequence[float]) -> list[list]:
        """The reduced slots as ``[src, dst, bytes]``, the pairs that moved bytes only."""
        n, out = len(self.zones), []
        for i in range(self.num_slots):
            num_bytes = values[self.offset + i]
            if num_bytes > 0:
                out.append([self.zones[i // n], self.zones[i % n], num_bytes])
        return out


def _all_pairs(zone: str, sent_bytes: Mapping[str, float],
               moved_bytes: Mapping[tuple[str, str], float] | None) -> dict[tuple[str, str], float]:
    out = {(zone, dst): float(num_bytes) for dst, num_bytes in sent_bytes.items()}
    for pair, num_bytes in (moved_bytes or {}).items():
        out[pair] = out.get(pair, 0.0) + num_bytes
    return out
