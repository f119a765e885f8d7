"""The embedded cloud as faithful as a real one: instances boot the controller's wheel from the job's
bucket in their own root, with credentials of their instance profile scoped to the job's prefix,
in their own network namespace where the job's security group / firewall rules decide who reaches
the rendezvous.  The tests that need namespaces fail (not skip) where they are unavailable:
CI runs as root."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import boto3
import pytest

from infra.bootstrap import read_boot_report, startup_script
from infra.code import upload_code
from infra.local.cloud import SERVICE_ACCOUNT
from infra.local.network import netns_available
from infra.records import job_labels, job_resource_name
from sailor_core.job.protocol import AgentAction, AgentAssignment, AgentState, read_status, write_assignment
from sailor_core.storage import StorageError, open_storage
from tests.infra.conftest import wait_until
from tests.instance_calls import metadata, role_credentials

BUCKET = "faithful-jobs"


def _need_namespaces(cloud) -> None:
    why = netns_available()
    assert why is None, f"network namespaces are needed here and unavailable: {why}"
    assert cloud.network.enforced, "the embedded cloud is not in netns mode"


@pytest.fixture
def bucket(cloud, monkeypatch):
    """The embedded S3, reached by this process (the controller) with the standard variables."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", cloud.s3_endpoint)
    key_id, secret = cloud.aws_keys  # the embedded account's administrator: the controller's keys
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    s3 = boto3.client("s3", endpoint_url=cloud.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id=key_id, aws_secret_access_key=secret)
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    return s3


def _boot_one(cloud, providers, job: str, *, script: str, cloud_name: str = "aws"):
    p = providers[cloud_name]
    zone, itype = ("us-east-1a", "g4dn.xlarge") if cloud_name == "aws" else ("us-central1-a", "n1-standard-4-t4x1")
    (inst,) = p.run_instances(zone=zone, instance_type=itype, count=1, labels=job_labels(job, 1), startup_script=script)
    (ready,) = p.wait_instances(job_labels(job, 1), instance_ids=[inst.instance_id], timeout_s=20)
    # An EC2 instance's machine boots on the cloud's next tick after moto says "running".
    assert wait_until(lambda: cloud.machines.get(inst.instance_id) is not None, timeout_s=10)
    return ready  # as described now: with the addresses of its machine


@pytest.mark.slow  # the default run's e2e job boots every instance this way; this checks the details
def test_an_instance_boots_the_controllers_wheel_from_the_bucket_in_its_own_root(cloud, providers, bucket):
    job, job_url = "boot-a", f"s3://{BUCKET}/boot-a"
    providers["aws"].create_job_identity(job, read_write=[job_url])
    code = upload_code(job_url)
    script = startup_script(job_url, code, cloud="", num_gpus=1)
    inst = _boot_one(cloud, providers, job, script=script)
    # The agent runs: its first report is in the bucket, written with the instance's own credentials.
    assert wait_until(lambda: read_status(job_url, inst.instance_id) is not None, timeout_s=90), \
        (cloud.machines.get(inst.instance_id).directory / "console.log").read_text()[-2000:]
    console = (cloud.machines.get(inst.instance_id).directory / "console.log").read_text()
    assert f"fetched {code.wheel_key}" in console and "sha256 ok" in console and "starting the agent" in console
    machine = cloud.machines.get(inst.instance_id)
    described = bucket.meta  # noqa: F841 - the controller's client stays the admin's
    ec2 = providers["aws"]._ec2("us-east-1").describe_instances(InstanceIds=[inst.instance_id])
    attached = ec2["Reservations"][0]["Instances"][0]
    assert attached["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/{job_resource_name(job)}")
    assert [g["GroupName"] for g in attached["SecurityGroups"]] == [job_resource_name(job)]
    # The agent process: in the instance's root, from the wheel's environment, with no credential.
    pid = read_status(job_url, inst.instance_id)
    assert pid is not None
    procs = [p for p in _group_members(machine.process.pid) if b"sailor_core.runtime.agent" in _cmdline(p)]
    assert procs, "no agent process in the instance's process group"
    env = dict(item.split(b"=", 1) for item in open(f"/proc/{procs[0]}/environ", "rb").read().split(b"\0") if b"=" in item)
    assert b"AWS_SECRET_ACCESS_KEY" not in env and b"AWS_ACCESS_KEY_ID" not in env and b"PYTHONPATH" not in env
    assert env[b"HOME"] == str(machine.root).encode()
    import os

    # confined (infra/local/confine.py), the process sees its root at the same path inside a fresh
    # root of its own, which is how this machine names it: <instance>/fs<root>
    cwd = os.readlink(f"/proc/{procs[0]}/cwd")
    assert cwd == str(machine.root) or cwd.endswith(f"/fs{machine.root}")
    assert os.path.samefile(f"/proc/{procs[0]}/cwd", machine.root)
    confined = cloud.machines.confinement is not None
    # confined, the image is read-only and each instance makes its environment on its own disk (as a VM)
    envs = machine.root / "opt" / "sailor" / "envs" if confined else cloud.machines.image.env_cache
    assert _cmdline(procs[0]).split(b"\0")[0].startswith(str(envs).encode())
    # A second instance of the same wheel still fetches the wheel; unconfined it reuses the environment.
    write_assignment(job_url, inst.instance_id, AgentAssignment(generation=1, action=AgentAction.SHUTDOWN))
    second = _boot_one(cloud, providers, job, script=script)
    assert wait_until(lambda: read_status(job_url, second.instance_id) is not None, timeout_s=60)
    console = (cloud.machines.get(second.instance_id).directory / "console.log").read_text()
    assert "sha256 ok" in console and (confined or "already made for this wheel" in console)
    providers["aws"].terminate_instances(job_labels(job))
    providers["aws"].delete_job_identity(job)


