"""Issue #37, the AWS side: from inside an instance of job A, each attempt on job B (object storage
and control plane) is refused by the embedded AWS endpoint, which authenticates every request and
authorises it by the caller's IAM policies (moto's access control, ``infra/local/aws_auth.py``).

Two jobs at once on one embedded cloud, each with its own role, security group and instance.
Job A's instance runs ``ATTEMPTS`` with the credentials its metadata server gives it (IMDSv2),
as any process on it could, plus unsigned and made-up-key requests; it writes what happened to
its own prefix (which its role may write).  The test then checks both the answers and that
nothing of B's changed.  The policy test shows a policy mistake fails here as on AWS.
"""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from infra.aws import prefix_policy
from infra.buckets import ensure_private_bucket
from infra.local.aws_auth import instance_credentials
from infra.records import job_labels
from tests.infra.conftest import embedded  # noqa: F401 - the session's cloud

BUCKET = "sec-jobs"
OTHER_BUCKET = "sec-other"
JOBS = ("sec-a", "sec-b")

# Run by job A's instance with the image's Python. Each attempt: its name, and "allowed" or the
# error code it met.  The expected answers are the test's, not the script's.
ATTEMPTS = r'''
import json, os, sys, urllib.request
import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

base = os.environ["AWS_METADATA_ENDPOINT"].rstrip("/")
def imds(path, method="GET", headers=None):
    req = urllib.request.Request(f"{base}/{path}", method=method, headers=headers or {})
    return urllib.request.urlopen(req, timeout=10).read().decode()
token = imds("latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
auth = {"X-aws-ec2-metadata-token": token}
role = imds("latest/meta-data/iam/security-credentials/", headers=auth).strip()
creds = json.loads(imds(f"latest/meta-data/iam/security-credentials/{role}", headers=auth))
endpoint = os.environ["AWS_ENDPOINT_URL_S3"]  # the embedded AWS endpoint: S3, EC2, IAM and STS alike
own = dict(aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
           aws_session_token=creds["Token"])
made_up = dict(aws_access_key_id="AKIAMADEUPMADEUP0000", aws_secret_access_key="x" * 40)
def client(service, keys=None, unsigned=False):
    config = Config(signature_version=UNSIGNED) if unsigned else None
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", config=config, **(keys or {}))
A, B, bucket, other = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
b_group, b_instance, a_role = sys.argv[5], sys.argv[6], sys.argv[7]
s3, ec2, iam = client("s3", own), client("ec2", own), client("iam", own)
wide = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": "s3:*", "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]})
trust = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
no_block = {"BlockPublicAcls": False, "IgnorePublicAcls": False, "BlockPublicPolicy": False,
            "RestrictPublicBuckets": False}
attempts = {
    # the job's own work: allowed
    "own: put": lambda: s3.put_object(Bucket=bucket, Key=f"{A}/agents/x/status.json", Body=b"{}"),
    "own: list": lambda: s3.list_objects_v2(Bucket=bucket, Prefix=f"{A}/"),
    "own: data object": lambda: s3.get_object(Bucket=bucket, Key="data/tokens.bin"),
    "own: init-from": lambda: s3.get_object(Bucket=bucket, Key="models/tiny/config.json"),
    "own: init-from list": lambda: s3.list_objects_v2(Bucket=bucket, Prefix="models/tiny/"),
    # made-up keys
    "made-up: list B": lambda: client("s3", made_up).list_objects_v2(Bucket=bucket, Prefix=f"{B}/"),
    "made-up: list root": lambda: client("s3", made_up).list_objects_v2(Bucket=bucket),
    "made-up: other bucket": lambda: client("s3", made_up).put_object(Bucket=other, Key="x", Body=b"x"),
    "made-up: CreateBucket": lambda: client("s3", made_up).create_bucket(Bucket="sec-made-up"),
    "made-up: DescribeInstances": lambda: client("ec2", made_up).describe_instances(),
    "made-up: TerminateInstances": lambda: client("ec2", made_up).terminate_instances(InstanceIds=[b_instance]),
    "made-up: CreateRole": lambda: client("iam", made_up).create_role(RoleName="sec-x", AssumeRolePolicyDocument=trust),
    # unsigned
    "unsigned: list B": lambda: client("s3", unsigned=True).list_objects_v2(Bucket=bucket, Prefix=f"{B}/"),
    "unsigned: put B": lambda: client("s3", unsigned=True).put_object(Bucket=bucket, Key=f"{B}/planted", Body=b"x"),
    "unsigned: get B": lambda: client("s3", unsigned=True).get_object(Bucket=bucket, Key=f"{B}/secret.txt"),
    # A's own keys on B, the bucket and the account
    "A: get B": lambda: s3.get_object(Bucket=bucket, Key=f"{B}/secret.txt"),
    "A: list B": lambda: s3.list_objects_v2(Bucket=bucket, Prefix=f"{B}/"),
    "A: list root": lambda: s3.list_objects_v2(Bucket=bucket),
    "A: put B": lambda: s3.put_object(Bucket=bucket, Key=f"{B}/planted", Body=b"x"),
    "A: CopyObject from B": lambda: s3.copy_object(Bucket=bucket, Key=f"{A}/stolen",
                                                   CopySource={"Bucket": bucket, "Key": f"{B}/secret.txt"}),
    "A: CopyObject from another bucket": lambda: s3.copy_object(Bucket=bucket, Key=f"{A}/stolen2",
                                                                CopySource={"Bucket": other, "Key": "secret.txt"}),
    "A: DeleteObjects of B": lambda: s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"{B}/secret.txt"}]}),
    "A: DeleteObjects of A and B": lambda: s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": f"{A}/agents/x/status.json"}, {"Key": f"{B}/secret.txt"}]}),
    "A: PutPublicAccessBlock": lambda: s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration=no_block),
    "A: DeletePublicAccessBlock": lambda: s3.delete_public_access_block(Bucket=bucket),
    "A: CreateBucket": lambda: s3.create_bucket(Bucket="sec-a-own-bucket"),
    "A: AuthorizeSecurityGroupIngress on B": lambda: ec2.authorize_security_group_ingress(
        GroupId=b_group, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
                                         "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]),
    "A: TerminateInstances of B": lambda: ec2.terminate_instances(InstanceIds=[b_instance]),
    "A: RunInstances": lambda: ec2.run_instances(ImageId="ami-0sailor000000001", InstanceType="g4dn.xlarge",
                                                 MinCount=1, MaxCount=1),
    "A: DescribeInstances": lambda: ec2.describe_instances(),
    "A: CreateRole": lambda: iam.create_role(RoleName="sec-a-escape", AssumeRolePolicyDocument=trust),
    "A: PutRolePolicy widening A": lambda: iam.put_role_policy(RoleName=a_role, PolicyName="job-prefix",
                                                               PolicyDocument=wide),
}
out = {}
for name, call in attempts.items():
    try:
        answer = call()
        failed = answer.get("Errors") if isinstance(answer, dict) else None  # DeleteObjects answers per key
        out[name] = f"per-key {failed[0]['Code']}" if failed else "allowed"
    except ClientError as exc:
        out[name] = exc.response["Error"]["Code"]
    except Exception as exc:
        out[name] = f"error {type(exc).__name__}: {exc}"
s3.put_object(Bucket=bucket, Key=f"{A}/attempts.json", Body=json.dumps(out).encode())
print("attempts done", flush=True)
'''

