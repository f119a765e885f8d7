"""The controller's economics: expected time and cost to finish under preemptions, the job's
objective and constraints, the hysteresis of voluntary switches, stormy pools left unused, and
mixed spot / on-demand plans."""

import dataclasses
import math

import pytest

from sailor_core.objective import JobTerms, Objective
from sailor_core.controller import (
    Action,
    ControllerConfig,
    ControllerState,
    Costs,
    Event,
    EventKind,
    PlanOption,
    decide,
    with_on_demand,
)
from sailor_core.controller.economics import (
    change_s,
    hits_per_s,
    outlook,
    regrow_shortfall,
    share_per_hit,
)
from sailor_core.controller.ranking import SOONEST, switch_pays
from sailor_core.controller.reasons import why_words

from tests.controller.planners import linear_option, linear_planner

A, B, C = "us-central1-a", "us-central1-b", "us-east1-b"
START = Event(kind=EventKind.START)
CAP = Event(kind=EventKind.CAPACITY)
COSTS = Costs(save_s=10, provisioning_s=90, startup_s=60, work_lost_s=0)


CHEAPEST_TERMS = JobTerms(objective=Objective.COST)


def run(state, event=START, plan_fn=linear_planner, cost_plan_fn=None, objective=Objective.THROUGHPUT,
        min_throughput_samples_per_s=None, **cfg):
    terms = JobTerms(objective=objective, min_throughput_samples_per_s=min_throughput_samples_per_s)
    return decide(state, event, config=ControllerConfig(terms=terms, **cfg), plan_fn=plan_fn,
                  cost_plan_fn=cost_plan_fn)


# ---- the model --------------------------------------------------------------------


def test_hits_count_the_share_of_a_pool_an_event_takes():
    o = linear_option({("V100-16", A): 4, ("T4", B): 2})
    rates = {("V100-16", A): 6 / 3600, ("T4", B): 2 / 3600}
    # Every event hits when the share is unknown; an event taking 1/16 of a pool hits 4 GPUs of it 1/4 of the time.
    assert hits_per_s(o, rates=rates, shares={}) == pytest.approx(8 / 3600)
    assert hits_per_s(o, rates=rates, shares={("V100-16", A): 1 / 16}) == pytest.approx((6 / 4 + 2) / 3600)
    # On-demand GPUs are never taken.
    import dataclasses

    mixed = with_on_demand(dataclasses.replace(o, on_demand_premium_usd_per_hr={("V100-16", A): 2.0}),
                           {("V100-16", A): 4})
    assert mixed.usd_per_hr == pytest.approx(o.usd_per_hr + 8.0) and mixed.label.endswith("on demand 4xV100-16@us-central1-a")
    assert hits_per_s(mixed, rates=rates, shares={}) == pytest.approx(2 / 3600)


def test_change_pays_save_provisioning_and_startup_only_where_needed():
    running = linear_option({("V100-16", A): 4})
    smaller = linear_option({("V100-16", A): 2})
    bigger = linear_option({("V100-16", A): 8})
    held = running.gpus
    assert change_s(running, running=running, held=held, held_on_demand={}, costs=COSTS) == 0
    assert change_s(smaller, running=running, held=held, held_on_demand={}, costs=COSTS) == 10 + 60
    assert change_s(bigger, running=running, held=held, held_on_demand={}, costs=COSTS) == 10 + 90 + 60
    # After a preemption nothing runs: no save; what survived needs no provisioning.
    assert change_s(smaller, running=None, held={("V100-16", A): 2}, held_on_demand={}, costs=COSTS) == 60
    # With parked workers, a change onto GPUs all held is their rejoin, not a start-up.
    parked = dataclasses.replace(COSTS, rejoin_s=15)
    assert change_s(smaller, running=running, held=held, held_on_demand={}, costs=parked) == 10 + 15
    assert change_s(smaller, running=None, held={("V100-16", A): 2}, held_on_demand={}, costs=parked) == 15
    assert change_s(bigger, running=running, held=held, held_on_demand={}, costs=parked) == 10 + 90 + 60