def _group_members(pgid: int) -> list[int]:
    import os

    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    out.append(int(entry))
            except ProcessLookupError:
                pass
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def test_a_failed_boot_is_reported_in_the_bucket_with_its_log_tail(cloud, providers, bucket):
    job, job_url = "boot-b", f"s3://{BUCKET}/boot-b"
    providers["aws"].create_job_identity(job, read_write=[job_url])
    code = upload_code(job_url)
    forged = code.__class__(**{**{f: getattr(code, f) for f in code.__slots__}, "wheel_sha256": "0" * 64})
    inst = _boot_one(cloud, providers, job, script=startup_script(job_url, forged, cloud="", num_gpus=1))
    assert wait_until(lambda: read_boot_report(job_url, inst.instance_id) is not None, timeout_s=60)
    report = read_boot_report(job_url, inst.instance_id)
    assert report.stage == "fetch" and "SHA-256" in report.error and report.log_tail
    assert "failed to boot at fetch" in report.describe()
    # More GPUs expected than the instance has: the driver check fails, after the install.
    gpus = _boot_one(cloud, providers, job, script=startup_script(job_url, code, cloud="", num_gpus=8))
    assert wait_until(lambda: read_boot_report(job_url, gpus.instance_id) is not None, timeout_s=90)
    assert read_boot_report(job_url, gpus.instance_id).stage == "gpu"
    assert read_status(job_url, gpus.instance_id) is None  # no agent started
    providers["aws"].terminate_instances(job_labels(job))
    providers["aws"].delete_job_identity(job)


def _imds_credentials(cloud, instance_id: str) -> dict:
    return role_credentials(cloud, instance_id)  # as the instance asks: from its address, with a token


def test_instance_credentials_reach_the_jobs_prefix_and_nothing_else(cloud, providers, bucket, monkeypatch):
    job, job_url = "cred-a", f"s3://{BUCKET}/cred-a"
    providers["aws"].create_job_identity(job, read_write=[job_url])
    inst = _boot_one(cloud, providers, job, script="#!/bin/bash\nsleep 60\n")
    open_storage(f"s3://{BUCKET}/other-job").put("secret.txt", b"not yours")
    creds = _imds_credentials(cloud, inst.instance_id)
    assert creds["AccessKeyId"].startswith("ASIA") and creds["Token"]
    # What the instance can do with them (the same standard variables obstore reads there).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", creds["Token"])
    mine = open_storage(job_url)
    mine.put("agents/x/status.json", b"{}")
    assert mine.get("agents/x/status.json") == b"{}"
    with pytest.raises(StorageError, match="cannot read"):
        open_storage(f"s3://{BUCKET}/other-job").get("secret.txt")
    with pytest.raises(StorageError, match="cannot write"):
        open_storage(f"s3://{BUCKET}/other-job").put("x", b"y")
    # A GCE instance runs as the service account; a job with an S3 bucket trusts it (federation).
    gcp_job = "cred-b"
    providers["aws"].create_job_identity(gcp_job, read_write=[f"s3://{BUCKET}/{gcp_job}"],
                                         trusted_accounts={"gcp": SERVICE_ACCOUNT})
    vm = _boot_one(cloud, providers, gcp_job, script="#!/bin/bash\nsleep 60\n", cloud_name="gcp")
    got = providers["gcp"]._instances.get(project="sailor-local", zone=vm.zone, instance=vm.instance_id)
    assert [a.email for a in got.service_accounts] == [SERVICE_ACCOUNT]
    assert _imds_credentials(cloud, vm.instance_id)["AccessKeyId"].startswith("ASIA")
    for p in providers.values():
        p.terminate_instances({"sailor-job": job}), p.terminate_instances({"sailor-job": gcp_job})
    providers["aws"].delete_job_identity(job)
    providers["aws"].delete_job_identity(gcp_job)


