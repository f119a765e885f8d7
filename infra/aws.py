"""AWS EC2 through boto3: spot GPU instances tagged with the job, errors translated.

Credentials come from boto3's standard chain (env, ~/.aws, SSO, instance role);
``endpoint_url`` points the same code at the embedded moto server.
"""

from __future__ import annotations

import dataclasses
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
from infra.provider import CloudProvider, log
from infra.records import (
    LOCAL_ADDRESS_LABEL,
    PENDING,
    PREEMPTED,
    RUNNING,
    STOPPING,
    TERMINATED,
    InstanceInfo,
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

