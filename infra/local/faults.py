"""API faults injected by the embedded clouds at configurable rates.

Each API request draws once: throttling, a 5xx, a capacity or quota refusal
(only for launches), or a slow answer (a client with a shorter read timeout
sees a timeout). A seeded generator makes a test's sequence repeatable.
"""

from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass

from sailor_core.errors import InputError

KINDS = ("throttle", "server_error", "capacity", "quota", "timeout")
LAUNCH_ONLY = frozenset({"capacity", "quota"})


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRates:
    throttle: float = 0.0
    server_error: float = 0.0
    capacity: float = 0.0
    quota: float = 0.0
    timeout: float = 0.0
    timeout_s: float = 2.0  # how long a "timeout" answer takes
    seed: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class Faults:
    def __init__(self, rates: FaultRates | None = None) -> None:
        self._lock = threading.Lock()
        self.injected: dict[str, int] = {}
        self.configure(rates or FaultRates())

    def configure(self, rates: FaultRates) -> None:
        with self._lock:
            self.rates = rates
            self._rng = random.Random(rates.seed)
            self.injected = {k: 0 for k in KINDS}

    def draw(self, *, launch: bool) -> str | None:
        """The fault this request gets, if any."""
        with self._lock:
            u = self._rng.random()
            acc = 0.0
            for kind in KINDS:
                if kind in LAUNCH_ONLY and not launch:
                    continue
                acc += getattr(self.rates, kind)
                if u < acc:
                    self.injected[kind] += 1
                    return kind
            return None


def parse_fault_rates(text: str) -> FaultRates:
    """``"throttle=0.1,server_error=0.05,seed=1"`` -> FaultRates (the CLI's and control's format)."""
    values: dict = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, val = item.partition("=")
        if key not in FaultRates.__dataclass_fields__:
            raise InputError(f"unknown fault {key!r}; known: {', '.join(FaultRates.__dataclass_fields__)}")
        try:
            values[key] = int(val) if key == "seed" else float(val)
        except ValueError:
            raise InputError(f"fault {key!r} needs a number, got {val!r}") from None
        if key not in ("seed", "timeout_s") and not 0 <= values[key] <= 1:
            raise InputError(f"fault rate {key}={val} must be within [0, 1]")
        if key == "timeout_s" and not 0 <= values[key] <= 600:
            raise InputError(f"timeout_s={val} must be within [0, 600] seconds")
    return FaultRates(**values)