def test_effective_throughput_and_the_time_and_cost_to_finish():
    o = linear_option({("V100-16", A): 10})  # 40 samples/s, 8 USD/h
    rates = {("V100-16", A): 10 / 3600}     # 10 hits an hour, 150 s each: 5/12 of the time restarting
    out = outlook(o, remaining=40 * 3600, change=150, rates=rates, shares={}, costs=COSTS)
    assert out.effective_samples_per_s == pytest.approx(40 / (1 + 10 / 3600 * 150))
    assert out.time_s == pytest.approx(150 + 3600 * (1 + 10 / 3600 * 150))
    assert out.cost_usd == pytest.approx(8 * out.time_s / 3600)
    assert out.useful_fraction == pytest.approx(1 / (1 + 10 / 3600 * 150))


def test_a_switch_must_pay_before_the_next_preemption_would_force_a_replan():
    now = outlook(linear_option({("V100-16", A): 10}), remaining=1e7, change=0,
                  rates={("V100-16", A): 12 / 3600}, shares={}, costs=COSTS)
    new = outlook(linear_option({("V100-16", A): 12}), remaining=1e7, change=160,
                  rates={("V100-16", A): 12 / 3600}, shares={}, costs=COSTS)
    # 20 % faster, but the next hit comes in 5 min: 160 s of the 300 s are lost to the switch.
    assert new.time_s < now.time_s
    assert not switch_pays(now, new, ranking=SOONEST, remaining=1e7, min_gain=0.05)
    calm_now = outlook(now.option, remaining=1e7, change=0, rates={}, shares={}, costs=COSTS)
    calm_new = outlook(new.option, remaining=1e7, change=160, rates={}, shares={}, costs=COSTS)
    assert switch_pays(calm_now, calm_new, ranking=SOONEST, remaining=1e7, min_gain=0.05)


# ---- the objective, the constraints ------------------------------------------------


FAST = PlanOption(gpus={("A100-40", A): 8}, throughput_samples_per_s=100, usd_per_hr=12, label="fast")
CHEAP = PlanOption(gpus={("V100-16", A): 8}, throughput_samples_per_s=50, usd_per_hr=4, label="cheap")
AVAIL = {("A100-40", A): 8, ("V100-16", A): 8}


def both(_avail):
    return [FAST, CHEAP]


def test_the_objective_picks_the_fastest_or_the_cheapest_to_finish():
    state = ControllerState(plan=None, available=AVAIL, samples_target=720_000)
    assert run(state, plan_fn=both).plan is FAST
    d = run(state, plan_fn=both, objective=Objective.COST)
    assert d.plan is CHEAP and "USD to finish" in d.reason


def test_the_deadline_picks_the_cheapest_plan_that_finishes_in_time():
    # 720000 samples: FAST takes 2 h (24 USD), CHEAP 4 h (16 USD), each plus a 150 s start.
    state = ControllerState(plan=None, available=AVAIL, samples_target=720_000, time_left_s=5 * 3600)
    assert run(state, plan_fn=both, objective=Objective.COST).plan is CHEAP
    tight = ControllerState(plan=None, available=AVAIL, samples_target=720_000, time_left_s=3 * 3600)
    assert run(tight, plan_fn=both, objective=Objective.COST).plan is FAST
    # None meets it: the fastest runs, and the reason says so.
    hopeless = ControllerState(plan=None, available=AVAIL, samples_target=720_000, time_left_s=3600)
    d = run(hopeless, plan_fn=both, objective=Objective.COST)
    assert d.plan is FAST and "deadline" in d.reason


def test_a_running_plan_that_will_miss_the_deadline_gives_way():
    state = ControllerState(plan=CHEAP, available=AVAIL, samples_target=720_000, time_left_s=3 * 3600,
                            planned_on=AVAIL)
    d = run(state, CAP, plan_fn=both, objective=Objective.COST)
    assert d.action == Action.REPLAN and d.plan is FAST and d.reason.startswith("deadline")


def test_the_floor_counts_restarts():
    stormy = {("V100-16", A): 30 / 3600}  # CHEAP trains 50 / (1 + 30/3600 * 300) = 14.3 samples/s
    state = ControllerState(plan=None, available=AVAIL, samples_target=720_000, preemption_rate_per_s=stormy)
    assert run(state, plan_fn=both, objective=Objective.COST, min_throughput_samples_per_s=40).plan is FAST
    calm = ControllerState(plan=None, available=AVAIL, samples_target=720_000)
    assert run(calm, plan_fn=both, objective=Objective.COST, min_throughput_samples_per_s=40).plan is CHEAP


