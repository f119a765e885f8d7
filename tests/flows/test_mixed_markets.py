"""A mixed plan in the train-job flow: the controller rents the pool that preempted the job on
demand and the other on spot, and the job really rents and pays them so.

Real parts: a Prefect server, the embedded cloud (the GCE fake, through google-cloud-compute), the
agents and workers.  The job is resumed by a new flow run after a first one saw zone a preempt it
(its saved history, as a crashed flow run leaves it), so one attempt shows the mixed plan; the
controller's choice after a preemption within one run has a fast test in
tests/flows/test_controller_state.py, and the embedded cloud's sparing of on-demand instances
in tests/infra/test_providers.py.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from sailor_core.catalog.instances import get_instance_type
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec
from tests.flows.test_train_job import _assert_nothing_left, _live_instances

pytestmark = pytest.mark.e2e

ZONES = ("us-central1-a", "us-central1-b")
ITYPE = "n1-standard-4-t4x1"


def _preempted_in_zone_a(store: js.JobStore, job_id: str, spec: JobSpec) -> None:
    """The job as its first flow run left it: 3 steps in, zone a preempted it 20 s after launch."""
    now = time.time()
    state = dataclasses.replace(js.new_job(spec.for_job(store.job_url(job_id)), job_id), created_unix_s=now - 30,
                                attempt=1, steps_done=3)
    rec = dict(cloud="gcp", instance_type=ITYPE, gpu="T4", num_gpus=1, spot=True, attempt=1, launched_unix_s=now - 30,
               usd_per_hr=get_instance_type("gcp", ITYPE).spot_usd_per_hr)
    state = js.with_instances_launched(state, tuple(js.InstanceRecord(instance_id=f"old-{z}", zone=z, **rec)
                                                    for z in ZONES))
    state = js.with_instances_ended(state, {f"old-{ZONES[0]}"}, "preempted", now_unix_s=now - 10)
    state = js.with_instances_ended(state, {f"old-{ZONES[1]}"}, "terminated", now_unix_s=now - 10)
    store.save(js.with_status(state, js.FAILED, "the flow process died"))


def test_the_pool_that_preempted_the_job_is_rented_on_demand_and_paid_at_that_price(prefect_api):
    from flows.train_job import train_job
    from tasks.reporting import JobEvent, add_event_listener, remove_event_listener

    job_id = "tiny-mixed-markets"
    # 256 samples a step train fastest on a T4 in each zone; one GPU of each pool may be on demand.
    args = dict(model="tiny", budget_usd=0.05, steps=6, checkpoint_every_steps=3, global_batch_size=256,
                gpus=("T4",), zones=ZONES, on_demand_gpus=1, max_gpus=2)
    store = js.JobStore()
    _preempted_in_zone_a(store, job_id, JobSpec(**args))
    rented: list[list] = []  # the job's instances as the cloud's API describes them

    def heard(event: JobEvent) -> None:
        if event.kind == "event" and event.text.startswith("rented "):
            rented.append(_live_instances(job_id))

    add_event_listener(heard)
    try:
        summary = train_job(**args, cloud="embedded", max_gpus_per_zone=1, job_id=job_id)
    finally:
        remove_event_listener(heard)
    state = store.load(job_id)
    assert summary["status"] == "succeeded" and summary["steps"] == 6, summary
    # Zone a on demand (the GCE instance's scheduling.provisioningModel is not SPOT), b on spot.
    (instances,) = rented
    assert sorted((i.zone, i.instance_type, i.spot) for i in instances) == [(ZONES[0], ITYPE, False),
                                                                             (ZONES[1], ITYPE, True)]
    new = {r.instance_id: r for r in state.instances if r.attempt == 2}
    assert {(r.zone, r.spot) for r in new.values()} == {(ZONES[0], False), (ZONES[1], True)}
    assert sorted(new) == sorted(i.instance_id for i in instances)
    replicas = [rep for stage in state.plan["stages"] for rep in stage["replicas"]]
    assert sorted((rep["zone"], rep.get("market")) for rep in replicas) == [(ZONES[0], "on_demand"), (ZONES[1], "spot")]
    assert "on demand" in state.replans[-1].reason, state.replans[-1].reason

    # Each instance at its market's price; the spend is the ledger's, split by market.
    row = get_instance_type("gcp", ITYPE)
    assert sorted((r.spot, r.usd_per_hr) for r in new.values()) == [
        (False, pytest.approx(row.on_demand_usd_per_hr)), (True, pytest.approx(row.spot_usd_per_hr))]
    assert state.replans[-1].usd_per_hr == pytest.approx(row.on_demand_usd_per_hr + row.spot_usd_per_hr)
    end = state.updated_unix_s
    by_market = state.ledger().by_market(end)
    assert by_market["on_demand"] > 0 and by_market["spot"] > 0
    paid = sum(r.usd_per_hr * ((r.ended_unix_s or end) - r.launched_unix_s) / 3600 for r in state.instances)
    # rent by market, and the bytes the two zones' replicas sent each other (egress, issue 36)
    egress = state.ledger().egress_usd()
    assert egress > 0
    assert summary["usd_spent"] == pytest.approx(sum(by_market.values()) + egress, abs=1e-6)
    assert summary["usd_spent"] == pytest.approx(paid + egress, abs=1e-6) and 0 < paid <= 0.05
    _assert_nothing_left(state)
