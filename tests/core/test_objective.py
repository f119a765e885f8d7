"""An objective is defined once (``sailor_core.objective``) and ranked by one table in the planner
and one in the controller; user spellings are parsed once, with the known ones named."""

from __future__ import annotations

import pytest

from sailor_core.controller.ranking import OPTION_RANKINGS
from sailor_core.errors import InputError
from sailor_core.job.spec import JobSpec, JobSpecError
from sailor_core.objective import JobTerms, Objective
from sailor_core.planner.ranking import PLAN_RANKINGS


def test_every_objective_has_a_planner_and_a_controller_ranking():
    assert set(PLAN_RANKINGS) == set(Objective) == set(OPTION_RANKINGS)
    for objective in Objective:  # a ranking's own objective ranks by it
        assert PLAN_RANKINGS[PLAN_RANKINGS[objective].objective] is PLAN_RANKINGS[objective]


def test_user_spellings_parse_once_and_bad_ones_name_the_known():
    assert Objective.parse(" COST ") is Objective.COST
    with pytest.raises(InputError, match="unknown objective 'speed'; known: throughput, cost"):
        Objective.parse("speed")
    assert JobSpec(budget_usd=1, objective="cost").objective is Objective.COST
    with pytest.raises(JobSpecError, match="objective must be throughput or cost, got 'speed'"):
        JobSpec(budget_usd=1, objective="speed")


def test_the_jobs_terms_are_its_specs_validated_in_one_place():
    spec = JobSpec(budget_usd=1, objective="cost", deadline_h=3.0, min_throughput_samples_per_s=5.0,
                   on_demand_gpus=1)
    assert spec.terms == JobTerms(objective=Objective.COST, deadline_h=3.0, min_throughput_samples_per_s=5.0,
                                  on_demand_gpus=1)
    for field, value in (("deadline_h", 0.0), ("deadline_h", float("inf")), ("min_throughput_samples_per_s", -1.0)):
        with pytest.raises(JobSpecError, match=f"{field} must be a positive number"):
            JobSpec(budget_usd=1, **{field: value})
        with pytest.raises(InputError, match=f"{field} must be a positive number"):
            JobTerms(**{field: value})


def test_each_objective_says_what_it_means_and_the_job_option_lists_them_all():
    from sailor_core.job.spec import JobSpec
    from sailor_core.specs.fields import spec_fields
    from sailor_core.specs.plan import PlanSpec
    from sailor_core.specs.replay import ReplaySpec

    for spec in (JobSpec, PlanSpec, ReplaySpec):
        (field,) = [f for f in spec_fields(spec) if f.name == "objective"]
        for objective in Objective:
            assert objective.meaning and f"{objective.value} ({objective.meaning})" in field.option.help, spec
