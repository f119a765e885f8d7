"""The training recipe: learning-rate schedule, weight decay, gradient clipping (no torch here).

One ``Recipe`` drives the engine's ranks and the single-process reference alike, and is
written into every checkpoint's meta, so a resumed or re-planned job continues the schedule
it started with (the same peak, warm-up and decay over the same total steps) whatever the
new workers were told.

Schedule, for the optimizer step ``s`` (0 for the first update, ``total_steps - 1`` for
the last): a linear warm-up ``peak * (s + 1) / (warmup + 1)`` for ``s < warmup``, then a
cosine from ``peak`` down to ``peak * min_lr_ratio`` at ``s = total_steps - 1``; after the
job's total (a run extended past it) the floor.  The defaults are JobSpec's
(``sailor_core/job/spec.py``): a job's recipe is its spec's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from sailor_core.errors import InputError
from sailor_core.job.spec import JobSpec

DEFAULT_WARMUP_FRACTION = 0.05  # of the job's steps, when no warm-up length is given


def spec_default(name: str) -> Any:
    """JobSpec's default of a field: the engine's defaults are a job's."""
    return next(f.default for f in dataclasses.fields(JobSpec) if f.name == name)


def default_warmup_steps(total_steps: int) -> int:
    """5 % of the job's steps, rounded up (1 step for a short job)."""
    return math.ceil(DEFAULT_WARMUP_FRACTION * total_steps)


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    total_steps: int
    peak_lr: float = spec_default("learning_rate")
    warmup_steps: int | None = None  # None: default_warmup_steps(total_steps)
    min_lr_ratio: float = spec_default("min_lr_ratio")
    weight_decay: float = spec_default("weight_decay")
    grad_clip_norm: float = spec_default("grad_clip_norm")  # 0: no clipping

    def __post_init__(self) -> None:
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", default_warmup_steps(self.total_steps))
        if self.total_steps < 1:
            raise InputError(f"the schedule needs at least one step, got {self.total_steps}")
        if not self.peak_lr > 0:
            raise InputError(f"learning rate must be positive, got {self.peak_lr}")
        if self.warmup_steps < 0:
            raise InputError(f"warm-up steps must be at least 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise InputError(f"min LR ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0 or self.grad_clip_norm < 0:
            raise InputError("weight decay and the gradient clipping norm must be at least 0")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based: the update that makes step ``step + 1``)."""
        warmup = self.warmup_steps
        if step < warmup:
            return self.peak_lr * (step + 1) / (warmup + 1)
        floor = self.peak_lr * self.min_lr_ratio
        decay_steps = self.total_steps - 1 - warmup
        if decay_steps <= 0:
            return floor
        progress = min(1.0, (step - warmup) / decay_steps)
        return floor + (self.peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
