"""Finishing cheapest by a deadline (issue 22): a plan makes the deadline at a high quantile of its
preemptions, not on average; the margin shrinks with the work left; when no plan makes it the
fastest runs and a switch to it is judged on time; without a deadline nothing changes."""

import dataclasses

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
)
from sailor_core.controller.economics import deadline_margin_s, outlook
from sailor_core.errors import InputError

from tests.controller.planners import linear_planner

A = "us-east-1a"
POOL = ("V100-16", A)
COSTS = Costs(save_s=0, provisioning_s=150, startup_s=150, work_lost_s=0)
START = Event(kind=EventKind.START)
CAP = Event(kind=EventKind.CAPACITY)
# One pool: 16 GPUs train 100 samples/s for 16 USD/h; 12 train 80/s for 12 USD/h (cheaper per sample).
FAST = PlanOption(gpus={POOL: 16}, throughput_samples_per_s=100, usd_per_hr=16, label="fast")
CHEAP = PlanOption(gpus={POOL: 12}, throughput_samples_per_s=80, usd_per_hr=12, label="cheap")
AVAIL = {POOL: 16}
STORMY = {POOL: 2 / 3600}  # two preemptions an hour, each taking the plan


def both(_avail):
    return [FAST, CHEAP]


def run(state, event=START, **cfg):
    return decide(state, event, config=ControllerConfig(terms=JobTerms(objective=Objective.COST), **cfg), plan_fn=both)


def _time_s(option, samples):
    return outlook(option, remaining=samples, change=300, rates=STORMY, shares={}, costs=COSTS).time_s


def test_the_margin_is_z_sqrt_of_the_hits_expected_and_shrinks_with_the_work_left():
    far = outlook(CHEAP, remaining=2_000_000, change=300, rates=STORMY, shares={}, costs=COSTS)
    near = outlook(CHEAP, remaining=200_000, change=300, rates=STORMY, shares={}, costs=COSTS)
    hits = 2 / 3600 * 2_000_000 / 80  # ~13.9 over its 6.9 h of training
    assert deadline_margin_s(far, quantile=0.9, costs=COSTS) == pytest.approx(1.2816 * hits ** 0.5 * 300, rel=1e-3)
    assert 0 < deadline_margin_s(near, quantile=0.9, costs=COSTS) < deadline_margin_s(far, quantile=0.9, costs=COSTS)
    # At the median the margin is 0 (the expected time), and so it is without preemptions.
    assert deadline_margin_s(far, quantile=0.5, costs=COSTS) == 0
    calm = outlook(CHEAP, remaining=2_000_000, change=300, rates={}, shares={}, costs=COSTS)
    assert deadline_margin_s(calm, quantile=0.99, costs=COSTS) == 0


def test_a_plan_that_makes_the_deadline_only_on_average_gives_way_to_one_that_makes_it_at_the_quantile():
    samples = 2_000_000
    expected_cheap_s = _time_s(CHEAP, samples)
    # The deadline just above CHEAP's expected time: the mean rule (quantile 0.5, the old rule) takes
    # CHEAP and a burst of preemptions makes it late; at the 90th percentile it does not make it.
    state = ControllerState(plan=None, available=AVAIL, samples_target=samples, time_left_s=expected_cheap_s + 60,
                            preemption_rate_per_s=STORMY)
    assert run(state, deadline_quantile=0.5).plan is CHEAP
    d = run(state)
    assert d.plan is FAST
    assert "in 90% of outcomes" in d.reason
    # Far more time: CHEAP makes it at the quantile too, and runs.
    loose = dataclasses.replace(state, time_left_s=expected_cheap_s * 1.5)
    assert run(loose).plan is CHEAP


def test_near_the_deadline_the_margin_lets_the_cheaper_plan_run_again():
    # The same 10 min of slack beyond CHEAP's expected time: far from the end its margin (z sqrt of
    # the ~14 hits expected, ~24 min) is larger, near the end (a third of a hit left, ~4 min) not.
    far, near = 2_000_000, 50_000
    far_state = ControllerState(plan=None, available=AVAIL, samples_target=far,
                                time_left_s=_time_s(CHEAP, far) + 600, preemption_rate_per_s=STORMY)
    near_state = ControllerState(plan=None, available=AVAIL, samples_target=near,
                                 time_left_s=_time_s(CHEAP, near) + 600, preemption_rate_per_s=STORMY)
    assert run(far_state).plan is FAST
    assert run(near_state).plan is CHEAP


