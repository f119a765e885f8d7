"""On GCP a job's instances run as the job's own service account, granted exactly what the job
needs by bucket IAM bindings with IAM Conditions (``infra/gcp_identity.py``, the same calls for
real GCP): read on its data (an object is an object), read on its ``--init-from`` folder (a
prefix), read and write on its own prefixes, nothing else.  The embedded GCS front evaluates the
bindings the provider wrote for the caller's token (``infra/local/gcp_iam.py``): first the bindings
alone, then through an instance's own token, then two jobs at once."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from infra.gcp_identity import job_account_email, job_account_id, job_bindings
from infra.local.gcp_iam import GcpIam
from infra.records import job_labels
from sailor_core.job.spec import JobSpec
from tasks.job_resources import job_reads
from tests.infra.conftest import wait_until
from tests.instance_calls import metadata

JOB = "gs://jobs-bucket/job-a"
CHECKPOINTS = "gs://ckpt-bucket/runs/job-a"
MEMBER = f"serviceAccount:{job_account_email('job-a', 'p')}"


def _iam(spec: JobSpec) -> GcpIam:
    """The bindings ``create_job_identity`` writes for ``spec``, in an IAM of their own."""
    iam = GcpIam(project="p", bucket_exists=lambda name: True)
    for bucket, bindings in job_bindings(MEMBER, "job-a", read_write=[JOB, CHECKPOINTS],
                                         **job_reads(spec, "gs://")).items():
        status, body = iam.handle("PUT", f"/storage/v1/b/{bucket}/iam", lambda b=bindings: {"bindings": b, "version": 3})
        assert status == 200, body
    return iam


def _can(iam: GcpIam, method: str, url: str, *, member: str = MEMBER, copy_source: str = "") -> bool:
    path = "/" + url[len("gs://"):]
    account = member.split(":", 1)[1] if member else None
    return iam.refusal(account, method, path, copy_source) is None


def test_a_data_object_is_granted_as_that_object_and_nothing_beside_it():
    iam = _iam(JobSpec(budget_usd=1, dataset="gs://data-bucket/corpus/tokens.bin"))
    assert _can(iam, "GET", "gs://data-bucket/corpus/tokens.bin")
    assert _can(iam, "HEAD", "gs://data-bucket/corpus/tokens.bin")
    assert not _can(iam, "PUT", "gs://data-bucket/corpus/tokens.bin")
    assert not _can(iam, "DELETE", "gs://data-bucket/corpus/tokens.bin")
    for other in ("gs://data-bucket/corpus/tokens.bin/x", "gs://data-bucket/corpus/tokens.bin2",
                  "gs://data-bucket/corpus/other.bin", "gs://data-bucket/tokens.bin"):
        assert not _can(iam, "GET", other), other
    assert not _can(iam, "GET", "gs://data-bucket?list-type=2&prefix=corpus/")


def test_a_data_prefix_is_read_as_a_folder_and_nothing_beside_it():
    """A prefix the job reads (a folder of data) grants its objects and listings, not a neighbour with the same start."""
    iam = GcpIam(project="p", bucket_exists=lambda name: True)
    (bucket, bindings), = job_bindings(MEMBER, "job-a", read_only=["gs://data-bucket/corpus"]).items()
    assert iam.handle("PUT", f"/storage/v1/b/{bucket}/iam", lambda: {"bindings": bindings, "version": 3})[0] == 200
    assert _can(iam, "GET", "gs://data-bucket/corpus/shard-0.bin")
    assert _can(iam, "GET", "gs://data-bucket?list-type=2&prefix=corpus/")
    for refused in ("gs://data-bucket/corpus2/shard-0.bin", "gs://data-bucket/corpus", "gs://data-bucket/top.bin"):
        assert not _can(iam, "GET", refused), refused
    assert not _can(iam, "PUT", "gs://data-bucket/corpus/shard-0.bin")
    assert not _can(iam, "GET", "gs://data-bucket?list-type=2&prefix=corpus2/")


def test_the_init_from_folder_is_read_as_a_prefix_and_a_bucket_root_as_the_bucket():
    iam = _iam(JobSpec(budget_usd=1, init_from="gs://models/llama-1b"))
    assert _can(iam, "GET", "gs://models/llama-1b/config.json")
    assert _can(iam, "GET", "gs://models/llama-1b/model-00001-of-00002.safetensors")
    assert _can(iam, "GET", "gs://models?list-type=2&prefix=llama-1b/")
    assert not _can(iam, "PUT", "gs://models/llama-1b/config.json")
    assert not _can(iam, "GET", "gs://models/llama-1b2/config.json")  # a neighbour folder with the same start
    assert not _can(iam, "GET", "gs://models?list-type=2&prefix=")
    assert not _can(iam, "GET", "gs://models?list-type=2&prefix=llama-1b2/")
    root = _iam(JobSpec(budget_usd=1, init_from="gs://whole-model/"))
    assert _can(root, "GET", "gs://whole-model/config.json") and _can(root, "GET", "gs://whole-model?list-type=2")
    assert not _can(root, "PUT", "gs://whole-model/config.json")
    assert not _can(root, "GET", "gs://other-bucket/config.json")


def test_the_jobs_own_prefixes_are_read_and_written_and_a_neighbours_are_not():
    iam = _iam(JobSpec(budget_usd=1))
    for url in (f"{JOB}/agents/i-1/status.json", f"{CHECKPOINTS}/step-5/manifest.json"):
        for method in ("GET", "PUT", "DELETE", "POST"):
            assert _can(iam, method, url), (method, url)
    assert _can(iam, "GET", "gs://jobs-bucket?list-type=2&prefix=job-a/agents/")
    for url in ("gs://jobs-bucket/job-b/agents/i-1/status.json", "gs://jobs-bucket/job-a2/x",
                "gs://ckpt-bucket/runs/job-b/step-5/manifest.json", "gs://ckpt-bucket/top.json"):
        assert not _can(iam, "GET", url) and not _can(iam, "PUT", url) and not _can(iam, "DELETE", url), url
    for prefix in ("job-b/", "", "job-a2/"):
        assert not _can(iam, "GET", f"gs://jobs-bucket?list-type=2&prefix={prefix}"), prefix
    # a copy into its own prefix reads its source: another job's object is refused so
    assert not _can(iam, "PUT", f"{JOB}/stolen", copy_source="/jobs-bucket/job-b/agents/i-1/status.json")
    assert _can(iam, "PUT", f"{JOB}/copy", copy_source="/jobs-bucket/job-a/agents/i-1/status.json")
    # buckets are not the job's to make or change; strangers and other accounts get nothing
    assert not _can(iam, "PUT", "gs://new-bucket")
    assert not _can(iam, "GET", f"{JOB}/agents/i-1/status.json", member="")
    assert not _can(iam, "GET", f"{JOB}/agents/i-1/status.json",
                    member=f"serviceAccount:{job_account_email('job-b', 'p')}")
    # synthetic data and a local --init-from add nothing in GCS
    assert job_reads(JobSpec(budget_usd=1, init_from="/models/llama", dataset="synthetic"), "gs://") == \
        {"read_only": [], "read_objects": []}


def test_an_object_url_must_name_a_key_and_account_ids_are_gcps():
    with pytest.raises(ValueError, match="names a key"):
        job_bindings(MEMBER, "job-a", read_objects=["gs://data-bucket"])
    long_a, long_b = job_account_id("a-very-long-job-identifier-number-1"), job_account_id("a-very-long-job-identifier-number-2")
    assert long_a != long_b and all(6 <= len(i) <= 30 for i in (long_a, long_b, job_account_id("j")))
    assert job_account_id("job_a") == "sailor-job-a"


def test_a_policy_the_embedded_iam_cannot_hold_is_refused_as_gcp_refuses_it():
    iam = GcpIam(project="p", bucket_exists=lambda name: name == "b")
    cond = {"role": "roles/storage.objectViewer", "members": [MEMBER],
            "condition": {"title": "t", "expression": 'resource.name.startsWith("projects/_/buckets/b/objects/x/")'}}
    assert iam.handle("PUT", "/storage/v1/b/b/iam", lambda: {"bindings": [cond], "version": 1})[0] == 400
    assert iam.handle("PUT", "/storage/v1/b/b/iam", lambda: {"bindings": [{**cond, "role": "roles/owner"}],
                                                             "version": 3})[0] == 400
    assert iam.handle("GET", "/storage/v1/b/missing/iam", dict)[0] == 404
    status, policy = iam.handle("PUT", "/storage/v1/b/b/iam", lambda: {"bindings": [cond], "version": 3})
    assert status == 200
    stale = {"bindings": [], "version": 3, "etag": "CAE="}  # another writer came between
    assert iam.handle("PUT", "/storage/v1/b/b/iam", lambda: stale)[0] == 412


# ---- through the embedded cloud: the provider's calls, an instance's token, the GCS front ----------

def _boot(cloud, providers, job: str):
    p = providers["gcp"]
    (inst,) = p.run_instances(zone="us-central1-a", instance_type="n1-standard-4-t4x1", count=1,
                              labels=job_labels(job, 1), startup_script="#!/bin/bash\nsleep 60\n")
    p.wait_instances(job_labels(job, 1), instance_ids=[inst.instance_id], timeout_s=20)
    assert wait_until(lambda: cloud.machines.get(inst.instance_id) is not None, timeout_s=10)
    return inst


def _token(cloud, instance_id: str) -> str:
    status, answer = metadata(cloud, instance_id, "computeMetadata/v1/instance/service-accounts/default/token")
    assert status == 200, answer
    return json.loads(answer)["access_token"]


def _status(cloud, method: str, url: str, token: str | None, *, data: bytes | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"{cloud.instance_gcs_endpoint}/{url[len('gs://'):]}", data=data, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_an_instance_reaches_exactly_its_jobs_urls_with_its_own_token(cloud, providers):
    for bucket in ("gcp-access", "gcp-models", "gcp-data"):
        cloud.disk.ensure_bucket(bucket)
    local = {"gcp-models/llama/config.json": b"{}", "gcp-data/corpus/tokens.bin": b"tok",
             "gcp-data/corpus/other.bin": b"no", "gcp-access/job-b/secret.txt": b"B's"}
    for path, body in local.items():  # the controller's: the loopback endpoint, the buckets' owner
        urllib.request.urlopen(urllib.request.Request(f"{cloud.gcs_endpoint}/{path}", data=body, method="PUT"))
    email = providers["gcp"].create_job_identity("job-a", read_write=["gs://gcp-access/job-a"],
                                                 read_only=["gs://gcp-models/llama"],
                                                 read_objects=["gs://gcp-data/corpus/tokens.bin"])
    try:
        assert email == providers["gcp"].job_instance_account("job-a")
        inst = _boot(cloud, providers, "job-a")
        got = providers["gcp"]._instances.get(project="sailor-local", zone=inst.zone, instance=inst.instance_id)
        assert [a.email for a in got.service_accounts] == [email]
        token = _token(cloud, inst.instance_id)
        allowed = [("PUT", "gs://gcp-access/job-a/ckpt/x", b"mine"), ("GET", "gs://gcp-access/job-a/ckpt/x", None),
                   ("GET", "gs://gcp-access?list-type=2&prefix=job-a/", None),
                   ("DELETE", "gs://gcp-access/job-a/ckpt/x", None),
                   ("GET", "gs://gcp-models/llama/config.json", None),
                   ("GET", "gs://gcp-models?list-type=2&prefix=llama/", None),
                   ("GET", "gs://gcp-data/corpus/tokens.bin", None)]
        refused = [("GET", "gs://gcp-access/job-b/secret.txt", None), ("PUT", "gs://gcp-access/job-b/x", b"y"),
                   ("DELETE", "gs://gcp-access/job-b/secret.txt", None),
                   ("GET", "gs://gcp-access?list-type=2&prefix=job-b/", None),
                   ("PUT", "gs://gcp-models/llama/config.json", b"{}"), ("GET", "gs://gcp-data/corpus/other.bin", None),
                   ("PUT", "gs://gcp-new-bucket", None)]
        for method, url, data in allowed:
            assert _status(cloud, method, url, token, data=data) in (200, 204), (method, url)
        for method, url, data in refused:
            assert _status(cloud, method, url, token, data=data) == 403, (method, url)
        for stranger in (None, "ya29.made-up"):  # no token, a token no metadata server issued
            assert _status(cloud, "GET", "gs://gcp-models/llama/config.json", stranger) == 403
        assert (cloud.disk.root / "gcp-access" / "job-b" / "secret.txt").read_bytes() == b"B's"
    finally:
        providers["gcp"].terminate_instances(job_labels("job-a"))
        assert providers["gcp"].delete_job_identity("job-a") == [email]
    assert providers["gcp"].job_identity_leftovers("job-a") == []
    assert cloud.gcp_iam.handle("GET", "/storage/v1/b/gcp-access/iam", dict)[1]["bindings"] == []


def test_a_jobs_session_makes_its_gcp_account_and_the_aws_role_trusts_that_account(cloud, providers):
    """``open_job_resources`` (tasks/job_resources.py): with instances on both clouds, a gs:// checkpoint
    location and an s3:// jobs bucket, GCP grants the job's account its gs:// prefix and AWS's role
    trusts that same account (no shared one); closing the session deletes both."""
    from infra.errors import CloudError
    from infra.local.identity import _web_identity_audiences
    from tasks.cloud import close_session
    from tasks.cloud_session import CloudSession
    from tasks.job_resources import job_leftovers, open_job_resources

    cloud.disk.ensure_bucket("sess-ckpt")
    session = CloudSession(mode="real", job_id="sess-a", jobs_url="s3://sess-jobs/sess-a", providers=providers)
    open_job_resources(session, JobSpec(budget_usd=1, checkpoint_url="gs://sess-ckpt/runs/sess-a"))
    try:
        account = job_account_email("sess-a", "sailor-local")
        assert cloud.gcp_iam.has_account(account)
        assert cloud.gcp_iam.refusal(account, "PUT", "/sess-ckpt/runs/sess-a/step_1/x") is None
        assert cloud.gcp_iam.refusal(account, "PUT", "/sess-ckpt/runs/sess-b/step_1/x") is not None
        role = providers["aws"]._do_iam("get_role", RoleName="sailor-sess-a")["Role"]
        assert _web_identity_audiences(role["AssumeRolePolicyDocument"]) == {account}
    finally:
        close_session(session)
    assert job_leftovers("sess-a", providers) == []
    # a grant the cloud refuses (no such bucket) fails the session's opening and leaves no account behind
    failing = CloudSession(mode="real", job_id="sess-b", jobs_url="s3://sess-jobs/sess-b", providers=providers)
    with pytest.raises(CloudError, match="404"):
        open_job_resources(failing, JobSpec(budget_usd=1, checkpoint_url="gs://no-such-bucket/runs/sess-b"))
    close_session(failing)
    assert job_leftovers("sess-b", providers) == []


def test_an_instance_with_an_unknown_account_is_refused_and_retried_as_iam_propagation(cloud, providers):
    """GCE refuses an account that does not exist; right after its creation on real GCP that is IAM's
    propagation delay, so the provider retries it as transient rather than failing the attempt."""
    from infra.errors import TransientCloudError

    providers["gcp"]._accounts["ghost"] = job_account_email("ghost", "sailor-local")  # never created
    with pytest.raises(TransientCloudError, match="serviceAccounts/sailor-ghost@"):
        providers["gcp"].run_instances(zone="us-central1-a", instance_type="n1-standard-4-t4x1", count=1,
                                       labels=job_labels("ghost", 1), startup_script="#!/bin/bash\nsleep 60\n")
    assert providers["gcp"].query_instances(job_labels("ghost")) == []
