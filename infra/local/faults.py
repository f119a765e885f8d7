"""API faults injected by the embedded clouds at configurable rates.

Each API request draws once: throttling, a 5xx, a capacity or quota refusal
(only for launches), or a slow answer (a client with a shorter read timeout
sees a timeout). A seeded generator makes a test's sequence repeatable.
"""

from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass

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
        self.configure(rates or FaultRates())
        self.injected: dict[str, int] = {k: 0 for k in KINDS}

    def configure(self, rates: FaultRates) -> None:
        with self._lock:
            self.rates = rates
            self._rng = random.Random(rates.seed)

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
