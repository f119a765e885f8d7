"""What the embedded AWS endpoint's authorisation costs per request (issue 37): the CPU time of
``aws_auth.s3_refusal`` (an object GET signed by the controller's keys) and ``query_refusal`` (an
EC2 DescribeInstances), each signature verified and the caller's policies evaluated by moto's
classes; then the same requests end to end through an embedded cloud, for scale.

    .venv/bin/python benchmarks/bench_aws_auth.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import boto3
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from werkzeug.test import EnvironBuilder

from infra.local.aws_auth import controller_keys, query_refusal, s3_refusal
from infra.local.cloud import EmbeddedCloud

BASE = "http://127.0.0.1:5000"


def _signed_environ(auth_cls, service: str, method: str, target: str, body: bytes, headers: dict) -> dict:
    key_id, secret = controller_keys()
    request = AWSRequest(method=method, url=BASE + target, data=body, headers=headers)
    auth_cls(Credentials(key_id, secret), service, "us-east-1").add_auth(request)
    path, _, query = target.partition("?")
    environ = EnvironBuilder(method=method, base_url=BASE, path=path, query_string=query or None,
                             headers=dict(request.headers.items()), data=body).get_environ()
    environ["RAW_URI"] = target
    return environ


def _cpu_us(call, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        call()
    return (time.process_time() - start) / n * 1e6


def _end_to_end_ms(n: int) -> dict[str, float]:
    cloud = EmbeddedCloud(state_dir=tempfile.mkdtemp(prefix="bench-auth-"), network="host").start()
    try:
        key_id, secret = cloud.aws_keys
        kw = dict(endpoint_url=cloud.aws_endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                  aws_secret_access_key=secret)
        s3, ec2 = boto3.client("s3", **kw), boto3.client("ec2", **kw)
        s3.create_bucket(Bucket="bench")
        s3.put_object(Bucket="bench", Key="job/x", Body=b"x" * 1000)
        out = {}
        for name, call in (("S3 GetObject", lambda: s3.get_object(Bucket="bench", Key="job/x")["Body"].read()),
                           ("EC2 DescribeInstances", ec2.describe_instances)):
            call()
            start = time.perf_counter()
            for _ in range(n):
                call()
            out[name] = (time.perf_counter() - start) / n * 1000
        return out
    finally:
        cloud.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    s3_env = _signed_environ(S3SigV4Auth, "s3", "GET", "/bench/job/x", b"", {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    body = b"Action=DescribeInstances&Version=2016-11-15"
    ec2_env = _signed_environ(SigV4Auth, "ec2", "POST", "/", body,
                              {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    assert s3_refusal(s3_env, b"") is None and query_refusal(ec2_env, body, "DescribeInstances") is None
    print(f"S3 GetObject authorisation: {_cpu_us(lambda: s3_refusal(s3_env, b''), args.requests):.0f} us CPU")
    print(f"EC2 DescribeInstances authorisation: "
          f"{_cpu_us(lambda: query_refusal(ec2_env, body, 'DescribeInstances'), args.requests):.0f} us CPU")
    for name, ms in _end_to_end_ms(max(args.requests // 10, 20)).items():
        print(f"{name} end to end (boto3 -> embedded cloud): {ms:.1f} ms wall")


if __name__ == "__main__":
    main()
