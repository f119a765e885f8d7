"""The train-job flow under a real Prefect server, on the embedded local cloud.

Real parts throughout: moto's EC2 server and the GCE fake provision the
instances, each instance's startup script runs the agent, the agent runs the
engine's torch workers (gloo), preemptions are the embedded cloud's (notice,
SIGTERM, SIGKILL), the controller and the planner decide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.local.confine import host_pid
from sailor_core import settings
from sailor_core.job import state as js
from tests.flows.test_job_logs import assert_the_logs_outlive_the_instances

pytestmark = pytest.mark.e2e


def _live_instances(job_id: str) -> list:
    from infra.config import embedded_endpoints
    from infra.local.cloud import providers_for
    from infra.records import job_labels

    ends = embedded_endpoints()
    return [i for p in providers_for(ends["aws_endpoint"], ends["gce_endpoint"], aws_keys=ends["aws_keys"]).values()
            for i in p.query_instances(job_labels(job_id)) if i.live]


def _assert_nothing_left(state: js.JobState) -> None:
    assert not state.running_instances()
    assert _live_instances(state.job_id) == []
    from tasks.embedded_bucket import agent_reports, stray_objects
    from tasks.job_resources import job_leftovers

    assert job_leftovers(state.job_id) == []  # no security group, firewall rule or role
    assert stray_objects([s.job_id for s in js.JobStore().list()]) == []  # nothing outside the jobs' prefixes
    reports = agent_reports(state.job_id)  # in the job's bucket, where its instances wrote them
    # a stopped generation's last report: its instance's
    pids = [(r["instance_id"], pid) for r in reports for d in (r, r.get("previous") or {})
            for pid in d.get("pids", {}).values()]
    assert pids, "the agents reported no workers"
    assert not [p for i, p in pids if host_pid(i, p)], "a worker process outlived the job"


def test_two_preemptions_end_with_the_loss_of_an_uninterrupted_run(prefect_api, tmp_path, sailor_cli):
    from flows.train_job import train_job
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.runtime.launch import launch_local

    from tasks.reporting import add_event_listener, remove_event_listener

    steps, budget = 30, 0.05
    events = []
    add_event_listener(events.append)
    try:
        summary = train_job(model="tiny", budget_usd=budget, steps=steps, preempt_at_steps=[5, 15],
                            checkpoint_every_steps=5, global_batch_size=64, cloud="embedded", max_gpus=2,
                            max_gpus_per_zone=1, job_id="tiny-two-preemptions")
    finally:
        remove_event_listener(events.append)
    state = js.JobStore().load(summary["job_id"])
    _assert_the_run_tells_what_happened(prefect_api, summary, events)
    assert summary["status"] == "succeeded", summary
    assert summary["preemptions"] == 2 and summary["replans"] == 2
    assert summary["steps"] == steps
    assert summary["instances_left_running"] == 0
    assert 0 < summary["usd_spent"] <= budget
    assert [i.end_reason for i in state.instances].count("preempted") == 2
    assert all(r.at_step > 0 for r in state.replans[1:]), "each recovery resumed from a checkpoint"
    _assert_nothing_left(state)
    _assert_tensorboard_tells_one_run(state, steps)
    assert_the_logs_outlive_the_instances(sailor_cli, state)  # `sailor logs`, instances gone
    _assert_a_new_shell_reaches_the_job(state, tmp_path / "export")

    # The same samples, uninterrupted, on local processes under the plan the job ended with.
    data = settings.sailor_home() / "data" / "synthetic-tiny-seed0.npy"
    ref = launch_local(plan_from_dict(state.plan), steps, data=data, seed=0, workdir=tmp_path / "ref")
    assert ref.status == "ok", ref.message
    assert summary["final_loss"] == pytest.approx(ref.losses[-1], rel=1e-5, abs=1e-6)
    job_losses = dict(state.losses)
    for step, loss in zip(ref.steps, ref.losses):
        assert job_losses[step] == pytest.approx(loss, rel=1e-5, abs=1e-6), f"step {step}"


def _assert_a_new_shell_reaches_the_job(state: js.JobState, out: Path) -> None:
    """From a process with no environment but the Sailor home: the job's status, and its export from
    the checkpoints in the embedded cloud's buckets (on disk; this process's cloud is not asked)."""
    sailor = str(Path(sys.executable).parent / "sailor")
    env = {"PATH": os.environ["PATH"], "HOME": str(out.parent), "SAILOR_HOME": str(settings.sailor_home())}
    status = subprocess.run([sailor, "status", state.job_id, "--json"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["last_checkpoint_step"] == state.last_checkpoint_step
    done = subprocess.run([sailor, "export", state.job_id, "--out", str(out), "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["step"] == state.steps_done and (out / "model.safetensors").is_file()


def _assert_tensorboard_tells_one_run(state: js.JobState, steps: int) -> None:
    """The job's event files (from its bucket, read by TensorBoard's own reader): one step axis over
    its three attempts, every metric at every step, the attempts and preemptions marked."""
    from infra.config import embedded_endpoints
    from tasks.embedded_bucket import EMBEDDED_BUCKET
    from sailor_core.runtime.trackers import ATTEMPTS_RUN
    from tests.runtime.test_trackers import STEP_TAGS, read_tensorboard

    # TensorBoard's own S3 file system (boto3), told the embedded endpoint as a user is (`sailor status`)
    # (and the embedded account's keys: every request is checked, and another test of this worker
    # process may have left other keys in the environment)
    saved = {k: os.environ.get(k) for k in ("S3_ENDPOINT", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    ends = embedded_endpoints()
    key_id, secret = ends["aws_keys"]
    os.environ.update(S3_ENDPOINT=ends["aws_endpoint"], AWS_REGION="us-east-1", AWS_ACCESS_KEY_ID=key_id,
                      AWS_SECRET_ACCESS_KEY=secret)
    import boto3

    boto3.DEFAULT_SESSION = None  # TensorBoard's reader uses boto3's default session, which keeps the first keys it read
    try:
        url = f"s3://{EMBEDDED_BUCKET}/{state.job_id}/tensorboard"
        acc, flow = read_tensorboard(url), read_tensorboard(f"{url}/{ATTEMPTS_RUN}")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        boto3.DEFAULT_SESSION = None
    for tag in [t for t in STEP_TAGS if not t.startswith("memory/")] + ["memory/peak_bytes_rank0"]:
        assert [e.step for e in acc.Scalars(tag)] == list(range(1, steps + 1)), tag
    assert [e.value for e in acc.Scalars("events/attempt")] == [1, 2, 3]
    assert len(acc.Scalars("events/preemption")) == 2
    assert [e.step for e in acc.Scalars("val/loss")] == [steps] and acc.Scalars("val/perplexity")
    # the flow's own marks: spend, preemptions so far
    assert [e.value for e in flow.Scalars("attempt/number")] == [1, 2, 3]
    assert [e.value for e in flow.Scalars("attempt/preemptions")] == [0, 1, 2]
    assert [e.step for e in flow.Scalars("attempt/number")] == [r.at_step for r in state.replans]


def _assert_the_run_tells_what_happened(prefect_api: str, summary: dict, events: list) -> None:
    """Named after its job, its link kept, the recovery said as it happened, every INFO line on the server."""
    import urllib.request

    assert events[0].kind == "run" and events[0].url == summary["flow_run_url"]
    assert summary["flow_run_url"].endswith(f"/runs/flow-run/{summary['flow_run_id']}")
    said = [e.text for e in events if e.kind == "event"]
    order = ["planned on", "provisioning", "training: attempt 1 started", "spot preemption took", "newest checkpoint",
             "re-planned on", "training: attempt 2 resumed from step", "training: attempt 3 resumed from step",
             "succeeded"]
    at = [next((i for i, text in enumerate(said) if what in text), None) for what in order]
    assert None not in at and at == sorted(at), said
    with urllib.request.urlopen(f"{prefect_api}/flow_runs/{summary['flow_run_id']}", timeout=30) as resp:
        run = json.loads(resp.read())
    assert run["name"] == summary["job_id"] == run["parameters"]["job_id"]
    body = json.dumps({"logs": {"flow_run_id": {"any_": [summary["flow_run_id"]]}, "level": {"ge_": 20, "le_": 20}}})
    deadline = time.monotonic() + 30  # the run's last lines reach the server in a batch
    while True:
        req = urllib.request.Request(f"{prefect_api}/logs/filter", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            infos = [lg["message"] for lg in json.loads(resp.read())]
        if any(m.startswith(f"job {summary['job_id']}: succeeded") for m in infos) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert any(m.startswith(f"job {summary['job_id']}: spot preemption took") for m in infos), infos


# ~90 s of instance time by design: slow; the stop's decisions are tested fast in tests/controller/test_controller.py
# and test_replay_accounting.py
@pytest.mark.slow
def test_a_job_whose_budget_runs_out_stops_cleanly(prefect_api):
    from flows.train_job import train_job
    from sailor_core.catalog.instances import catalog_offers

    # Enough for ~90 s of the cheapest single-GPU instance: it boots Sailor's wheel from the bucket,
    # starts its workers (torch's import alone takes 10 s on a loaded 2-core machine), trains, and must
    # stop in time (the controller keeps ~20 s for the stop and the shutdown).
    cheapest = min(o.spot_usd_per_hr for o in catalog_offers() if o.gpus_per_node == 1)
    budget = cheapest * 90.0 / 3600.0
    summary = train_job(model="tiny", budget_usd=budget, steps=100_000, checkpoint_every_steps=5,
                        global_batch_size=8, cloud="embedded", max_gpus=1, max_gpus_per_zone=1)
    state = js.JobStore().load(summary["job_id"])
    assert summary["status"] == "stopped_budget", summary
    assert "budget" in summary["status_reason"]
    assert 0 < summary["steps"] < 100_000
    assert summary["usd_spent"] <= budget
    assert state.ledger().spent_usd(state.updated_unix_s) <= budget
    assert summary["instances_left_running"] == 0
    _assert_nothing_left(state)


@pytest.mark.slow
def test_an_interrupted_flow_run_is_continued_by_the_next_one(prefect_api):
    """The flow process is interrupted mid-training (Ctrl-C in the flow's thread): its instances are
    terminated, the job is left `cancelled`; a new flow run with the same job id continues it from the
    last checkpoint, with the spend carried over, and finishes it."""
    import _thread
    import threading
    import time

    from prefect.exceptions import CancelledRun

    from flows.train_job import train_job

    # Long enough that the job is still training when the interrupt lands (on a quiet machine
    # tiny runs 20 steps before the flow has even noticed the sixth).
    job_id, steps = "tiny-restart-test", 60
    params = dict(model="tiny", budget_usd=0.05, steps=steps, checkpoint_every_steps=2, global_batch_size=64,
                  cloud="embedded", max_gpus=1, max_gpus_per_zone=1, job_id=job_id)
    store = js.JobStore()

    def interrupt_when_training() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if store.exists(job_id) and store.load(job_id).steps_done >= 4:
                _thread.interrupt_main()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=interrupt_when_training, daemon=True)
    watcher.start()
    with pytest.raises(CancelledRun):  # stopped at once: the run ends Cancelled, not Crashed
        train_job(**params)
    first = store.load(job_id)
    assert first.status == js.CANCELLED and not first.running_instances()
    assert _live_instances(job_id) == []
    spent_before = first.usd_spent(first.updated_unix_s)

    summary = train_job(**params)
    state = store.load(job_id)
    assert summary["status"] == "succeeded" and summary["steps"] == steps
    assert state.num_flow_runs == 2 and state.attempt == 2
    assert state.replans[1].at_step > 0, "the second flow run resumed from a checkpoint"
    assert state.replans[1].reason.startswith("a new flow run picked the job up")
    assert summary["usd_spent"] > spent_before
    _assert_nothing_left(state)


# ~55 s; the default run checks that the job's rules decide the rendezvous in tests/infra/test_faithful_cloud.py
@pytest.mark.slow
def test_a_plan_across_two_clouds_meets_at_public_addresses_through_the_jobs_rules(prefect_api):
    """One T4 in AWS's us-east-1a and one in GCP's us-central1-a: the plan spans two clouds, so the
    workers meet at their public addresses, each cloud's rule opened to exactly the peers; in the
    embedded cloud's network namespaces (CI runs as root) nothing else would let them reach each other."""
    import ipaddress

    from flows.train_job import train_job
    from infra.config import embedded_endpoints
    from sailor_core.job.protocol import read_assignment

    assert embedded_endpoints()["network"] == "netns", "the instances' own namespaces are needed here (root)"
    steps = 4  # a batch of 1024: compute outweighs the slow link between the clouds, so the plan uses both
    summary = train_job(model="tiny", budget_usd=0.05, steps=steps, checkpoint_every_steps=2, global_batch_size=1024,
                        validation_fraction=0.0, validate_every_steps=0, cloud="embedded", gpus=("T4",), zones=("us-east-1a", "us-central1-a"), max_gpus=2,
                        max_gpus_per_zone=1, job_id="tiny-two-clouds")
    state = js.JobStore().load(summary["job_id"])
    assert summary["status"] == "succeeded" and summary["steps"] == steps, summary
    assert {(r.cloud, r.zone) for r in state.instances} == {("aws", "us-east-1a"), ("gcp", "us-central1-a")}
    jobs_url = state.spec.checkpoint_url.rsplit("/checkpoints", 1)[0]
    assigned = [read_assignment(jobs_url, r.instance_id) for r in state.instances]
    masters = {a.master_addr for a in assigned if a is not None and a.master_addr}
    assert len(masters) == 1, assigned
    master = ipaddress.ip_address(masters.pop())
    assert master in ipaddress.ip_network("100.64.0.0/10"), f"{master}: not a public address of the embedded cloud"
    _assert_nothing_left(state)


# ~60 s (three instances, one preempted)
@pytest.mark.slow
def test_while_the_next_plans_instance_boots_the_survivor_trains_on_its_own(prefect_api):
    """The job's floor needs both T4s; one is preempted.  The next plan needs a new instance, and
    while it boots the survivor trains on an interim plan of its own (its worker kept, no injected
    preemption), which stops with a checkpoint; the next attempt resumes from it on the survivor's
    parked worker and the new instance."""
    from flows.train_job import train_job
    from tasks.reporting import add_event_listener, remove_event_listener

    said: list[str] = []
    add_event_listener(on_event := lambda e: said.append(e.text))
    try:
        summary = train_job(model="tiny", budget_usd=0.05, steps=12, preempt_at_steps=[4], checkpoint_every_steps=2,
                            global_batch_size=1024, validation_fraction=0.0, validate_every_steps=0,
                            min_throughput_samples_per_s=20000.0, cloud="embedded", gpus=("T4",),
                            zones=("us-central1-a", "us-central1-b", "us-central1-c"), max_gpus=2,
                            max_gpus_per_zone=1, job_id="tiny-interim")
    finally:
        remove_event_listener(on_event)
    state = js.JobStore().load(summary["job_id"])
    # The interim trained on until the new instance's standby worker was ready, not just its VM.
    first, waited, stopped = (next(i for i, t in enumerate(said) if t.startswith(w))
                              for w in ("interim: ", "waited ", "interim stopped at step"))
    assert first < waited < stopped and said[waited].endswith("of 1 new instance: 1 of 1 ready"), said
    assert summary["status"] == "succeeded" and summary["steps"] == 12, summary
    reasons = [r.reason for r in state.replans]
    interims = [i for i, r in enumerate(state.replans) if r.reason.startswith("interim: ")]
    assert len(interims) == 1 and 0 < interims[0] < len(state.replans) - 1, reasons
    interim, after = state.replans[interims[0]], state.replans[interims[0] + 1]
    assert sum(len(s["replicas"]) for s in interim.plan["stages"]) == 1, interim.plan
    assert sum(len(s["replicas"]) for s in after.plan["stages"]) == 2, after.plan
    assert after.at_step >= interim.at_step and after.at_step == after.steps_done_before, state.replans
    assert after.num_ranks == 2 and after.num_ranks_rejoined == 1 and after.num_ranks_standby == 1, state.replans
    assert state.injected_preemption_steps == (4,) and len(state.instances) == 3, state.instances
    _assert_nothing_left(state)


# ~80 s (a 10 s wait for capacity)
@pytest.mark.slow
def test_an_interim_whose_next_plan_finds_no_capacity_stops_and_the_job_waits(prefect_api):
    """The next plan's new instance finds no capacity while the survivor trains on its interim:
    the interim stops with a checkpoint (its worker parks), the flow waits and plans again, and
    the job finishes once capacity is back; nothing is left running."""
    from flows.train_job import train_job
    from infra.config import in_process_cloud
    from tasks.reporting import add_event_listener, remove_event_listener

    cloud, zones, said, at_wait = in_process_cloud(), ("us-central1-a", "us-central1-b", "us-central1-c"), [], []

    def on_event(e):
        said.append(e.text)
        if e.kind == "event" and e.text.startswith("interim: ") and not any("no capacity" in t for t in said):
            for z in zones:  # no room but for the survivor (zone failover would find some elsewhere)
                cloud.set_capacity("T4", z, 1 if z == zones[0] else 0)
        if e.kind == "event" and e.text.startswith("no capacity"):
            for z in zones:
                cloud.set_capacity("T4", z, None)
            at_wait.append(js.JobStore().load("tiny-interim-nocap"))  # as saved for the wait

    add_event_listener(on_event)
    try:
        summary = train_job(model="tiny", budget_usd=0.05, steps=12, preempt_at_steps=[4], checkpoint_every_steps=2,
                            global_batch_size=1024, validation_fraction=0.0, validate_every_steps=0,
                            min_throughput_samples_per_s=20000.0, cloud="embedded", gpus=("T4",), zones=zones,
                            max_gpus=2, max_gpus_per_zone=1, job_id="tiny-interim-nocap")
    finally:
        remove_event_listener(on_event)
        for z in zones:
            cloud.set_capacity("T4", z, None)
    state = js.JobStore().load(summary["job_id"])
    assert summary["status"] == "succeeded" and summary["steps"] == 12, (summary, said)
    first = next(i for i, t in enumerate(said) if t.startswith("interim: "))
    stopped = next(i for i, t in enumerate(said) if t.startswith("interim stopped at step"))
    waited = next(i for i, t in enumerate(said) if t.startswith("no capacity"))
    assert first < stopped < waited, said
    # The job waits with the interim in its history: its attempt, and the checkpoint it stopped at
    # (the interim may even finish the job while the launch fails).
    saved = at_wait[0]
    stopped_at = int(said[stopped].rsplit("step ", 1)[1])
    assert saved.replans[-1].reason.startswith("interim: ") and saved.last_checkpoint_step == stopped_at, saved
    assert [r.attempt for r in state.replans] == list(range(1, len(state.replans) + 1)), state.replans
    _assert_nothing_left(state)


# ~50 s (two instances, one preempted): the agent and worker side are tested fast in
# tests/runtime/test_parked_workers.py.  The survivor parks only if the preempted rank lives until
# the stop is agreed: the step in flight must fit the preemption notice.  The embedded cloud's 2 s
# did not on a machine loaded to ~20 (a step ~4.5 s): the survivor exited 77 and attempt 2 started
# a new process from the checkpoint before (docs/engine.md, "Parked workers"), the product as
# designed.  A real spot notice is 30-120 s: this test gives the preempted instance 30 s, so what it
# checks does not depend on how fast the machine steps.
SURVIVORS_NOTICE_S = 30.0
@pytest.mark.slow
def test_the_survivors_of_a_preemption_train_on_in_their_own_processes(prefect_api):
    """A plan over two instances loses one: the flow stops the attempt, the survivor's worker parks
    and is handed the next attempt, keeping its process and its state (the job's event says so);
    no worker outlives the job."""
    from flows.train_job import train_job
    from tasks.reporting import add_event_listener, remove_event_listener

    from infra.config import in_process_cloud

    events = []
    cloud = in_process_cloud()  # the flow's own: its notice counts from the next preemption on
    saved = cloud.notice_s, cloud.machines.notice_s
    cloud.notice_s = cloud.machines.notice_s = SURVIVORS_NOTICE_S
    add_event_listener(events.append)
    try:  # a batch of 1024: the plan uses both T4s
        summary = train_job(model="tiny", budget_usd=0.05, steps=12, preempt_at_steps=[4], checkpoint_every_steps=2,
                            global_batch_size=1024, validation_fraction=0.0, validate_every_steps=0,
                            cloud="embedded", gpus=("T4",), zones=("us-central1-a", "us-central1-b"), max_gpus=2,
                            max_gpus_per_zone=1, job_id="tiny-survivors")
    finally:
        remove_event_listener(events.append)
        cloud.notice_s, cloud.machines.notice_s = saved
    state = js.JobStore().load(summary["job_id"])
    assert summary["status"] == "succeeded" and summary["steps"] == 12, summary
    said = [e.text for e in events if e.kind == "event"]
    first = next(t for t in said if t.startswith("training: attempt 1 started"))
    assert "(2 of 2 ranks in standby workers)" in first, said  # the new instances' agents started them at boot
    kept = [t for t in said if t.startswith("training: attempt 2 resumed")]
    assert state.replans[-1].num_ranks == 1 and len(state.instances) == 2, state.replans
    assert kept and "1 of 1 ranks kept their processes; rank 0 state kept in memory" in kept[0], (said, state.replans)
    assert state.replans[-1].state_from == "memory" and state.replans[-1].ready_s < state.replans[0].ready_s
    _assert_the_recovery_is_task_runs(prefect_api, summary["flow_run_id"])
    _assert_nothing_left(state)


def _assert_the_recovery_is_task_runs(prefect_api: str, flow_run_id: str) -> None:
    """The recovery's steps are the flow run's task runs on the server (the UI's run graph): after the
    first attempt's watch, the survivors' stop, the decision and the assignment, each completed."""
    import urllib.request

    body = json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}, "sort": "EXPECTED_START_TIME_ASC"}).encode()
    want = [(name, "COMPLETED") for name in ("watch-attempt", "stop-workers", "decide", "assign-workers",
                                             "watch-attempt")]
    deadline = time.monotonic() + 30  # the server records task runs from their events, in batches
    while True:
        req = urllib.request.Request(f"{prefect_api}/task_runs/filter", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            runs = [(r["name"].rsplit("-", 1)[0], r["state_type"]) for r in json.loads(resp.read())]
        steps = [run for run in runs if run[0] in {name for name, _ in want}]
        names = [name for name, _ in steps]
        got = steps[names.index("watch-attempt"):][:len(want)] if "watch-attempt" in names else []
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert got == want, runs