def test_a_running_plan_that_would_miss_at_the_quantile_gives_way_and_says_why():
    samples = 2_000_000
    state = ControllerState(plan=CHEAP, available=AVAIL, samples_target=samples, planned_on=AVAIL,
                            time_left_s=_time_s(CHEAP, samples) - 300 + 60, preemption_rate_per_s=STORMY)
    d = run(state, CAP)
    assert d.action == Action.REPLAN and d.plan is FAST
    assert d.reason.startswith("deadline: the plan in use finishes in") and "in 90% of outcomes" in d.reason
    assert "would not keep the deadline" in d.why
    # The old rule (the mean) keeps it.
    assert run(state, CAP, deadline_quantile=0.5).action == Action.CONTINUE


def test_when_no_plan_makes_the_deadline_a_switch_to_the_fastest_is_judged_on_time():
    # Neither makes it; CHEAP runs.  Judged on cost per sample (the old rule) FAST never pays (it is
    # dearer per sample); with the deadline lost the fastest should run, and the switch saves time.
    state = ControllerState(plan=CHEAP, available=AVAIL, samples_target=2_000_000, planned_on={POOL: 12},
                            time_left_s=3600)
    d = run(state, CAP)
    assert d.action == Action.REPLAN and d.plan is FAST and "no plan finishes by the deadline" in d.reason
    assert "finish in" in d.why


def test_by_a_deadline_a_plan_within_min_gain_of_the_cheapest_that_finishes_sooner_runs():
    # close costs 3 % more per sample than cheap (15.5 / 100 against 12 / 80 USD): within min_gain (5 %).
    cheap = PlanOption(gpus={POOL: 12}, throughput_samples_per_s=80, usd_per_hr=12, label="cheap")
    close = PlanOption(gpus={POOL: 16}, throughput_samples_per_s=100, usd_per_hr=15.5, label="close")

    def plans(_avail):
        return [close, cheap]

    state = ControllerState(plan=None, available=AVAIL, samples_target=1_000_000, time_left_s=30 * 3600)
    cfg = ControllerConfig(terms=JobTerms(objective=Objective.COST))
    assert decide(state, START, config=cfg, plan_fn=plans).plan is close
    # Without a deadline the cheapest runs, whatever the margin.
    no_deadline = dataclasses.replace(state, time_left_s=float("inf"))
    assert decide(no_deadline, START, config=cfg, plan_fn=plans).plan is cheap


@pytest.mark.parametrize("objective", list(Objective))
def test_without_a_deadline_the_quantile_changes_no_decision(objective):
    states = [
        ControllerState(plan=None, available={POOL: 8, ("T4", A): 4}, samples_target=1e6,
                        preemption_rate_per_s={POOL: 3 / 3600}),
        ControllerState(plan=None, available={POOL: 8}, samples_target=1e6, budget_left_usd=50.0,
                        preemption_rate_per_s={POOL: 1 / 3600}),
    ]
    for state in states:
        a = decide(state, START, config=ControllerConfig(terms=JobTerms(objective=objective)), plan_fn=linear_planner)
        b = decide(state, START, config=ControllerConfig(terms=JobTerms(objective=objective), deadline_quantile=0.5),
                   plan_fn=linear_planner)
        assert (a.action, a.plan, a.reason) == (b.action, b.plan, b.reason)
        running = dataclasses.replace(state, plan=a.plan, planned_on=dict(state.available),
                                      available={k: n * 2 for k, n in state.available.items()})
        a2 = decide(running, CAP, config=ControllerConfig(terms=JobTerms(objective=objective)), plan_fn=linear_planner)
        b2 = decide(running, CAP, config=ControllerConfig(terms=JobTerms(objective=objective), deadline_quantile=0.5),
                    plan_fn=linear_planner)
        assert (a2.action, a2.plan, a2.reason) == (b2.action, b2.plan, b2.reason)


def test_the_deadline_quantile_is_checked():
    with pytest.raises(InputError):
        ControllerConfig(deadline_quantile=1.0)
    with pytest.raises(InputError):
        ControllerConfig(deadline_quantile=0.3)
