"""The controller's decisions with a trivial additive planner."""

import math

import pytest

from sailor_core.controller import (
    Action,
    CachedPlanner,
    ControllerConfig,
    ControllerState,
    Event,
    EventKind,
    decide,
)
from sailor_core.errors import InputError

from tests.controller.planners import linear_option, linear_planner

A, B = "us-central1-a", "us-central1-b"
START = Event(kind=EventKind.START)
CAP = Event(kind=EventKind.CAPACITY)


def run(state, event, **cfg):
    return decide(state, event, config=ControllerConfig(**cfg), plan_fn=linear_planner)


def test_start_uses_everything_and_waits_when_nothing():
    d = run(ControllerState(plan=None, available={("A100-40", A): 4, ("V100-16", A): 2}), START)
    assert d.action == Action.REPLAN and d.plan.gpus == {("A100-40", A): 4, ("V100-16", A): 2}
    assert math.isinf(d.stop_in_s)
    d = run(ControllerState(plan=None, available={("A100-40", A): 0}), START)
    assert d.action == Action.WAIT


def test_preemption_replans_on_what_is_left():
    cur = linear_option({("A100-40", A): 4, ("V100-16", A): 2})
    d = run(ControllerState(plan=cur, available={("A100-40", A): 2, ("V100-16", A): 2}),
            Event(kind=EventKind.PREEMPTION, lost={("A100-40", A): 2}))
    assert d.action == Action.REPLAN and "preemption" in d.reason
    assert d.plan.gpus == {("A100-40", A): 2, ("V100-16", A): 2}


def test_new_capacity_replans_only_when_it_pays():
    cur = linear_option({("A100-40", A): 4})  # 40 samples/s
    big = {("A100-40", A): 4, ("T4", A): 1}   # 41 samples/s: 2.5 % faster, not worth a restart
    state = ControllerState(plan=cur, available=big, samples_target=1e6)
    assert run(state, CAP).action == Action.CONTINUE
    more = {("A100-40", A): 8}  # twice as fast
    d = run(ControllerState(plan=cur, available=more, samples_target=1e6), CAP)
    assert d.action == Action.REPLAN and d.plan.num_gpus == 8
    # Nearly done: the change cost outweighs the speed-up.
    d = run(ControllerState(plan=cur, available=more, samples_target=1e6, samples_done=1e6 - 4000), CAP)
    assert d.action == Action.CONTINUE


def test_single_type_restriction():
    avail = {("A100-40", A): 2, ("V100-16", A): 8}
    d = run(ControllerState(plan=None, available=avail), START, gpu_types=("V100-16",))
    assert d.plan.gpus == {("V100-16", A): 8}


def test_budget_keep_most_efficient_then_stop():
    # 4 A100: 40 samples/s at 4.8 USD/h (30000 samples/USD), the most per USD of the options.
    avail = {("A100-40", A): 4, ("T4", A): 1}
    cur = linear_option({("A100-40", A): 4})
    target = 40 * 3600 * 10  # 10 h of it: 48 USD
    state = ControllerState(plan=cur, available=avail, samples_target=target, budget_left_usd=20.0)
    d = run(state, CAP, provisioning_s=0, startup_s=0, shutdown_s=60)
    assert d.action == Action.CONTINUE
    assert d.stop_in_s == pytest.approx(20.0 * 3600 / 4.8 - 60)
    # Only the shutdown is left to pay: stop.
    state = ControllerState(plan=cur, available=avail, samples_target=target, budget_left_usd=4.8 * 120 / 3600)
    d = run(state, Event(kind=EventKind.TIMER), shutdown_s=120)
    assert d.action == Action.STOP and "budget" in d.reason


def test_budget_shrinks_to_a_plan_that_finishes():
    from sailor_core.controller import PlanOption

    fast = PlanOption(gpus={("A100-40", A): 8}, throughput_samples_per_s=100, usd_per_hr=10, label="fast")
    cheap = PlanOption(gpus={("V100-16", A): 8}, throughput_samples_per_s=50, usd_per_hr=4, label="cheap")
    avail = {("A100-40", A): 8, ("V100-16", A): 8}
    # 720000 samples: fast needs 2 h = 20 USD, cheap 4 h = 16 USD; 18 USD left.
    state = ControllerState(plan=fast, available=avail, samples_target=720000, budget_left_usd=18.0)
    d = decide(state, CAP, config=ControllerConfig(provisioning_s=0, startup_s=0, shutdown_s=0), plan_fn=lambda a: [fast, cheap])
    assert d.action == Action.SHRINK and d.plan is cheap and "budget" in d.reason
    # With 25 USD left the fast plan finishes: keep it.
    state = ControllerState(plan=fast, available=avail, samples_target=720000, budget_left_usd=25.0)
    d = decide(state, CAP, config=ControllerConfig(provisioning_s=0, startup_s=0, shutdown_s=0), plan_fn=lambda a: [fast, cheap])
    assert d.action == Action.CONTINUE


