"""Issue 37, metadata and control: from inside an instance of job A, against a concurrent job B.

Every request is sent from A's own network address (``tests/instance_calls.py``: inside A's
network namespace), as an attacker on A would send it.  The metadata server answers only its
caller (by address), with IMDSv2 tokens and GCE's header required; the embedded cloud's control
API needs the controller's secret; an ended instance's disk is gone.  Both clouds.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import time
import urllib.error
import urllib.request

import pytest

from infra.local.cloud import SERVICE_ACCOUNT, EmbeddedCloud
from infra.local.network import netns_available
from infra.records import job_labels, job_resource_name
from tests.infra.conftest import embedded, make_providers, wait_until  # noqa: F401 - the session's cloud
from tests.instance_calls import ask, imds_token, metadata, metadata_base, role_credentials, run_as

BUCKET = "security-jobs"
JOBS = ("sec-a", "sec-b")
CREDENTIALS = "latest/meta-data/iam/security-credentials"
INSTANCE_ID = {"aws": "latest/meta-data/instance-id", "gcp": "computeMetadata/v1/instance/name"}


@pytest.fixture
def cloud(embedded):  # noqa: F811 - the session's cloud, reset around each test
    why = netns_available()
    assert why is None, f"network namespaces are needed here and unavailable: {why}"
    assert embedded.network.enforced, "the embedded cloud is not in netns mode"
    embedded.reset()
    yield embedded
    embedded.reset()


@pytest.fixture
def two_jobs(cloud, request):
    """One live instance of job A and one of job B on ``request.param``'s cloud, each job with its
    own role (an instance profile on AWS; on GCP the role trusting the instances' account)."""
    name = request.param
    providers = make_providers(cloud)
    zone, itype = ("us-east-1a", "g4dn.xlarge") if name == "aws" else ("us-central1-a", "n1-standard-4-t4x1")
    ids = {}
    try:
        for job in JOBS:
            providers["aws"].create_job_identity(job, read_write=[f"s3://{BUCKET}/{job}"],
                                                 trusted_accounts={"gcp": SERVICE_ACCOUNT})
            (inst,) = providers[name].run_instances(zone=zone, instance_type=itype, count=1, labels=job_labels(job, 1),
                                                    startup_script="#!/bin/bash\nsleep 120\n")
            providers[name].wait_instances(job_labels(job, 1), instance_ids=[inst.instance_id], timeout_s=20)
            ids[job] = inst.instance_id
        assert wait_until(lambda: all(cloud.machines.get(i) is not None for i in ids.values()), timeout_s=10)
        yield name, ids[JOBS[0]], ids[JOBS[1]]
    finally:
        for job in JOBS:
            providers[name].terminate_instances(job_labels(job))
            providers["aws"].delete_job_identity(job)


BOTH = pytest.mark.parametrize("two_jobs", ["aws", "gcp"], indirect=True)


@BOTH
def test_an_instance_gets_its_own_jobs_credentials_and_never_anothers(cloud, two_jobs):
    name, a, b = two_jobs
    assert metadata(cloud, a, INSTANCE_ID[name]) == (200, a)
    assert metadata(cloud, a, f"{CREDENTIALS}/") == (200, job_resource_name("sec-a"))
    creds = role_credentials(cloud, a)
    assert cloud.identities._keys[(a, job_resource_name("sec-a"))]["AccessKeyId"] == creds["AccessKeyId"]
    # Naming B, as any instance could before: in the path, or B's role under A's own path.
    token = imds_token(cloud, a)
    named = ask(cloud, a, f"{cloud.gce_endpoint}/metadata/{b}/{CREDENTIALS}/{job_resource_name('sec-b')}",
                headers={"X-aws-ec2-metadata-token": token})
    assert named[0] == 404 and "ASIA" not in named[1]
    assert metadata(cloud, a, f"{CREDENTIALS}/{job_resource_name('sec-b')}")[0] == 404
    assert metadata(cloud, b, f"{CREDENTIALS}/") == (200, job_resource_name("sec-b"))
    # Not an instance (the host's own address): nothing at all.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{cloud.gce_endpoint}/metadata/{b}/{INSTANCE_ID[name]}", timeout=10)
    assert refused.value.code == 404


_FROM = """
import sys, urllib.request, http.client
source, url = sys.argv[1], sys.argv[2]
host, port = url.split("//")[1].split("/")[0].split(":")
conn = http.client.HTTPConnection(host, int(port), timeout=3, source_address=(source, 0))
try:
    conn.request("GET", "/" + url.split("//")[1].split("/", 1)[1], headers={"Metadata-Flavor": "Google"})
    print(conn.getresponse().status)
except OSError as exc:
    print("no answer", type(exc).__name__)
"""


@pytest.mark.parametrize("two_jobs", ["gcp"], indirect=True)
def test_an_instance_cannot_pass_for_another_by_taking_its_address(cloud, two_jobs):
    name, a, b = two_jobs
    b_public = cloud.network.addresses(b).public
    took = run_as(cloud, a, ["ip", "addr", "add", f"{b_public}/16", "dev", "pub0"])
    assert took.returncode == 0, took.stderr  # root in its namespace (until confined) may add it...
    url = f"{metadata_base(cloud, a)}/{INSTANCE_ID[name]}"
    sent = run_as(cloud, a, [sys.executable, "-c", _FROM, b_public, url])
    assert sent.stdout.split()[:2] == ["no", "answer"], sent.stdout + sent.stderr  # ...but not send from it
    # The dropped attempt's unanswered ARP leaves the host's neighbour entry FAILED for a while (the
    # kernel then answers "no route to host" at once): give the address back and forget that entry.
    run_as(cloud, a, ["ip", "addr", "del", f"{b_public}/16", "dev", "pub0"])
    run_as(cloud, a, ["ip", "neigh", "flush", "dev", "pub0"])
    own = run_as(cloud, a, [sys.executable, "-c", _FROM, cloud.network.addresses(a).public, url])
    assert own.stdout.strip() == "200", own.stdout + own.stderr


@BOTH
def test_metadata_wants_an_imdsv2_token_and_the_metadata_flavor_header(cloud, two_jobs):
    name, a, b = two_jobs
    base = metadata_base(cloud, a)
    assert ask(cloud, a, f"{base}/{INSTANCE_ID['aws']}")[0] == 401  # IMDSv1: no token
    assert ask(cloud, a, f"{base}/{CREDENTIALS}/")[0] == 401
    token = f"{base}/latest/api/token"
    assert ask(cloud, a, token, method="PUT")[0] == 400  # no TTL
    for ttl in ("0", "21601", "soon"):
        assert ask(cloud, a, token, method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": ttl})[0] == 400
    assert ask(cloud, a, token)[0] == 405
    relayed = {"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.1"}
    assert ask(cloud, a, token, method="PUT", headers=relayed)[0] == 403
    # B's token is B's: A cannot use it; an expired one is refused.
    assert ask(cloud, a, f"{base}/{CREDENTIALS}/", headers={"X-aws-ec2-metadata-token": imds_token(cloud, b)})[0] == 401
    status, short = ask(cloud, a, token, method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "1"})
    assert status == 200
    time.sleep(1.2)
    assert ask(cloud, a, f"{base}/{INSTANCE_ID['aws']}", headers={"X-aws-ec2-metadata-token": short})[0] == 401
    # GCE's server: the header, and no relayed request.
    gce = f"{base}/{INSTANCE_ID['gcp']}"
    assert ask(cloud, a, gce)[0] == 403
    assert ask(cloud, a, gce, headers={"Metadata-Flavor": "Google", "X-Forwarded-For": "10.0.0.1"})[0] == 403
    assert ask(cloud, a, gce, headers={"Metadata-Flavor": "Google"}) == (200, a)


@BOTH
def test_an_instance_cannot_use_the_control_api_nor_preempt_another_job(cloud, two_jobs):
    name, a, b = two_jobs
    control = f"{cloud.gce_endpoint}/sailor"
    assert ask(cloud, a, f"{control}/status")[0] == 401
    for route, body in (("preempt", {"instance_id": b}), ("faults", {"throttle": 1.0}),
                        ("capacity", {"gpu": "T4", "zone": "us-east-1a", "num_gpus": 0}), ("shutdown", {})):
        assert ask(cloud, a, f"{control}/{route}", method="POST", data=json.dumps(body))[0] == 401, route
    guessed = {"Authorization": "Bearer " + "x" * len(cloud.control_secret)}
    assert ask(cloud, a, f"{control}/preempt", method="POST", headers=guessed, data=json.dumps({"instance_id": b}))[0] == 401
    # What an agent may ask its own metadata server (--preempt-at): its own job's instances only.
    asked = ask(cloud, a, f"{metadata_base(cloud, a)}/sailor/preempt", method="POST", data=json.dumps({"instance_id": b}))
    assert asked[0] == 404
    assert not cloud.preemptions and {i.instance_id for i in cloud.live_instances()} >= {a, b}
    assert not cloud.shutdown_requested.is_set() and cloud.faults.rates.throttle == 0
    # The controller holds the secret: its file is its owner's alone, and no instance is given it.
    secret_file = cloud.control_secret_file
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600 and secret_file.read_text() == cloud.control_secret
    request = urllib.request.Request(f"{control}/status", headers={"Authorization": f"Bearer {cloud.control_secret}"})
    assert json.loads(urllib.request.urlopen(request, timeout=10).read())["num_live_instances"] == 2
    machine = cloud.machines.get(a)
    environ = open(f"/proc/{machine.process.pid}/environ", "rb").read()
    assert cloud.control_secret.encode() not in environ
    assert all(cloud.control_secret not in p.read_text() for p in machine.directory.rglob("*") if p.is_file())


@BOTH
def test_an_ended_instances_disk_is_removed(cloud, two_jobs):
    name, a, b = two_jobs
    machine = cloud.machines.get(a)
    (machine.root / "rank0.log").write_text("a rank's log\n")  # what a job leaves in its root
    assert (machine.root / "var" / "lib" / "cloud" / "startup-script").exists()
    providers = make_providers(cloud)
    providers[name].terminate_instances(job_labels("sec-a"))
    assert wait_until(lambda: not machine.directory.exists(), timeout_s=15)
    assert not (cloud.state_dir / "instances" / a).exists() and (cloud.state_dir / "instances" / b).is_dir()


def test_host_network_says_the_metadata_cannot_tell_instances_apart(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="sailor.infra.local")
    cloud = EmbeddedCloud(state_dir=tmp_path / "cloud", network="host").start()
    try:
        assert any("cannot tell instances apart" in r.getMessage() for r in caplog.records)
        assert cloud.status()["metadata_tells_instances_apart"] is False
        assert stat.S_IMODE(os.stat(cloud.control_secret_file).st_mode) == 0o600
    finally:
        cloud.stop()


_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.mark.parametrize("two_jobs", ["aws"], indirect=True)
def test_a_service_of_the_host_on_every_address_is_out_of_an_instances_reach(cloud, two_jobs):
    """A Prefect server, a database or the buckets' rclone listening on 0.0.0.0 is the user's
    machine, not the internet: an instance reaches the host's address on the cloud's endpoints only."""
    import socket

    _, a, _ = two_jobs
    server = socket.create_server(("0.0.0.0", 0))
    try:
        port = server.getsockname()[1]
        host = cloud.network.host_address

        def attempt(p: int) -> str:
            return run_as(cloud, a, [sys.executable, "-c", _CONNECT, host, str(p)]).stdout.strip()

        assert attempt(port) != "connected"
        assert attempt(int(cloud.gce_endpoint.rsplit(":", 1)[1].split("/")[0])) == "connected"  # its metadata server
    finally:
        server.close()


@pytest.mark.parametrize("two_jobs", ["gcp"], indirect=True)
def test_an_instances_token_gets_nothing_of_gces_iams_or_storages_administration(cloud, two_jobs):
    """GCP's control plane from job A's instance: its service account's token (from its metadata
    server) holds no role there, a request without one is unauthenticated; B stays as it was."""
    _, a, b = two_jobs
    status, answer = metadata(cloud, a, "computeMetadata/v1/instance/service-accounts/default/token")
    assert status == 200, answer
    bearer = {"Authorization": f"Bearer {json.loads(answer)['access_token']}"}
    api = f"{cloud.gce_endpoint}/compute/v1/projects/sailor-local"
    attempts = [
        ("DELETE", f"{api}/zones/us-central1-a/instances/{b}", None),
        ("POST", f"{api}/global/firewalls", json.dumps({"name": "open-b", "sourceRanges": ["0.0.0.0/0"],
                                                         "allowed": [{"IPProtocol": "tcp"}]})),
        ("GET", f"{api}/aggregated/instances", None),
        ("POST", f"{cloud.gce_endpoint}/v1/projects/sailor-local/serviceAccounts",
         json.dumps({"accountId": "sailor-a-widened"})),
        ("PUT", f"{cloud.gce_endpoint}/storage/v1/b/{BUCKET}/iam", json.dumps({"bindings": []})),
    ]
    for method, url, body in attempts:
        assert ask(cloud, a, url, method=method, headers=bearer, data=body)[0] == 403, (method, url)
        assert ask(cloud, a, url, method=method, data=body)[0] == 401, (method, url)
    assert cloud.machines.get(b) is not None and not cloud.machines.get(b).ended
    gcp = make_providers(cloud)["gcp"]  # the controller's own credentials still do all of it
    assert b in {i.instance_id for i in gcp.query_instances(job_labels(JOBS[1]), include_ended=False)}
