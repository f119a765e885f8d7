"""`sailor logs`: the agents' and workers' logs of a job, read from its storage after its instances are gone.

The journey runs in ``test_train_job``'s two-preemption job (``assert_the_logs_outlive_the_instances``);
here the storage layout, the tails and the one-line errors."""

from __future__ import annotations

import dataclasses
import re

from sailor_core.job import state as js
from sailor_core.job.logs import LogRef, find_logs, log_tail, read_log, upload
from sailor_core.storage import open_storage


def assert_the_logs_outlive_the_instances(sailor_cli, state: js.JobState) -> None:
    """After the job: every instance's agent and worker logs print, by attempt; --rank/--attempt filter."""
    store = js.JobStore()
    refs = find_logs(store.job_url(state.job_id))
    assert {r.instance_id for r in refs} == {i.instance_id for i in state.instances}
    assert {r.attempt for r in refs} == set(range(1, state.attempt + 1))

    done = sailor_cli("logs", state.job_id)
    assert done.returncode == 0, done.stderr
    headers = re.findall(r"^==> attempt (\d+) (\S+) (agent|rank \d+) <==$", done.stdout, re.M)
    assert len(headers) == len(refs) and [int(a) for a, _, _ in headers] == sorted(int(a) for a, _, _ in headers)
    assert "[sailor worker rank 0] ready to train in" in done.stdout  # a worker's start line
    assert re.search(r"agent \S+: generation \d+ \(attempt 1\): starting ranks 0", done.stdout)
    preempted = [i.instance_id for i in state.instances if i.end_reason == "preempted"]
    sections = dict(re.findall(r"^==> attempt \d+ (\S+) agent <==\n(.*?)(?=^==> |\Z)", done.stdout, re.M | re.S))
    assert preempted and all("SIGTERM (a preemption" in sections[i] for i in preempted)  # their last words

    only = sailor_cli("logs", state.job_id, "--rank", "0", "--attempt", "2")
    assert only.returncode == 0, only.stderr
    assert re.findall(r"^==> .* <==$", only.stdout, re.M) == [
        f"==> attempt 2 {iid} rank 0 <==" for a, iid, who in headers if (a, who) == ("2", "rank 0")]
    assert "[sailor worker rank 0]" in only.stdout
    assert not re.search(r"\[sailor worker rank [1-9]", only.stdout) and "agent " not in only.stdout


def test_an_unknown_job_or_one_without_logs_is_one_line(sailor_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SAILOR_HOME", str(tmp_path))
    unknown = sailor_cli("logs", "no-such-job")
    assert unknown.returncode != 0 and unknown.stdout == ""
    assert unknown.stderr.startswith("error: no job 'no-such-job'") and unknown.stderr.count("\n") == 1
    from sailor_core.job.spec import JobSpec

    js.JobStore().save(js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=2), job_id="quiet"))
    quiet = sailor_cli("logs", "quiet", "--rank", "3")
    assert quiet.returncode != 0 and quiet.stderr.startswith("error: job 'quiet' has no logs of rank 3")


def test_follow_prints_what_there_is_and_returns_once_the_attempt_has_ended(sailor_cli, tmp_path, monkeypatch):
    from sailor_core.job.spec import JobSpec

    monkeypatch.setenv("SAILOR_HOME", str(tmp_path))
    store = js.JobStore()
    state = js.with_status(js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=2), job_id="ended"), js.SUCCEEDED)
    store.save(dataclasses.replace(state, attempt=1))
    log = tmp_path / "rank0.log"
    log.write_text("[sailor worker rank 0] ready to train in 1.00 s (state from init)\n")
    upload(open_storage(store.job_url("ended")), LogRef(attempt=1, instance_id="i-1", rank=0), log)
    done = sailor_cli("logs", "ended", "--follow")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "==> attempt 1 i-1 rank 0 <==\n" + log.read_text()


def test_uploads_keep_each_logs_last_mib_from_a_whole_line(tmp_path):
    path = tmp_path / "rank0.log"
    lines = [f"line {i:07d}\n".encode() for i in range(200_000)]  # 2.6 MB
    path.write_bytes(b"".join(lines))
    job_url = str(tmp_path / "job")
    ref = LogRef(attempt=2, instance_id="i-1", rank=0)
    upload(open_storage(job_url), ref, path)
    upload(open_storage(job_url), LogRef(attempt=2, instance_id="i-1", rank=None), path)
    data = read_log(job_url, ref)
    head, first, *_ = data.split(b"\n", 2)
    assert re.fullmatch(rb"\[\.\.\. \d+ earlier bytes dropped\]", head) and first.startswith(b"line ")
    assert data.endswith(lines[-1]) and len(data) <= (1 << 20) + len(head) + 1
    assert int(re.search(rb"\d+", head).group()) + len(data) - len(head) - 1 == path.stat().st_size
    assert log_tail(path, 1 << 30) == path.read_bytes()
    assert [r.key for r in find_logs(job_url)] == ["logs/attempt-2/i-1/agent.log", "logs/attempt-2/i-1/rank-0.log"]
    assert find_logs(job_url, rank=0) == [ref] and find_logs(job_url, attempt=1) == []
