"""Job state: pure transitions, spend from instance records, persistence round trips."""

from __future__ import annotations

import json

import pytest

from sailor_core.job import state as js

from sailor_core.job.spec import JobSpec
from sailor_core.errors import InputError


def _spec(**kw):
    return JobSpec(model="tiny", budget_usd=1.0, steps=20, **kw)


def _instance(iid: str, *, launched: float, price: float = 3.6, attempt: int = 1) -> js.InstanceRecord:
    return js.InstanceRecord(instance_id=iid, cloud="aws", zone="us-east-1a", instance_type="p3.2xlarge",
                             gpu="V100-16", num_gpus=1, usd_per_hr=price, spot=True, attempt=attempt,
                             launched_unix_s=launched)


def test_spend_is_running_time_times_price_and_preemptions_are_counted():
    s = js.new_job(_spec(), job_id="j1")
    s = js.with_instances_launched(s, (_instance("a", launched=100.0), _instance("b", launched=100.0)))
    # 3.6 USD/h = 0.001 USD/s
    assert s.usd_spent(now_unix_s=110.0) == pytest.approx(0.02)
    s = js.with_instances_ended(s, {"a"}, "preempted", now_unix_s=105.0)
    s = js.with_instances_ended(s, {"a"}, "preempted", now_unix_s=200.0)  # already closed: no change
    assert s.num_preemptions == 1
    assert [i.instance_id for i in s.running_instances()] == ["b"]
    assert s.usd_spent(now_unix_s=110.0) == pytest.approx(0.005 + 0.01)
    assert s.ledger().by_instance(110.0) == {"a": pytest.approx(0.005), "b": pytest.approx(0.01)}


def test_redone_steps_replace_their_losses_and_replans_keep_reasons():
    s = js.new_job(_spec(), job_id="j2")
    s = js.with_plan(s, plan={"model": "tiny"}, reason="initial plan", usd_per_hr=1.0, throughput_samples_per_s=2.0)
    s = js.with_progress(s, steps_done=6, losses=[(5, 2.0), (6, 1.9)], last_checkpoint_step=5)
    s = js.with_plan(s, plan={"model": "tiny"}, reason="preempted: i-1", usd_per_hr=0.5, throughput_samples_per_s=1.0)
    s = js.with_progress(s, steps_done=7, losses=[(6, 1.8), (7, 1.7)])
    assert s.attempt == 2
    assert [r.reason for r in s.replans] == ["initial plan", "preempted: i-1"]
    assert s.replans[1].at_step == 5
    assert s.losses == ((5, 2.0), (6, 1.8), (7, 1.7))
    assert s.last_loss == 1.7 and s.last_checkpoint_step == 5


def test_store_round_trip_and_listing(tmp_path):
    store = js.JobStore(str(tmp_path / "jobs"))
    s = js.new_job(_spec(zones=("us-east-1a",), preempt_at_steps=(3, 7)), job_id="j3")
    s = js.with_instances_launched(s, (_instance("a", launched=1.0),))
    s = js.with_plan(s, plan={"model": "tiny", "stages": []}, reason="r", usd_per_hr=1.0, throughput_samples_per_s=1.0)
    s = js.with_progress(s, losses=[(1, 3.0)])
    store.save(s)
    assert store.load("j3") == s
    (tmp_path / "jobs" / "broken").mkdir()
    (tmp_path / "jobs" / "broken" / "state.json").write_text("{not json")
    assert [x.job_id for x in store.list()] == ["j3"]  # a corrupt job does not break the listing
    with pytest.raises(InputError, match="not valid JSON"):
        store.load("broken")
    with pytest.raises(InputError, match="no job"):
        store.load("missing")
    data = json.loads((tmp_path / "jobs" / "j3" / "state.json").read_text())
    del data["spec"]
    with pytest.raises(InputError, match="corrupt job state"):
        js.state_from_dict(data)


