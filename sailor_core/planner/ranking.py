"""How the planner orders plans for each objective: by one figure, samples/s or USD/iteration.

The planner's searches (their bounds, orders and pruning) know two rankings: ``FASTEST``
(most samples/s within the caps) and ``CHEAPEST`` (least USD/iteration above the floor).
``PLAN_RANKINGS`` says which one each objective (``sailor_core.objective``) searches by:
a new objective is a line here, and a new ranking only for a figure neither ranks by.
"""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.objective import Objective


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRanking:
    """One order of plans: by USD per iteration (``by_cost``), else by samples/s; the least score first."""

    by_cost: bool
    objective: Objective  # what a search by this ranking alone asks (explaining an empty answer, ...)

    def score(self, *, throughput_samples_per_s: float, usd_per_iteration: float) -> float:
        return usd_per_iteration if self.by_cost else -throughput_samples_per_s

    @property
    def other(self) -> PlanRanking:
        """The ranking by the other figure (a search that misses one's limits tries the other)."""
        return FASTEST if self.by_cost else CHEAPEST


FASTEST = PlanRanking(by_cost=False, objective=Objective.THROUGHPUT)
CHEAPEST = PlanRanking(by_cost=True, objective=Objective.COST)

PLAN_RANKINGS: dict[Objective, PlanRanking] = {
    Objective.THROUGHPUT: FASTEST,
    Objective.COST: CHEAPEST,
}

__all__ = ["CHEAPEST", "FASTEST", "PLAN_RANKINGS", "PlanRanking"]