def test_cheap_plans_join_the_options_with_the_cost_objective_or_a_deadline():
    floors = []

    def cheapest(_avail, floor):
        floors.append(floor)
        return [o for o in (CHEAP, FAST) if floor is None or o.throughput_samples_per_s >= floor]

    state = ControllerState(plan=None, available=AVAIL, samples_target=720_000)
    fast_only = lambda _a: [FAST]  # noqa: E731
    assert run(state, plan_fn=fast_only, cost_plan_fn=cheapest).plan is FAST and floors == []  # not asked
    assert run(state, plan_fn=fast_only, cost_plan_fn=cheapest, objective=Objective.COST).plan is CHEAP
    assert floors == [None]
    # A deadline asks for the cheapest plans fast enough to make it: 720000 samples in the 5 h left
    # after a 300 s change need 40 samples/s, between 2 ** (42 / 8) and 2 ** (43 / 8) on the floors' grid.
    in_time = ControllerState(plan=None, available=AVAIL, samples_target=720_000, time_left_s=5 * 3600 + 300)
    assert run(in_time, plan_fn=fast_only, cost_plan_fn=cheapest, objective=Objective.COST).plan is CHEAP
    assert floors[-2:] == [pytest.approx(2 ** (42 / 8)), pytest.approx(2 ** (43 / 8))]


# ---- stability ---------------------------------------------------------------------


def test_a_stormy_pool_is_left_unused_and_the_reason_says_so():
    avail = {("A100-40", A): 4, ("A100-40", B): 4}   # 80 samples/s together, 40 each
    rates = {("A100-40", B): 40 / 3600}              # B loses a node every 90 s
    state = ControllerState(plan=None, available=avail, samples_target=1e7, preemption_rate_per_s=rates)
    d = run(state, plan_fn=lambda a: [linear_option(a)])  # a planner that always uses everything offered
    assert d.plan.gpus == {("A100-40", A): 4}
    assert "leaves unused A100-40@us-central1-b (40.0 preemptions/h)" in d.reason


def test_growth_that_does_not_pay_before_the_next_hit_is_declined_with_a_reason():
    cur = linear_option({("V100-16", A): 10})
    more = {("V100-16", A): 12}
    rates = {("V100-16", A): 12 / 3600}
    state = ControllerState(plan=cur, available=more, samples_target=1e7, preemption_rate_per_s=rates,
                            planned_on={("V100-16", A): 10})
    d = run(state, CAP)
    assert d.action == Action.CONTINUE and d.declined is not None and d.declined.num_gpus == 12
    assert d.reason.startswith("declined 12xV100-16@us-central1-a") and "next preemption, expected then" in d.reason
    calm = ControllerState(plan=cur, available=more, samples_target=1e7, planned_on={("V100-16", A): 10})
    assert run(calm, CAP).action == Action.REPLAN


def test_with_a_deadline_each_pool_alone_joins_the_options():
    avail = {("A100-40", A): 4, ("A100-40", B): 4}
    state = ControllerState(plan=None, available=avail, samples_target=1e6, time_left_s=1e6 / 40 + 1000)
    everything = lambda a: [linear_option(a)]  # noqa: E731 - a planner that never offers less
    # B alone (40/s, its zone 10 % cheaper) makes the deadline for less than both pools together.
    d = run(state, plan_fn=everything, cost_plan_fn=lambda a, floor: [], objective=Objective.COST)
    assert d.plan.gpus == {("A100-40", B): 4}
    assert run(dataclasses.replace(state, time_left_s=math.inf), plan_fn=everything).plan.gpus == avail