def test_two_gcp_jobs_at_once_each_get_their_own_jobs_account_and_role(cloud, providers, bucket):
    """Each job's GCE instances run as the job's own service account, which only its own job's AWS
    role trusts: each instance gets its own job's account, role and GCS grants (with one shared
    account, the second job's instance was handed the first job's role and failed with 403 on its
    own prefix).  Checked in both places the mix-up could be: the GCP provider's identity code
    (which account an instance is launched with) and the embedded metadata server (which role it
    hands out)."""
    jobs = ("twin-a", "twin-b")
    cloud.disk.ensure_bucket("twin-gs")
    accounts = {job: providers["gcp"].create_job_identity(job, read_write=[f"gs://twin-gs/{job}"]) for job in jobs}
    assert len(set(accounts.values())) == 2
    for job in jobs:
        providers["aws"].create_job_identity(job, read_write=[f"s3://{BUCKET}/{job}"],
                                             trusted_accounts={"gcp": providers["gcp"].job_instance_account(job)})
    try:
        vms = {job: _boot_one(cloud, providers, job, script="#!/bin/bash\nsleep 60\n", cloud_name="gcp")
               for job in jobs}
        for job, vm in vms.items():
            other = next(j for j in jobs if j != job)
            got = providers["gcp"]._instances.get(project="sailor-local", zone=vm.zone, instance=vm.instance_id)
            assert [a.email for a in got.service_accounts] == [accounts[job]]
            assert metadata(cloud, vm.instance_id,
                            "computeMetadata/v1/instance/service-accounts/default/email") == (200, accounts[job])
            assert metadata(cloud, vm.instance_id, "latest/meta-data/iam/security-credentials/") == (
                200, job_resource_name(job))
            creds = _imds_credentials(cloud, vm.instance_id)
            s3 = boto3.client("s3", endpoint_url=cloud.s3_endpoint, region_name="us-east-1",
                              aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                              aws_session_token=creds["Token"])
            s3.put_object(Bucket=BUCKET, Key=f"{job}/x", Body=b"mine")
            with pytest.raises(s3.exceptions.ClientError, match="AccessDenied"):
                s3.put_object(Bucket=BUCKET, Key=f"{other}/x", Body=b"theirs")
            status, answer = metadata(cloud, vm.instance_id, "computeMetadata/v1/instance/service-accounts/default/token")
            assert status == 200, answer
            token = json.loads(answer)["access_token"]
            assert cloud.identities.token_account(token) == accounts[job]
            assert cloud.gcp_iam.refusal(accounts[job], "PUT", f"/twin-gs/{job}/x") is None
            assert cloud.gcp_iam.refusal(accounts[job], "PUT", f"/twin-gs/{other}/x") is not None
        # a role is handed only to an instance whose account its trust names, even under its job's name:
        # a twin-b instance running as twin-a's account gets no role at all
        trust_b = providers["aws"]._do_iam("get_role", RoleName=job_resource_name("twin-b"))["Role"]
        assert accounts["twin-a"] not in json.dumps(trust_b["AssumeRolePolicyDocument"])
        providers["gcp"].terminate_instances({"sailor-job": "twin-b"})
        providers["gcp"]._accounts["twin-b"] = accounts["twin-a"]
        impostor = _boot_one(cloud, providers, "twin-b", script="#!/bin/bash\nsleep 60\n", cloud_name="gcp")
        assert metadata(cloud, impostor.instance_id, "latest/meta-data/iam/security-credentials/")[0] == 404
    finally:
        for job in jobs:
            providers["gcp"].terminate_instances({"sailor-job": job})
            providers["aws"].delete_job_identity(job)
            providers["gcp"].delete_job_identity(job)


