"""The cost ledger: every instance's running time x its price, the egress its bytes across
zones and clouds cost, and what the budget still allows.

Time is any monotonic clock in seconds (Unix time in the train-job flow,
simulated time in the replay).  A price can change while an instance runs
(spot price series); each instance keeps its price segments and its market
(spot or on demand: a mixed plan rents both, and ``by_market`` splits the spend).
Egress is charged as it is known (``charge_egress``: bytes and USD from one zone to another,
at a time; the flow charges what the engine counted, the replay what the simulator predicts);
``spent_usd`` counts it, ``rent_usd`` and ``egress_usd`` tell the two apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sailor_core.errors import InputError
from sailor_core.network.storage_egress import is_bucket_pair

_S_PER_HR = 3600.0
# The pair of an egress charge the simulator priced for a whole plan (the replay charges its
# options' egress per hour of training: neither split by pair nor counted in bytes).
SIMULATED_PAIR = ("*", "*")


@dataclass(slots=True, kw_only=True)
class LedgerEntry:
    instance_id: str
    gpu: str
    zone: str
    num_gpus: int
    start_s: float
    # (from_s, usd_per_hr) segments, time-ordered; the first starts at start_s.
    prices: list[tuple[float, float]] = field(default_factory=list)
    end_s: float | None = None
    end_reason: str | None = None
    spot: bool = True

    @property
    def market(self) -> str:
        return "spot" if self.spot else "on_demand"

    @property
    def usd_per_hr(self) -> float:
        return self.prices[-1][1]

    def cost_usd(self, now_s: float) -> float:
        end = self.end_s if self.end_s is not None else now_s
        total = 0.0
        for i, (since, rate) in enumerate(self.prices):
            until = self.prices[i + 1][0] if i + 1 < len(self.prices) else end
            total += max(0.0, min(until, end) - since) * rate / _S_PER_HR
        return total


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressCharge:
    """Bytes sent from ``src_zone`` to ``dst_zone`` and what they cost, charged at ``at_s``."""

    src_zone: str
    dst_zone: str
    num_bytes: float
    usd: float
    at_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"src_zone": self.src_zone, "dst_zone": self.dst_zone, "num_bytes": self.num_bytes,
                "usd": self.usd, "at_s": self.at_s}

    @classmethod
    def from_dict(cls, row: Any) -> "EgressCharge":
        return cls(src_zone=str(row["src_zone"]), dst_zone=str(row["dst_zone"]), num_bytes=float(row["num_bytes"]),
                   usd=float(row["usd"]), at_s=float(row["at_s"]))


class CostLedger:
    """Accumulates spend as instances open, change price and close.

    ``can_afford`` is the one budget test: spend so far plus running at a rate
    for a duration plus the shutdown still to pay at that rate must stay within
    the budget.  The controller asks it before every step forward, so the
    budget is never crossed; the rate it is asked about is rent plus egress
    while training (``PlanOption.cost_usd_per_hr``).
    """

    __slots__ = ("budget_usd", "_entries", "_egress")

    def __init__(self, *, budget_usd: float | None = None) -> None:
        if budget_usd is not None and not (math.isfinite(budget_usd) and budget_usd > 0):
            raise InputError(f"budget must be a positive number of USD, got {budget_usd!r}")
        self.budget_usd = budget_usd
        self._entries: dict[str, LedgerEntry] = {}
        self._egress: list[EgressCharge] = []

    # ---- recording -------------------------------------------------------
    def open(self, instance_id: str, *, gpu: str, zone: str, num_gpus: int, usd_per_hr: float,
             start_s: float, spot: bool = True) -> None:
        if instance_id in self._entries:
            raise InputError(f"instance {instance_id!r} is already in the ledger")
        if not (math.isfinite(usd_per_hr) and usd_per_hr >= 0):
            raise InputError(f"price of {instance_id!r} must be >= 0 USD/h, got {usd_per_hr!r}")
        self._entries[instance_id] = LedgerEntry(
            instance_id=instance_id, gpu=gpu, zone=zone, num_gpus=int(num_gpus),
            start_s=float(start_s), prices=[(float(start_s), float(usd_per_hr))], spot=bool(spot),
        )

    def set_price(self, instance_id: str, usd_per_hr: float, at_s: float) -> None:
        e = self._entry(instance_id)
        if e.end_s is None and usd_per_hr != e.usd_per_hr:
            at_s = max(at_s, e.prices[-1][0])
            if at_s == e.prices[-1][0]:
                e.prices[-1] = (at_s, float(usd_per_hr))
            else:
                e.prices.append((float(at_s), float(usd_per_hr)))

    def close(self, instance_id: str, end_s: float, reason: str = "terminated") -> None:
        e = self._entry(instance_id)
        if e.end_s is None:
            e.end_s = max(float(end_s), e.start_s)
            e.end_reason = reason

    def charge_egress(self, src_zone: str, dst_zone: str, *, num_bytes: float, usd: float, at_s: float) -> None:
        """Charge ``num_bytes`` sent from ``src_zone`` to ``dst_zone``, costing ``usd``, at ``at_s``."""
        if not (math.isfinite(num_bytes) and num_bytes >= 0 and math.isfinite(usd) and usd >= 0):
            raise InputError(f"egress {src_zone} -> {dst_zone} must be >= 0 bytes and USD, got {num_bytes!r} "
                             f"bytes for {usd!r} USD")
        if num_bytes > 0 or usd > 0:
            self._egress.append(EgressCharge(src_zone=src_zone, dst_zone=dst_zone, num_bytes=float(num_bytes),
                                             usd=float(usd), at_s=float(at_s)))

    def _entry(self, instance_id: str) -> LedgerEntry:
        try:
            return self._entries[instance_id]
        except KeyError:
            raise InputError(f"instance {instance_id!r} is not in the ledger") from None

    # ---- reading ---------------------------------------------------------
    def open_ids(self) -> list[str]:
        return [i for i, e in self._entries.items() if e.end_s is None]

    def usd_per_hr(self) -> float:
        """What the instances still open cost per hour now."""
        return sum(e.usd_per_hr for e in self._entries.values() if e.end_s is None)

    def spent_usd(self, now_s: float) -> float:
        """Rent and egress (every egress charge made, whatever its time)."""
        return self.rent_usd(now_s) + self.egress_usd()

    def rent_usd(self, now_s: float) -> float:
        return sum(e.cost_usd(now_s) for e in self._entries.values())

    def egress_usd(self) -> float:
        return sum(c.usd for c in self._egress)

    def checkpoint_egress_usd(self) -> float:
        """Of ``egress_usd``: the bytes checkpoints moved to and from a bucket outside the ranks' regions."""
        return sum(c.usd for c in self._egress if is_bucket_pair(c.src_zone, c.dst_zone))

    def egress_by_pair(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(bytes, USD) sent from each zone to each other zone."""
        out: dict[tuple[str, str], tuple[float, float]] = {}
        for c in self._egress:
            num_bytes, usd = out.get((c.src_zone, c.dst_zone), (0.0, 0.0))
            out[(c.src_zone, c.dst_zone)] = (num_bytes + c.num_bytes, usd + c.usd)
        return out

    def egress_charges(self) -> list[EgressCharge]:
        return list(self._egress)

    def budget_left_usd(self, now_s: float) -> float:
        return math.inf if self.budget_usd is None else self.budget_usd - self.spent_usd(now_s)

    def can_afford(self, usd_per_hr: float, duration_s: float, shutdown_s: float, *, now_s: float) -> bool:
        """Would running at ``usd_per_hr`` for ``duration_s``, then ``shutdown_s`` more, stay in budget?"""
        need = usd_per_hr * (max(duration_s, 0.0) + max(shutdown_s, 0.0)) / _S_PER_HR
        return need <= self.budget_left_usd(now_s) + 1e-9

    def affordable_s(self, usd_per_hr: float, shutdown_s: float, *, now_s: float,
                     shutdown_usd_per_hr: float | None = None) -> float:
        """How long one can still run at ``usd_per_hr`` and pay the shutdown, at
        ``shutdown_usd_per_hr`` when it differs (the rent without the egress of training), else
        at the same rate (inf without a budget)."""
        left = self.budget_left_usd(now_s)
        if math.isinf(left) or usd_per_hr <= 0:
            return math.inf
        if shutdown_usd_per_hr is None or shutdown_usd_per_hr == usd_per_hr:
            return max(0.0, left * _S_PER_HR / usd_per_hr - max(shutdown_s, 0.0))
        return max(0.0, (left * _S_PER_HR - shutdown_usd_per_hr * max(shutdown_s, 0.0)) / usd_per_hr)

    def by_instance(self, now_s: float) -> dict[str, float]:
        return {i: e.cost_usd(now_s) for i, e in self._entries.items()}

    def by_gpu_zone(self, now_s: float) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for e in self._entries.values():
            out[(e.gpu, e.zone)] = out.get((e.gpu, e.zone), 0.0) + e.cost_usd(now_s)
        return out

    def by_market(self, now_s: float) -> dict[str, float]:
        """USD spent on spot and on on-demand instances."""
        out: dict[str, float] = {}
        for e in self._entries.values():
            out[e.market] = out.get(e.market, 0.0) + e.cost_usd(now_s)
        return out

    def gpu_seconds(self, now_s: float) -> float:
        total = 0.0
        for e in self._entries.values():
            end = e.end_s if e.end_s is not None else now_s
            total += max(0.0, end - e.start_s) * e.num_gpus
        return total

    def entries(self) -> list[LedgerEntry]:
        return list(self._entries.values())

    # ---- persistence -----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_usd": self.budget_usd,
            "instances": [
                {
                    "instance_id": e.instance_id, "gpu": e.gpu, "zone": e.zone, "num_gpus": e.num_gpus,
                    "start_s": e.start_s, "prices": [list(p) for p in e.prices],
                    "end_s": e.end_s, "end_reason": e.end_reason,
                } | ({} if e.spot else {"spot": False})
                for e in self._entries.values()
            ],
        } | ({"egress": [c.to_dict() for c in self._egress]} if self._egress else {})

    @classmethod
    def from_dict(cls, data: Any) -> "CostLedger":
        try:
            ledger = cls(budget_usd=data.get("budget_usd"))
            for row in data["instances"]:
                prices = [(float(a), float(b)) for a, b in row["prices"]]
                if not prices:
                    raise ValueError(f"instance {row['instance_id']!r} has no price")
                ledger._entries[str(row["instance_id"])] = LedgerEntry(
                    instance_id=str(row["instance_id"]), gpu=str(row["gpu"]), zone=str(row["zone"]),
                    num_gpus=int(row["num_gpus"]), start_s=float(row["start_s"]), prices=prices,
                    end_s=None if row.get("end_s") is None else float(row["end_s"]),
                    end_reason=row.get("end_reason"), spot=bool(row.get("spot", True)),
                )
            for row in data.get("egress", ()):  # absent from ledgers written before egress was charged
                c = EgressCharge.from_dict(row)
                ledger.charge_egress(c.src_zone, c.dst_zone, num_bytes=c.num_bytes, usd=c.usd, at_s=c.at_s)
            return ledger
        except InputError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise InputError(f"corrupt cost ledger: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_instance_records(cls, records, *, budget_usd: float | None = None, egress=()) -> "CostLedger":
        """Rebuild from the job state's instance records (``sailor_core.job.state.InstanceRecord``)
        and its egress charges (``EgressCharge``s)."""
        ledger = cls(budget_usd=budget_usd)
        ledger._egress = list(egress)
        for r in records:
            ledger.open(r.instance_id, gpu=r.gpu, zone=r.zone, num_gpus=r.num_gpus,
                        usd_per_hr=r.usd_per_hr, start_s=r.launched_unix_s, spot=r.spot)
            if r.ended_unix_s is not None:
                ledger.close(r.instance_id, r.ended_unix_s, r.end_reason or "terminated")
        return ledger
