"""The train-job flow's controller sees the preemptions its job has seen, as the replay's does."""

from __future__ import annotations

import pytest

from sailor_core.job import state as js

from sailor_core.job.spec import JobSpec
from sailor_core.objective import Objective
from tasks.control import controller_state


def test_the_flows_controller_state_carries_the_jobs_preemption_rates():
    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=20), job_id="j1")
    rec = dict(cloud="aws", instance_type="g4dn.xlarge", gpu="T4", num_gpus=1, usd_per_hr=0.5, spot=True,
               attempt=1, launched_unix_s=0.0)
    s = js.with_instances_launched(s, (js.InstanceRecord(instance_id="a", zone="us-east-1a", **rec),
                                       js.InstanceRecord(instance_id="b", zone="us-east-1b", **rec)))
    s = js.with_instances_ended(s, {"a"}, "preempted", now_unix_s=600.0)
    state = controller_state(s, available={("T4", "us-east-1a"): 1, ("T4", "us-east-1b"): 1}, current=None,
                             now_unix_s=7200.0)
    assert state.preemption_rate_per_s == {("T4", "us-east-1a"): pytest.approx(1 / 7200)}


def _job(**spec):
    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=20, **spec), job_id="j2")
    rec = dict(cloud="gcp", instance_type="n1-standard-4-t4", gpu="T4", num_gpus=1, usd_per_hr=0.15, spot=True,
               attempt=1, launched_unix_s=s.created_unix_s)
    s = js.with_instances_launched(s, (js.InstanceRecord(instance_id="a", zone="us-central1-a", **rec),))
    return js.with_instances_ended(s, {"a"}, "preempted", now_unix_s=s.created_unix_s + 20)


def test_the_jobs_deadline_objective_and_floor_reach_the_controller():
    from sailor_core.controller import controller_config
    from tasks.control import flow_costs

    s = _job(objective="cost", deadline_h=2.0, min_throughput_samples_per_s=10.0)
    state = controller_state(s, available={}, current=None, now_unix_s=s.created_unix_s + 1800)
    assert state.time_left_s == pytest.approx(1.5 * 3600)
    config = controller_config("ours", costs=flow_costs(s.spec), shutdown_s=5.0, terms=s.spec.terms)
    assert (config.terms.objective, config.terms.min_throughput_samples_per_s, config.shutdown_s) == \
        (Objective.COST, 10.0, 5.0)
    assert config.ranking.by_cost and config.terms.deadline_h == 2.0
    assert controller_config("ours", costs=flow_costs(s.spec), shutdown_s=5.0).terms.objective is Objective.THROUGHPUT
    no_deadline = _job()
    assert controller_state(no_deadline, available={}, current=None, now_unix_s=0.0).time_left_s == float("inf")


def test_a_short_job_counts_its_preemptions_over_its_own_length():
    # 1 preemption, 40 s in, half done: the job's expected length (80 s) is the rate's window, not an hour.
    s = js.with_progress(_job(), steps_done=10, losses=[], val_losses=[])
    state = controller_state(s, available={}, current=None, now_unix_s=s.created_unix_s + 40)
    assert state.preemption_rate_per_s == {("T4", "us-central1-a"): pytest.approx(1 / 80)}


def test_the_recorded_reason_carries_the_controllers_economics_in_words():
    from sailor_core.controller import Action, Decision, Event, EventKind, PlanOption
    from sailor_core.job import recovery

    option = PlanOption(gpus={("T4", "us-central1-b"): 1}, throughput_samples_per_s=1.0, usd_per_hr=0.15)
    rec = recovery.Recovery(event=Event(kind=EventKind.PREEMPTION), cause="spot preemption took 1 of 1 T4s")
    decision = Decision(action=Action.REPLAN, reason="technical", plan=option,
                        why="left T4 in us-central1-a unused (preempted 45 times an hour)")
    _, reason = recovery.choose(rec, decision)
    assert reason == ("spot preemption took 1 of 1 T4s; re-planned on 1 T4 in us-central1-b; "
                      "left T4 in us-central1-a unused (preempted 45 times an hour)")


