"""How the controller orders options for each objective over a job's life.

A re-plan weighs each option's outlook (``economics.Outlook``: its expected time and cost to
finish, restarts counted).  ``SOONEST`` ranks by the time, ``CHEAPEST`` by the cost;
``OPTION_RANKINGS`` says which one each objective (``sailor_core.objective``) ranks by, and
``switch_pays`` measures a switch's gain in that figure.  A new objective is a line here,
and a new ranking only for a figure neither ranks by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sailor_core.controller.economics import Outlook, switch_window
from sailor_core.objective import Objective


@dataclass(frozen=True, slots=True, kw_only=True)
class OptionRanking:
    """One order of options: by expected USD to finish (``by_cost``), else by expected time."""

    by_cost: bool

    def key(self, o: Outlook) -> tuple[float, float]:
        return (o.cost_usd, o.time_s) if self.by_cost else (o.time_s, o.cost_usd)

    def asks_cheapest(self, *, deadline: bool) -> bool:
        """Whether the planner's cheapest plans (its cost search) join the options: ranking by
        cost, or by a deadline (the cheapest plans that still make it)."""
        return self.by_cost or deadline


SOONEST = OptionRanking(by_cost=False)
CHEAPEST = OptionRanking(by_cost=True)

OPTION_RANKINGS: dict[Objective, OptionRanking] = {
    Objective.THROUGHPUT: SOONEST,
    Objective.COST: CHEAPEST,
}


def option_ranking(objective: Objective) -> OptionRanking:
    return OPTION_RANKINGS[objective]


def switch_pays(now: Outlook, new: Outlook, *, ranking: OptionRanking, remaining: float, min_gain: float) -> bool:
    """Whether leaving the running plan (``now``) for ``new`` pays within the window it can gain in.

    The window ends at the first forced re-plan either way: the running plan's next hit (expected
    in 1 / H_now; the switch would then come for free), the new plan's next hit (1 / H_new; its
    advantage ends there and a restart follows), or the end of the job: tau = min(time to finish,
    1 / H_now, 1 / H_new).  Over tau, staying trains x_now tau samples at c_now USD/h; switching
    trains x_new (tau - change) at c_new.  Ranking by time the switch must train ``min_gain``
    more; by cost it must cost ``min_gain`` less per sample.  Without preemptions tau is the
    whole job: the plain "finishes sooner (or cheaper) after paying the change".
    """
    tau, _ = switch_window(now, new)
    x_now, x_new = now.option.throughput_samples_per_s, new.option.throughput_samples_per_s
    trained_now = x_now * tau
    trained_new = x_new * max(0.0, tau - new.change_s)
    if trained_new <= 0 or not math.isfinite(trained_new):
        return False
    if ranking.by_cost:
        per_sample_now = now.option.cost_usd_per_hr * tau / trained_now if trained_now > 0 else math.inf
        per_sample_new = new.option.cost_usd_per_hr * tau / trained_new
        return per_sample_new < per_sample_now * (1.0 - min_gain)
    return trained_new > trained_now * (1.0 + min_gain)


__all__ = ["CHEAPEST", "OPTION_RANKINGS", "SOONEST", "OptionRanking", "option_ranking", "switch_pays"]
