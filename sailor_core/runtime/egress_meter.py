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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sailor_core.plan.layout import rank_layout
from sailor_core.plan.types import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressSlots:
    """Where the (source, destination) zone pairs sit in a status vector, from ``offset`` on."""

    zones: tuple[str, ...]  # the plan's zones, sorted
    offset: int
    zone: str  # this rank's

    @classmethod
    def of(cls, plan: Plan, offset: int, rank: int) -> EgressSlots:
        layout = rank_layout(plan)
        return cls(zones=tuple(sorted({r.zone for r in layout})), offset=offset, zone=layout[rank].zone)

    @property
    def num_slots(self) -> int:
        """None for a plan in one zone: nothing leaves it."""
        n = len(self.zones)
        return n * n if n > 1 else 0

    def fill(self, status, sent_bytes: Mapping[str, float]) -> None:
        """Add this rank's bytes sent per destination zone (``links.take_sent_bytes``) to ``status``."""
        i = self.zones.index(self.zone)
        for dst, num_bytes in sent_bytes.items():
            status[self.offset + i * len(self.zones) + self.zones.index(dst)] += num_bytes

    def own_pairs(self, sent_bytes: Mapping[str, float]) -> list[list]:
        """This rank's bytes sent per destination zone as ``[src, dst, bytes]`` (an ``egress`` line's)."""
        return [[self.zone, dst, num_bytes] for dst, num_bytes in sorted(sent_bytes.items()) if num_bytes > 0]

    def pairs(self, values: Sequence[float]) -> list[list]:
        """The reduced slots as ``[src, dst, bytes]``, the pairs that moved bytes only."""
        n, out = len(self.zones), []
        for i in range(self.num_slots):
            num_bytes = values[self.offset + i]
            if num_bytes > 0:
                out.append([self.zones[i // n], self.zones[i % n], num_bytes])
        return out
