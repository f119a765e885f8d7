"""Google Compute Engine through ``google.cloud.compute_v1``: spot VMs labelled with the job.

Credentials come from ``google.auth.default()`` (``GOOGLE_APPLICATION_CREDENTIALS``,
``gcloud auth application-default login``, the metadata server); ``api_endpoint``
and anonymous credentials point the same code at the embedded GCE fake.
Compute Engine sells no prices through this API, so prices come from the catalog.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence

import google.api_core.exceptions as gexc
import google.auth
import google.auth.exceptions
import requests
from google.cloud import compute_v1

from infra.errors import CapacityError, CloudConfigError, CloudError, QuotaError, TransientCloudError
from infra.gcp_identity import GcpJobIdentities, job_account_email
from infra.provider import CloudProvider, Feature
from infra.records import (
    ATTEMPT_LABEL,
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
from sailor_core.catalog.instances import InstanceType, Offer, get_instance_type, instance_types, offer_for

PREEMPTED_OPERATION = "compute.instances.preempted"
_CAPACITY_CODES = {
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
    "STOCKOUT",
    "NOT_OFFERED",
}
_QUOTA_CODES = {"QUOTA_EXCEEDED", "quotaExceeded", "rateLimitExceeded:quota"}
_STATES = {
    "PROVISIONING": PENDING,
    "STAGING": PENDING,
    "RUNNING": RUNNING,
    "STOPPING": STOPPING,
    "SUSPENDING": STOPPING,
    "REPAIRING": PENDING,
}
_NAME = re.compile(r"^sailor-(?P<job>[a-z0-9-]+)-a(?P<attempt>\d+)-[0-9a-f]{6}$")


def instance_name(job_id: str, attempt: str | int) -> str:
    """A GCE name that carries the job, so even a deleted (preempted) VM is traceable."""
    job = job_id.replace("_", "-")[:40].strip("-") or "job"
    return f"sailor-{job}-a{attempt}-{secrets.token_hex(3)}"


def translate_gcp_error(exc: Exception, *, zone: str = "", what: str = "") -> Exception:
    where = f" in {zone}" if zone else ""
    msg = f"gcp {what}{where}: {exc}".strip()
    if isinstance(exc, google.auth.exceptions.DefaultCredentialsError):
        return CloudConfigError(
            f"gcp: no credentials ({exc}); run 'gcloud auth application-default login' "
            "or set GOOGLE_APPLICATION_CREDENTIALS",
            cloud="gcp",
        )
    if isinstance(exc, (gexc.TooManyRequests, gexc.ServiceUnavailable, gexc.InternalServerError,
                        gexc.GatewayTimeout, gexc.DeadlineExceeded, gexc.BadGateway)):
        return TransientCloudError(msg, cloud="gcp", zone=zone, code=str(getattr(exc, "code", "")))
    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return TransientCloudError(msg, cloud="gcp", zone=zone, code="timeout")
    if isinstance(exc, gexc.Forbidden):
        if "quota" in str(exc).lower():
            return QuotaError(msg, cloud="gcp", zone=zone, code="QUOTA_EXCEEDED")
        return CloudConfigError(msg, cloud="gcp", zone=zone, code="forbidden")
    if isinstance(exc, gexc.Unauthorized):
        return CloudConfigError(msg, cloud="gcp", zone=zone, code="unauthorized")
    if isinstance(exc, gexc.BadRequest) and "does not exist in zone" in str(exc):
        return CapacityError(msg, cloud="gcp", zone=zone, code="NOT_OFFERED")
    if isinstance(exc, gexc.BadRequest) and "/serviceAccounts/" in str(exc) and "not found" in str(exc):
        # a job's account made seconds ago: IAM is eventually consistent, GCE sees it within a minute
        return TransientCloudError(msg, cloud="gcp", zone=zone, code="serviceAccountNotFound")
    if isinstance(exc, gexc.GoogleAPICallError):
        return CloudError(msg, cloud="gcp", zone=zone, code=str(getattr(exc, "code", "")))
    return exc


def _operation_error(op: compute_v1.Operation, zone: str, what: str) -> Exception | None:
    if not op.error or not op.error.errors:
        return None
    first = op.error.errors[0]
    msg = f"gcp {what} in {zone}: {first.code}: {first.message}"
    if first.code in _CAPACITY_CODES:
        return CapacityError(msg, cloud="gcp", zone=zone, code=first.code)
    if first.code in _QUOTA_CODES or "QUOTA" in first.code:
        return QuotaError(msg, cloud="gcp", zone=zone, code=first.code)
    if op.http_error_status_code >= 500:
        return TransientCloudError(msg, cloud="gcp", zone=zone, code=first.code)
    return CloudError(msg, cloud="gcp", zone=zone, code=first.code)


def _last(url: str) -> str:
    return url.rsplit("/", 1)[-1]


class GCPProvider(CloudProvider):
    cloud = "gcp"
    features = frozenset({Feature.JOB_NETWORK, Feature.JOB_IDENTITY})

    def __init__(
        self,
        *,
        project: str | None = None,
        zones: Sequence[str] | None = None,
        api_endpoint: str | None = None,
        credentials=None,
        image: str = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11",
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        service_account: str | None = None,
    ) -> None:
        super().__init__(retry=retry)
        # what instances outside a job's identity run as; a job's run as its own account (create_job_identity)
        self.service_account = service_account
        self.instance_account = service_account
        self._accounts: dict[str, str] = {}  # job id -> the job's service account, made by this provider
        if credentials is None:
            try:
                credentials, default_project = google.auth.default()
            except Exception as exc:  # noqa: BLE001
                raise translate_gcp_error(exc) from exc
            project = project or default_project
        if not project:
            raise CloudConfigError(f"gcp: no project (set {settings.GCP_PROJECT_ENV} or a gcloud default project)",
                                   cloud="gcp")
        self.project = project
        catalog_zones = sorted({z for r in instance_types() if r.cloud == "gcp" for z in r.zones})
        self.zones = list(zones or catalog_zones)
        self.image = image
        self.timeout_s = timeout_s
        opts = {"api_endpoint": api_endpoint} if api_endpoint else None
        kw = dict(credentials=credentials, client_options=opts)
        self._instances = compute_v1.InstancesClient(**kw)
        self._zones = compute_v1.ZonesClient(**kw)
        self._machine_types = compute_v1.MachineTypesClient(**kw)
        self._accelerators = compute_v1.AcceleratorTypesClient(**kw)
        self._zone_ops = compute_v1.ZoneOperationsClient(**kw)
        self._global_ops = compute_v1.GlobalOperationsClient(**kw)
        self._firewalls = compute_v1.FirewallsClient(**kw)
        self._identities = GcpJobIdentities(credentials=credentials, project=project, endpoint=api_endpoint,
                                            timeout_s=timeout_s)

    @classmethod
    def from_settings(cls) -> "GCPProvider":
        return cls(project=settings.gcp_project(), zones=settings.gcp_zones() or None,
                   service_account=settings.gcp_service_account())

    def _do(self, what: str, fn, *, zone: str = ""):
        def call():
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - translated or re-raised unchanged
                raise translate_gcp_error(exc, zone=zone, what=what) from exc

        return self._call(call, what)

    # ---- offers -------------------------------------------------------------------

    def list_offers(self, gpu_types=None, regions=None) -> list[Offer]:
        wanted = {normalize_gpu_name(g) for g in gpu_types} if gpu_types else None
        rows = [r for r in instance_types() if r.cloud == "gcp" and (wanted is None or r.gpu in wanted)]
        if not rows:
            return []
        region_set = set(regions) if regions else None
        zones = [
            z.name
            for z in self._do("zones.list", lambda: list(self._zones.list(project=self.project, retry=None, timeout=self.timeout_s)))
            if z.name in self.zones and (region_set is None or _last(z.region) in region_set) and z.status == "UP"
        ]
        names = sorted({r.machine_type for r in rows})
        mt_filter = " OR ".join(f'(name = "{n}")' for n in names)
        offers = []
        for zone in zones:
            machine_types = {
                m.name
                for m in self._do("machineTypes.list", lambda: list(self._machine_types.list(
                    request=compute_v1.ListMachineTypesRequest(project=self.project, zone=zone, filter=mt_filter),
                    retry=None, timeout=self.timeout_s)), zone=zone)
            }
            accels = {
                a.name: a.maximum_cards_per_instance
                for a in self._do("acceleratorTypes.list", lambda: list(self._accelerators.list(
                    project=self.project, zone=zone, retry=None, timeout=self.timeout_s)), zone=zone)
            }
            for row in rows:
                if row.machine_type in machine_types and accels.get(row.accelerator_type, 0) >= row.gpus_per_node:
                    offers.append(offer_for(row, zone))
        offers.sort(key=lambda o: (o.zone, o.gpu, o.gpus_per_node))
        return offers

    # ---- instances ----------------------------------------------------------------

    def _resource(self, row: InstanceType, zone: str, name: str, labels, spot: bool, script: str | None):
        scheduling = compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=False)
        if spot:
            scheduling.provisioning_model = "SPOT"
            scheduling.instance_termination_action = "DELETE"
        inst = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{row.machine_type}",
            labels={k: str(v) for k, v in labels.items()},
            scheduling=scheduling,
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(source_image=self.image, disk_size_gb=200),
            )],
            network_interfaces=[compute_v1.NetworkInterface(
                network="global/networks/default",
                # an external address: peers in another cloud reach the instance by it
                access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])],
            tags=compute_v1.Tags(items=[job_resource_name(labels[JOB_LABEL])] if JOB_LABEL in labels else []),
        )
        account = self._accounts.get(labels.get(JOB_LABEL, "")) or self.service_account
        if account:
            inst.service_accounts = [compute_v1.ServiceAccount(
                email=account, scopes=["https://www.googleapis.com/auth/devstorage.read_write"])]
        if row.attached_gpus:
            inst.guest_accelerators = [compute_v1.AcceleratorConfig(
                accelerator_count=row.gpus_per_node,
                accelerator_type=f"zones/{zone}/acceleratorTypes/{row.accelerator_type}",
            )]
        if script:
            inst.metadata = compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value=script)])
        return inst

    def run_instances(self, *, zone, instance_type, count, labels, spot=True, startup_script=None):
        row = get_instance_type("gcp", instance_type)
        if count < 1:
            raise CloudError(f"gcp run_instances: count must be >= 1, got {count}", cloud="gcp")
        created: list[str] = []
        try:
            for _ in range(count):
                name = instance_name(labels.get(JOB_LABEL, "job"), labels.get(ATTEMPT_LABEL, "0"))
                resource = self._resource(row, zone, name, labels, spot, startup_script)
                self._insert(zone, resource)
                created.append(name)
        except BaseException:
            for name in created:  # all or nothing, like EC2's MinCount
                self._delete(zone, name, missing_ok=True)
            raise
        return [self._info(self._do("instances.get", lambda n=n: self._instances.get(
            project=self.project, zone=zone, instance=n, retry=None, timeout=self.timeout_s), zone=zone)) for n in created]

    def _insert(self, zone: str, resource: compute_v1.Instance) -> None:
        def attempt():
            try:
                op = self._instances.insert(project=self.project, zone=zone, instance_resource=resource,
                                            retry=None, timeout=self.timeout_s)
                done = self._zone_ops.wait(project=self.project, zone=zone, operation=op.name, retry=None, timeout=self.timeout_s)
            except gexc.Conflict:
                return  # our earlier attempt got through before its answer was lost
            except Exception as exc:  # noqa: BLE001
                raise translate_gcp_error(exc, zone=zone, what="instances.insert") from exc
            err = _operation_error(done, zone, "instances.insert")
            if err is not None:
                raise err

        self._call(attempt, "instances.insert")

    def _delete(self, zone: str, name: str, *, missing_ok: bool = False) -> None:
        def attempt():
            try:
                op = self._instances.delete(project=self.project, zone=zone, instance=name, retry=None, timeout=self.timeout_s)
                self._zone_ops.wait(project=self.project, zone=zone, operation=op.name, retry=None, timeout=self.timeout_s)
            except gexc.NotFound:
                if not missing_ok:
                    raise CloudError(f"gcp: instance {name} in {zone} not found", cloud="gcp", zone=zone) from None
            except Exception as exc:  # noqa: BLE001
                raise translate_gcp_error(exc, zone=zone, what="instances.delete") from exc

        self._call(attempt, "instances.delete")

    def _row_of(self, machine_type: str, accel: str | None, count: int) -> InstanceType | None:
        for row in instance_types():
            if row.cloud == "gcp" and row.machine_type == machine_type:
                if not row.attached_gpus or (row.accelerator_type == accel and row.gpus_per_node == count):
                    return row
        return None

    def _info(self, inst: compute_v1.Instance) -> InstanceInfo:
        accel, count = None, 0
        if inst.guest_accelerators:
            accel = _last(inst.guest_accelerators[0].accelerator_type)
            count = inst.guest_accelerators[0].accelerator_count
        row = self._row_of(_last(inst.machine_type), accel, count)
        labels = dict(inst.labels)
        ip = inst.network_interfaces[0].network_i_p if inst.network_interfaces else None
        access = inst.network_interfaces[0].access_configs if inst.network_interfaces else []
        public = access[0].nat_i_p if access else None
        return InstanceInfo(
            cloud="gcp",
            instance_id=inst.name,
            zone=_last(inst.zone),
            instance_type=row.instance_type if row else _last(inst.machine_type),
            gpu=row.gpu if row else None,
            gpus_per_node=row.gpus_per_node if row else count,
            spot=inst.scheduling.provisioning_model == "SPOT",
            state=_STATES.get(inst.status, TERMINATED),
            labels=labels,
            private_ip=labels.get(LOCAL_ADDRESS_LABEL) or ip or None,
            public_ip=public or None,
            state_reason=inst.status,
        )

    def query_instances(self, labels: Mapping[str, str], *, include_ended: bool = True) -> list[InstanceInfo]:
        flt = " AND ".join(f'labels.{k} = "{v}"' for k, v in labels.items())
        pager = self._do("instances.aggregatedList", lambda: list(self._instances.aggregated_list(
            request=compute_v1.AggregatedListInstancesRequest(project=self.project, filter=flt),
            retry=None, timeout=self.timeout_s)))
        found = [
            self._info(i)
            for _, scoped in pager
            for i in scoped.instances
            if all(i.labels.get(k) == str(v) for k, v in labels.items())
        ]
        if not include_ended:
            found = [i for i in found if i.live]
        present = {(i.zone, i.instance_id) for i in found}
        # Spot VMs with termination action DELETE vanish after preemption: their
        # preempted operations are what is left, named after the job.
        if include_ended and JOB_LABEL in labels and set(labels) <= {JOB_LABEL, ATTEMPT_LABEL}:
            job = labels[JOB_LABEL].replace("_", "-")[:40].strip("-")
            attempt = labels.get(ATTEMPT_LABEL)
            ops = self._do("globalOperations.aggregatedList", lambda: list(self._global_ops.aggregated_list(
                request=compute_v1.AggregatedListGlobalOperationsRequest(
                    project=self.project, filter=f'operationType = "{PREEMPTED_OPERATION}"'),
                retry=None, timeout=self.timeout_s)))
            for _, scoped in ops:
                for op in scoped.operations:
                    m = _NAME.match(_last(op.target_link))
                    if op.operation_type != PREEMPTED_OPERATION or not m or m["job"] != job:
                        continue
                    if attempt is not None and m["attempt"] != str(attempt):
                        continue
                    zone = _last(op.zone)
                    if (zone, _last(op.target_link)) in present:
                        continue
                    present.add((zone, _last(op.target_link)))
                    found.append(InstanceInfo(
                        cloud="gcp", instance_id=_last(op.target_link), zone=zone, instance_type="", gpu=None,
                        gpus_per_node=0, spot=True, state=PREEMPTED,
                        labels={JOB_LABEL: labels[JOB_LABEL], ATTEMPT_LABEL: m["attempt"]},
                        state_reason=PREEMPTED_OPERATION,
                    ))
        # A spot VM that was preempted but kept (termination action STOP) shows TERMINATED.
        return sorted(found, key=lambda i: (i.zone, i.instance_id))

    def terminate_instances(self, labels: Mapping[str, str], *, instance_ids=None) -> list[str]:
        only = set(instance_ids) if instance_ids is not None else None
        live = [i for i in self.query_instances(labels, include_ended=False)
                if only is None or i.instance_id in only]
        for i in live:
            self._delete(i.zone, i.instance_id, missing_ok=True)
        return [i.instance_id for i in live]


    # ---- a job's network: firewall rules on the instances' tag ---------------------------

    def _insert_firewall(self, rule: compute_v1.Firewall) -> None:
        def attempt():
            try:
                op = self._firewalls.insert(project=self.project, firewall_resource=rule, retry=None,
                                            timeout=self.timeout_s)
                done = self._global_ops.wait(project=self.project, operation=op.name, retry=None, timeout=self.timeout_s)
            except gexc.Conflict:
                return
            except Exception as exc:  # noqa: BLE001
                raise translate_gcp_error(exc, what="firewalls.insert") from exc
            err = _operation_error(done, "global", "firewalls.insert")
            if err is not None:
                raise err

        self._call(attempt, "firewalls.insert")

    def _delete_firewall(self, name: str) -> bool:
        def attempt():
            try:
                op = self._firewalls.delete(project=self.project, firewall=name, retry=None, timeout=self.timeout_s)
                self._global_ops.wait(project=self.project, operation=op.name, retry=None, timeout=self.timeout_s)
                return True
            except gexc.NotFound:
                return False
            except Exception as exc:  # noqa: BLE001
                raise translate_gcp_error(exc, what="firewalls.delete") from exc

        return self._call(attempt, "firewalls.delete")

    def _rule(self, name: str, tag: str, *, source_tags=(), source_ranges=()) -> compute_v1.Firewall:
        rule = compute_v1.Firewall(
            name=name, network="global/networks/default", direction="INGRESS", priority=1000,
            description="Sailor: the rendezvous and collective ports of one job",
            allowed=[compute_v1.Allowed(I_p_protocol="tcp",
                                        ports=[str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in JOB_PORTS])],
            target_tags=[tag])
        if source_tags:
            rule.source_tags = list(source_tags)
        if source_ranges:
            rule.source_ranges = list(source_ranges)
        return rule

    def open_job_network(self, job_id: str) -> None:
        """The job's rule: its ports open among instances carrying the job's tag, nothing else."""
        tag = job_resource_name(job_id)
        self._insert_firewall(self._rule(job_resource_name(job_id, "peers-in"), tag, source_tags=[tag]))

    def set_job_peers(self, job_id: str, cidrs) -> None:
        """Open the job's ports to exactly these outside addresses (peers in another cloud)."""
        name, tag = job_resource_name(job_id, "peers-out"), job_resource_name(job_id)
        current = self.job_firewalls(job_id).get(name)
        wanted = sorted(set(cidrs))
        if current is not None and sorted(current.source_ranges) == wanted:
            return
        if current is not None:
            self._delete_firewall(name)
        if wanted:
            self._insert_firewall(self._rule(name, tag, source_ranges=wanted))

    def job_firewalls(self, job_id: str) -> dict[str, compute_v1.Firewall]:
        names = {job_resource_name(job_id, "peers-in"), job_resource_name(job_id, "peers-out")}
        rules = self._do("firewalls.list", lambda: list(self._firewalls.list(
            project=self.project, retry=None, timeout=self.timeout_s)))
        return {r.name: r for r in rules if r.name in names}

    def job_network_leftovers(self, job_id: str) -> list[str]:
        return list(self.job_firewalls(job_id))

    def delete_job_network(self, job_id: str) -> list[str]:
        return [name for name in self.job_firewalls(job_id) if self._delete_firewall(name)]

    # ---- a job's identity: its own service account, granted its gs:// URLs by bucket IAM ----

    def job_instance_account(self, job_id: str) -> str | None:
        return job_account_email(job_id, self.project)

    def create_job_identity(self, job_id: str, *, read_write: Sequence[str], read_only: Sequence[str] = (),
                            read_objects: Sequence[str] = (), trusted_accounts: Mapping[str, str] | None = None) -> str:
        """The job's service account, which its instances run as, with bucket IAM bindings (IAM
        Conditions) for exactly the gs:// URLs given (``infra.gcp_identity``); GCP trusts no
        other cloud's accounts (``trusted_accounts`` is unused)."""
        email = self._call(lambda: self._identities.create(job_id, read_write=read_write, read_only=read_only,
                                                           read_objects=read_objects), "iam.serviceAccounts.create")
        self._accounts[job_id] = email
        return email

    def delete_job_identity(self, job_id: str) -> list[str]:
        self._accounts.pop(job_id, None)
        return self._call(lambda: self._identities.delete(job_id), "iam.serviceAccounts.delete")

    def job_identity_leftovers(self, job_id: str) -> list[str]:
        return self._call(lambda: self._identities.leftovers(job_id), "iam.serviceAccounts.get")