def test_no_secret_in_startup_scripts_or_instance_metadata(cloud, providers, bucket, monkeypatch):
    canary = "CANARYsecret0123456789abcdefghij"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canary)
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", canary)
    job, job_url = "secret-a", f"s3://{BUCKET}/secret-a"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", cloud.aws_keys[1])  # the controller's own key to the bucket
    script = startup_script(job_url, upload_code(job_url), cloud="", num_gpus=1)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canary)
    assert canary not in script and cloud.aws_keys[1] not in script and "AWS_SECRET" not in script
    for cloud_name in ("aws", "gcp"):
        inst = _boot_one(cloud, providers, job, script=script, cloud_name=cloud_name)
        machine = cloud.machines.get(inst.instance_id)
        assert canary not in (machine.root / "var" / "lib" / "cloud" / "startup-script").read_text()
        assert canary not in json.dumps(machine.hardware.__class__.__slots__)
        env = cloud.machines.environment(machine)
        assert canary not in json.dumps(env) and not any(k.startswith(("AWS_SECRET", "AWS_ACCESS", "GOOGLE_O"))
                                                         for k in env)
    with cloud.gce._lock:
        assert canary not in json.dumps(list(cloud.gce.instances.values()))
    for p in providers.values():
        p.terminate_instances(job_labels(job))


SOCKET_SERVER = """#!/bin/bash
exec python3 - <<'EOF'
import os, socket
server = socket.create_server(("0.0.0.0", 29500))  # every interface, as TCPStore's server
while True:
    conn, _ = server.accept()
    conn.sendall(b"from the master")
    conn.close()
EOF
"""

SOCKET_CLIENT = """#!/bin/bash
exec python3 - <<'EOF'
import socket, time
for attempt in range(120):
    try:
        with socket.create_connection(("{addr}", 29500), timeout=1) as conn:
            print("rendezvous:", conn.recv(100).decode(), flush=True)
        break
    except OSError as exc:
        print("rendezvous failed:", type(exc).__name__, flush=True)
        time.sleep(0.3)
time.sleep(60)
EOF
"""

RENDEZVOUS_SERVER = """#!/bin/bash
exec python3 - <<'EOF'
import datetime, os, time
from torch.distributed import TCPStore
store = TCPStore(os.environ["SAILOR_PRIVATE_IP"], 29500, 2, is_master=True, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=60))
store.set("hello", "from the master")
time.sleep(120)
EOF
"""

RENDEZVOUS_CLIENT = """#!/bin/bash
exec python3 - <<'EOF'
import datetime, time
from torch.distributed import TCPStore
for attempt in range(60):
    try:
        store = TCPStore("{addr}", 29500, 2, is_master=False, timeout=datetime.timedelta(seconds=2))
        print("rendezvous:", store.get("hello").decode(), flush=True)
        break
    except Exception as exc:
        print("rendezvous failed:", type(exc).__name__, flush=True)
        time.sleep(0.5)
time.sleep(60)
EOF
"""


