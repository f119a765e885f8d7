"""A budget that cannot pay for the fastest plans (issue 22): the controller asks the planner's
cheapest plans for the fastest that finishes within it, rather than spend the budget on a plan
that stops before the end; it asks only when no fast plan fits, and a bounded number of times."""

import math

import pytest

from sailor_core.objective import JobTerms, Objective
from sailor_core.controller import Action, ControllerConfig, ControllerState, Event, EventKind, PlanOption, decide
from sailor_core.controller.economics import change_s, outlook

POOL = ("V100-16", "us-east-1a")
MAX_GPUS = 64
SAMPLES = 2_000_000
START = Event(kind=EventKind.START)
CONFIG = ControllerConfig(terms=JobTerms(objective=Objective.THROUGHPUT))


def plan(n: int) -> PlanOption:
    # Sub-linear scaling at 1 USD/h per GPU: the larger the plan, the more a sample costs.
    return PlanOption(gpus={POOL: n}, throughput_samples_per_s=10.0 * n ** 0.8, usd_per_hr=float(n), label=f"{n} GPUs")


def fastest_only(available):
    return [plan(available[POOL])]


class CheapestAbove:
    """The planner's cost search on this family: the fewest GPUs above the floor."""

    def __init__(self) -> None:
        self.floors: list[float | None] = []

    def __call__(self, available, floor=None):
        self.floors.append(floor)
        need = 1 if floor is None else math.ceil((floor / 10.0) ** (1 / 0.8) - 1e-9)
        return [plan(need)] if need <= available[POOL] else []


def expected_usd(option: PlanOption, config: ControllerConfig = CONFIG) -> float:
    """What the controller expects ``option`` to cost to finish from the start, shutdown included."""
    change = change_s(option, running=None, held={}, held_on_demand={}, costs=config.costs)
    o = outlook(option, remaining=SAMPLES, change=change, rates={}, shares={}, costs=config.costs)
    return option.usd_per_hr * (o.time_s + config.shutdown_s) / 3600


def state(budget_usd: float) -> ControllerState:
    return ControllerState(plan=None, available={POOL: MAX_GPUS}, samples_target=SAMPLES, budget_left_usd=budget_usd)


@pytest.mark.parametrize("largest_affordable", [3, 12, 40])
def test_the_fastest_plan_within_the_budget_runs_when_the_fast_plans_do_not_fit(largest_affordable):
    budget = (expected_usd(plan(largest_affordable)) + expected_usd(plan(largest_affordable + 1))) / 2
    cheap = CheapestAbove()
    d = decide(state(budget), START, config=CONFIG, plan_fn=fastest_only, cost_plan_fn=cheap)
    assert d.action == Action.REPLAN
    n = d.plan.gpus[POOL]
    assert expected_usd(d.plan) <= budget  # it finishes within the budget
    # the fastest that does, to the floors' grid (8 per doubling of throughput)
    best = plan(largest_affordable).throughput_samples_per_s
    assert best / 2 ** (1 / 8) <= d.plan.throughput_samples_per_s <= best and n <= largest_affordable
    assert 2 <= len(cheap.floors) <= 7 and cheap.floors[0] is None  # the cheapest first, then a bisection
    # the reason says why the fastest plan does not run
    assert f"the fastest plan ({MAX_GPUS} GPUs" in d.reason and "would overrun" in d.reason
    assert "so the fastest one within the budget runs" in d.why


def test_without_the_cost_search_the_budget_buys_a_plan_that_stops_short():
    budget = expected_usd(plan(12))
    d = decide(state(budget), START, config=CONFIG, plan_fn=fastest_only)
    assert d.plan.gpus[POOL] == MAX_GPUS and "no plan finishes within the budget" in d.reason


def test_the_cost_search_is_not_asked_while_a_fast_plan_fits_or_none_could():
    cheap = CheapestAbove()
    d = decide(state(10 * expected_usd(plan(MAX_GPUS))), START, config=CONFIG, plan_fn=fastest_only,
               cost_plan_fn=cheap)
    assert d.plan.gpus[POOL] == MAX_GPUS and cheap.floors == []
    # Below the cheapest plan's cost: one search, then the plan training the most per USD.
    d = decide(state(0.5 * expected_usd(plan(1))), START, config=CONFIG, plan_fn=fastest_only, cost_plan_fn=cheap)
    assert cheap.floors == [None] and d.plan.gpus[POOL] == 1


def test_a_running_plan_that_no_longer_fits_the_budget_shrinks_to_one_that_does():
    running = plan(MAX_GPUS)
    s = ControllerState(plan=running, available={POOL: MAX_GPUS}, samples_target=SAMPLES,
                        budget_left_usd=expected_usd(plan(8)), planned_on={POOL: MAX_GPUS})
    d = decide(s, Event(kind=EventKind.TIMER), config=CONFIG, plan_fn=fastest_only, cost_plan_fn=CheapestAbove())
    assert d.action == Action.SHRINK and d.plan.gpus[POOL] <= 8 and "budget" in d.reason
