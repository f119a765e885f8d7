"""The provider verbs on both clouds: moto's EC2 server and the GCE fake, through the
real boto3 and google-cloud-compute clients."""

from __future__ import annotations

import os
import sys

import pytest

from infra.errors import CapacityError, CloudConfigError, QuotaError, TransientCloudError
from infra.local.faults import FaultRates
from infra.provisioner import GpuNeed, Provisioner
from infra.records import PREEMPTED, RUNNING, job_labels
from tests.infra.conftest import wait_until
from tests.instance_calls import metadata, run_as
from sailor_core.catalog.instances import catalog_offers, offer_for, get_instance_type

# (cloud, a zone, a second zone, a 1-GPU instance type sold in both, its GPU)
CASES = {
    "aws": ("us-east-1a", "us-west-2a", "g4dn.xlarge", "T4"),
    "gcp": ("us-central1-a", "us-west1-b", "n1-standard-4-t4x1", "T4"),
}
PREEMPT_REASON = {"aws": "Server.SpotInstanceTermination", "gcp": "compute.instances.preempted"}
CAPACITY_CODE = {"aws": "InsufficientInstanceCapacity", "gcp": "ZONE_RESOURCE_POOL_EXHAUSTED"}

pytestmark = pytest.mark.parametrize("cloud_name", ["aws", "gcp"])


def group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return False
    except ProcessLookupError:
        return True


def test_offers_come_from_the_cloud_api_priced_from_the_catalog(providers, cloud_name):
    zone, other, itype, gpu = CASES[cloud_name]
    offers = providers[cloud_name].list_offers(gpu_types=["A100-40", gpu])
    assert offers and {o.cloud for o in offers} == {cloud_name}
    assert {o.gpu for o in offers} == {"A100-40", gpu}
    by_key = {(o.zone, o.instance_type): o for o in offers}
    assert (zone, itype) in by_key and (other, itype) in by_key
    assert by_key[(zone, itype)] == offer_for(get_instance_type(cloud_name, itype), zone)
    # Every offer the API returns is also in the catalog for that zone.
    catalog = {(o.zone, o.instance_type) for o in catalog_offers(clouds=[cloud_name])}
    assert set(by_key) <= catalog


def test_spot_launch_labels_wait_query_terminate_no_leaks(cloud, providers, new_providers, cloud_name):
    zone, _, itype, gpu = CASES[cloud_name]
    p = providers[cloud_name]
    labels = job_labels("job-a", 3)
    launched = p.run_instances(zone=zone, instance_type=itype, count=2, labels=labels, spot=True)
    assert len(launched) == 2 and all(i.spot and i.zone == zone and i.gpu == gpu for i in launched)
    ready = p.wait_instances(labels, instance_ids=[i.instance_id for i in launched], timeout_s=10)
    assert {i.state for i in ready} == {RUNNING}
    # State is rediscovered from the cloud by label, by a provider that never launched anything.
    fresh = new_providers()[cloud_name]
    found = fresh.query_instances(job_labels("job-a"))
    assert sorted(i.instance_id for i in found) == sorted(i.instance_id for i in launched)
    assert all(i.labels["sailor-job"] == "job-a" and i.labels["sailor-attempt"] == "3" for i in found)
    # The addresses the machines have: private in the instance's VPC, public for peers outside it.
    assert fresh.get_cluster_info(labels).addresses == {i.instance_id: cloud.network.addresses(i.instance_id).private
                                                        for i in launched}
    assert {i.instance_id: i.public_ip for i in found} == {i.instance_id: cloud.network.addresses(i.instance_id).public
                                                           for i in launched}
    assert fresh.query_instances(job_labels("someone-else")) == []

    ended = fresh.terminate_instances(job_labels("job-a"))
    assert sorted(ended) == sorted(i.instance_id for i in launched)
    assert p.query_instances(job_labels("job-a"), include_ended=False) == []
    assert wait_until(lambda: not [i for i in cloud.live_instances() if i.cloud == cloud_name])


def test_capacity_error_is_translated_and_the_next_zone_is_used(cloud, providers, cloud_name):
    zone, other, itype, gpu = CASES[cloud_name]
    p = providers[cloud_name]
    cloud.set_capacity(gpu, zone, 0)
    with pytest.raises(CapacityError) as info:
        p.run_instances(zone=zone, instance_type=itype, count=1, labels=job_labels("job-c", 0))
    assert info.value.code == CAPACITY_CODE[cloud_name] and info.value.zone == zone
    assert p.num_retries == 0  # capacity fails fast, never retried in place

    offers = [o for o in p.list_offers(gpu_types=[gpu]) if o.instance_type == itype and o.zone in (zone, other)]
    result = Provisioner({cloud_name: p}).provision(
        [GpuNeed(gpu=gpu, zone=zone, num_gpus=1)], job_id="job-c", offers=offers)
    assert [a.offer.zone for a in result.allocations] == [other]
    assert [(h.zone, h.outcome) for h in result.history] == [(zone, "capacity"), (other, "ok")]
    assert CAPACITY_CODE[cloud_name] in result.history[0].message
    Provisioner({cloud_name: p}).teardown("job-c")


