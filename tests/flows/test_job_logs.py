"""`sailor logs`: the agents' and workers' logs of a job, read from its storage after its instances are gone."""

from __future__ import annotations

import re

import pytest

from sailor_core.job import state as js
from sailor_core.job.logs import find_logs

pytestmark = pytest.mark.e2e


def test_a_jobs_logs_are_printed_after_it_ended_and_filtered_by_rank(prefect_api, sailor_cli):
    from flows.train_job import train_job
    from tests.flows.test_train_job import _live_instances

    summary = train_job(model="tiny", budget_usd=0.05, steps=6, global_batch_size=8, cloud="embedded",
                        max_gpus=2, max_gpus_per_zone=1, job_id="tiny-logs")
    assert summary["status"] == "succeeded", summary
    assert _live_instances("tiny-logs") == []  # the instances are gone; their logs are in the job's storage
    store = js.JobStore()
    state = store.load("tiny-logs")
    refs = find_logs(store.job_url("tiny-logs"))
    assert {r.instance_id for r in refs} == {i.instance_id for i in state.instances}

    done = sailor_cli("logs", "tiny-logs")
    assert done.returncode == 0, done.stderr
    headers = re.findall(r"^==> attempt (\d+) (\S+) (agent|rank \d+) <==$", done.stdout, re.M)
    ranks = sorted({int(who.split()[1]) for _, _, who in headers if who != "agent"})
    assert ranks == list(range(len(ranks))) and ranks, headers  # every rank's log, rank 0 first
    assert "[sailor worker rank 0] ready to train in" in done.stdout  # the worker's start line
    assert re.search(r"agent \S+: generation \d+ \(attempt 1\): starting ranks 0", done.stdout)
    assert re.search(r"rank 0 exited with code 0", done.stdout)

    only = sailor_cli("logs", "tiny-logs", "--rank", "0", "--attempt", "1")
    assert only.returncode == 0, only.stderr
    assert re.findall(r"^==> .* <==$", only.stdout, re.M) == [f"==> attempt 1 {iid} rank 0 <==" for _, iid, who
                                                              in headers if who == "rank 0"]
    assert "[sailor worker rank 0] ready to train in" in only.stdout
    assert not re.search(r"\[sailor worker rank [1-9]", only.stdout) and "agent " not in only.stdout

    unknown = sailor_cli("logs", "no-such-job")
    assert unknown.returncode != 0 and unknown.stdout == ""
    assert unknown.stderr.startswith("error: no job 'no-such-job'") and unknown.stderr.count("\n") == 1
