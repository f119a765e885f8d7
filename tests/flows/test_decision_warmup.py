"""The controller's decisions after the preemptions that may come next, made while an attempt
trains (``tasks.control.DecisionWarmup``): the decision after a real one then needs no planner
search, and it is the decision a planner that never warmed up makes."""

from __future__ import annotations

import dataclasses
import time

from sailor_core.catalog.instances import catalog_offers
from sailor_core.job import recovery
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec
from sailor_core.controller import Action, Event, EventKind
from tasks import control

ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")
SPEC = JobSpec(model="tiny", budget_usd=1.0, steps=100, global_batch_size=1024, gpus=("T4",), zones=ZONES,
               max_gpus=3)


def _running(planner, available) -> tuple[js.JobState, control.PlanOption]:
    """A job training on the controller's first plan, one spot instance per node."""
    now = time.time()
    first = control.controller_decision(planner, js.JobState(job_id="tiny-warm", spec=SPEC), available=available,
                                        event=Event(kind=EventKind.START), current=None, shutdown_s=120.0,
                                        now_unix_s=now)
    assert first.action == Action.REPLAN and first.plan is not None
    state = recovery.start_attempt(js.JobState(job_id="tiny-warm", spec=SPEC, created_unix_s=now - 60),
                                   first.plan, "planned")
    records = tuple(js.InstanceRecord(instance_id=f"i-{k}", cloud="gcp", zone=node.zone, instance_type="n1-standard-4",
                                      gpu=node.gpu, num_gpus=len(node.ranks), usd_per_hr=node.usd_per_hr, spot=True,
                                      attempt=1, launched_unix_s=now - 60)
                    for k, node in enumerate(planner.nodes(first.plan)))
    return js.with_instances_launched(state, records), first.plan


def test_a_preemption_after_the_warmup_is_decided_without_a_search_and_as_without_it():
    offers = catalog_offers(gpus=["T4"], zones=list(ZONES))
    available = control.availability(offers, max_gpus_per_zone=1, max_gpus=SPEC.max_gpus)
    planner = control.job_planner(SPEC, offers)
    state, option = _running(planner, available)
    assert len(state.instances) == 3
    searched = planner.cached.num_calls
    control.DecisionWarmup(planner, state, instance_ids=[i.instance_id for i in state.instances], available=available,
                           current=option, shutdown_s=120.0).start().wait()
    assert planner.cached.num_calls > searched  # the survivors' pools were searched ahead

    warmed = planner.cached.num_calls
    for victim in state.instances:
        after = js.with_instances_ended(state, {victim.instance_id}, "preempted")
        event = recovery.preemption_event(after, [victim.instance_id])
        decision = control.controller_decision(planner, after, available=available, event=event, current=option,
                                               shutdown_s=120.0, now_unix_s=time.time())
        cold_planner = control.job_planner(SPEC, offers)
        cold = control.controller_decision(cold_planner, after, available=available, event=event, current=option,
                                           shutdown_s=120.0, now_unix_s=time.time())
        assert planner.cached.num_calls == warmed, f"a search after {victim.zone}'s preemption"
        assert cold_planner.cached.num_calls > 0
        assert decision.action == cold.action and decision.plan is not None
        assert decision.plan.plan.to_dict() == cold.plan.plan.to_dict()


def test_nothing_is_warmed_without_a_planner_or_spot_instances():
    offers = catalog_offers(gpus=["T4"], zones=list(ZONES))
    available = control.availability(offers, max_gpus_per_zone=1, max_gpus=SPEC.max_gpus)
    planner = control.job_planner(SPEC, offers)
    state, option = _running(planner, available)
    on_demand = dataclasses.replace(state, instances=tuple(dataclasses.replace(r, spot=False)
                                                           for r in state.instances))
    searched = planner.cached.num_calls
    control.DecisionWarmup(planner, on_demand, instance_ids=[i.instance_id for i in state.instances],
                           available=available, current=option, shutdown_s=120.0).start().wait()
    control.DecisionWarmup(None, state, instance_ids=[i.instance_id for i in state.instances],
                           available=available, current=option, shutdown_s=120.0).start().wait()
    assert planner.cached.num_calls == searched