def test_a_capacity_drop_reclaims_spot_instances_never_on_demand_ones(cloud, providers, cloud_name):
    zone, _, itype, gpu = CASES[cloud_name]
    p = providers[cloud_name]
    labels = job_labels("job-m", 0)
    (od,) = p.run_instances(zone=zone, instance_type=itype, count=1, labels=labels, spot=False)
    (sp,) = p.run_instances(zone=zone, instance_type=itype, count=1, labels=labels, spot=True)
    assert (od.spot, sp.spot) == (False, True)  # InstanceLifecycle / scheduling.provisioningModel, as the API says
    p.wait_instances(labels, instance_ids=[od.instance_id, sp.instance_id], timeout_s=10)
    assert not cloud.preempt(od.instance_id)  # the control surface's 404: no such live spot instance
    cloud.set_capacity(gpu, zone, 0)  # the zone's capacity falls to nothing: only spot capacity is reclaimed
    assert wait_until(lambda: [i.state for i in p.query_instances(labels) if i.instance_id == sp.instance_id]
                      in ([PREEMPTED], []))
    assert [(i.instance_id, i.state) for i in p.query_instances(labels, include_ended=False)] == [(od.instance_id, RUNNING)]
    assert [e["instance_id"] for e in cloud.preemptions] == [sp.instance_id]
    cloud.set_capacity(gpu, zone, None)
    p.terminate_instances(labels)


def test_throttling_and_server_errors_are_retried(cloud, providers, cloud_name):
    zone, _, itype, _ = CASES[cloud_name]
    p = providers[cloud_name]
    cloud.set_faults(FaultRates(throttle=0.3, server_error=0.2, seed=7))
    labels = job_labels("job-t", 0)
    launched = p.run_instances(zone=zone, instance_type=itype, count=1, labels=labels)
    for _ in range(4):
        assert [i.instance_id for i in p.query_instances(labels)] == [launched[0].instance_id]
    assert cloud.faults.injected["throttle"] + cloud.faults.injected["server_error"] > 0
    assert p.num_retries == cloud.faults.injected["throttle"] + cloud.faults.injected["server_error"], (p.num_retries, cloud.faults.injected)
    cloud.set_faults(FaultRates())
    p.terminate_instances(labels)


def test_quota_and_persistent_errors_surface_as_project_errors(cloud, providers, cloud_name):
    zone, _, itype, _ = CASES[cloud_name]
    p = providers[cloud_name]
    cloud.set_faults(FaultRates(quota=1.0))
    with pytest.raises(QuotaError):
        p.run_instances(zone=zone, instance_type=itype, count=1, labels=job_labels("job-q", 0))
    cloud.set_faults(FaultRates(server_error=1.0))
    with pytest.raises(TransientCloudError):
        p.query_instances(job_labels("job-q"))
    assert p.num_retries == p.retry.max_attempts - 1
    cloud.set_faults(FaultRates())
    assert p.query_instances(job_labels("job-q")) == []