def test_a_hit_that_leaves_survivors_costs_what_the_interim_leaves_idle():
    pool = ("V100-16", A)
    rates, shares = {pool: 8 / 3600}, {pool: 1 / 16}   # each event takes 1 of the pool's 16
    option = linear_option({pool: 16})
    assert share_per_hit(option, rates=rates, shares=shares) == pytest.approx(1 / 16)
    assert share_per_hit(option, rates={}, shares={}) == 1.0
    parked = dataclasses.replace(COSTS, rejoin_s=10)
    # The 15 survivors rejoin (10 s), train through the provisioning (a sixteenth of it idle),
    # save (10 s) and start with the replacement (60 s): 85.625 s, not 150.
    assert parked.hit_s_at(1 / 16) == pytest.approx(10 + 10 + 90 / 16 + 60)
    assert parked.hit_s_at(1.0) == COSTS.hit_s == 150       # nothing survives: the plain restart
    assert COSTS.hit_s_at(1 / 16) == 150                     # no parked workers: no interim
    o = outlook(option, remaining=1e6, change=0, rates=rates, shares=shares, costs=parked)
    assert o.hit_s == pytest.approx(85.625)
    assert o.effective_samples_per_s == pytest.approx(64 / (1 + 8 / 3600 * 85.625))


def test_replacements_pay_once_the_plan_on_what_is_held_falls_short_by_the_order_quantity():
    pool = ("V100-16", A)
    rates, shares = {pool: 8 / 3600}, {pool: 1 / 16}   # an event every 7.5 min takes 1 of the pool's 16
    new = outlook(linear_option({pool: 16}), remaining=1e6, change=150, rates=rates, shares=shares, costs=COSTS)
    held = outlook(linear_option({pool: 15}), remaining=1e6, change=60, rates=rates, shares=shares, costs=COSTS)
    # P = 90 s of provisioning, H = 8/h hits, q = 1/16 of the plan per hit: sqrt(2 P q H).
    assert regrow_shortfall(new, held, rates=rates, shares=shares) == pytest.approx(math.sqrt(2 * 90 / 16 * 8 / 3600))
    assert regrow_shortfall(new, held, rates={}, shares={}) == 0.0  # calm: rent at once
    assert regrow_shortfall(new, dataclasses.replace(held, change_s=150), rates=rates, shares=shares) == 0.0


def test_after_a_preemption_the_job_restarts_on_the_gpus_held_until_new_instances_pay():
    pool = ("V100-16", A)
    rates, shares = {pool: 8 / 3600}, {pool: 1 / 16}
    hit = Event(kind=EventKind.PREEMPTION, lost={pool: 1})

    def after_hit(gpus, rates=rates):
        state = ControllerState(plan=linear_option({pool: gpus}), available={pool: 16}, samples_target=1e7,
                                preemption_rate_per_s=rates, preemption_share=shares)
        return decide(state, hit, config=ControllerConfig(**COSTS_CFG), plan_fn=linear_planner)

    d = after_hit(16)   # 15 held, 1/16 short: under sqrt(2 P q H) = 16 %, no new instance
    assert d.action == Action.REPLAN and d.plan.gpus == {pool: 15}
    assert "not renting 1xV100-16@us-central1-a" in d.reason and "new instances pay from 16%" in d.reason
    assert "restarted on the GPUs still held rather than wait for 1xV100-16@us-central1-a" in d.why
    d = after_hit(12)   # 11 held, 31 % short: the replacements pay
    assert d.plan.gpus == {pool: 16} and "not renting" not in d.reason
    assert after_hit(16, rates={}).plan.gpus == {pool: 16}  # no storms seen: replaced at once
    # Finishing cheapest, the ranking's choice runs: waiting for a shortfall would shrink the job away.
    state = ControllerState(plan=linear_option({pool: 16}), available={pool: 16}, samples_target=1e7,
                            preemption_rate_per_s=rates, preemption_share=shares)
    d = decide(state, hit, config=ControllerConfig(**COSTS_CFG, terms=CHEAPEST_TERMS),
               plan_fn=linear_planner)
    assert "not renting" not in d.reason
    # By a deadline the 15 held still make (in 100 h), replacements wait for the shortfall as
    # finishing soonest: the deadline keeps the job from shrinking away.
    by_deadline = dataclasses.replace(state, time_left_s=100 * 3600.0)
    d = decide(by_deadline, hit, config=ControllerConfig(**COSTS_CFG, terms=CHEAPEST_TERMS),
               plan_fn=linear_planner)
    assert d.plan.gpus == {pool: 15} and "not renting 1xV100-16@us-central1-a" in d.reason, d.reason


COSTS_CFG = {"save_s": COSTS.save_s, "provisioning_s": COSTS.provisioning_s, "startup_s": COSTS.startup_s}


