"""What the train-job flow's survivors train on while the next plan's new instances boot
(``tasks.control.interim_plan``), on catalog offers: the rule the replay uses."""

from __future__ import annotations

from sailor_core.catalog.instances import catalog_offers
from sailor_core.job.spec import JobSpec
from tasks import control

A, B = ("T4", "us-central1-a"), ("T4", "us-central1-b")
SPEC = JobSpec(model="tiny", budget_usd=1.0, steps=100, global_batch_size=1024, gpus=("T4",),
               zones=(A[1], B[1]), max_gpus=2, min_throughput_samples_per_s=20000.0)


def test_the_survivors_plan_ignores_the_floor_and_keeps_the_next_plans_batch():
    offers = catalog_offers(gpus=["T4"], zones=[A[1], B[1]])
    planner = control.job_planner(SPEC, offers)
    nxt = planner({A: 1, B: 1})[0]
    option, nodes = control.interim_plan(SPEC, offers, nxt, {A: 1})
    # one T4 is under the job's floor (the job's planner offers nothing there); the interim runs anyway
    assert option.gpus == {A: 1} and 0 < option.throughput_samples_per_s < SPEC.min_throughput_samples_per_s
    assert option.plan.global_batch_size == nxt.plan.global_batch_size == 1024
    assert [(n.zone, n.gpu, len(n.ranks)) for n in nodes] == [(A[1], "T4", 1)]
    assert control.interim_plan(SPEC, offers, nxt, {}) is None  # nothing kept: no interim
