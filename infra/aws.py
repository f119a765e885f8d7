"""AWS EC2 through boto3: spot GPU instances tagged with the job, errors translated.

Credentials come from boto3's standard chain (env, ~/.aws, SSO, instance role);
``endpoint_url`` points the same code at the embedded moto server.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import uuid
from datetime import datetime, timezone
from collections.abc import Mapping, Sequence

import boto3
import botocore.exceptions as bexc
from botocore.config import Config
from botocore.parsers import ResponseParserError

from infra.errors import (
    CapacityError,
    CloudConfigError,
    CloudError,
    QuotaError,
    TransientCloudError,
)
from infra.provider import CloudProvider, Feature, log
from infra.records import (
    JOB_LABEL,
    JOB_PORTS,
    LOCAL_ADDRESS_LABEL,
    PENDING,
    PREEMPTED,
    RUNNING,
    STOPPING,
    TERMINATED,
    InstanceInfo,
    job_resource_name,
)
from infra.retry import RetryPolicy
from sailor_core import settings
from sailor_core.catalog import normalize_gpu_name
from sailor_core.catalog.instances import Offer, get_instance_type, instance_types, offer_for
from sailor_core.errors import UnknownNameError
from sailor_core.zones import parse_zone

SPOT_INTERRUPTION = "Server.SpotInstanceTermination"
_CLIENT_LOCK = threading.Lock()
AWS_REGION = re.compile(r"^[a-z]{2}(?:-gov)?-[a-z]+-\d+$")

_CAPACITY = {
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "SpotMaxPriceTooLow",
    "Unsupported",  # the type is not sold in this AZ: for us, no capacity there
}
_QUOTA = {
    "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "InstanceLimitExceeded",
    "InsufficientFreeAddressesInSubnet",
}
_TRANSIENT = {
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
    "RequestTimeout",
    "DependencyViolation",  # a security group still held by instances that are shutting down
}
_CONFIG = {
    "AuthFailure",
    "UnauthorizedOperation",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "OptInRequired",
    "InvalidAMIID.NotFound",
    "InvalidAMIID.Malformed",
}


def translate_aws_error(exc: Exception, *, zone: str = "", what: str = "") -> Exception:
    """The project's error for a boto3/botocore failure (returned, for ``raise ... from``)."""
    where = f" in {zone}" if zone else ""
    if isinstance(exc, bexc.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        msg = f"aws {what}{where}: {code}: {err.get('Message', '')}".strip()
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _CAPACITY:
            return CapacityError(msg, cloud="aws", zone=zone, code=code)
        if code in _QUOTA:
            return QuotaError(msg, cloud="aws", zone=zone, code=code)
        if code == "InvalidParameterValue" and "instance profile" in msg.lower():
            # a new instance profile takes seconds to be usable by EC2
            return TransientCloudError(msg, cloud="aws", zone=zone, code=code)
        if code in _CONFIG:
            return CloudConfigError(msg, cloud="aws", zone=zone, code=code)
        if code in _TRANSIENT or status >= 500:
            return TransientCloudError(msg, cloud="aws", zone=zone, code=code or str(status))
        return CloudError(msg, cloud="aws", zone=zone, code=code)
    if isinstance(exc, (bexc.NoCredentialsError, bexc.PartialCredentialsError, bexc.NoRegionError)):
        return CloudConfigError(
            f"aws: {exc} (configure credentials the boto3 way: AWS_PROFILE, ~/.aws, env vars)",
            cloud="aws",
        )
    if isinstance(
        exc,
        (
            ResponseParserError,  # a 5xx answered with an HTML page (load balancers, moto crashes)
            bexc.EndpointConnectionError,
            bexc.ConnectTimeoutError,
            bexc.ReadTimeoutError,
            bexc.ConnectionClosedError,
        ),
    ):
        return TransientCloudError(f"aws {what}{where}: {exc}", cloud="aws", zone=zone, code="timeout")
    return exc


def _state_of(inst: dict) -> tuple[str, str | None]:
    name = inst["State"]["Name"]
    reason = (inst.get("StateReason") or {}).get("Code")
    if name in ("terminated", "shutting-down") and reason == SPOT_INTERRUPTION:
        return PREEMPTED, reason
    mapping = {
        "pending": PENDING,
        "running": RUNNING,
        "shutting-down": STOPPING,
        "stopping": STOPPING,
        "stopped": TERMINATED,
        "terminated": TERMINATED,
    }
    return mapping.get(name, TERMINATED), reason


class AWSProvider(CloudProvider):
    cloud = "aws"
    features = frozenset({Feature.JOB_NETWORK, Feature.JOB_IDENTITY})

    def __init__(
        self,
        *,
        regions: Sequence[str] | None = None,
        endpoint_url: str | None = None,
        ami_id: str | None = None,
        spot_prices_from_api: bool | None = None,
        session: boto3.Session | None = None,
        retry: RetryPolicy | None = None,
        read_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(retry=retry)
        catalog_regions = sorted({parse_zone(z).region for r in instance_types() if r.cloud == "aws" for z in r.zones})
        self.regions = list(regions or catalog_regions)
        self.endpoint_url = endpoint_url
        self.ami_id = ami_id
        # moto's spot price history is a constant; real AWS's is the live price.
        self.spot_prices_from_api = (endpoint_url is None) if spot_prices_from_api is None else spot_prices_from_api
        self._session = session or boto3.Session()
        self._config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},  # we retry, with our own policy
            connect_timeout=5,
            read_timeout=read_timeout_s,
        )
        self._clients: dict[str, object] = {}
        self._groups: dict[tuple[str, str], str] = {}  # (job, region) -> its security group id
        self._profiles: dict[str, str] = {}  # job -> its instance profile's name

    @classmethod
    def from_settings(cls) -> "AWSProvider":
        return cls(regions=settings.aws_regions() or None, ami_id=settings.aws_ami())

    def _iam(self):
        with _CLIENT_LOCK:
            if "iam" not in self._clients:
                self._clients["iam"] = self._session.client("iam", region_name="us-east-1",
                                                             endpoint_url=self.endpoint_url, config=self._config)
            return self._clients["iam"]

    def _do_iam(self, method: str, **kwargs):
        def call():
            try:
                return getattr(self._iam(), method)(**kwargs)
            except Exception as exc:  # noqa: BLE001 - translated or re-raised unchanged
                raise translate_aws_error(exc, what=f"iam {method}") from exc

        return self._call(call, method)

    def _ec2(self, region: str):
        with _CLIENT_LOCK:  # boto3 sessions are not thread-safe while making clients
            if region not in self._clients:
                self._clients[region] = self._session.client(
                    "ec2", region_name=region, endpoint_url=self.endpoint_url, config=self._config
                )
            return self._clients[region]

    def _do(self, region: str, method: str, *, zone: str = "", **kwargs):
        def call():
            try:
                return getattr(self._ec2(region), method)(**kwargs)
            except Exception as exc:  # noqa: BLE001 - translated or re-raised unchanged
                raise translate_aws_error(exc, zone=zone, what=method) from exc

        return self._call(call, method)

    def _pages(self, region: str, method: str, key: str, **kwargs) -> list[dict]:
        items: list[dict] = []
        token = None
        while True:
            extra = {"NextToken": token} if token else {}
            page = self._do(region, method, **kwargs, **extra)
            items.extend(page.get(key, []))
            token = page.get("NextToken")
            if not token:
                return items

    # ---- offers -------------------------------------------------------------------

    def list_offers(self, gpu_types=None, regions=None) -> list[Offer]:
        wanted = {normalize_gpu_name(g) for g in gpu_types} if gpu_types else None
        rows = {r.instance_type: r for r in instance_types() if r.cloud == "aws" and (wanted is None or r.gpu in wanted)}
        offers: list[Offer] = []
        for region in [r for r in regions if AWS_REGION.match(r)] if regions else self.regions:
            if not rows:
                break
            found = self._pages(
                region,
                "describe_instance_type_offerings",
                "InstanceTypeOfferings",
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": sorted(rows)}],
            )
            types_here = sorted({o["InstanceType"] for o in found})
            if not types_here:
                continue
            gpus_by_type = self._gpu_counts(region, types_here)
            spot = self._spot_prices(region, types_here) if self.spot_prices_from_api else {}
            for o in found:
                row = rows[o["InstanceType"]]
                if gpus_by_type.get(row.instance_type, row.gpus_per_node) != row.gpus_per_node:
                    log.warning("aws %s reports %s GPUs, catalog says %d", row.instance_type,
                                gpus_by_type[row.instance_type], row.gpus_per_node)
                offer = offer_for(row, o["Location"])
                live = spot.get((o["InstanceType"], o["Location"]))
                if live is not None:
                    offer = dataclasses.replace(offer, spot_usd_per_hr=live)
                offers.append(offer)
        offers.sort(key=lambda o: (o.zone, o.gpu, o.gpus_per_node))
        return offers

    def _gpu_counts(self, region: str, types: list[str]) -> dict[str, int]:
        out = {}
        for info in self._pages(region, "describe_instance_types", "InstanceTypes", InstanceTypes=types):
            gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
            out[info["InstanceType"]] = sum(int(g.get("Count", 0)) for g in gpus)
        return out

    def _spot_prices(self, region: str, types: list[str]) -> dict[tuple[str, str], float]:
        latest: dict[tuple[str, str], tuple] = {}
        for rec in self._pages(
            region,
            "describe_spot_price_history",
            "SpotPriceHistory",
            InstanceTypes=types,
            ProductDescriptions=["Linux/UNIX"],
            StartTime=datetime.now(timezone.utc),  # "now": the current price per AZ, not 90 days of history
            MaxResults=1000,
        ):
            key = (rec["InstanceType"], rec["AvailabilityZone"])
            if key not in latest or rec["Timestamp"] > latest[key][0]:
                latest[key] = (rec["Timestamp"], float(rec["SpotPrice"]))
        return {k: v[1] for k, v in latest.items()}

    # ---- instances ----------------------------------------------------------------

    def run_instances(self, *, zone, instance_type, count, labels, spot=True, startup_script=None):
        row = get_instance_type("aws", instance_type)
        if count < 1:
            raise CloudError(f"aws run_instances: count must be >= 1, got {count}", cloud="aws")
        if not self.ami_id:
            raise CloudConfigError(
                f"aws: no machine image configured (set {settings.AWS_AMI_ENV} to a GPU AMI id for the region)",
                cloud="aws",
            )
        region = parse_zone(zone).region
        tags = [{"Key": k, "Value": str(v)} for k, v in labels.items()]
        kwargs = dict(
            ImageId=self.ami_id,
            InstanceType=row.machine_type,
            MinCount=count,  # all or nothing: a partial gang is useless for training
            MaxCount=count,
            Placement={"AvailabilityZone": zone},
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            ClientToken=uuid.uuid4().hex,  # makes our retries idempotent on real EC2
        )
        if startup_script:
            kwargs["UserData"] = startup_script
        job = labels.get(JOB_LABEL)
        if job:
            kwargs["SecurityGroupIds"] = [self.job_security_group(job, region)]
            if job in self._profiles:
                kwargs["IamInstanceProfile"] = {"Name": self._profiles[job]}
        if spot:
            kwargs["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        resp = self._do(region, "run_instances", zone=zone, **kwargs)
        return [self._info(inst) for inst in resp["Instances"]]

    def _info(self, inst: dict) -> InstanceInfo:
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        state, reason = _state_of(inst)
        try:
            row = get_instance_type("aws", inst["InstanceType"])
            gpu, gpus = row.gpu, row.gpus_per_node
        except UnknownNameError:  # a type outside the catalog: report it without a GPU
            gpu, gpus = None, 0
        return InstanceInfo(
            cloud="aws",
            instance_id=inst["InstanceId"],
            zone=inst["Placement"]["AvailabilityZone"],
            instance_type=inst["InstanceType"],
            gpu=gpu,
            gpus_per_node=gpus,
            spot=inst.get("InstanceLifecycle") == "spot",
            state=state,
            labels=tags,
            private_ip=tags.get(LOCAL_ADDRESS_LABEL) or inst.get("PrivateIpAddress"),
            public_ip=inst.get("PublicIpAddress"),
            state_reason=reason,
        )

    def query_instances(self, labels: Mapping[str, str], *, include_ended: bool = True) -> list[InstanceInfo]:
        filters = [{"Name": f"tag:{k}", "Values": [str(v)]} for k, v in labels.items()]
        if not include_ended:
            filters.append({"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "shutting-down"]})
        out = []
        for region in self.regions:
            for res in self._pages(region, "describe_instances", "Reservations", Filters=filters):
                out.extend(self._info(i) for i in res["Instances"])
        return sorted(out, key=lambda i: (i.zone, i.instance_id))

    def terminate_instances(self, labels: Mapping[str, str], *, instance_ids=None) -> list[str]:
        only = set(instance_ids) if instance_ids is not None else None
        live = [i for i in self.query_instances(labels, include_ended=False)
                if i.live and (only is None or i.instance_id in only)]
        by_region: dict[str, list[str]] = {}
        for i in live:
            by_region.setdefault(parse_zone(i.zone).region, []).append(i.instance_id)
        for region, ids in by_region.items():
            self._do(region, "terminate_instances", InstanceIds=ids)
        return [i.instance_id for i in live]


    # ---- a job's network: one security group per region it uses ------------------------

    def open_job_network(self, job_id: str) -> None:
        """Nothing yet: the job's group in a region is made when it first launches there."""

    def job_security_group(self, job_id: str, region: str) -> str:
        """The job's group in ``region`` (made on first use in the region's default VPC): the
        rendezvous and collective ports open to members of the same group only."""
        key = (job_id, region)
        if key in self._groups:
            return self._groups[key]
        name = job_resource_name(job_id)
        found = self._do(region, "describe_security_groups",
                         Filters=[{"Name": "group-name", "Values": [name]}])["SecurityGroups"]
        if found:
            group = found[0]["GroupId"]
        else:
            vpcs = self._do(region, "describe_vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
            if not vpcs:
                raise CloudConfigError(f"aws {region}: no default VPC for the job's instances", cloud="aws")
            group = self._do(region, "create_security_group", GroupName=name, VpcId=vpcs[0]["VpcId"],
                             Description=f"Sailor job {job_id}: rendezvous and collectives among its instances",
                             TagSpecifications=[{"ResourceType": "security-group",
                                                 "Tags": [{"Key": JOB_LABEL, "Value": job_id}]}])["GroupId"]
            self._do(region, "authorize_security_group_ingress", GroupId=group, IpPermissions=[
                {"IpProtocol": "tcp", "FromPort": lo, "ToPort": hi,
                 "UserIdGroupPairs": [{"GroupId": group, "Description": "the job's own instances"}]}
                for lo, hi in JOB_PORTS])
        self._groups[key] = group
        return group

    def job_groups(self, job_id: str) -> dict[str, dict]:
        """The job's security groups as described, by region."""
        out = {}
        for region in self.regions:
            for g in self._do(region, "describe_security_groups",
                              Filters=[{"Name": "group-name", "Values": [job_resource_name(job_id)]}])["SecurityGroups"]:
                out[region] = g
        return out

    def job_network_leftovers(self, job_id: str) -> list[str]:
        return [g["GroupId"] for g in self.job_groups(job_id).values()]

    def set_job_peers(self, job_id: str, cidrs: Sequence[str]) -> None:
        """Open the job's ports to exactly these outside addresses (peers in other VPCs or clouds)."""
        wanted = set(cidrs)
        for region, group in self.job_groups(job_id).items():
            have = {r["CidrIp"] for p in group.get("IpPermissions", []) for r in p.get("IpRanges", [])}
            stale, new = sorted(have - wanted), sorted(wanted - have)
            if stale:
                self._do(region, "revoke_security_group_ingress", GroupId=group["GroupId"], IpPermissions=[
                    {"IpProtocol": "tcp", "FromPort": lo, "ToPort": hi, "IpRanges": [{"CidrIp": c} for c in stale]}
                    for lo, hi in JOB_PORTS])
            if new:
                self._do(region, "authorize_security_group_ingress", GroupId=group["GroupId"], IpPermissions=[
                    {"IpProtocol": "tcp", "FromPort": lo, "ToPort": hi,
                     "IpRanges": [{"CidrIp": c, "Description": "a peer of the job outside this VPC"} for c in new]}
                    for lo, hi in JOB_PORTS])

    def delete_job_network(self, job_id: str) -> list[str]:
        """Delete the job's security groups (retried while instances still hold them)."""
        deleted = []
        for region, group in self.job_groups(job_id).items():
            self._do(region, "delete_security_group", GroupId=group["GroupId"])
            deleted.append(group["GroupId"])
        self._groups = {k: v for k, v in self._groups.items() if k[0] != job_id}
        return deleted

    # ---- a job's identity: an instance profile allowed the job's prefixes only -----------

    def create_job_identity(self, job_id: str, *, read_write: Sequence[str], read_only: Sequence[str] = (),
                            read_objects: Sequence[str] = (), trusted_accounts: Mapping[str, str] | None = None) -> str:
        """A role (and its instance profile) that may read and write the prefixes ``read_write``
        (s3:// URLs), read the prefixes ``read_only`` and the objects ``read_objects``, nothing
        else (``prefix_policy``); the job's instances are launched with it.  A GCP
        service account of ``trusted_accounts`` may assume it by web identity (cross-cloud jobs);
        AWS knows no other cloud's accounts."""
        name = job_resource_name(job_id)
        gcp_service_account = (trusted_accounts or {}).get("gcp")
        trust = [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]
        if gcp_service_account:
            trust.append({"Effect": "Allow", "Principal": {"Federated": "accounts.google.com"},
                          "Action": "sts:AssumeRoleWithWebIdentity",
                          "Condition": {"StringEquals": {"accounts.google.com:aud": gcp_service_account}}})
        try:
            self._do_iam("create_role", RoleName=name, AssumeRolePolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": trust}), Tags=[{"Key": JOB_LABEL, "Value": job_id}],
                Description=f"Sailor job {job_id}: its instances' access to the job's bucket prefix")
        except CloudError as exc:
            if exc.code != "EntityAlreadyExists":
                raise
        self._do_iam("put_role_policy", RoleName=name, PolicyName="job-prefix",
                     PolicyDocument=json.dumps(prefix_policy(read_write, read_only, read_objects)))
        try:
            self._do_iam("create_instance_profile", InstanceProfileName=name)
            self._do_iam("add_role_to_instance_profile", InstanceProfileName=name, RoleName=name)
        except CloudError as exc:
            if exc.code not in ("EntityAlreadyExists", "LimitExceeded"):
                raise
        self._profiles[job_id] = name
        return name

    def delete_job_identity(self, job_id: str) -> list[str]:
        name = job_resource_name(job_id)
        self._profiles.pop(job_id, None)
        deleted = []
        for method, kwargs in (("remove_role_from_instance_profile", {"InstanceProfileName": name, "RoleName": name}),
                               ("delete_instance_profile", {"InstanceProfileName": name}),
                               ("delete_role_policy", {"RoleName": name, "PolicyName": "job-prefix"}),
                               ("delete_role", {"RoleName": name})):
            try:
                self._do_iam(method, **kwargs)
                deleted.append(f"{method}:{name}")
            except CloudError as exc:
                if exc.code != "NoSuchEntity":
                    raise
        return deleted

    def job_identity_leftovers(self, job_id: str) -> list[str]:
        name = job_resource_name(job_id)
        try:
            self._do_iam("get_role", RoleName=name)
            return [name]
        except CloudError as exc:
            if exc.code == "NoSuchEntity":
                return []
            raise


def prefix_policy(read_write: Sequence[str], read_only: Sequence[str] = (), read_objects: Sequence[str] = ()) -> dict:
    """An IAM policy: objects under the prefixes ``read_write`` (s3:// URLs) read and written, under
    ``read_only`` read, their listings within those prefixes, and the single objects
    ``read_objects`` read (an object is not a folder: ``s3://b/corpus/tokens.bin`` grants that key,
    not ``corpus/tokens.bin/*``); nothing else.  A prefix is a folder: ``s3://b/job`` grants
    ``job/...``, never ``job2/...``; a bucket's root grants the bucket."""
    statements = []
    for urls, actions in ((read_write, ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]),
                          (read_only, ["s3:GetObject"])):
        for url in urls:
            bucket, prefix = _bucket_and_key(url)
            statements.append({"Effect": "Allow", "Action": actions,
                               "Resource": f"arn:aws:s3:::{bucket}/{prefix + '/' if prefix else ''}*"})
            listing = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}"}
            if prefix:  # a bucket's root: no condition (a listing without a prefix has no s3:prefix to match)
                listing["Condition"] = {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}
            statements.append(listing)
    for url in read_objects:
        bucket, key = _bucket_and_key(url)
        if not key or url.endswith("/"):
            raise ValueError(f"{url}: an object's URL names a key, not a bucket or folder")
        statements.append({"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": f"arn:aws:s3:::{bucket}/{key}"})
    return {"Version": "2012-10-17", "Statement": statements}


def _bucket_and_key(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise ValueError(f"{url}: not an s3:// URL")
    bucket, _, key = url[len("s3://"):].partition("/")
    return bucket, key.strip("/")
