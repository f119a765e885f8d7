"""The train-job flow's controller on a budget too small for the fastest plans, and plans the
instances offered cannot hold (issue 22): the same decision as the replay's, on catalog offers."""

from __future__ import annotations

import dataclasses

from sailor_core.catalog.instances import catalog_offers
from sailor_core.controller import Action, Event, EventKind, controller_config, planner_plan_fn
from sailor_core.planner.request import PlanQuery, SearchSettings
from sailor_core.controller.economics import change_s, outlook
from sailor_core.errors import InfeasibleError
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec
from tasks import control

ZONES = ("us-central1-a", "us-central1-b")
SPEC = JobSpec(model="opt-350m", budget_usd=1e6, steps=2000, global_batch_size=64, gpus=("T4",), zones=ZONES,
               max_gpus=16)


def _expected_usd(option, spec: JobSpec) -> float:
    config = controller_config("ours", costs=control.flow_costs(spec), shutdown_s=5.0, terms=spec.terms)
    change = change_s(option, running=None, held={}, held_on_demand={}, costs=config.costs)
    o = outlook(option, remaining=spec.steps * spec.global_batch_size, change=change, rates={}, shares={},
                costs=config.costs)
    return option.usd_per_hr * (o.time_s + config.shutdown_s) / 3600


def _start(spec: JobSpec, offers, available):
    s = js.new_job(spec, job_id="jb")
    return control.controller_decision(control.job_planner(spec, offers), s, available=available,
                                       event=Event(kind=EventKind.START), current=None, shutdown_s=5.0,
                                       now_unix_s=s.created_unix_s)


def test_a_budget_below_the_fastest_plans_cost_starts_the_fastest_plan_within_it():
    offers = catalog_offers(gpus=["T4"], zones=list(ZONES))
    available = control.availability(offers, max_gpus_per_zone=8, max_gpus=16)
    planner = control.job_planner(SPEC, offers)
    fastest, cheapest = planner(available)[0], planner.cost_plan_fn(available, None)[0]
    low, high = _expected_usd(cheapest, SPEC), _expected_usd(fastest, SPEC)
    assert low < high
    spec = dataclasses.replace(SPEC, budget_usd=(low + high) / 2)
    d = _start(spec, offers, available)
    assert d.action == Action.REPLAN and "no plan finishes within the budget" not in d.reason
    assert _expected_usd(d.plan, spec) <= spec.budget_usd
    assert cheapest.throughput_samples_per_s < d.plan.throughput_samples_per_s < fastest.throughput_samples_per_s


def test_tp_groups_stay_within_the_nodes_offered():
    # GCP sells T4s four to a node: no TP 8 there, though the GPU type allows 8 elsewhere.
    gcp = catalog_offers(gpus=["T4"], zones=list(ZONES))
    assert control.max_tp_degree(gcp) == 4
    assert control.max_tp_degree(catalog_offers(gpus=["T4"], zones=["us-east-1a"])) == 8
    available = control.availability(gcp, max_gpus_per_zone=8, max_gpus=16)
    options = control.job_planner(SPEC, gcp)(available)
    assert options and all(r.tp_degree <= 4 for o in options for st in o.plan.stages for r in st.replicas)


def test_a_candidate_the_instances_cannot_hold_is_left_out_not_fatal():
    heard = []

    def pricing(plan):  # as OfferPricing does for a TP group wider than any node of its zone
        if any(r.tp_degree > 1 for st in plan.stages for r in st.replicas):
            raise InfeasibleError("no instance type in us-central1-a has 2 T4 GPUs on one node")
        return 0.35 * sum(r.tp_degree for st in plan.stages for r in st.replicas)

    fn = planner_plan_fn(PlanQuery(model="opt-350m", global_batch_size=64, search=SearchSettings(top_n=10)),
                         pricing=pricing, on_infeasible=heard.append)
    options = fn({("T4", "us-central1-a"): 8})
    assert options and all(r.tp_degree == 1 for o in options for st in o.plan.stages for r in st.replicas)
    assert heard and all("on one node" in str(e) for e in heard)