def test_interruption_is_detected_with_the_clouds_reason_and_kills_the_script(cloud, providers, cloud_name, tmp_path,
                                                                              monkeypatch):
    zone, _, itype, _ = CASES[cloud_name]
    p = providers[cloud_name]
    # The "worker": records its identity in its own root (its HOME: a confined instance sees
    # nothing of the host's files), ignores SIGTERM (so the notice period is observable).
    script = (
        "#!/bin/bash\n"
        "echo \"$SAILOR_INSTANCE_ID $SAILOR_ZONE $SAILOR_CLOUD $SAILOR_PRIVATE_IP\" > \"$HOME/seen\"\n"
        "trap 'echo term >> \"$HOME/seen\"' TERM\n"
        "while true; do sleep 0.05; done\n"
    )
    labels = job_labels("job-p", 1)
    (inst,) = p.run_instances(zone=zone, instance_type=itype, count=1, labels=labels, startup_script=script)
    p.wait_instances(labels, timeout_s=10)
    assert wait_until(lambda: cloud.machines.get(inst.instance_id) is not None)
    out = cloud.machines.get(inst.instance_id).root / "seen"
    assert wait_until(lambda: out.exists() and out.read_text().strip())
    assert out.read_text().split() == [inst.instance_id, zone, cloud_name, cloud.network.addresses(inst.instance_id).private]
    machine = cloud.machines.get(inst.instance_id)
    preempted = "computeMetadata/v1/instance/preempted"
    assert metadata(cloud, inst.instance_id, preempted) == (200, "FALSE")
    # the worker's poller, from the instance's address (the metadata server answers only the caller)
    poll = [sys.executable, "-c", "from infra.metadata import preemption_notice; print(preemption_notice())"]
    assert run_as(cloud, inst.instance_id, poll, env={"SAILOR_CLOUD": cloud_name}).stdout.strip() == "None"

    monkeypatch.setattr(cloud, "notice_s", 4.0)  # room for the checks below from the instance's namespace
    assert cloud.preempt(inst.instance_id)
    assert wait_until(lambda: "term" in out.read_text(), 2)  # SIGTERM at the notice
    notice = machine.metadata_dir / "latest/meta-data/spot/instance-action"
    assert '"action": "terminate"' in notice.read_text()
    assert not group_gone(machine.process.pid)  # still alive during the notice period
    assert metadata(cloud, inst.instance_id, preempted) == (200, "TRUE")
    seen_notice = run_as(cloud, inst.instance_id, poll, env={"SAILOR_CLOUD": cloud_name}).stdout.strip()
    assert seen_notice not in ("", "None")  # what the worker's poller sees during the notice
    assert wait_until(lambda: group_gone(machine.process.pid), 8)  # SIGKILL after it
    assert wait_until(lambda: not machine.directory.exists(), 3)  # its disk went with it
    assert wait_until(lambda: [i.state for i in p.query_instances(labels)] == [PREEMPTED], 3)
    (seen,) = p.query_instances(labels)
    assert seen.instance_id == inst.instance_id and seen.state_reason == PREEMPT_REASON[cloud_name]
    assert seen.labels["sailor-attempt"] == "1"
    assert p.query_instances(labels, include_ended=False) == []


def test_wrong_configuration_is_a_config_error(cloud, cloud_name):
    from google.auth.credentials import AnonymousCredentials

    from infra.aws import AWSProvider
    from infra.gcp import GCPProvider

    zone, _, itype, _ = CASES[cloud_name]
    if cloud_name == "aws":
        p = AWSProvider(endpoint_url=cloud.aws_endpoint, ami_id=None, regions=["us-east-1"])
        with pytest.raises(CloudConfigError, match="SAILOR_AWS_AMI"):
            p.run_instances(zone=zone, instance_type=itype, count=1, labels=job_labels("job-x"))
    else:
        with pytest.raises(CloudConfigError, match="project"):
            GCPProvider(project="", api_endpoint=cloud.gce_endpoint, credentials=AnonymousCredentials())


def test_a_launch_is_all_or_nothing(cloud, providers, cloud_name):
    zone, _, itype, gpu = CASES[cloud_name]
    p = providers[cloud_name]
    cloud.set_capacity(gpu, zone, 1)  # room for one of the two
    with pytest.raises(CapacityError):
        p.run_instances(zone=zone, instance_type=itype, count=2, labels=job_labels("job-n", 0))
    assert p.query_instances(job_labels("job-n"), include_ended=False) == []


def test_timeouts_are_transient_and_retried(cloud, cloud_name):
    from google.oauth2.credentials import Credentials

    from infra.aws import AWSProvider
    from infra.gcp import GCPProvider
    from infra.local.cloud import FIXED_AMI, PROJECT, _local_session, admin_gcp_token
    from infra.retry import RetryPolicy

    retry = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02)
    if cloud_name == "aws":
        p = AWSProvider(endpoint_url=cloud.aws_endpoint, ami_id=FIXED_AMI, regions=["us-east-1"], retry=retry,
                        read_timeout_s=0.3, session=_local_session(*cloud.aws_keys))
    else:
        p = GCPProvider(project=PROJECT, api_endpoint=cloud.gce_endpoint, zones=["us-central1-a"], retry=retry,
                        credentials=Credentials(token=admin_gcp_token(cloud.aws_keys)), timeout_s=0.3)
    cloud.set_faults(FaultRates(timeout=1.0, timeout_s=0.8))
    with pytest.raises(TransientCloudError):
        p.query_instances(job_labels("job-slow"))
    assert p.num_retries == 1
    cloud.set_faults(FaultRates())
    assert p.query_instances(job_labels("job-slow")) == []
