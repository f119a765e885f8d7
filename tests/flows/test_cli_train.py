"""`sailor train` argument errors, `sailor jobs` and `sailor status` on stored job states (no flow runs here)."""

from __future__ import annotations

import json

import pytest

from sailor_core.job import report
from sailor_core.job import state as js

from sailor_core.job.spec import JobSpec


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SAILOR_HOME", str(tmp_path))
    monkeypatch.delenv("SAILOR_JOBS_URL", raising=False)
    return tmp_path


@pytest.mark.parametrize("args, needle", [
    (["--budget-usd", "-1"], "--budget-usd must be positive"),
    (["--budget-usd", "1", "--steps", "0"], "--steps must be at least 1"),
    (["--budget-usd", "1", "--preempt-at", "3,x"], "--preempt-at takes comma-separated steps like 5,12; 'x' is not"),
    (["--budget-usd", "1", "--preempt-at", "0,3"], "--preempt-at must list steps of at least 1"),
    (["--budget-usd", "1", "--max-usd-per-hour", "-2"], "--max-usd-per-hour must be positive"),  # hidden alias
    (["--budget-usd", "1", "--max-gpus", "0"], "--max-gpus must be at least 1"),
    (["--budget-usd", "1", "--max-gpus-per-zone", "0"], "--max-gpus-per-zone must be at least 1"),
    (["--budget-usd", "1", "--cloud", "moon"], "--cloud must be auto, embedded or real"),
    (["--budget-usd", "1", "--objective", "fast"], "--objective must be throughput or cost"),
    (["--budget-usd", "1", "--data", "nowhere/tokens.bin"], "--data 'nowhere/tokens.bin': no such file"),
    (["--budget-usd", "1", "--dataset", "corpus.txt"], "--dataset must name a .bin, .u32.bin or .npy"),  # hidden alias
    (["--budget-usd", "1", "--data", "ftp://host/t.bin"], "--data must be a path, file://, s3:// or gs://"),
    (["--budget-usd", "1", "--lr", "0"], "--lr must be positive"),
    (["--budget-usd", "1", "--min-lr-ratio", "2"], "--min-lr-ratio must be in [0, 1]"),
    (["--budget-usd", "1", "--val-fraction", "0"], "--validate-every needs held-out samples"),
])
def test_train_rejects_bad_arguments_in_one_line(home, sailor_cli, args, needle):
    r = sailor_cli("train", *args)
    code, err = r.returncode, r.stderr
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def test_jobs_and_status_read_the_persisted_states(home, sailor_cli):
    store = js.JobStore()
    s = js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=10), job_id="tiny-abc")
    url = "http://127.0.0.1:4200/runs/flow-run/0c8e5b2a-1111-2222-3333-444455556666"
    s = js.with_flow_run(s, "0c8e5b2a-1111-2222-3333-444455556666", url)
    s = js.with_plan(s, plan={"model": "tiny"}, reason="start: 1xT4@us-east-1a", usd_per_hr=0.2,
                     throughput_samples_per_s=5.0)
    s = js.with_instances_launched(s, (js.InstanceRecord(
        instance_id="i-1", cloud="aws", zone="us-east-1a", instance_type="g4dn.xlarge", gpu="T4", num_gpus=1,
        usd_per_hr=0.2, spot=True, attempt=1, launched_unix_s=1000.0),))
    s = js.with_instances_ended(s, {"i-1"}, "preempted", now_unix_s=1000.0 + 3600.0)
    s = js.with_plan(s, plan={"model": "tiny"}, reason="preempted: i-1 at step 4", usd_per_hr=0.2,
                     throughput_samples_per_s=5.0)
    s = js.with_status(s, js.STOPPED_BUDGET, "budget: ...")
    store.save(s)

    r = sailor_cli("jobs", "--json")
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)["jobs"]
    assert row["job_id"] == "tiny-abc" and row["status"] == "stopped_budget"
    assert row["attempts"] == 2 and row["preemptions"] == 1 and row["usd_spent"] == pytest.approx(0.2)

    assert row["flow_run_url"] == url and row["started"] and row["started_unix_s"] == s.created_unix_s
    r = sailor_cli("jobs")
    assert r.returncode == 0 and url in r.stdout, r.stdout
    assert report.local_time(s.created_unix_s) in r.stdout

    r = sailor_cli("status", "tiny-abc", "--json")
    assert r.returncode == 0, r.stderr
    detail = json.loads(r.stdout)
    assert [r["reason"] for r in detail["replans"]] == ["start: 1xT4@us-east-1a", "preempted: i-1 at step 4"]
    assert detail["instances"][0]["end_reason"] == "preempted"

    s = js.with_progress(s, steps_done=10, losses=[(9, 5.5), (10, 5.4)], val_losses=[(5, 5.9), (10, 5.6)])
    # the agents said how the second attempt's workers came back (tasks/workers.watch_attempt)
    s = js.with_first_step(s, 1000.0 + 3700.0, num_ranks=2, num_ranks_rejoined=1, ready_s=2.5,
                           state_from="checkpoint")
    store.save(s)
    r = sailor_cli("status", "tiny-abc", "--json")
    detail = json.loads(r.stdout)
    assert detail["final_loss"] == 5.4 and detail["val_loss"] == 5.6 and detail["val_loss_step"] == 10
    assert [(r["num_ranks_rejoined"], r["ready_s"]) for r in detail["replans"]] == [(None, None), (1, 2.5)]
    r = sailor_cli("status", "tiny-abc")
    assert r.returncode == 0 and "val loss 5.6000 (step 10)" in r.stdout, r.stdout
    assert ("preempted: i-1 at step 4 (0.200 USD/h); workers ready in 2.5 s (1 of 2 ranks kept their processes; "
            "rank 0 state read from the checkpoint)") in r.stdout, r.stdout
    assert f"started {report.local_time(s.created_unix_s)}; flow run 0c8e5b2a-1111-2222-3333-444455556666: {url}" in r.stdout

    r = sailor_cli("status", "nope")
    assert r.returncode != 0 and r.stderr.strip() == f"error: no job 'nope' under {home / 'jobs'}"


