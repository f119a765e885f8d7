"""Checkpoint and job buckets: created private, with default encryption, ACLs off.

A job's checkpoints hold the model's weights; its documents hold the plan and
addresses.  When Sailor creates the S3 bucket behind an ``s3://`` URL it blocks
every form of public access, enforces bucket-owner object ownership (no ACLs)
and turns on default encryption (SSE-S3, or SSE-KMS with ``SAILOR_S3_KMS_KEY``).
An existing bucket is left as its owner configured it, but ``check_private_bucket``
says what is missing and the flow refuses a bucket whose public access is not blocked.
Credentials come from boto3's standard chain only.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from infra.errors import CloudConfigError
from sailor_core import settings

_PUBLIC_BLOCK = {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                 "RestrictPublicBuckets": True}


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketReport:
    bucket: str
    created: bool
    public_access_blocked: bool
    encryption: str | None  # "AES256", "aws:kms", or None when off


def bucket_of(url: str) -> str | None:
    """The S3 bucket an ``s3://`` URL names; None for other URLs."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "s3":
        return None
    if not parsed.netloc:
        raise CloudConfigError(f"{url!r} names no bucket")
    return parsed.netloc


def _client(client):
    if client is not None:
        return client
    import boto3  # lazy: boto3, only for s3:// URLs

    return boto3.client("s3")  # the standard chain: env, profile, SSO, instance role


def ensure_private_bucket(url: str, *, client=None, region: str | None = None) -> BucketReport | None:
    """Create the URL's bucket private and encrypted if it does not exist; check it if it does."""
    from botocore.exceptions import ClientError  # lazy: botocore, only for s3:// URLs

    bucket = bucket_of(url)
    if bucket is None:
        return None
    s3 = _client(client)
    try:
        s3.head_bucket(Bucket=bucket)
        created = False
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise CloudConfigError(f"cannot reach bucket {bucket!r}: {exc}", cloud="aws") from None
        region = region or s3.meta.region_name or "us-east-1"
        kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        s3.create_bucket(Bucket=bucket, ObjectOwnership="BucketOwnerEnforced", **kwargs)
        s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration=dict(_PUBLIC_BLOCK))
        kms_key = settings.s3_kms_key()
        rule = ({"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": kms_key} if kms_key else {"SSEAlgorithm": "AES256"})
        s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": rule, "BucketKeyEnabled": bool(kms_key)}]})
        created = True
    report = check_private_bucket(bucket, client=s3, created=created)
    if not report.public_access_blocked:
        raise CloudConfigError(f"bucket {bucket!r} does not block public access; Sailor will not write "
                               "checkpoints or job documents there (enable S3 Block Public Access on it)",
                               cloud="aws")
    return report


def bucket_location(bucket: str, *, client=None) -> str | None:
    """The bucket's LocationConstraint as S3's GetBucketLocation answers it (None: made without one,
    which on AWS means us-east-1)."""
    from botocore.exceptions import ClientError  # lazy: botocore, only for S3 buckets

    try:
        return _client(client).get_bucket_location(Bucket=bucket).get("LocationConstraint") or None
    except ClientError as exc:
        raise CloudConfigError(f"cannot ask where bucket {bucket!r} is: {exc}", cloud="aws") from None


def check_private_bucket(bucket: str, *, client=None, created: bool = False) -> BucketReport:
    from botocore.exceptions import ClientError  # lazy: botocore, only for s3:// URLs

    s3 = _client(client)
    try:
        block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
        blocked = all(block.get(k) for k in _PUBLIC_BLOCK)
    except ClientError:
        blocked = False
    try:
        rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
        encryption = rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] if rules else None
    except ClientError:
        encryption = None
    return BucketReport(bucket=bucket, created=created, public_access_blocked=blocked, encryption=encryption)
