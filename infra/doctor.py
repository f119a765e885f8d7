"""``sailor doctor``: is this account ready for Sailor's jobs?  Each check says what is missing and how to fix it.

AWS: credentials (STS), regions, the image (``SAILOR_AWS_AMI``), IAM (Sailor makes a role and
instance profile per job, scoped to the job's prefix), spot GPU quotas (Service Quotas, in vCPUs,
for the GPU types asked for).  GCP: credentials and project, firewall rules (Sailor makes them
per job), job identities (Sailor makes a service account per job and grants it the job's gs://
URLs by bucket IAM: the credentials must manage service accounts),
preemptible GPU quotas per region.  The jobs' bucket (``SAILOR_JOBS_URL``): private, encrypted,
writable.  On the embedded cloud every check runs against moto and the GCE fake.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from infra.buckets import bucket_of, check_private_bucket
from infra.errors import CloudError
from sailor_core import settings
from sailor_core.catalog import normalize_gpu_name
from sailor_core.catalog.instances import instance_types
from sailor_core.storage import StorageError, open_storage

OK, MISSING, WARN = "ok", "missing", "warn"
# Service Quotas codes of the spot vCPU quotas per EC2 family (what a spot GPU launch counts against)
AWS_SPOT_QUOTAS = {"g": ("L-3819A6DF", "All G and VT Spot Instance Requests"),
                   "p": ("L-7212CCBC", "All P Spot Instance Requests")}


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    cloud: str
    name: str
    status: str  # ok, missing, warn
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return {"cloud": self.cloud, "check": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def gcp_gpu_quota_metric(accelerator: str, *, preemptible: bool = True) -> str:
    """GCE's quota metric of an accelerator type: nvidia-tesla-t4 -> PREEMPTIBLE_NVIDIA_T4_GPUS."""
    name = accelerator.upper().replace("TESLA-", "").replace("H100-80GB", "H100").replace("-", "_")
    return f"{'PREEMPTIBLE_' if preemptible else ''}{name}_GPUS"


def _smallest(cloud: str, gpus: Sequence[str]) -> dict[str, object]:
    """Per GPU type asked for: the smallest instance type of ``cloud`` selling it."""
    wanted = {normalize_gpu_name(g) for g in gpus} if gpus else None
    best: dict[str, object] = {}
    for row in instance_types():
        if row.cloud == cloud and (wanted is None or row.gpu in wanted):
            if row.gpu not in best or row.gpus_per_node < best[row.gpu].gpus_per_node:
                best[row.gpu] = row
    return best


def check_aws(provider, *, gpus: Sequence[str] = (), embedded: bool = False) -> list[Check]:
    out: list[Check] = []
    region = provider.regions[0] if provider.regions else "us-east-1"
    sts = provider._session.client("sts", region_name=region, endpoint_url=provider.endpoint_url)
    try:
        who = sts.get_caller_identity()
        out.append(Check(cloud="aws", name="credentials", status=OK, detail=f"account {who['Account']} ({who['Arn']})"))
    except Exception as exc:  # noqa: BLE001 - any failure here is the answer
        return [Check(cloud="aws", name="credentials", status=MISSING, detail=_line(exc),
                      fix="configure boto3's credentials: AWS_PROFILE, ~/.aws/credentials, SSO or env keys")]
    out.append(Check(cloud="aws", name="regions", status=OK, detail=", ".join(provider.regions)))
    if not provider.ami_id:
        out.append(Check(cloud="aws", name="image", status=MISSING, detail="no AMI configured",
                         fix=f"set {settings.AWS_AMI_ENV} to a Deep Learning AMI (GPU PyTorch, Ubuntu 22.04) "
                             "of the region: docs/clouds.md"))
    elif embedded:
        out.append(Check(cloud="aws", name="image", status=OK, detail=f"{provider.ami_id} (the embedded image)"))
    else:
        try:
            images = provider._do(region, "describe_images", ImageIds=[provider.ami_id])["Images"]
            detail = f"{provider.ami_id}: {images[0].get('Name', '')}" if images else ""
            out.append(Check(cloud="aws", name="image", status=OK if images else MISSING,
                             detail=detail or f"{provider.ami_id} not found in {region}",
                             fix="" if images else "use an AMI id of that region"))
        except CloudError as exc:
            out.append(Check(cloud="aws", name="image", status=MISSING, detail=_line(exc), fix="check the AMI id"))
    try:
        provider._do_iam("list_roles", MaxItems=1)
        out.append(Check(cloud="aws", name="iam", status=OK,
                         detail="IAM readable: Sailor makes one role + instance profile per job, scoped to its prefix"))
    except CloudError as exc:
        out.append(Check(cloud="aws", name="iam", status=MISSING, detail=_line(exc),
                         fix="allow iam:CreateRole, PutRolePolicy, CreateInstanceProfile, AddRoleToInstanceProfile, "
                             "PassRole and their deletes on roles named sailor-*"))
    out += _aws_quotas(provider, region, gpus)
    return out


