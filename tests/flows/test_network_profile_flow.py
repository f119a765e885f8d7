"""The network-profile flow under a real Prefect server, on the embedded local cloud.

Real parts: moto's EC2 server / the GCE fake rent the instances, each instance's startup script
runs the agent, the agents run the profiler's gloo workers, which rendezvous between the
instances; the fit and the saved file are the profiler's.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from infra.local.confine import host_pid
from sailor_core.job import state as js

pytestmark = pytest.mark.e2e

FAST = dict(cloud="embedded", max_mib=1, reps=2, timeout_s=60.0)


def _live_instances(job_id: str) -> list:
    from infra.config import embedded_endpoints
    from infra.local.cloud import providers_for
    from infra.records import job_labels

    ends = embedded_endpoints()
    return [i for p in providers_for(ends["aws_endpoint"], ends["gce_endpoint"], aws_keys=ends["aws_keys"]).values()
            for i in p.query_instances(job_labels(job_id)) if i.live]


def _assert_nothing_left(job_id: str, *, expect_workers: bool = True) -> None:
    state = js.JobStore().load(job_id)
    assert not state.running_instances()
    assert _live_instances(job_id) == []
    from tasks.embedded_bucket import agent_reports
    from tasks.job_resources import job_leftovers

    assert job_leftovers(job_id) == []  # no firewall rule, security group or role
    reports = agent_reports(job_id)  # in the job's bucket, where its instances wrote them
    pids = [(r["instance_id"], pid) for r in reports for pid in r.get("pids", {}).values()]
    if expect_workers:
        assert pids, "the agents reported no workers"
    assert not [p for i, p in pids if host_pid(i, p)], "a worker process outlived the profile"


def test_two_instances_in_one_zone_give_a_saved_profile_and_leave_nothing_running(prefect_api):
    from flows.network_profile_flow import network_profile_flow
    from sailor_core.network.model import Endpoint, default_network

    out = network_profile_flow(gpu="T4", zone="us-central1-a", workers=2, save=True, **FAST)
    assert out["mode"] == "embedded" and out["device"] == "cpu"
    assert out["instances_left_running"] == 0 and len(out["instances"]) == 2
    assert out["instance_types"] == ["n1-standard-4-t4x1"]
    saved = json.loads(Path(out["saved_to"]).read_text())
    assert Path(out["saved_to"]).name == "us-central1-a-T4--us-central1-a-T4.json"
    assert "embedded cloud" in saved["source"]
    points = saved["p2p_points"]
    assert [b for b, _ in points] == [2**16, 2**18, 2**20]
    # Loopback between two local processes: well above 10 MB/s, below 100 GB/s; each point positive.
    bws = [b / t for b, t in points]
    assert all(1e7 < bw < 1e11 for bw in bws), bws
    assert saved["allreduce_points"]["2"] and len(saved["allreduce_points"]["2"]) == 3
    # The planner's network now uses the measured link for that zone and GPU.
    net = default_network()
    e = Endpoint(zone="us-central1-a", gpu="T4")
    t = net.p2p_time_s(2**20, e, Endpoint(zone="us-central1-a", gpu="T4"))
    assert t == pytest.approx(dict(points)[2**20], rel=max(0.05, saved["max_rel_error"] * 1.5))
    state = js.JobStore().load(out["job_id"])
    assert state.status == js.SUCCEEDED and len(state.instances) == 2
    assert all(r.end_reason == "terminated" for r in state.instances)
    assert out["usd_spent"] > 0
    _assert_nothing_left(out["job_id"])
    # The rows are a table artifact on the Prefect server.
    key = "network-us-central1-a-us-central1-a-t4"
    req = urllib.request.Request(f"{prefect_api}/artifacts/filter", method="POST",
                                 headers={"Content-Type": "application/json"}, data=json.dumps({"artifacts": {"key": {"any_": [key]}}}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        artifacts = json.loads(resp.read())
    assert artifacts and artifacts[0]["type"] == "table"
    rows = json.loads(artifacts[0]["data"]) if isinstance(artifacts[0]["data"], str) else artifacts[0]["data"]
    assert [r["bytes"] for r in rows] == [2**16, 2**18, 2**20]


@pytest.mark.slow  # ~20 s; the flow in one zone is the default run's (test_two_instances_in_one_zone_...)
def test_cross_zone_records_both_zones_and_is_not_saved_from_the_embedded_cloud_unless_asked(prefect_api):
    from flows.network_profile_flow import network_profile_flow
    from sailor_core.network._data import user_network_dir

    before = sorted(user_network_dir().glob("*.json")) if user_network_dir().is_dir() else []
    out = network_profile_flow(gpu="T4", zone="us-central1-a", dst_zone="us-central1-b", workers=3, **FAST)
    state = js.JobStore().load(out["job_id"])
    assert sorted(r.zone for r in state.instances) == ["us-central1-a", "us-central1-a", "us-central1-b"]
    fits = out["profile"]["fits"]
    assert list(fits) == ["us-central1-a"] and list(fits["us-central1-a"]["T4"]["1"]) == ["us-central1-b"]
    assert list(out["profile"]["allreduce_points"]) == ["3"]
    # The embedded cloud's figures are this machine's loopback: by default they must not stand in
    # for the named zones in the planner's network.
    assert out["saved_to"] is None
    assert (sorted(user_network_dir().glob("*.json")) if user_network_dir().is_dir() else []) == before
    _assert_nothing_left(out["job_id"])


def test_no_capacity_or_no_quota_is_one_line_and_leaves_nothing(prefect_api):
    from flows.network_profile_flow import network_profile_flow
    from infra.config import in_process_cloud
    from infra.errors import CapacityError
    from infra.local.faults import FaultRates

    cloud = in_process_cloud()
    cloud.set_capacity("T4", "us-central1-c", 0)
    try:
        with pytest.raises(CapacityError) as info:
            network_profile_flow(gpu="T4", zone="us-central1-a", dst_zone="us-central1-c", job_id="netprof-nocap",
                                 **FAST)
    finally:
        cloud.set_capacity("T4", "us-central1-c", None)
    msg = str(info.value)
    assert "\n" not in msg and "us-central1-c" in msg and "capacity" in msg.lower(), msg
    assert js.JobStore().load("netprof-nocap").status == js.FAILED
    # rank 0's instance in us-central1-a was rented first, then given back when rank 1 found none
    assert "us-central1-a n1-standard-4-t4x1 x1: ok" in msg, msg
    _assert_nothing_left("netprof-nocap", expect_workers=False)

    cloud.set_faults(FaultRates(quota=1.0))
    try:
        with pytest.raises(CapacityError) as info:  # the provisioner's ProvisionError names the quota
            network_profile_flow(gpu="T4", zone="us-east-1a", job_id="netprof-noquota", **FAST)
    finally:
        cloud.set_faults(FaultRates())
    msg = str(info.value)
    assert "\n" not in msg and "us-east-1a" in msg and "quota" in msg.lower(), msg
    _assert_nothing_left("netprof-noquota", expect_workers=False)


@pytest.mark.slow  # ~8 s; the default run covers failures with the no-capacity/quota and Ctrl-C tests
def test_a_worker_failure_fails_the_run_with_its_log_line_and_terminates(prefect_api):
    from flows.network_profile_flow import network_profile_flow
    from tasks import net_profiling

    # CUDA on instances that are CPU processes: the workers fail at start, after the instances are up.
    with pytest.raises(net_profiling.NetworkProfilingError) as info:
        network_profile_flow(gpu="T4", zone="us-central1-a", workers=2, device="cuda", job_id="netprof-fail",
                             **FAST)
    msg = str(info.value)
    assert "\n" not in msg and "failed with exit code" in msg, msg
    assert js.JobStore().load("netprof-fail").status == js.FAILED
    _assert_nothing_left("netprof-fail")


@pytest.mark.slow  # ~6 s: keeps the default run of this area under a minute
def test_the_deadline_stops_the_run_and_terminates(prefect_api):
    from flows.network_profile_flow import network_profile_flow
    from tasks.net_profiling import NetworkProfilingError

    with pytest.raises(NetworkProfilingError, match="did not finish within 1 s"):
        network_profile_flow(gpu="T4", zone="us-central1-a", workers=2, job_id="netprof-timeout",
                             **{**FAST, "timeout_s": 1.0})
    assert js.JobStore().load("netprof-timeout").status == js.FAILED
    _assert_nothing_left("netprof-timeout", expect_workers=False)


def test_ctrl_c_after_the_launch_terminates_the_instances(prefect_api):
    from flows.network_profile_flow import network_profile_flow
    from tasks import net_profiling

    def interrupt(msg: dict) -> None:
        if msg["event"] == "launched":  # the instances are up and recorded: the worst moment to stop
            raise KeyboardInterrupt

    net_profiling.add_progress_listener(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            network_profile_flow(gpu="T4", zone="us-central1-a", workers=2, job_id="netprof-ctrl-c", **FAST)
    finally:
        net_profiling.remove_progress_listener(interrupt)
    state = js.JobStore().load("netprof-ctrl-c")
    assert state.status == js.CANCELLED and len(state.instances) == 2
    _assert_nothing_left("netprof-ctrl-c", expect_workers=False)


@pytest.mark.slow  # ~15 s
def test_a_preempted_instance_fails_the_run_with_that_reason_and_terminates(prefect_api):
    from flows.network_profile_flow import network_profile_flow
    from infra.config import in_process_cloud
    from tasks import net_profiling

    cloud = in_process_cloud()

    def preempt_rank1(msg: dict) -> None:
        if msg["event"] == "p2p":  # measuring: both ranks are up
            net_profiling.remove_progress_listener(preempt_rank1)
            state = js.JobStore().load("netprof-preempted")
            victim = sorted(state.instances, key=lambda r: r.instance_id)[-1].instance_id
            assert cloud.preempt(victim)

    net_profiling.add_progress_listener(preempt_rank1)
    try:
        with pytest.raises(net_profiling.NetworkProfilingError, match="is preempted before the profile finished"):
            network_profile_flow(gpu="T4", zone="us-central1-a", workers=2, job_id="netprof-preempted",
                                 **{**FAST, "max_mib": 256, "reps": 20})
    finally:
        net_profiling.remove_progress_listener(preempt_rank1)
    state = js.JobStore().load("netprof-preempted")
    assert state.status == js.FAILED
    assert sorted(r.end_reason for r in state.instances) == ["preempted", "terminated"]
    _assert_nothing_left("netprof-preempted")