# ---- spot and on demand --------------------------------------------------------------


def _priced(planner, premium):
    """``planner``'s options, movable to on-demand nodes at ``premium`` USD/h per GPU."""
    def fn(a):
        return [PlanOption(gpus=o.gpus, throughput_samples_per_s=o.throughput_samples_per_s, usd_per_hr=o.usd_per_hr,
                           label=o.label, on_demand_premium_usd_per_hr=premium) for o in planner(a)]
    return fn


def test_on_demand_takes_the_stormy_pool_when_the_objective_pays_for_it():
    avail = {("A100-40", A): 4, ("A100-40", B): 4}
    planner = _priced(linear_planner, {k: 2.0 for k in avail})  # 1.2 USD/h on spot, 3.2 on demand
    rates = {("A100-40", B): 40 / 3600}
    state = ControllerState(plan=None, available=avail, samples_target=1e7, preemption_rate_per_s=rates,
                            on_demand_available={("A100-40", B): 4})
    d = run(state, plan_fn=planner)
    assert d.plan.gpus == {("A100-40", A): 4} and d.plan.on_demand == {("A100-40", B): 4}
    assert d.plan.usd_per_hr == pytest.approx(4 * 1.2 + 4 * (1.2 * 0.9 + 2.0))  # B spot is 10 % cheaper
    assert "on demand" in d.reason
    # Finishing cheapest, the calm spot pool alone wins: on demand costs more than it saves.
    d = run(state, plan_fn=planner, objective=Objective.COST)
    assert d.plan.gpus == {("A100-40", A): 4} and not d.plan.on_demand


def test_on_demand_capacity_runs_a_plan_when_spot_has_none():
    planner = _priced(linear_planner, {("A100-40", A): 2.0})
    state = ControllerState(plan=None, available={}, samples_target=1e6, on_demand_available={("A100-40", A): 2})
    d = run(state, plan_fn=planner)
    assert d.action == Action.REPLAN and d.plan.on_demand == {("A100-40", A): 2} and not d.plan.gpus
    assert d.plan.usd_per_hr == pytest.approx(2 * 3.2)


def test_terms_check_the_objective_and_floor():
    from sailor_core.errors import InputError

    with pytest.raises(InputError, match="objective must be throughput or cost, got 'speed'"):
        JobTerms(objective="speed")
    with pytest.raises(InputError, match="min_throughput_samples_per_s must be a positive number"):
        JobTerms(min_throughput_samples_per_s=0)
    assert JobTerms(objective=" Cost ").objective is Objective.COST
    assert math.isclose(ControllerConfig(save_s=4, provisioning_s=90, startup_s=64).change_cost_s, 158)


def test_a_re_plan_says_how_many_preemptions_it_expects_before_the_job_ends():
    """A short job learns its rates from minutes: 96 an hour over the ~40 s it has left is about
    one more hit, and the words say that count beside the rate."""

    pool = ("T4", "us-central1-a")
    plan = PlanOption(gpus={pool: 2}, throughput_samples_per_s=10.0, usd_per_hr=0.7, label="2xT4")
    costs = Costs(save_s=1, provisioning_s=2, startup_s=5, work_lost_s=0)
    state = ControllerState(plan=plan, samples_done=100.0, samples_target=500.0, budget_left_usd=1.0,
                            available={pool: 2}, preemption_rate_per_s={pool: 96 / 3600})
    short = outlook(plan, remaining=400.0, change=8.0, rates=state.preemption_rate_per_s, shares={}, costs=costs)
    assert short.expected_hits == pytest.approx(96 / 3600 * 400.0 / 10.0)  # rate x training time: ~1.07
    words = why_words(short, {pool: 2}, state, "")
    assert "expects about one more preemption before the job ends (96 times an hour)" in words
    long = outlook(plan, remaining=400_000.0, change=8.0, rates=state.preemption_rate_per_s, shares={}, costs=costs)
    assert "expects about 1067 more preemptions" in why_words(long, {pool: 2}, state, "")
    calm = outlook(plan, remaining=400.0, change=8.0, rates={pool: 1 / 3600}, shares={}, costs=costs)
    assert calm.expected_hits < 0.5
    assert "less than one more preemption" in why_words(calm, {pool: 2}, state, "")
