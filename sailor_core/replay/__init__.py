"""Trace-driven replay: what training costs and how long it takes on capacity that comes and goes."""

from sailor_core.controller.state_load import checkpoint_bytes_for
from sailor_core.replay.costs import ChangeCosts
from sailor_core.replay.result import DecisionRecord, ReplayResult, TimelinePoint, activity_words
from sailor_core.replay.scenario import Goal, Lookahead, Market, ReplayPolicy
from sailor_core.replay.simulation import replay
from sailor_core.controller.policies import POLICIES, POLICY_HELP
from sailor_core.replay.policies import controller_costs, pick_single_type
from sailor_core.replay.prices import PriceSeries, load_price_series
from sailor_core.objective import JobTerms
from sailor_core.replay.run import ReplaySuite, catalog_price_fn, run_policies

__all__ = [
    "POLICIES",
    "POLICY_HELP",
    "ChangeCosts",
    "DecisionRecord",
    "Goal",
    "JobTerms",
    "Lookahead",
    "Market",
    "PriceSeries",
    "ReplayPolicy",
    "ReplayResult",
    "ReplaySuite",
    "TimelinePoint",
    "activity_words",
    "catalog_price_fn",
    "checkpoint_bytes_for",
    "controller_costs",
    "load_price_series",
    "pick_single_type",
    "replay",
    "run_policies",
]
