"""The embedded cloud itself: trace-driven capacity and preemption, control, `sailor offers`."""

from __future__ import annotations

import json
import urllib.request

from typer.testing import CliRunner

from infra.provisioner import GpuNeed, Provisioner
from infra.records import PREEMPTED, RUNNING, job_labels
from tests.infra.conftest import wait_until


def test_a_sailor_trace_drives_capacity_and_preemptions(cloud, providers, tmp_path):
    # Sailor's CSV format: 4 T4 in one GCP and one AWS zone, 120 s later 1 and 0;
    # played 40x faster, so the drop comes after 3 s.
    trace = tmp_path / "gpu_trace.csv"
    trace.write_text(
        ",Timestamp,T4_us-central1-a,T4_us-east-1a\n"
        "0,1712574000.0,4,4\n"
        "1,1712574120.0,1,0\n"
    )
    prov = Provisioner(providers)
    offers = [o for o in prov.offers(["T4"], zones=["us-central1-a", "us-east-1a"]) if o.gpus_per_node == 1]
    cloud.play_trace(trace, time_scale=40.0)
    got = prov.provision([GpuNeed(gpu="T4", zone="us-central1-a", num_gpus=3),
                          GpuNeed(gpu="T4", zone="us-east-1a", num_gpus=2)],
                         job_id="trace-1", offers=offers, substitute_zones=False)
    assert got.availability() == {("T4", "us-central1-a"): 3, ("T4", "us-east-1a"): 2}
    # The pool holds 4: a 2-GPU ask on top of 3 used is refused now.
    refused = prov.provision([GpuNeed(gpu="T4", zone="us-central1-a", num_gpus=2)], job_id="trace-1",
                             attempt=1, offers=offers, substitute_zones=False, all_or_nothing=False)
    assert refused.missing and refused.history[0].outcome == "capacity"

    def states():
        found = {}
        for p in providers.values():
            for i in p.query_instances(job_labels("trace-1", 0)):
                found.setdefault((i.zone, i.state), 0)
                found[(i.zone, i.state)] += 1
        return found

    # After the drop: 2 of 3 reclaimed in the GCP zone, both in the AWS one.
    assert wait_until(lambda: states() == {("us-central1-a", RUNNING): 1, ("us-central1-a", PREEMPTED): 2,
                                           ("us-east-1a", PREEMPTED): 2}, timeout_s=8)
    reasons = {p["reason"] for p in cloud.preemptions}
    assert reasons == {"capacity fell to 1 GPUs", "capacity fell to 0 GPUs"}
    prov.teardown("trace-1")


def test_control_endpoint_preempts_a_zone_and_reports_status(cloud, providers):
    gcp = providers["gcp"]
    labels = job_labels("ctl-1", 0)
    gcp.run_instances(zone="us-central1-b", instance_type="a2-highgpu-1g", count=2, labels=labels)
    gcp.wait_instances(labels, timeout_s=10)
    control = f"{cloud.gce_endpoint}/sailor"
    secret = {"Authorization": f"Bearer {cloud.control_secret}"}  # the controller's (tests/security: without it)
    status = json.loads(urllib.request.urlopen(urllib.request.Request(f"{control}/status", headers=secret)).read())
    assert status["num_live_instances"] == 2
    req = urllib.request.Request(f"{control}/preempt", method="POST", headers={"Content-Type": "application/json", **secret},
                                 data=json.dumps({"zone": "us-central1-b", "gpu": "A100-40", "num_gpus": 1}).encode())
    out = json.loads(urllib.request.urlopen(req).read())
    assert len(out["preempted"]) == 1  # one 1-GPU instance is enough
    assert wait_until(lambda: sorted(i.state for i in gcp.query_instances(labels)) == [PREEMPTED, RUNNING])
    gcp.terminate_instances(labels)


