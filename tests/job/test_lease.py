"""The job lease's rules: who may take a job, which jobs the watch re-submits, the document's round trip."""

from __future__ import annotations

import pytest

from sailor_core.errors import InputError
from sailor_core.job import lease as jl
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec


def _lease(owner="run-a", renewed=100.0, ttl=60.0, **kw) -> jl.JobLease:
    return jl.take(job_id="j", owner=owner, host="m1", ttl_s=ttl, now_unix_s=renewed, **kw)


def test_a_free_expired_released_or_own_lease_is_taken():
    assert jl.may_take(None, "run-b", 0.0) == jl.TAKE
    assert jl.may_take(_lease(), "run-b", 161.0) == jl.TAKE  # expired at 160
    assert jl.may_take(jl.released(_lease(), 120.0), "run-b", 121.0) == jl.TAKE
    assert jl.may_take(_lease(), "run-a", 120.0) == jl.TAKE


def test_a_live_lease_is_waited_out_unless_its_holder_renews_it():
    held = _lease()
    assert jl.may_take(held, "run-b", 130.0) == jl.WAIT
    assert jl.may_take(held, "run-b", 150.0, first_seen=held) == jl.WAIT  # not renewed since: maybe dead
    assert jl.may_take(jl.renewed(held, 145.0), "run-b", 150.0, first_seen=held) == jl.YIELD  # alive
    assert jl.may_take(_lease(owner="run-c", renewed=140.0), "run-b", 150.0, first_seen=held) == jl.YIELD
    assert jl.may_take(held, "run-b", 160.0, first_seen=held) == jl.TAKE  # never renewed: dead


def test_the_watch_resubmits_only_unended_deployment_jobs_whose_lease_expired():
    spec = JobSpec(budget_usd=1.0)
    running = js.with_status(js.new_job(spec, "a"), js.RUNNING)
    ended = js.with_status(js.new_job(spec, "b"), js.CANCELLED)
    dep = dict(deployment="train-job/train-job", run_parameters={"cloud": "embedded"})
    jobs = [(running, _lease(**dep)), (ended, _lease(**dep)), (running, _lease()), (running, None),
            (running, jl.released(_lease(**dep), 100.0))]
    assert jl.takeover_candidates(jobs, 159.0, js.ENDED_STATUSES) == []
    assert jl.takeover_candidates(jobs, 161.0, js.ENDED_STATUSES) == [jobs[0]]
    # One re-submission per dead controller: the key names it.
    assert jl.takeover_key(_lease()) != jl.takeover_key(_lease(owner="run-b"))
    assert jl.takeover_key(_lease()) == jl.takeover_key(jl.renewed(_lease(), 130.0))


def test_the_lease_document_round_trips_through_the_store(tmp_path):
    store = js.JobStore(str(tmp_path))
    assert store.load_lease("j") is None
    lease = _lease(deployment="train-job/train-job", run_parameters={"cloud": "embedded", "max_gpus_per_zone": 2})
    store.save_lease(lease)
    assert store.load_lease("j") == lease
    with pytest.raises(InputError, match="corrupt job lease"):
        jl.lease_from_json(b"[1]")
    with pytest.raises(InputError, match="version"):
        jl.lease_from_json(b'{"version": 99}')
    with pytest.raises(InputError, match="more than 0 s"):
        _lease(ttl=0)
