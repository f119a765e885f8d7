"""The controller: pure decisions on capacity changes and the cost ledger that bounds them.

Used by both the train-job flow (real clouds) and the replay (simulated time).
"""

from sailor_core.controller.ledger import CostLedger, LedgerEntry
from sailor_core.controller.options import (
    CachedPlanner,
    CheapestPlanner,
    CostPlanFn,
    PlanFn,
    PlannerPlanFn,
    PlanOption,
    PlanPricing,
    describe_gpus,
    gpus_of_plan,
    on_demand_of_plan,
    plan_option,
    planner_plan_fn,
    restrict,
    with_on_demand,
)
from sailor_core.controller.economics import Costs, Outlook
from sailor_core.controller.policy import decide
from sailor_core.controller.policies import POLICIES, POLICY_HELP, controller_config
from sailor_core.controller.ranking import OPTION_RANKINGS, OptionRanking, option_ranking
from sailor_core.controller.state import (
    RATE_WINDOW_S,
    STRATEGIES,
    Action,
    ControllerConfig,
    ControllerState,
    Decision,
    Event,
    EventKind,
    observed_preemption_rates_per_s,
    rate_window_s,
)

__all__ = [
    "OPTION_RANKINGS",
    "POLICIES",
    "POLICY_HELP",
    "RATE_WINDOW_S",
    "STRATEGIES",
    "Action",
    "CachedPlanner",
    "CheapestPlanner",
    "CostPlanFn",
    "ControllerConfig",
    "ControllerState",
    "Costs",
    "CostLedger",
    "Decision",
    "Event",
    "EventKind",
    "LedgerEntry",
    "OptionRanking",
    "Outlook",
    "PlanFn",
    "PlanOption",
    "PlanPricing",
    "PlannerPlanFn",
    "controller_config",
    "decide",
    "describe_gpus",
    "gpus_of_plan",
    "on_demand_of_plan",
    "option_ranking",
    "observed_preemption_rates_per_s",
    "plan_option",
    "planner_plan_fn",
    "rate_window_s",
    "restrict",
    "with_on_demand",
]
