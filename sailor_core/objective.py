"""What a job optimises and the constraints it keeps: its ``Objective`` and ``JobTerms``.

An objective is defined here once (its name and what it means to users).  How each part of
Sailor ranks by it is a table keyed by the objective, one per ranking: the planner's
(``sailor_core/planner/ranking.py``: how a search orders plans) and the controller's
(``sailor_core/controller/ranking.py``: how a re-plan orders options over the job's life).
So a new objective is a member here, a line in each of those two tables (and a ranking of
its own where neither has one yet), and its tests.

``JobTerms`` are the job's objective and constraints as the job (``JobSpec``), the
controller (``ControllerConfig``) and the replay share them, validated here only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from sailor_core.errors import InputError
from sailor_core.specs.fields import SpecError


class Objective(StrEnum):
    """What every (re-)plan optimises over a job's life; its value is its user-facing name."""

    THROUGHPUT = "throughput"  # finish soonest (most samples/s within the caps)
    COST = "cost"              # finish for the fewest USD (least USD per sample above the floor)

    @classmethod
    def parse(cls, value: str | Objective) -> Objective:
        """``value`` (a user's spelling, any case) as an Objective; InputError naming the known ones."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise InputError(f"unknown objective {value!r}; known: {', '.join(cls)}") from None

    @property
    def meaning(self) -> str:
        """What it asks, in a few words for users."""
        return _MEANINGS[self]

    @classmethod
    def described(cls) -> str:
        """Every objective with its meaning, for help texts: ``throughput (finish soonest) or ...``."""
        return " or ".join(f"{o.value} ({o.meaning})" for o in cls)


_MEANINGS = {
    Objective.THROUGHPUT: "finish soonest",
    Objective.COST: "finish for the fewest USD",
}


class TermsError(SpecError):
    """A bad job term; ``field`` names it (a JobSpec field), ``problem`` says what is wrong."""


def objective_term(value: str | Objective) -> Objective:
    """A spec's ``objective`` field as an Objective; TermsError naming the field and the known ones."""
    try:
        return Objective.parse(value)
    except InputError:
        raise TermsError("objective", f"must be {' or '.join(Objective)}, got {value!r}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTerms:
    """What a job asks beyond its model and steps, as ``sailor train`` takes it: the objective,
    a floor on the throughput (counting the restarts of preemptions), a deadline from the job's
    start, and on-demand GPUs per pool besides the spot ones (0: spot only)."""

    objective: Objective = Objective.THROUGHPUT
    min_throughput_samples_per_s: float | None = None
    deadline_h: float | None = None
    on_demand_gpus: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", objective_term(self.objective))
        for name in ("min_throughput_samples_per_s", "deadline_h"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):  # NaN too
                raise TermsError(name, f"must be a positive number, got {value}")
        if self.on_demand_gpus < 0:
            raise TermsError("on_demand_gpus", f"must be at least 0, got {self.on_demand_gpus}")

    @classmethod
    def of(cls, spec: object) -> JobTerms:
        """The terms a spec holds under the same field names (JobSpec, ReplaySpec): read in one place."""
        return cls(objective=spec.objective, min_throughput_samples_per_s=spec.min_throughput_samples_per_s,
                   deadline_h=spec.deadline_h, on_demand_gpus=spec.on_demand_gpus)

    @property
    def deadline_s(self) -> float | None:
        return self.deadline_h * 3600.0 if self.deadline_h is not None else None


__all__ = ["JobTerms", "Objective", "TermsError", "objective_term"]
