"""The controller: pure decisions on capacity changes and the cost ledger that bounds them.

Used by both the train-job flow (real clouds) and the replay (simulated time).
"""

from sailor_core.controller.ledger import CostLedger, LedgerEntry
from sailor_core.controller.options import (
    CachedPlanner,
    PlanFn,
    PlannerPlanFn,
    PlanOption,
    PlanPricing,
    describe_gpus,
    gpus_of_plan,
    plan_option,
    planner_plan_fn,
    restrict,
)
from sailor_core.controller.policy import (
    STRATEGIES,
    Action,
    ControllerConfig,
    ControllerState,
    Decision,
    Event,
    EventKind,
    decide,
    observed_preemption_rates_per_s,
)

__all__ = [
    "STRATEGIES",
    "Action",
    "CachedPlanner",
    "ControllerConfig",
    "ControllerState",
    "CostLedger",
    "Decision",
    "Event",
    "EventKind",
    "LedgerEntry",
    "PlanFn",
    "PlanOption",
    "PlanPricing",
    "PlannerPlanFn",
    "decide",
    "describe_gpus",
    "gpus_of_plan",
    "observed_preemption_rates_per_s",
    "plan_option",
    "planner_plan_fn",
    "restrict",
]
