"""The controller's one way to the planner: ``planner_plan_fn`` (the replay, its workers and the flows)."""

from __future__ import annotations

import dataclasses

from sailor_core.controller import planner_plan_fn
from sailor_core.plan.types import plan_from_dict
from sailor_core.planner.request import PlanQuery, SearchSettings

AVAILABLE = {("T4", "us-central1-a"): 4}
QUERY = PlanQuery(model="tiny", global_batch_size=8, search=SearchSettings(max_evaluations=50, top_n=2))


def test_options_are_the_planners_candidates_priced_as_it_prices_them_and_its_result_is_kept():
    plan_fn = planner_plan_fn(QUERY)
    options = plan_fn(AVAILABLE)
    candidates = plan_fn.last_result.candidates
    assert options and len(options) == len(candidates)
    for option, c in zip(options, candidates):
        assert option.plan == c.plan
        assert option.throughput_samples_per_s == c.sim.throughput_samples_per_s
        assert option.usd_per_hr == c.sim.usd_per_hour
        assert sum(option.gpus.values()) == c.plan.num_gpus


def test_a_pricing_prices_every_option_and_leaves_the_ranking_to_the_planner():
    plain = planner_plan_fn(QUERY)(AVAILABLE)
    priced = planner_plan_fn(QUERY, pricing=lambda plan: 100.0 + plan.num_gpus)(AVAILABLE)
    assert [o.plan for o in priced] == [o.plan for o in plain]
    assert [o.usd_per_hr for o in priced] == [100.0 + o.plan.num_gpus for o in plain]


def test_an_infeasible_request_answers_nothing_and_says_why():
    heard = []
    plan_fn = planner_plan_fn(dataclasses.replace(QUERY, min_throughput_samples_per_s=1e12), on_infeasible=heard.append)
    assert plan_fn(AVAILABLE) == []
    assert plan_fn.last_result is None
    assert len(heard) == 1 and str(heard[0])


def test_nothing_available_is_no_search():
    plan_fn = planner_plan_fn(PlanQuery(model="no-such-model"))
    assert plan_fn({("T4", "us-central1-a"): 0}) == []


def test_a_replan_where_nothing_fits_without_memory_levers_keeps_them_in_its_plan():
    # issue 34: the controller's re-plans search the levers as `sailor plan` does (SearchSettings'
    # memory_levers), and the option's plan carries them to the workers through the plan file.
    query = PlanQuery(model="llama-3-8b", global_batch_size=64, search=SearchSettings(top_n=1))
    options = planner_plan_fn(query)({("V100-16", "us-central1-a"): 32})
    assert options
    plan = options[0].plan
    assert any(s.recompute != "none" or s.zero_stage for s in plan.stages)
    assert plan_from_dict(plan.to_dict()) == plan
    off = dataclasses.replace(query, search=SearchSettings(top_n=1, memory_levers="off"))
    assert planner_plan_fn(off)({("V100-16", "us-central1-a"): 32}) == []