def _console(cloud, instance_id: str) -> str:
    path = cloud.machines.get(instance_id).directory / "console.log"
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("kind", ["socket", pytest.param("torch", marks=pytest.mark.slow)])
def test_the_jobs_rules_decide_who_reaches_the_rendezvous(cloud, providers, kind):
    """Same VPC: the job's group lets its members meet at private addresses; a group without its
    rule keeps them apart.  Across clouds: the private address is unreachable, the public one only
    once the job's rules name the peer.  ``torch``: torch's TCPStore (the workers' rendezvous);
    ``socket``: the same connection without torch's start-up time."""
    _need_namespaces(cloud)
    server, client = (SOCKET_SERVER, SOCKET_CLIENT) if kind == "socket" else (RENDEZVOUS_SERVER, RENDEZVOUS_CLIENT)
    aws, gcp = providers["aws"], providers["gcp"]
    job = f"rules-{kind}"
    master = _boot_one(cloud, providers, job, script=server)
    # The job's group has no rule yet for this test: take it away, as a wrong set-up would.
    group = aws.job_security_group(job, "us-east-1")
    ec2 = aws._ec2("us-east-1")
    rules = ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"][0]["IpPermissions"]
    ec2.revoke_security_group_ingress(GroupId=group, IpPermissions=rules)
    peer = _boot_one(cloud, providers, job, script=client.replace("{addr}", master.private_ip))
    assert wait_until(lambda: _console(cloud, peer.instance_id).count("rendezvous failed") >= 2, timeout_s=60), \
        _console(cloud, peer.instance_id)
    assert "rendezvous: from the master" not in _console(cloud, peer.instance_id)
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=rules)  # the job's rule back
    assert wait_until(lambda: "rendezvous: from the master" in _console(cloud, peer.instance_id), timeout_s=60), \
        _console(cloud, peer.instance_id)
    assert f"{peer.private_ip}" in cloud.network.rules_of(master.instance_id)

    # Another cloud: GCE's private network is not AWS's; the master's public address is reachable
    # only once the job's rules open it to the peer's public address.
    gcp.open_job_network(job)
    private = _boot_one(cloud, providers, job, cloud_name="gcp",
                        script=client.replace("{addr}", master.private_ip))
    public = _boot_one(cloud, providers, job, cloud_name="gcp",
                       script=client.replace("{addr}", master.public_ip))
    assert master.public_ip and master.public_ip != master.private_ip
    assert wait_until(lambda: _console(cloud, public.instance_id).count("rendezvous failed") >= 2, timeout_s=60)
    found = {i.instance_id: i for i in gcp.query_instances(job_labels(job))}
    aws.set_job_peers(job, [f"{found[public.instance_id].public_ip}/32"])
    assert wait_until(lambda: "rendezvous: from the master" in _console(cloud, public.instance_id), timeout_s=60), \
        _console(cloud, public.instance_id)
    assert "rendezvous: from the master" not in _console(cloud, private.instance_id)
    for p in providers.values():
        p.terminate_instances(job_labels(job))
    assert wait_until(lambda: not cloud.live_instances())
    assert aws.delete_job_network(job) and gcp.delete_job_network(job)


def test_a_jobs_rules_and_identity_leave_nothing_behind(cloud, providers):
    aws, gcp = providers["aws"], providers["gcp"]
    job = "left-a"
    for region in ("us-east-1", "us-west-2"):
        aws.job_security_group(job, region)
    aws.set_job_peers(job, ["100.64.1.2/32"])
    aws.create_job_identity(job, read_write=[f"s3://{BUCKET}/{job}"])
    gcp.open_job_network(job)
    gcp.set_job_peers(job, ["100.64.1.3/32"])
    assert set(aws.job_groups(job)) == {"us-east-1", "us-west-2"}
    fw = gcp.job_firewalls(job)
    assert sorted(fw) == [job_resource_name(job, "peers-in"), job_resource_name(job, "peers-out")]
    assert list(fw[job_resource_name(job, "peers-in")].source_tags) == [job_resource_name(job)]
    assert list(fw[job_resource_name(job, "peers-out")].source_ranges) == ["100.64.1.3/32"]
    ingress = aws.job_groups(job)["us-east-1"]["IpPermissions"]
    assert {p["FromPort"] for p in ingress} == {29500, 32768}
    assert all(pair["GroupId"] == aws.job_groups(job)["us-east-1"]["GroupId"]
               for p in ingress for pair in p.get("UserIdGroupPairs", []))
    aws.delete_job_network(job), aws.delete_job_identity(job), gcp.delete_job_network(job)
    assert aws.job_groups(job) == {} and gcp.job_firewalls(job) == {} and aws.job_identity_leftovers(job) == []


# ---- no instance reads or writes outside its root (strace of everything it runs) ------------

_PATH = re.compile(r'^\d+\s+(\w+)\((?:(?:AT_FDCWD|-?\d+)(?:<[^>]*>)?, )?"([^"]*)"')
_FILE_CALLS = frozenset({"open", "openat", "openat2", "creat", "stat", "lstat", "newfstatat", "statx", "access",
                         "faccessat", "faccessat2", "readlink", "readlinkat", "execve", "execveat", "mkdir",
                         "mkdirat", "unlink", "unlinkat", "rmdir", "rename", "renameat", "renameat2", "chdir",
                         "truncate", "utimensat", "chmod", "fchmodat", "symlink", "symlinkat", "link", "linkat",
                         "statfs", "getxattr", "lgetxattr", "listxattr", "llistxattr"})
