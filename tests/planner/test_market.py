"""Mixed plans: a replica's market (spot or on demand) in the plan file, priced by simulate."""

import json

import pytest

from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.controller import plan_option
from sailor_core.errors import PlanError
from sailor_core.plan.types import ON_DEMAND, SPOT, plan_from_dict, with_on_demand
from sailor_core.simulator.simulate import simulate

Z = "us-east-1a"
PLAN = {"model": "opt-350m", "global_batch_size": 64, "micro_batch_size": 2,
        "stages": [{"layers": [0, 13], "replicas": [{"gpu": "V100-16", "tp": 1, "zone": Z},
                                                    {"gpu": "V100-16", "tp": 1, "zone": Z}]},
                   {"layers": [13, 26], "replicas": [{"gpu": "V100-16", "tp": 1, "zone": Z},
                                                     {"gpu": "V100-16", "tp": 1, "zone": Z}]}]}


def test_the_plan_file_keeps_each_replicas_market():
    plan = plan_from_dict(PLAN)
    assert all(r.market is None for s in plan.stages for r in s.replicas)
    assert "market" not in json.dumps(plan.to_dict())  # plans without markets are written as before
    mixed = with_on_demand(plan, {("V100-16", Z): 2})
    # The first stage's replicas go on demand first: its loss would stop every later stage too.
    assert [r.market for r in mixed.stages[0].replicas] == [ON_DEMAND, ON_DEMAND]
    assert [r.market for r in mixed.stages[1].replicas] == [SPOT, SPOT]
    assert plan_from_dict(json.loads(mixed.to_json())) == mixed
    assert mixed.on_demand_gpus() == {("V100-16", Z): 2}
    bad = json.loads(json.dumps(PLAN))
    bad["stages"][0]["replicas"][0]["market"] = "reserved"
    with pytest.raises(PlanError, match="market"):
        plan_from_dict(bad)


def test_simulate_prices_each_replica_by_its_market():
    plan = plan_from_dict(PLAN)
    spot, od = gpu_price_usd_per_hr("V100-16", Z, spot=True), gpu_price_usd_per_hr("V100-16", Z, spot=False)
    assert od > spot
    mixed = with_on_demand(plan, {("V100-16", Z): 2})
    a, b = simulate(plan), simulate(mixed)
    assert a.usd_per_hour == pytest.approx(4 * spot)
    assert b.usd_per_hour == pytest.approx(2 * spot + 2 * od)
    assert b.iteration_time_s == a.iteration_time_s  # the market changes the bill, not the speed
    assert simulate(mixed, spot=False).usd_per_hour == pytest.approx(2 * spot + 2 * od)  # explicit markets win
    # The controller's option of the mixed plan: spot GPUs apart from on-demand ones, the same price.
    o = plan_option(mixed, throughput_samples_per_s=b.throughput_samples_per_s, usd_per_hr=b.usd_per_hour)
    assert o.gpus == {("V100-16", Z): 2} and o.on_demand == {("V100-16", Z): 2} and o.num_gpus == 4
    assert o.on_demand_premium_usd_per_hr[("V100-16", Z)] == pytest.approx(od - spot)


def test_the_controllers_mixed_option_is_priced_as_simulate_prices_the_mixed_plan():
    from sailor_core.controller import with_on_demand as option_on_demand

    plan = plan_from_dict(PLAN)
    sim = simulate(plan)
    option = plan_option(plan, throughput_samples_per_s=sim.throughput_samples_per_s, usd_per_hr=sim.usd_per_hour)
    mixed = option_on_demand(option, {("V100-16", Z): 2})
    assert mixed.plan == with_on_demand(plan, {("V100-16", Z): 2})
    assert mixed.usd_per_hr == pytest.approx(simulate(mixed.plan).usd_per_hour)
    assert (mixed.gpus, mixed.on_demand) == ({("V100-16", Z): 2}, {("V100-16", Z): 2})