def test_stop_asks_a_running_job_to_stop_and_refuses_an_ended_one(home, sailor_cli):
    store = js.JobStore()
    store.save(js.with_status(js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=10), job_id="j-run"),
                              js.RUNNING))
    r = sailor_cli("stop", "j-run", "--no-wait")
    assert r.returncode == 0 and "final checkpoint" in r.stdout, r.stderr
    assert store.stop_request("j-run").by == "`sailor stop`"

    store.save(js.with_status(js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=10), job_id="j-done"),
                              js.SUCCEEDED, "10 steps done"))
    r = sailor_cli("stop", "j-done")
    assert r.returncode == 2 and r.stderr == "error: job j-done is not running: succeeded 10 steps done\n"
    assert store.stop_request("j-done") is None


def test_a_continued_job_needs_no_budget_and_refuses_other_settings_in_one_line(home, sailor_cli, monkeypatch):
    from flows.cli import prefect_server

    def nothing_starts(**kw):
        raise AssertionError("a refused command started Prefect")

    monkeypatch.setattr(prefect_server, "configure_prefect_env", nothing_starts)
    js.JobStore().save(js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=600), job_id="j-old"))
    r = sailor_cli("train", "--job-id", "j-old", "--steps", "100")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: --steps 100 is below the job's 600: a continued job may only raise it"]
    r = sailor_cli("train", "--job-id", "j-old", "--lr", "0.5")
    assert r.returncode == 2 and r.stderr.startswith("error: --lr is 0.5 for the job, which keeps the settings") \
        and len(r.stderr.splitlines()) == 1
    r = sailor_cli("train", "--steps", "100")  # a new job still needs its budget
    assert r.returncode == 2 and r.stderr == "error: --budget-usd is required\n"


def test_status_shows_gpu_rent_and_egress_apart(home, sailor_cli):
    from sailor_core.job.protocol import AgentState, AgentStatus

    store = js.JobStore()
    s = js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=10), job_id="tiny-egress")
    s = js.with_instances_launched(s, (js.InstanceRecord(
        instance_id="i-1", cloud="gcp", zone="us-central1-a", instance_type="n1-standard-4-t4", gpu="T4",
        num_gpus=1, usd_per_hr=0.36, spot=True, attempt=1, launched_unix_s=1000.0),))
    s = js.with_instances_ended(s, {"i-1"}, "terminated", now_unix_s=1000.0 + 600.0)
    sent = AgentStatus(instance_id="i-1", generation=1, state=AgentState.EXITED,
                       egress=(("us-central1-a", "us-central1-b", 3e9),))
    s = js.with_egress(s, [sent], usd_per_byte=lambda a, b: 1e-11, now_unix_s=1500.0)
    store.save(s)
    r = sailor_cli("status", "tiny-egress", "--json")
    assert r.returncode == 0, r.stderr
    detail = json.loads(r.stdout)
    assert detail["usd_rent"] == pytest.approx(0.06) and detail["usd_egress"] == pytest.approx(0.03)
    assert detail["usd_spent"] == pytest.approx(0.09)
    assert detail["egress"] == [{"from": "us-central1-a", "to": "us-central1-b", "bytes": 3e9, "usd": pytest.approx(0.03)}]
    r = sailor_cli("status", "tiny-egress")
    assert "(GPU rent 0.0600 USD + egress 0.0300 USD)" in r.stdout, r.stdout
    assert "egress us-central1-a -> us-central1-b: 3.00 GB, 0.0300 USD" in r.stdout, r.stdout


@pytest.mark.parametrize("jobs_url, expected", [
    ("gs://my-bucket/sailor-jobs", "curves: pip install 'sailor[gcs]' (gcsfs), then "
                                   "tensorboard --logdir gs://my-bucket/sailor-jobs/tiny-abc/tensorboard"),
    ("s3://my-bucket/sailor-jobs", "curves: tensorboard --logdir s3://my-bucket/sailor-jobs/tiny-abc/tensorboard"),
])
def test_status_tells_how_tensorboard_reads_a_real_clouds_job(home, monkeypatch, jobs_url, expected):
    # the command tests/runtime/test_tensorboard_gcs.py runs (gs://) and test_train_job.py (s3://)
    from flows.cli.train import _tensorboard_hint

    monkeypatch.setenv("SAILOR_CLOUDS", "real")
    state = js.new_job(JobSpec(model="tiny", budget_usd=0.5, steps=10), job_id="tiny-abc")
    assert _tensorboard_hint(state, js.JobStore(jobs_url)) == [expected]
