"""Retries with exponential backoff and jitter, for transient cloud errors only."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from infra.errors import TransientCloudError

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 6
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Full jitter (AWS architecture blog): spreads retries of many clients apart."""
        cap = min(self.max_delay_s, self.base_delay_s * (2**attempt))
        return rng.uniform(cap / 2, cap)


def with_retries(
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[TransientCloudError, int], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """Run ``call``; on ``TransientCloudError`` wait and try again, up to the policy's limit."""
    rng = rng or random.Random()
    for attempt in range(policy.max_attempts):
        try:
            return call()
        except TransientCloudError as exc:
            if attempt + 1 >= policy.max_attempts:
                raise
            if on_retry is not None:
                on_retry(exc, attempt + 1)
            sleep(policy.delay_s(attempt, rng))
    raise AssertionError("unreachable")