def test_a_spot_job_may_rent_each_pool_on_demand_up_to_its_on_demand_gpus():
    from sailor_core.job.spec import JobSpecError
    from tasks.control import on_demand_availability

    avail = {("T4", "us-central1-a"): 2, ("T4", "us-central1-b"): 1}
    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, on_demand_gpus=1), job_id="j3")
    state = controller_state(s, available=avail, current=None, now_unix_s=s.created_unix_s)
    assert state.on_demand_available == {("T4", "us-central1-a"): 1, ("T4", "us-central1-b"): 1}
    assert on_demand_availability(JobSpec(budget_usd=1.0, on_demand_gpus=4), avail) == avail  # within the caps
    assert on_demand_availability(JobSpec(budget_usd=1.0), avail) == {}  # spot only, the default
    with pytest.raises(JobSpecError, match="on_demand_gpus is for spot jobs"):
        JobSpec(budget_usd=1.0, spot=False, on_demand_gpus=1)
    with pytest.raises(JobSpecError, match="on_demand_gpus must be at least 0"):
        JobSpec(budget_usd=1.0, on_demand_gpus=-1)


def test_after_a_preemption_the_flows_controller_moves_the_stormy_pool_on_demand_at_its_instances_price():
    # Two zones of a T4 each; 256 samples a step train fastest on both.  Zone a preempted the job
    # 20 s in: the re-plan keeps b on spot and rents a on demand, priced as the instances (the ledger's).
    from sailor_core.catalog.instances import catalog_offers
    from sailor_core.controller import Action, Event, EventKind
    from tasks import control

    zones = ("us-central1-a", "us-central1-b")
    spec = JobSpec(model="tiny", budget_usd=0.05, steps=30, global_batch_size=256, gpus=("T4",), zones=zones,
                   max_gpus=2, on_demand_gpus=1)
    offers = catalog_offers(gpus=["T4"], zones=list(zones))
    planner = control.job_planner(spec, offers)
    available = control.availability(offers, max_gpus_per_zone=1, max_gpus=2)
    s = js.new_job(spec, job_id="j4")
    first = control.controller_decision(planner, s, available=available, event=Event(kind=EventKind.START),
                                        current=None, shutdown_s=5.0, now_unix_s=s.created_unix_s)
    assert first.plan.gpus == available and not first.plan.on_demand  # calm pools: all spot, within the caps
    rec = dict(cloud="gcp", instance_type="n1-standard-4-t4x1", gpu="T4", num_gpus=1, usd_per_hr=0.15, spot=True,
               attempt=1, launched_unix_s=s.created_unix_s)
    s = js.with_instances_launched(s, tuple(js.InstanceRecord(instance_id=z, zone=z, **rec) for z in zones))
    s = js.with_instances_ended(js.with_progress(s, last_checkpoint_step=5), {zones[0]}, "preempted",
                                now_unix_s=s.created_unix_s + 20)
    d = control.controller_decision(planner, s, available=available, event=Event(kind=EventKind.PREEMPTION),
                                    current=None, shutdown_s=5.0, now_unix_s=s.created_unix_s + 21)
    assert d.action == Action.REPLAN
    assert (d.plan.gpus, d.plan.on_demand) == ({("T4", zones[1]): 1}, {("T4", zones[0]): 1})
    nodes = planner.nodes(d.plan)
    assert sorted((n.zone, n.spot) for n in nodes) == [(zones[0], False), (zones[1], True)]
    by_zone = {o.zone: o for o in offers if o.instance_type == "n1-standard-4-t4x1"}
    assert d.plan.usd_per_hr == pytest.approx(by_zone[zones[0]].on_demand_usd_per_hr
                                              + by_zone[zones[1]].spot_usd_per_hr)


# ---- the flow's costs of change: the job's own checkpoint, handed over in memory (issue 36)