_WRITE_CALLS = frozenset({"creat", "mkdir", "mkdirat", "unlink", "unlinkat", "rmdir", "rename", "renameat", "renameat2",
                          "truncate", "utimensat", "chmod", "fchmodat", "symlink", "symlinkat", "link", "linkat"})
_LOOKUPS = frozenset({"stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2", "readlink",
                      "readlinkat"})
_SYSTEM = ("/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/etc/", "/dev/", "/proc/", "/sys/", "/run/netns/")


def outside_root(trace: str, machine, image, *, checkout: str, home: str) -> list[str]:
    """File syscalls of the trace that reached outside the instance's root, the image (read-only)
    and the system's directories; writes only in the root and the image's env cache.  A lookup
    that found nothing reads nothing, except under the controller's checkout or home: those are
    not even looked at."""
    root = str(machine.root)
    readable = (root, *(str(p) for p in image.read_only_paths()), *_SYSTEM)
    writable = (root, str(image.env_cache), "/dev/")
    bad = []
    for line in trace.splitlines():
        m = _PATH.match(line)
        if not m or m.group(1) not in _FILE_CALLS:
            continue
        call, path = m.groups()
        if call in ("symlink", "symlinkat"):  # symlink(target, link): what it writes is the link
            path = re.findall(r'"([^"]*)"', line)[-1]
        path = os.path.normpath(path if path.startswith("/") else f"{root}/{path}")  # cwd: the root
        if call in _LOOKUPS and any(str(p).startswith(path.rstrip("/") + "/") for p in (root, *readable)):
            continue  # a directory on the way to the root or the image (resolving a path stats each one)

        def under(prefixes, p=path):
            return any(p == str(q).rstrip("/") or p.startswith(str(q).rstrip("/") + "/") for q in prefixes)

        failed = " = -1 " in line
        controllers = under((checkout, home)) and not under(image.read_only_paths()) and not under((root,))
        writes = call in _WRITE_CALLS or (call.startswith("open") and re.search(r"O_(WRONLY|RDWR|CREAT)", line))
        if controllers or (writes and not failed and not under(writable)) or (not failed and not under(readable)):
            bad.append(line)
    return bad


def test_an_instance_touches_no_file_outside_its_root_and_the_image(cloud, providers, bucket):
    """strace -f of the instance: its startup script, the boot program, the install, the agent."""
    job, job_url = "audit-a", f"s3://{BUCKET}/audit-a"
    providers["aws"].create_job_identity(job, read_write=[job_url])
    code = upload_code(job_url)
    cloud.machines.trace_files = True
    try:
        inst = _boot_one(cloud, providers, job, script=startup_script(job_url, code, cloud="", num_gpus=1))
        assert wait_until(lambda: read_status(job_url, inst.instance_id) is not None, timeout_s=90)
        write_assignment(job_url, inst.instance_id, AgentAssignment(generation=1, action=AgentAction.SHUTDOWN))
        machine = cloud.machines.get(inst.instance_id)
        assert wait_until(lambda: machine.process.poll() is not None, timeout_s=30)
    finally:
        cloud.machines.trace_files = False
    trace = (machine.directory / "files.strace").read_text()
    assert "sailor_core/runtime/agent" in trace or "sailor_core.runtime.agent" in trace  # the agent did run
    checkout = str(Path(__file__).resolve().parents[2])
    bad = outside_root(trace, machine, cloud.machines.image, checkout=checkout, home=os.environ["SAILOR_HOME"])
    assert not bad, "\n".join(bad[:20])
    # and the audit does see a read of the controller's files, or a write outside the root
    for line in (f'1 openat(AT_FDCWD, "{checkout}/README.md", O_RDONLY|O_CLOEXEC) = 3',
                 f'1 newfstatat(AT_FDCWD, "{os.environ["SAILOR_HOME"]}/jobs", 0x7ff, 0) = -1 ENOENT (No such file)',
                 '1 openat(AT_FDCWD, "/tmp/x", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3'):
        assert outside_root(line, machine, cloud.machines.image, checkout=checkout, home=os.environ["SAILOR_HOME"])
    providers["aws"].terminate_instances(job_labels(job))
    providers["aws"].delete_job_identity(job)