OWN = {"own: put", "own: list", "own: data object", "own: init-from", "own: init-from list"}


@pytest.fixture
def cloud(embedded):  # noqa: F811 - the session's cloud (as the other security tests'), reset around each test
    # each test here cleans up its roles, instances and objects; the names are this file's own
    embedded.reset()
    yield embedded
    embedded.reset()


def _admin(cloud, service: str):
    key_id, secret = cloud.aws_keys
    return boto3.client(service, endpoint_url=cloud.aws_endpoint, region_name="us-east-1",
                        aws_access_key_id=key_id, aws_secret_access_key=secret)


def _boot(cloud, provider, job: str, script: str) -> str:
    (inst,) = provider.run_instances(zone="us-east-1a", instance_type="g4dn.xlarge", count=1,
                                     labels=job_labels(job, 1), startup_script=script)
    provider.wait_instances(job_labels(job, 1), instance_ids=[inst.instance_id], timeout_s=20)
    return inst.instance_id


def _expected(attempt: str) -> str:
    """What AWS answers each kind of attempt: made-up keys are unknown to S3 (InvalidAccessKeyId), EC2
    (AuthFailure) and IAM (InvalidClientTokenId); the rest is AccessDenied (a DeleteObjects naming
    a key the caller may not delete is refused whole here; S3 would answer AccessDenied for that key)."""
    if attempt.startswith("made-up"):
        return ("AuthFailure" if "Instances" in attempt else "InvalidClientTokenId" if "Role" in attempt
                else "InvalidAccessKeyId")
    return "AccessDenied"


