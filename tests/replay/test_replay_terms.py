"""The job's terms in the replay (objective, deadline, on-demand capacity) and the comparison at
equal terms, with the linear test planner."""

import dataclasses

import pytest

from sailor_core.controller import PlanOption, controller_config
from sailor_core.replay import (
    ChangeCosts,
    Goal,
    JobTerms,
    Market,
    ReplayPolicy,
    controller_costs,
    replay,
    run_policies,
)
from sailor_core.replay.compare import compare_policies, pareto_front, summary_lines
from sailor_core.specs.replay import ReplaySpec
from sailor_core.traces import build_trace

from tests.controller.planners import linear_planner

A = ("A100-40", "us-central1-a")   # stormy below
B = ("A100-40", "us-central1-b")   # calm
COSTS = ChangeCosts(standby_workers=False, provisioning_s=100, startup_s=50, checkpoint_bytes=0,
                    checkpoint_interval_s=1e9, terminate_s=0)
ONE_USD = lambda gpu, zone, t: 1.0  # noqa: E731
THREE_USD = lambda gpu, zone, t: 3.0  # noqa: E731


def stormy(hours: int = 10):
    """A loses two of its 4 GPUs every 4 minutes and gets them back 2 minutes later; B holds."""
    rows = []
    for i in range(hours * 15):
        rows += [(240.0 * i, {A: 4, B: 4}), (240.0 * i + 120, {A: 2, B: 4})]
    return build_trace(rows)


def priced(available):
    """The linear planner, its GPUs movable to on-demand nodes at 2 USD/h more (3 in all)."""
    return [PlanOption(gpus=o.gpus, throughput_samples_per_s=o.throughput_samples_per_s,
                       usd_per_hr=sum(o.gpus.values()) * 1.0, label=o.label,
                       on_demand_premium_usd_per_hr={A: 2.0, B: 2.0})
            for o in linear_planner(available)]


def run(trace, *, on_demand=None, target=1.2e6, objective="throughput"):
    config = controller_config("ours", costs=controller_costs(COSTS, ("us-central1-a",)), shutdown_s=COSTS.shutdown_s,
                               terms=JobTerms(objective=objective))
    return replay(trace, policy=ReplayPolicy(config=config, plan_fn=priced, name="ours"),
                  market=Market(price_fn=ONE_USD, on_demand_available=on_demand or {}, on_demand_price_fn=THREE_USD),
                  goal=Goal(samples_target=target), costs=COSTS)


def test_on_demand_gpus_are_never_preempted_and_are_billed_apart():
    spot = run(stormy())
    mixed = run(stormy(), on_demand={A: 4, B: 4})
    assert set(spot.usd_by_market) == {"spot"}
    assert mixed.usd_by_market["on_demand"] > 0
    assert sum(mixed.usd_by_market.values()) == pytest.approx(mixed.usd_spent)
    # Finishing soonest, the stormy pool's GPUs go on demand once its storms are seen: sooner done.
    assert mixed.num_restarts <= spot.num_restarts
    assert mixed.time_to_train_s < spot.time_to_train_s


def test_the_stormy_pool_is_left_and_the_replay_says_why():
    r = run(stormy())
    # Within the first hour of storms the plan settles on B: far fewer restarts than storms.
    assert r.finished and r.num_restarts < 15 < 15 * r.time_to_train_s / 3600
    assert any("leaves unused A100-40@us-central1-a" in d.reason for d in r.decisions)


def test_declined_switches_are_recorded_once_per_plan():
    r = run(stormy())
    declines = [d for d in r.decisions if d.action == "decline"]
    assert r.num_declined >= len(declines)
    assert all(d.reason.startswith("declined") for d in declines)
    assert all(a.reason != b.reason for a, b in zip(declines, declines[1:]))


def test_run_policies_takes_the_jobs_terms():
    trace = stormy(hours=20)
    spec = ReplaySpec(trace="-", model="opt-350m", tokens=2e9, policy="ours", workers=0)
    fastest = run_policies(trace, spec, plan_fn=linear_planner, costs=COSTS)
    slow_ok = fastest.results["ours"].time_to_train_s / 3600 * 3
    cheap = run_policies(trace, dataclasses.replace(spec, objective="cost", deadline_h=slow_ok),
                         plan_fn=linear_planner, costs=COSTS)
    f, c = fastest.results["ours"], cheap.results["ours"]
    assert c.finished and c.time_to_train_s <= slow_ok * 3600
    assert c.usd_spent < f.usd_spent
    assert cheap.to_dict()["terms"]["deadline_h"] == pytest.approx(slow_ok)
    with pytest.raises(Exception, match="objective"):
        JobTerms(objective="speed")


def test_compare_at_equal_terms():
    trace = stormy(hours=40)
    spec = ReplaySpec(trace="-", model="opt-350m", tokens=2e9, policy="ours,single-type,skypilot", workers=0,
                      gpu="A100-40")
    c = compare_policies(trace, spec, plan_fn=linear_planner, costs=COSTS, deadline_factors=(2.0,))
    assert {p.policy for p in c.points} == {"ours", "single-type", "skypilot"}
    assert c.front and all(p.policy == "ours" for p in c.front)
    assert c.front == tuple(pareto_front(c.front))
    assert [p.time_h for p in c.front] == sorted(p.time_h for p in c.front)
    assert [p.usd for p in c.front] == sorted((p.usd for p in c.front), reverse=True)
    by = {e.other: e for e in c.equal_terms}
    sky = by["skypilot"]
    assert sky.ours_by_deadline is not None and sky.ours_by_deadline.terms.startswith("deadline")
    assert sky.ours_by_budget is not None and sky.ours_by_budget.terms.startswith("budget")
    assert sky.ours_by_budget.usd <= sky.other_point.usd + 1e-6
    assert {p.terms for p in c.points if p.policy == "single-type"} >= {"fastest", "cheapest"}
    assert not [p for p in c.points if p.policy == "skypilot" and p.terms == "cheapest"]  # its request is fixed
    lines = summary_lines(c)
    assert lines[0].startswith("fastest, ours against single-type: ") and "time " in lines[0]
    assert any(line.startswith("cheapest, ours against single-type") for line in lines)
    assert any(line.startswith("skypilot: ") or line.startswith("skypilot did not finish") for line in lines)


def test_a_mixed_plan_is_billed_each_market_at_its_price():
    # No spot A100s in A, 4 on demand there; 4 calm spot ones in B: the plan takes both markets.
    trace = build_trace([(0.0, {A: 0, B: 4}), (36000.0, {A: 0, B: 4})])
    r = run(trace, on_demand={A: 4})
    assert r.finished
    # 100 s provisioning + 50 s start-up, then 1.2e6 samples at 80/s: both leases are billed from
    # 100 s, when their VMs run, to 15150 s, the spot GPUs at 1 USD/h, the on-demand ones at 3
    # (the option's 1 + 2 USD/h premium).
    assert r.time_to_train_s == pytest.approx(15150)
    assert r.usd_by_market == pytest.approx({"spot": 4 * 1.0 * 15050 / 3600, "on_demand": 4 * 3.0 * 15050 / 3600})
    assert r.usd_spent == pytest.approx(sum(r.usd_by_market.values()))