def _aws_quotas(provider, region: str, gpus: Sequence[str]) -> list[Check]:
    quotas = provider._session.client("service-quotas", region_name=region, endpoint_url=provider.endpoint_url)
    out: list[Check] = []
    for gpu, row in sorted(_smallest("aws", gpus).items()):
        family = row.machine_type[0]
        code, name = AWS_SPOT_QUOTAS.get(family, (None, None))
        if code is None:
            continue
        try:
            value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        except Exception as exc:  # noqa: BLE001
            out.append(Check(cloud="aws", name=f"quota {gpu}", status=WARN, detail=f"{name}: unknown ({_line(exc)})",
                             fix="check it in the Service Quotas console"))
            continue
        need = _vcpus(row.machine_type)
        ok = value >= need
        out.append(Check(cloud="aws", name=f"quota {gpu}", status=OK if ok else MISSING,
                         detail=f"{name} in {region}: {value:g} vCPUs; one {row.machine_type} needs {need}",
                         fix="" if ok else f"request an increase of {code} (Service Quotas, EC2) in {region}"))
    return out


def _vcpus(machine_type: str) -> int:
    """vCPUs of the common GPU instance sizes (Service Quotas count spot GPU capacity in vCPUs)."""
    size = machine_type.split(".", 1)[-1]
    table = {"xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "12xlarge": 48, "16xlarge": 64,
             "24xlarge": 96, "48xlarge": 192, "metal": 96}
    return table.get(size, 4)


def check_gcp(provider, *, gpus: Sequence[str] = (), embedded: bool = False) -> list[Check]:
    from google.cloud import compute_v1  # lazy: google-cloud-compute (~2 s), only for GCP's checks

    out = [Check(cloud="gcp", name="project", status=OK, detail=provider.project)]
    try:
        provider._do("firewalls.list", lambda: list(provider._firewalls.list(project=provider.project, retry=None,
                                                                             timeout=provider.timeout_s)))
        out.append(Check(cloud="gcp", name="firewall", status=OK,
                         detail="firewall rules readable: Sailor makes one per job on the default network"))
    except CloudError as exc:
        return out + [Check(cloud="gcp", name="credentials", status=MISSING, detail=_line(exc),
                            fix="gcloud auth application-default login, or GOOGLE_APPLICATION_CREDENTIALS")]
    try:
        provider._call(provider._identities.accounts_readable, "iam.serviceAccounts.list")
        out.append(Check(cloud="gcp", name="job identity", status=OK,
                         detail="service accounts readable: each job's instances run as its own (sailor-<job>@"
                                f"{provider.project}), granted its gs:// URLs by bucket IAM"))
    except CloudError as exc:
        out.append(Check(cloud="gcp", name="job identity", status=MISSING, detail=_line(exc),
                         fix="give Sailor's credentials roles/iam.serviceAccountAdmin and roles/iam.serviceAccountUser "
                             "on the project, and storage.buckets.setIamPolicy on the jobs' buckets "
                             "(uniform bucket-level access on)"))
    out.append(Check(cloud="gcp", name="image", status=OK,
                     detail=provider.image + (" (the embedded image)" if embedded else "")))
    regions_client = compute_v1.RegionsClient(credentials=provider._instances._transport._credentials,
                                              client_options=provider._instances._client_options)
    by_region: dict[str, list] = {}
    for gpu, row in sorted(_smallest("gcp", gpus).items()):
        zones = [z for z in row.zones if z in provider.zones] or list(row.zones)
        region = sorted({z.rsplit("-", 1)[0] for z in zones})[0]
        if region not in by_region:
            try:
                by_region[region] = list(regions_client.get(project=provider.project, region=region).quotas)
            except Exception as exc:  # noqa: BLE001
                out.append(Check(cloud="gcp", name=f"quota {gpu}", status=WARN, detail=f"{region}: {_line(exc)}",
                                 fix="check it on the console's Quotas page"))
                continue
        metric = gcp_gpu_quota_metric(row.accelerator_type)
        found = next((q for q in by_region[region] if q.metric == metric), None)
        if found is None:
            out.append(Check(cloud="gcp", name=f"quota {gpu}", status=WARN, detail=f"{region}: no {metric} quota listed"))
            continue
        free = found.limit - found.usage
        ok = free >= row.gpus_per_node
        out.append(Check(cloud="gcp", name=f"quota {gpu}", status=OK if ok else MISSING,
                         detail=f"{metric} in {region}: {free:g} of {found.limit:g} free",
                         fix="" if ok else f"request more {metric} in {region} (IAM & Admin > Quotas)"))
    return out