def _wait_for(fetch, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = fetch()
        if found is not None:
            return found
        time.sleep(0.2)
    return fetch()


def test_job_a_reaches_nothing_of_job_b_on_the_aws_side(cloud):
    aws = cloud.providers()["aws"]
    s3, ec2, iam = _admin(cloud, "s3"), _admin(cloud, "ec2"), _admin(cloud, "iam")
    for name in (BUCKET, OTHER_BUCKET):
        ensure_private_bucket(f"s3://{name}", client=s3)  # as the jobs bucket is: Block Public Access on
    s3.put_object(Bucket=BUCKET, Key=f"{JOBS[1]}/secret.txt", Body=b"B's secret")
    s3.put_object(Bucket=OTHER_BUCKET, Key="secret.txt", Body=b"another bucket's secret")
    s3.put_object(Bucket=BUCKET, Key="data/tokens.bin", Body=b"tokens")
    s3.put_object(Bucket=BUCKET, Key="models/tiny/config.json", Body=b"{}")
    roles = {}
    for job in JOBS:  # as open_job_resources makes them: the job's prefix, its data object, its init folder
        roles[job] = aws.create_job_identity(job, read_write=[f"s3://{BUCKET}/{job}"],
                                             read_only=[f"s3://{BUCKET}/models/tiny"],
                                             read_objects=[f"s3://{BUCKET}/data/tokens.bin"])
    a_policy = iam.get_role_policy(RoleName=roles[JOBS[0]], PolicyName="job-prefix")["PolicyDocument"]
    try:
        b_instance = _boot(cloud, aws, JOBS[1], "#!/bin/bash\nsleep 120\n")
        b_group = aws.job_security_group(JOBS[1], "us-east-1")
        b_rules = ec2.describe_security_groups(GroupIds=[b_group])["SecurityGroups"][0]["IpPermissions"]
        args = " ".join([JOBS[0], JOBS[1], BUCKET, OTHER_BUCKET, b_group, b_instance, roles[JOBS[0]]])
        script = f"#!/bin/bash\n\"$SAILOR_PYTHON\" - {args} <<'PY'\n{ATTEMPTS}\nPY\nsleep 120\n"
        _boot(cloud, aws, JOBS[0], script)

        def answers():
            try:
                return json.loads(s3.get_object(Bucket=BUCKET, Key=f"{JOBS[0]}/attempts.json")["Body"].read())
            except ClientError:
                return None

        got = _wait_for(answers, timeout_s=120)
        assert got is not None, "job A's instance wrote no answers"
        assert {name: got[name] for name in OWN} == dict.fromkeys(OWN, "allowed")
        refused = {name: answer for name, answer in got.items() if name not in OWN}
        assert refused == {name: _expected(name) for name in refused}, refused
        # and nothing of B's, of the bucket's or of A's own grants changed
        assert s3.get_object(Bucket=BUCKET, Key=f"{JOBS[1]}/secret.txt")["Body"].read() == b"B's secret"
        listed = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
        assert f"{JOBS[1]}/planted" not in listed and f"{JOBS[0]}/stolen" not in listed
        assert f"{JOBS[0]}/stolen2" not in listed
        assert ec2.describe_security_groups(GroupIds=[b_group])["SecurityGroups"][0]["IpPermissions"] == b_rules
        state = ec2.describe_instances(InstanceIds=[b_instance])["Reservations"][0]["Instances"][0]["State"]["Name"]
        assert state == "running"
        block = s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"]
        assert all(block.values()), block
        assert iam.get_role_policy(RoleName=roles[JOBS[0]], PolicyName="job-prefix")["PolicyDocument"] == a_policy
        assert "sec-a-escape" not in [r["RoleName"] for r in iam.list_roles()["Roles"]]
        assert "sec-made-up" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    finally:
        for job in JOBS:
            aws.terminate_instances(job_labels(job))
            aws.delete_job_identity(job)
        for name in (BUCKET, OTHER_BUCKET):
            for obj in s3.list_objects_v2(Bucket=name).get("Contents", []):
                s3.delete_object(Bucket=name, Key=obj["Key"])


def _session_s3(cloud, role: str):
    keys = instance_credentials(role, "i-policy-test")
    return boto3.client("s3", endpoint_url=cloud.aws_endpoint, region_name="us-east-1",
                        aws_access_key_id=keys["AccessKeyId"], aws_secret_access_key=keys["SecretAccessKey"],
                        aws_session_token=keys["Token"])


def test_a_policy_mistake_fails_here_as_it_would_on_aws(cloud):
    """The old data policy granted ``tokens.bin/*`` (the object as a folder): AWS then refuses the
    object itself, and so does the embedded S3; the policy ``prefix_policy`` builds now reads it."""
    s3, iam = _admin(cloud, "s3"), _admin(cloud, "iam")
    bucket, role = "sec-data", "sailor-sec-policy"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="corpus/tokens.bin", Body=b"tokens")
    s3.put_object(Bucket=bucket, Key="whole/config.json", Body=b"{}")
    mistaken = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": f"arn:aws:s3:::{bucket}/corpus/tokens.bin/*"}]}
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
    try:
        iam.put_role_policy(RoleName=role, PolicyName="job-prefix", PolicyDocument=json.dumps(mistaken))
        with pytest.raises(ClientError, match="AccessDenied"):
            _session_s3(cloud, role).get_object(Bucket=bucket, Key="corpus/tokens.bin")
        fixed = prefix_policy([f"s3://{bucket}/job"], read_only=[f"s3://{bucket}/whole"],
                              read_objects=[f"s3://{bucket}/corpus/tokens.bin"])
        iam.put_role_policy(RoleName=role, PolicyName="job-prefix", PolicyDocument=json.dumps(fixed))
        instance = _session_s3(cloud, role)
        assert instance.get_object(Bucket=bucket, Key="corpus/tokens.bin")["Body"].read() == b"tokens"
        assert instance.list_objects_v2(Bucket=bucket, Prefix="whole/")["KeyCount"] == 1
        for refused in (lambda: instance.list_objects_v2(Bucket=bucket, Prefix="corpus/"),  # an object is no folder
                        lambda: instance.list_objects_v2(Bucket=bucket, Prefix="whole"),  # nor a neighbour's start
                        lambda: instance.list_objects_v2(Bucket=bucket)):  # no prefix: the condition fails, as on AWS
            with pytest.raises(ClientError, match="AccessDenied"):
                refused()
    finally:
        iam.delete_role_policy(RoleName=role, PolicyName="job-prefix")
        iam.delete_role(RoleName=role)


def test_moto_s_own_controls_and_unsigned_calls_are_refused(cloud):
    import urllib.error
    import urllib.request

    for method, path in (("POST", "/moto-api/reset"), ("GET", "/moto-api/data.json"), ("POST", "/")):
        req = urllib.request.Request(f"{cloud.aws_endpoint}{path}", method=method,
                                     data=b"Action=DescribeInstances&Version=2016-11-15" if path == "/" else b"")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 403, path
    assert _admin(cloud, "ec2").describe_regions()["Regions"]  # the controller's keys still work


def test_a_known_key_with_a_wrong_secret_or_token_is_refused(cloud):
    key_id, _ = cloud.aws_keys
    forged = dict(endpoint_url=cloud.aws_endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                  aws_secret_access_key="not-the-secret")
    with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
        boto3.client("s3", **forged).list_buckets()
    with pytest.raises(ClientError, match="AuthFailure"):
        boto3.client("ec2", **forged).describe_instances()
    iam = _admin(cloud, "iam")
    role = "sailor-sec-token"
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
    try:
        keys = instance_credentials(role, "i-token-test")
        with pytest.raises(ClientError, match="InvalidToken"):
            boto3.client("s3", endpoint_url=cloud.aws_endpoint, region_name="us-east-1",
                         aws_access_key_id=keys["AccessKeyId"], aws_secret_access_key=keys["SecretAccessKey"],
                         aws_session_token="another-session's-token").list_buckets()
    finally:
        iam.delete_role(RoleName=role)