def test_done_stops():
    d = run(ControllerState(plan=None, available={}, samples_target=10, samples_done=10), CAP)
    assert d.action == Action.STOP and d.reason.startswith("done")


def test_failover_moves_whole_request_to_cheapest_other_zone():
    avail = {("V100-16", A): 4, ("V100-16", B): 8, ("A100-40", A): 8}
    cfg = dict(strategy="failover", gpu_types=("V100-16",))
    d = run(ControllerState(plan=None, available=avail), START, **cfg)
    assert d.plan.gpus == {("V100-16", B): 8}  # best single-zone plan of the type
    cur = d.plan
    # Preempted in B: the same 8-GPU request goes elsewhere; A has only 4, so wait.
    after = {("V100-16", A): 4, ("V100-16", B): 6, ("A100-40", A): 8}
    d = run(ControllerState(plan=cur, available=after, last_plan=cur),
            Event(kind=EventKind.PREEMPTION, lost={("V100-16", B): 2}), **cfg)
    assert d.action == Action.WAIT
    # New capacity in A (cheaper zone multiplier is B's, but B was just lost): restart in A.
    d = run(ControllerState(plan=None, available={("V100-16", A): 8, ("V100-16", B): 8}, last_plan=cur),
            Event(kind=EventKind.CAPACITY, zone_hint=B), **cfg)
    assert d.action == Action.REPLAN and d.plan.gpus == {("V100-16", A): 8}
    # Running and capacity grows: a managed job never resizes.
    d = run(ControllerState(plan=cur, available={("V100-16", B): 16}, last_plan=cur), CAP, **cfg)
    assert d.action == Action.CONTINUE


def test_static_never_grows_back():
    cur = linear_option({("A100-40", A): 4})
    cfg = dict(strategy="static")
    d = run(ControllerState(plan=cur, available={("A100-40", A): 3}, last_plan=cur),
            Event(kind=EventKind.PREEMPTION, lost={("A100-40", A): 1}), **cfg)
    assert d.action == Action.REPLAN and d.plan.gpus == {("A100-40", A): 3}
    d = run(ControllerState(plan=d.plan, available={("A100-40", A): 16}, last_plan=d.plan), CAP, **cfg)
    assert d.action == Action.CONTINUE
    d = run(ControllerState(plan=None, available={("A100-40", A): 16}, last_plan=cur), CAP, **cfg)
    assert d.action == Action.STOP


def test_config_validation():
    with pytest.raises(InputError, match="strategy"):
        ControllerConfig(strategy="yolo")
    with pytest.raises(InputError, match="one GPU type"):
        ControllerConfig(strategy="failover")


def test_cached_planner_reuses_results_for_covered_availability():
    calls = []

    def counting(avail):
        calls.append(dict(avail))
        return [linear_option({("A100-40", A): min(4, avail.get(("A100-40", A), 0))})]

    cp = CachedPlanner(plan_fn=counting)
    cp({("A100-40", A): 8})
    cp({("A100-40", A): 8})          # exact hit
    cp({("A100-40", A): 6})          # 4 <= 6 <= 8: covered
    cp({("A100-40", A): 3})          # best (4) no longer fits: planner again
    assert len(calls) == 2 and cp.num_hits == 2


def test_preemption_rates_steer_away_from_stormy_pools():
    avail = {("A100-40", A): 4, ("V100-16", B): 8}  # all: 72 samples/s; A100s alone: 40
    calm = run(ControllerState(plan=None, available=avail, samples_target=1e6), START)
    assert calm.plan.gpus == avail
    # The V100 pool loses nodes every 5 min: each costs a 300 s restart, so using it
    # doubles the time per sample (72 / 2 = 36 < 40).
    stormy = ControllerState(plan=None, available=avail, samples_target=1e6,
                             preemption_rate_per_s={("V100-16", B): 1 / 300})
    d = run(stormy, START)
    assert d.plan.gpus == {("A100-40", A): 4}
