"""The cost ledger on hand-computed cases."""

import json
import math

import pytest

from sailor_core.controller import CostLedger
from sailor_core.errors import InputError


def test_spend_is_running_time_times_price():
    led = CostLedger(budget_usd=10.0)
    led.open("a", gpu="A100-40", zone="us-central1-a", num_gpus=4, usd_per_hr=3.6, start_s=0)
    led.open("b", gpu="T4", zone="us-east-1a", num_gpus=1, usd_per_hr=0.36, start_s=1800)
    assert led.spent_usd(3600) == pytest.approx(3.6 + 0.18)
    led.close("a", 3600, "preempted")
    assert led.spent_usd(7200) == pytest.approx(3.6 + 0.54)
    assert led.by_instance(7200) == pytest.approx({"a": 3.6, "b": 0.54})
    assert led.by_gpu_zone(7200) == pytest.approx({("A100-40", "us-central1-a"): 3.6, ("T4", "us-east-1a"): 0.54})
    assert led.usd_per_hr() == pytest.approx(0.36)
    assert led.gpu_seconds(7200) == pytest.approx(4 * 3600 + 5400)


def test_price_changes_split_the_running_time():
    led = CostLedger()
    led.open("a", gpu="V100-16", zone="us-east-1a", num_gpus=1, usd_per_hr=1.0, start_s=0)
    led.set_price("a", 2.0, at_s=1800)
    led.close("a", 3600)
    assert led.spent_usd(99999) == pytest.approx(0.5 + 1.0)


def test_can_afford_counts_the_shutdown():
    led = CostLedger(budget_usd=2.0)
    led.open("a", gpu="T4", zone="us-east-1a", num_gpus=1, usd_per_hr=1.0, start_s=0)
    # At t=1 h, 1 USD left: 50 min + 10 min shutdown fits, 51 min does not.
    assert led.can_afford(1.0, 3000, 600, now_s=3600)
    assert not led.can_afford(1.0, 3060, 600, now_s=3600)
    assert led.affordable_s(1.0, 600, now_s=3600) == pytest.approx(3000)
    assert math.isinf(CostLedger().affordable_s(5.0, 60, now_s=0))


def test_json_round_trip():
    led = CostLedger(budget_usd=5.0)
    led.open("a", gpu="T4", zone="us-east-1a", num_gpus=1, usd_per_hr=1.0, start_s=0)
    led.set_price("a", 0.5, at_s=100)
    led.open("b", gpu="T4", zone="us-east-1b", num_gpus=2, usd_per_hr=2.0, start_s=50)
    led.close("b", 150, "preempted")
    back = CostLedger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert back.to_dict() == led.to_dict()
    assert back.spent_usd(400) == pytest.approx(led.spent_usd(400))


def test_bad_input():
    with pytest.raises(InputError, match="budget"):
        CostLedger(budget_usd=-1)
    led = CostLedger()
    led.open("a", gpu="T4", zone="us-east-1a", num_gpus=1, usd_per_hr=1.0, start_s=0)
    with pytest.raises(InputError, match="already"):
        led.open("a", gpu="T4", zone="us-east-1a", num_gpus=1, usd_per_hr=1.0, start_s=0)
    with pytest.raises(InputError, match="not in the ledger"):
        led.close("zz", 5)
    with pytest.raises(InputError, match="corrupt"):
        CostLedger.from_dict({"instances": [{"instance_id": "x"}]})


def test_rebuilt_from_job_state_records():
    from sailor_core.job.state import InstanceRecord

    recs = [
        InstanceRecord(instance_id="i1", cloud="aws", zone="us-east-1a", instance_type="g4dn.xlarge", gpu="T4",
                       num_gpus=1, usd_per_hr=0.5, spot=True, attempt=1, launched_unix_s=1000.0,
                       ended_unix_s=4600.0, end_reason="preempted"),
        InstanceRecord(instance_id="i2", cloud="aws", zone="us-east-1b", instance_type="g4dn.xlarge", gpu="T4",
                       num_gpus=1, usd_per_hr=0.5, spot=True, attempt=2, launched_unix_s=5000.0),
    ]
    led = CostLedger.from_instance_records(recs, budget_usd=3.0)
    assert led.spent_usd(8600) == pytest.approx(0.5 + 0.5)
    assert led.open_ids() == ["i2"]


def test_spot_and_on_demand_are_kept_apart():
    led = CostLedger()
    led.open("s", gpu="V100-16", zone="us-east-1a", num_gpus=2, usd_per_hr=1.0, start_s=0)
    led.open("o", gpu="V100-16", zone="us-east-1a", num_gpus=2, usd_per_hr=6.0, start_s=0, spot=False)
    assert led.by_market(1800) == pytest.approx({"spot": 0.5, "on_demand": 3.0})
    back = CostLedger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert back.by_market(1800) == led.by_market(1800)
    assert [e.market for e in back.entries()] == ["spot", "on_demand"]
    # A ledger written before markets were kept reads as spot.
    old = led.to_dict()
    for row in old["instances"]:
        row.pop("spot", None)
    assert set(CostLedger.from_dict(old).by_market(1800)) == {"spot"}


def test_egress_is_charged_per_pair_apart_from_the_rent_and_kept_in_json():
    led = CostLedger(budget_usd=1.0)
    led.open("a", gpu="T4", zone="us-east-1a", num_gpus=1, usd_per_hr=0.36, start_s=0)
    led.charge_egress("us-east-1a", "us-east-1b", num_bytes=2e9, usd=0.02, at_s=100)
    led.charge_egress("us-east-1a", "us-east-1b", num_bytes=1e9, usd=0.01, at_s=200)
    led.charge_egress("us-east-1b", "us-east-1a", num_bytes=1e9, usd=0.01, at_s=200)
    led.charge_egress("us-east-1b", "us-east-1a", num_bytes=0, usd=0.0, at_s=300)  # nothing: no entry
    assert led.rent_usd(3600) == pytest.approx(0.36)
    assert led.egress_usd() == pytest.approx(0.04)
    assert led.spent_usd(3600) == pytest.approx(0.40)
    assert led.egress_by_pair() == {("us-east-1a", "us-east-1b"): pytest.approx((3e9, 0.03)),
                                    ("us-east-1b", "us-east-1a"): pytest.approx((1e9, 0.01))}
    assert len(led.egress_charges()) == 3
    # the budget test sees the egress: 0.60 USD left at 3600 s
    assert led.affordable_s(0.36, 0, now_s=3600) == pytest.approx(0.60 * 3600 / 0.36)
    back = CostLedger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert back.to_dict() == led.to_dict() and back.egress_by_pair() == led.egress_by_pair()
    with pytest.raises(InputError, match="egress"):
        led.charge_egress("a", "b", num_bytes=-1, usd=0.0, at_s=0)


def test_a_ledger_written_before_egress_loads_without_it():
    led = CostLedger(budget_usd=5.0)
    led.open("a", gpu="T4", zone="us-east-1a", num_gpus=1, usd_per_hr=1.0, start_s=0)
    data = led.to_dict()
    assert "egress" not in data  # no key until something is charged: old readers see the same document
    back = CostLedger.from_dict(json.loads(json.dumps(data)))
    assert back.egress_usd() == 0.0 and back.spent_usd(3600) == pytest.approx(1.0)