def test_the_flows_costs_carry_a_state_load_sized_by_the_jobs_checkpoint():
    from sailor_core.controller.state_load import checkpoint_bytes_for
    from sailor_core.replay.costs import ChangeCosts
    from sailor_core.controller.economics import CHANGE_COST_S, REJOIN_COST_S
    from tasks.control import flow_costs

    bw = ChangeCosts().storage_bw_bytes_per_s
    small, large = flow_costs(JobSpec(model="tiny", budget_usd=1.0)), flow_costs(JobSpec(model="opt-350m", budget_usd=1.0))
    for costs, model in ((small, "tiny"), (large, "opt-350m")):
        load = costs.state_load
        assert load is not None and load.handover and load.storage_bw_bytes_per_s == bw
        assert load.storage_load_s == pytest.approx(checkpoint_bytes_for(model) / bw)
        # the start-up and the rejoin include the whole reload, which a change's own load replaces
        assert costs.startup_s == pytest.approx(CHANGE_COST_S / 2 + load.storage_load_s)
        assert costs.rejoin_s == pytest.approx(REJOIN_COST_S + load.storage_load_s)
    assert large.state_load.storage_load_s > small.state_load.storage_load_s > 0


class _Options:
    """A planner for ``controller_decision`` that offers fixed options, those that fit."""

    def __init__(self, *options):
        self.options = options
        self.cost_plan_fn = None

    def within(self, caps):
        return self

    def __call__(self, available):
        return [o for o in self.options if o.fits_in(available)]


def test_the_flows_controller_prefers_the_replacement_that_sends_no_state_across_zones():
    """After a preemption, two replacements alike in speed, rent and training egress; one new
    rank sits in the survivor's zone, the other in another zone and must receive its state
    across it.  By cost, the flow's controller now weighs that handover and takes the first."""
    import dataclasses

    from sailor_core.controller import Action, Event, EventKind, PlanOption
    from sailor_core.catalog.layers import layer_shapes
    from sailor_core.controller.economics import change_s, change_usd, outlook
    from sailor_core.plan.types import Plan, Replica, Stage
    from tasks.control import controller_decision, flow_costs

    model, a, b = "opt-350m", ("T4", "us-central1-a"), ("T4", "us-central1-b")
    spec = JobSpec(model=model, objective="cost", budget_usd=1e6, steps=1000, global_batch_size=64)
    num_layers = len(layer_shapes(model, seq_len=1))

    def option(pools):
        plan = Plan(model=model, global_batch_size=64, micro_batch_size=1, stages=(Stage(
            layer_start=0, layer_end=num_layers,
            replicas=tuple(Replica(gpu=g, zone=z, tp_degree=1) for (g, z), n in pools.items() for _ in range(n))),))
        return PlanOption(gpus=pools, throughput_samples_per_s=2.0, usd_per_hr=0.4, plan=plan)

    running, across, within = option({a: 2}), option({a: 1, b: 1}), option({a: 2})
    s = js.new_job(spec, job_id="j-handover")
    event = Event(kind=EventKind.PREEMPTION, lost={a: 1}, zone_hint=a[1])
    available = {a: 2, b: 1}
    costs = flow_costs(spec)
    assert change_usd(across, running=None, costs=costs, holder=running, lost={a: 1}) > 0
    assert change_usd(within, running=None, costs=costs, holder=running, lost={a: 1}) == 0.0

    # without the state's load the two cost the same to the end: the planner's order (``across``
    # first) decided, as it did in the flow before
    plain = dataclasses.replace(costs, state_load=None)
    figures = dict(remaining=1000 * 64, rates={}, shares={}, costs=plain)
    assert outlook(across, change=change_s(across, running=None, held={a: 1}, held_on_demand={}, costs=plain),
                   **figures).cost_usd == \
        outlook(within, change=change_s(within, running=None, held={a: 1}, held_on_demand={}, costs=plain),
                **figures).cost_usd

    decision = controller_decision(_Options(across, within), s, available=available, event=event, current=running,
                                   shutdown_s=5.0, now_unix_s=s.created_unix_s)
    assert decision.action == Action.REPLAN and decision.plan is within
