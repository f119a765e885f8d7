"""A job's identity is granted exactly what the job needs: read on its data (an object is an
object, a prefix a prefix), read on its ``--init-from`` folder, read and write on its own
prefixes, nothing else.  The policy ``infra/aws.prefix_policy`` builds (the same for real AWS)
is evaluated by moto's IAM policy engine, as the embedded cloud's S3 applies it
(``infra/local/aws_auth.py``), for each kind of URL."""

from __future__ import annotations


import pytest

from infra.aws import prefix_policy
from infra.local.aws_auth import s3_allows
from sailor_core.job.spec import JobSpec
from tasks.job_resources import job_reads

JOB = "s3://jobs-bucket/job-a"
CHECKPOINTS = "s3://ckpt-bucket/runs/job-a"


def _policy(spec: JobSpec) -> dict:
    return prefix_policy([JOB, CHECKPOINTS], **job_reads(spec, "s3://"))


def _reads(policy: dict, url: str) -> bool:
    bucket, key = url[len("s3://"):].split("/", 1)
    return s3_allows([policy], "s3:GetObject", f"arn:aws:s3:::{bucket}/{key}")


def _writes(policy: dict, url: str) -> bool:
    bucket, key = url[len("s3://"):].split("/", 1)
    return s3_allows([policy], "s3:PutObject", f"arn:aws:s3:::{bucket}/{key}")


def _lists(policy: dict, bucket: str, prefix: str) -> bool:
    return s3_allows([policy], "s3:ListBucket", f"arn:aws:s3:::{bucket}", prefix=prefix)


def test_a_data_object_is_granted_as_that_object_and_nothing_beside_it():
    policy = _policy(JobSpec(budget_usd=1, dataset="s3://data-bucket/corpus/tokens.bin"))
    assert _reads(policy, "s3://data-bucket/corpus/tokens.bin")
    assert not _writes(policy, "s3://data-bucket/corpus/tokens.bin")
    for other in ("s3://data-bucket/corpus/tokens.bin/x", "s3://data-bucket/corpus/tokens.bin2",
                  "s3://data-bucket/corpus/other.bin", "s3://data-bucket/tokens.bin"):
        assert not _reads(policy, other), other
    assert not _lists(policy, "data-bucket", "corpus/")


def test_the_init_from_folder_is_read_as_a_prefix_and_a_bucket_root_as_the_bucket():
    policy = _policy(JobSpec(budget_usd=1, init_from="s3://models/llama-1b"))
    assert _reads(policy, "s3://models/llama-1b/config.json")
    assert _reads(policy, "s3://models/llama-1b/model-00001-of-00002.safetensors")
    assert _lists(policy, "models", "llama-1b/")
    assert not _writes(policy, "s3://models/llama-1b/config.json")
    assert not _reads(policy, "s3://models/llama-1b2/config.json")  # a neighbour folder with the same start
    assert not _lists(policy, "models", "")
    root = _policy(JobSpec(budget_usd=1, init_from="s3://whole-model/"))
    assert _reads(root, "s3://whole-model/config.json") and _lists(root, "whole-model", "")
    assert not _reads(root, "s3://other-bucket/config.json")


def test_the_jobs_own_prefixes_are_read_and_written_and_a_neighbours_are_not():
    policy = _policy(JobSpec(budget_usd=1))
    for url in (f"{JOB}/agents/i-1/status.json", f"{CHECKPOINTS}/step-5/manifest.json"):
        assert _reads(policy, url) and _writes(policy, url), url
        bucket, key = url[len("s3://"):].split("/", 1)
        assert s3_allows([policy], "s3:DeleteObject", f"arn:aws:s3:::{bucket}/{key}")
    assert _lists(policy, "jobs-bucket", "job-a/agents/")
    for url in ("s3://jobs-bucket/job-b/agents/i-1/status.json", "s3://jobs-bucket/job-a2/x",
                "s3://ckpt-bucket/runs/job-b/step-5/manifest.json", "s3://ckpt-bucket/top.json"):
        assert not _reads(policy, url) and not _writes(policy, url), url
    assert not _lists(policy, "jobs-bucket", "job-b/") and not _lists(policy, "jobs-bucket", "")
    # synthetic data and a local --init-from add nothing in S3
    assert policy == _policy(JobSpec(budget_usd=1, init_from="/models/llama", dataset="synthetic"))


def test_an_object_url_must_name_a_key():
    with pytest.raises(ValueError, match="names a key"):
        prefix_policy([JOB], read_objects=["s3://data-bucket"])
