"""The lease keeper (tasks/job_lease.py) on a real store: one controller per job, a dead one's
job taken over once its lease expires, a controller that was taken over notices."""

from __future__ import annotations

import time

import pytest

from sailor_core import settings
from sailor_core.job import lease as jl
from sailor_core.job import state as js
from tasks.job_lease import LeaseKeeper

TTL_S = 2.0


@pytest.fixture
def store(tmp_path, monkeypatch) -> js.JobStore:
    monkeypatch.setenv(settings.JOB_LEASE_S_ENV, str(TTL_S))
    return js.JobStore(str(tmp_path / "jobs"))


def _wait_for(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_a_second_controller_of_a_live_job_yields_and_takes_it_once_released(store):
    a = LeaseKeeper(store, "j", "run-a").acquire()
    with pytest.raises(jl.JobHeldError, match="controlled by flow run run-a"):
        LeaseKeeper(store, "j", "run-b").acquire()  # run-a renews while run-b waits: alive
    a.release()
    assert store.load_lease("j").released
    b = LeaseKeeper(store, "j", "run-b").acquire()
    assert b.took_over_from is None  # released, not taken over
    b.release()


def test_a_dead_controllers_job_is_taken_over_after_its_lease_expires(store):
    dead = LeaseKeeper(store, "j", "run-a", deployment="train-job/train-job").acquire()
    dead._stop.set()  # its machine died: nothing renews the lease any more
    dead._thread.join()
    t0 = time.time()
    b = LeaseKeeper(store, "j", "run-b").acquire()
    assert b.took_over_from is not None and b.took_over_from.owner == "run-a"
    assert time.time() >= b.took_over_from.expires_unix_s
    assert time.time() - t0 < TTL_S + 3.0
    assert store.load_lease("j").owner == "run-b"
    b.release()


def test_a_controller_whose_job_was_taken_over_notices_and_leaves_the_lease_alone(store):
    a = LeaseKeeper(store, "j", "run-a").acquire()
    store.save_lease(jl.take(job_id="j", owner="run-b", host="m2", ttl_s=TTL_S, now_unix_s=time.time()))
    assert _wait_for(lambda: a.lost, TTL_S)
    assert a.lost_to == "run-b"
    a.release()
    held = store.load_lease("j")
    assert held.owner == "run-b" and not held.released
