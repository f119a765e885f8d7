"""The training recipe: what the job's options ask of the workers (no torch here).

A ``Recipe`` holds the job's total steps and every JobSpec option that reaches the workers
(``Option.worker`` in ``sailor_core/job/spec.py``: the learning-rate schedule, weight decay,
gradient clipping, validation, the pretrained weights), under the fields' names and with
their defaults: its fields are generated from JobSpec's, so an option added there is here
too, checked by the same ``check_worker_options``.  It drives the engine's ranks and the
single-process reference alike, and is written into every checkpoint's meta, so a resumed or
re-planned job continues the recipe it started with (the same peak, warm-up and decay over
the same total steps) whatever the new workers were told (``continued``).

Schedule, for the optimizer step ``s`` (0 for the first update, ``total_steps - 1`` for
the last): a linear warm-up ``peak * (s + 1) / (warmup + 1)`` for ``s < warmup``, then a
cosine from ``peak`` down to ``peak * min_lr_ratio`` at ``s = total_steps - 1``; after the
job's total (a run extended past it) the floor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from sailor_core.errors import InputError
from sailor_core.job.spec import JobSpecError, check_worker_options, worker_fields
from sailor_core.job.worker_args import as_flag_error

DEFAULT_WARMUP_FRACTION = 0.05  # of the job's steps, when no warm-up length is given


def default_warmup_steps(total_steps: int) -> int:
    """5 % of the job's steps, rounded up (1 step for a short job)."""
    return math.ceil(DEFAULT_WARMUP_FRACTION * total_steps)


class _RecipeRules:
    """What a Recipe does with its values (its fields: ``Recipe`` below)."""

    __slots__ = ()

    def __post_init__(self) -> None:
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", default_warmup_steps(self.total_steps))
        if self.total_steps < 1:
            raise InputError(f"the schedule needs at least one step, got {self.total_steps}")
        check_worker_options(self)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based: the update that makes step ``step + 1``)."""
        warmup, peak = self.warmup_steps, self.learning_rate
        if step < warmup:
            return peak * (step + 1) / (warmup + 1)
        floor = peak * self.min_lr_ratio
        decay_steps = self.total_steps - 1 - warmup
        if decay_steps <= 0:
            return floor
        progress = min(1.0, (step - warmup) / decay_steps)
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def continued(self, kept: Mapping[str, Any]) -> Recipe:
        """This recipe with a checkpoint's values (``to_dict``) over it: a value the checkpoint
        lacks (an option added since, a key of another version) stays as asked."""
        names = {f.name for f in dataclasses.fields(self)} - _ASKED_EACH_ATTEMPT
        return dataclasses.replace(self, **{k: v for k, v in kept.items() if k in names})


# Where the metrics and checkpoints go is no part of the training: the workers do as this attempt was told.
_ASKED_EACH_ATTEMPT = {"wandb_project", "mlflow_tracking_uri", "checkpoint_region"}


# The job's total steps, then JobSpec's worker options with their types and defaults.
Recipe = dataclasses.make_dataclass(
    "Recipe", [("total_steps", int)] + [(f.name, f.type, dataclasses.field(default=f.default))
                                        for f in worker_fields()],
    bases=(_RecipeRules,), frozen=True, slots=True, kw_only=True)
Recipe.__module__ = __name__  # pickled by name, as a class written here would be


def make_recipe(total_steps: int, values: Mapping[str, Any]) -> Recipe:
    """The recipe of ``values`` (worker options by field name; missing: JobSpec's default); a bad
    value raises InputError naming its flag, as the workers' command line spells it."""
    try:
        return Recipe(total_steps=total_steps, **values)
    except JobSpecError as exc:
        raise as_flag_error(exc) from None