def test_store_at_a_file_url(tmp_path):
    store = js.JobStore(f"file://{tmp_path}/jobs")
    s = js.new_job(_spec(), job_id="m1")
    store.save(s)
    assert store.load("m1") == s and store.exists("m1")


@pytest.mark.parametrize("kw, msg", [({"budget_usd": 0.0}, "budget"), ({"steps": 0}, "steps"),
                                     ({"checkpoint_every_steps": 0}, "checkpoint")])
def test_bad_specs_are_input_errors(kw, msg):
    base = {"model": "tiny", "budget_usd": 1.0, "steps": 5}
    with pytest.raises(InputError, match=msg):
        JobSpec(**{**base, **kw})


def test_preemption_rates_count_events_per_pool_since_the_first_launch():
    s = js.new_job(_spec(), job_id="j9")
    assert s.preemption_rates_per_s(now_unix_s=1000.0) == {}
    s = js.with_instances_launched(s, (_instance("a", launched=100.0), _instance("b", launched=100.0),
                                       _instance("c", launched=100.0)))
    # a and b go at the same second (one event), c later: two events on the pool.
    s = js.with_instances_ended(s, {"a", "b"}, "preempted", now_unix_s=500.0)
    s = js.with_instances_ended(s, {"c"}, "preempted", now_unix_s=900.0)
    # Under an hour observed: an hour in the denominator.
    assert s.preemption_rates_per_s(now_unix_s=1000.0) == {("V100-16", "us-east-1a"): pytest.approx(2 / 3600)}
    # Two hours after the first launch.
    assert s.preemption_rates_per_s(now_unix_s=100.0 + 7200.0) == {("V100-16", "us-east-1a"): pytest.approx(2 / 7200)}
    # Terminated instances are not preemptions.
    t = js.with_instances_launched(js.new_job(_spec(), job_id="j10"), (_instance("d", launched=0.0),))
    t = js.with_instances_ended(t, {"d"}, "terminated", now_unix_s=50.0)
    assert t.preemption_rates_per_s(now_unix_s=100.0) == {}


def test_a_state_written_with_the_removed_on_demand_fallback_option_still_loads():
    """--on-demand-fallback was declared but never did anything; --on-demand-gpus replaced it.
    Jobs saved before keep resuming."""
    s = js.new_job(_spec(), job_id="old")
    data = json.loads(json.dumps(js.state_to_dict(s)))
    data["spec"]["on_demand_fallback"] = False
    assert js.state_from_dict(data) == s


def test_agents_egress_reports_are_charged_once_per_generation_and_pair():
    from sailor_core.job.protocol import AgentState, AgentStatus

    a, b = "us-east-1a", "us-east-1b"
    price = {(a, b): 1e-11, (b, a): 2e-11}

    def report(gen, egress):
        return AgentStatus(instance_id="i", generation=gen, state=AgentState.RUNNING, egress=egress)

    s = js.with_instances_launched(js.new_job(_spec(), job_id="e1"), (_instance("i", launched=0.0, price=0.0),))
    s = js.with_egress(s, [report(1, ((a, b, 1e9),))], usd_per_byte=lambda x, y: price[(x, y)], now_unix_s=10.0)
    again = js.with_egress(s, [report(1, ((a, b, 1e9),))], usd_per_byte=lambda x, y: price[(x, y)], now_unix_s=11.0)
    assert again is s  # the same total read twice is charged once
    s = js.with_egress(s, [report(1, ((a, b, 3e9), (b, a, 1e9))), report(2, ((a, b, 1e9),))],
                       usd_per_byte=lambda x, y: price[(x, y)], now_unix_s=20.0)
    ledger = s.ledger()
    assert ledger.egress_by_pair() == {(a, b): pytest.approx((4e9, 0.04)), (b, a): pytest.approx((1e9, 0.02))}
    assert s.usd_spent(now_unix_s=20.0) == pytest.approx(0.06)
    assert js.state_from_dict(json.loads(json.dumps(js.state_to_dict(s)))) == s