def test_sailor_offers_lists_both_clouds_on_the_embedded_cloud(cloud, monkeypatch, tmp_path):
    import infra.config
    from flows.cli.app import _register_all, app

    monkeypatch.setenv("SAILOR_HOME", str(tmp_path))  # no standalone cloud there
    monkeypatch.delenv("SAILOR_CLOUDS", raising=False)
    monkeypatch.setattr(infra.config, "_in_process", cloud)  # reuse the session's cloud
    _register_all()
    runner = CliRunner()
    res = runner.invoke(app, ["offers", "--gpu", "A100-40", "--region", "us-central1", "--region", "us-east-1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert {o["cloud"] for o in data["offers"]} == {"aws", "gcp"}
    assert {o["gpu"] for o in data["offers"]} == {"A100-40"}
    by = {(o["zone"], o["instance_type"]): o for o in data["offers"]}
    assert by[("us-central1-a", "a2-highgpu-1g")]["on_demand_usd_per_hr"] == 3.673385
    assert ("us-east-1a", "p4d.24xlarge") in by
    table = runner.invoke(app, ["offers", "--cloud", "gcp", "--gpu", "V100-16", "--region", "us-west1"])
    assert table.exit_code == 0 and "us-west1-b" in table.output and "n1-standard-8-v100x1" in table.output
    bad = runner.invoke(app, ["offers", "--cloud", "azure"])
    assert bad.exit_code != 0


def test_aws_spot_prices_come_from_the_spot_price_history_when_asked(cloud):
    from infra.aws import AWSProvider
    from infra.local.cloud import FIXED_AMI, _local_session
    from sailor_core.catalog.instances import get_instance_type

    live = AWSProvider(endpoint_url=cloud.aws_endpoint, ami_id=FIXED_AMI, regions=["us-east-1"],
                       spot_prices_from_api=True, session=_local_session(*cloud.aws_keys))
    offers = live.list_offers(gpu_types=["T4"])
    row = get_instance_type("aws", "g4dn.xlarge")
    g4 = [o for o in offers if o.instance_type == "g4dn.xlarge"]
    assert g4 and all(o.on_demand_usd_per_hr == row.on_demand_usd_per_hr for o in g4)
    # moto's history is one constant price; the catalog's typical spot price is what the embedded cloud uses.
    assert {o.spot_usd_per_hr for o in g4} == {0.00001}


def test_real_clouds_without_credentials_fail_with_one_config_error(monkeypatch, tmp_path):
    import pytest

    from infra.config import get_providers
    from infra.errors import CloudConfigError

    monkeypatch.setenv("SAILOR_CLOUDS", "real")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-role probe
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    aws = get_providers(["aws"])["aws"]
    with pytest.raises(CloudConfigError, match="credentials"):
        aws.list_offers(regions=["us-east-1"])
    with pytest.raises(CloudConfigError, match="credentials"):
        get_providers(["gcp"])
    monkeypatch.setenv("SAILOR_CLOUDS", "azure")
    with pytest.raises(CloudConfigError):
        get_providers()


def test_a_client_hanging_up_on_the_gce_fake_prints_nothing(capfd):
    """The fake runs inside `sailor train`: an instance halted mid-request (a reset connection)
    must not put a server traceback on the user's terminal."""
    import socket
    import struct

    from infra.local.gce_fake import GCEFake

    fake = GCEFake()
    host, port = fake.start("127.0.0.1", 0).removeprefix("http://").split(":")
    try:
        for _ in range(20):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(b"GET /compute/v1/projects/sailor-local/zones HTTP/1.1\r\nHost: x\r\n\r\n")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        try:  # and the path itself, in case no reset happened to reach a write above
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            fake._server.handle_error(None, ("100.64.0.1", 1))
        with urllib.request.urlopen(f"{fake.endpoint}/compute/v1/projects/sailor-local/zones") as r:
            assert json.loads(r.read())["items"]  # still serving
    finally:
        fake.stop()
    assert capfd.readouterr().err == ""
