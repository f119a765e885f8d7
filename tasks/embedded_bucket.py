"""The embedded cloud's jobs bucket (on disk under the Sailor home, infra/local/object_store.py):
reading what the jobs left in it (their agents' reports, objects outside every job's prefix)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from infra import config

EMBEDDED_BUCKET = "sailor-jobs"  # the embedded cloud's bucket for jobs


def embedded_s3_client(ends: dict):
    """boto3's S3 on an embedded cloud (``ends``: its endpoints and administrator keys, as
    ``config.embedded_endpoints()`` or a standalone cloud's state gives them)."""
    from infra.local.cloud import _local_session  # lazy: boto3, only for the embedded cloud's bucket

    return _local_session(*ends["aws_keys"]).client("s3", endpoint_url=ends["aws_endpoint"])



def agent_reports(job_id: str, *, ends: dict | None = None) -> list[dict]:
    """The last status documents the job's agents wrote to its prefix of the embedded cloud's jobs
    bucket (``job_id`` ending in ``*``: every job whose id starts so).  ``ends``: a standalone
    cloud's state, else this process's embedded cloud's endpoints."""
    s3 = embedded_s3_client(ends or config.embedded_endpoints())
    stem = job_id[:-1] if job_id.endswith("*") else f"{job_id}/"
    out = []
    try:
        pages = list(s3.get_paginator("list_objects_v2").paginate(Bucket=EMBEDDED_BUCKET, Prefix=stem))
    except s3.exceptions.NoSuchBucket:  # no job has opened its session yet
        return out
    for page in pages:
        for obj in page.get("Contents", []):
            parts = obj["Key"].split("/")
            if len(parts) == 4 and parts[1] == "agents" and parts[3] == "status.json":
                try:
                    out.append(json.loads(s3.get_object(Bucket=EMBEDDED_BUCKET, Key=obj["Key"])["Body"].read()))
                except (s3.exceptions.NoSuchKey, ValueError):
                    continue
    return out


def stray_objects(known_jobs: Sequence[str]) -> list[str]:
    """Objects in the embedded cloud's jobs bucket outside every known job's prefix (none should be)."""
    s3 = embedded_s3_client(config.embedded_endpoints())
    top = s3.list_objects_v2(Bucket=EMBEDDED_BUCKET, Delimiter="/")
    return ([o["Key"] for o in top.get("Contents", [])]
            + [p["Prefix"] for p in top.get("CommonPrefixes", []) if p["Prefix"].rstrip("/") not in set(known_jobs)])