def check_cloud(provider, *, gpus: Sequence[str] = (), embedded: bool = False) -> list[Check]:
    """The checks written for the provider's cloud (``CLOUD_CHECKS``); a cloud without any says so."""
    check = CLOUD_CHECKS.get(provider.cloud)
    if check is None:
        return [Check(cloud=provider.cloud, name="checks", status=WARN,
                      detail="no doctor checks are written for this cloud (infra/doctor.py CLOUD_CHECKS)")]
    return check(provider, gpus=gpus, embedded=embedded)


def check_bucket(jobs_url: str, *, s3_client=None) -> list[Check]:
    """The jobs' bucket: where the instances reach the job; private, encrypted and writable."""
    if "://" not in jobs_url or jobs_url.startswith("file://"):
        return [Check(cloud="storage", name="jobs bucket", status=MISSING, detail=f"{jobs_url} is on this machine",
                      fix=f"on real clouds set {settings.JOBS_URL_ENV} to s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")]
    out: list[Check] = []
    bucket = bucket_of(jobs_url)
    if bucket is not None:
        report = check_private_bucket(bucket, client=s3_client)
        out.append(Check(cloud="storage", name="bucket private", status=OK if report.public_access_blocked else MISSING,
                         detail=f"{bucket}: public access " + ("blocked" if report.public_access_blocked else "not blocked"),
                         fix="" if report.public_access_blocked else "turn on S3 Block Public Access for it"))
        out.append(Check(cloud="storage", name="bucket encrypted", status=OK if report.encryption else MISSING,
                         detail=f"{bucket}: default encryption {report.encryption or 'off'}",
                         fix="" if report.encryption else "turn on default encryption (SSE-S3 or SSE-KMS)"))
    probe = f".sailor-doctor-{uuid.uuid4().hex[:8]}"
    try:
        store = open_storage(jobs_url)
        store.put(f"{probe}/probe", b"ok")
        store.delete_dir(probe)
        out.append(Check(cloud="storage", name="bucket writable", status=OK, detail=f"wrote and deleted {jobs_url}/{probe}"))
    except (StorageError, OSError) as exc:
        out.append(Check(cloud="storage", name="bucket writable", status=MISSING, detail=_line(exc),
                         fix="create the bucket and give your credentials read/write on the prefix"))
    return out


def _line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


# cloud -> its checks: a cloud without an entry is reported as unchecked, not as broken
CLOUD_CHECKS = {"aws": check_aws, "gcp": check_gcp}
