"""The embedded local cloud: moto's EC2 + the GCE fake + local processes as machines.

Both clouds share one capacity model (GPUs per (type, zone), from a trace or set
by hand) and one fault injector. A ticker turns capacity drops into spot
preemptions, and starts/stops the processes of EC2 instances as moto changes
their state. Preempting posts the metadata notice, SIGTERMs the instance's
process group, waits ``notice_s``, SIGKILLs it, then ends the instance as the
cloud would: EC2 terminated with ``Server.SpotInstanceTermination``, GCE
TERMINATED with a ``compute.instances.preempted`` operation, then deleted.
Only spot instances are preempted: capacity counts on-demand instances too (a full
pool refuses both), but a drop reclaims spot capacity, as the clouds do.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from infra.local.aws_auth import controller_keys
from infra.local.aws_server import FIXED_AMI, LIVE, MotoEC2, gpus_of_type
from infra.local.capacity import Capacity
from infra.local.faults import FaultRates, Faults, parse_fault_rates
from infra.local.gce_fake import GCEFake
from infra.local.gcp_iam import GcpIam
from infra.local.identity import Identities
from infra.local.image import image_for_this_machine
from infra.local.machines import Hardware, Machines
from infra.local.metadata_door import MetadataDoor
from infra.local.network import Network
from infra.local.object_store import DiskBuckets
from infra.local.rules import aws_allows, gce_allows
from infra.records import JOB_LABEL
from infra.retry import RetryPolicy
from sailor_core.catalog.instances import instance_types
from sailor_core.errors import InputError, SailorError
from sailor_core.zones import parse_zone

log = logging.getLogger("sailor.infra.local")
PROJECT = "sailor-local"
# What embedded GCE instances outside a job's identity run as (on real GCP: SAILOR_GCP_SERVICE_ACCOUNT);
# a job's run as the job's own account (infra/gcp_identity.py), granted by bucket IAM.
SERVICE_ACCOUNT_ID = "sailor-instances"
SERVICE_ACCOUNT = f"{SERVICE_ACCOUNT_ID}@{PROJECT}.iam.gserviceaccount.com"


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveInstance:
    cloud: str
    instance_id: str
    zone: str
    gpu: str | None
    num_gpus: int
    started_at: float
    spot: bool = True  # on-demand instances are never preempted


class EmbeddedCloud:
    def __init__(
        self,
        *,
        state_dir: str | Path | None = None,
        notice_s: float = 2.0,
        boot_s: float = 0.2,
        tick_s: float = 0.2,
        halt_grace_s: float = 1.0,
        faults: FaultRates | None = None,
        network: str | None = None,
        trace_files: bool = False,
        buckets_dir: str | Path | None = None,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="sailor-cloud-"))
        # the buckets' folder: the Sailor home's for the clouds Sailor starts, so they outlive this one
        self.disk = DiskBuckets(Path(buckets_dir) if buckets_dir else self.state_dir / "buckets",
                                gcs_guard=self._gcs_guard)
        self.notice_s = notice_s
        self.tick_s = tick_s
        self.halt_grace_s = halt_grace_s
        self.capacity = Capacity()
        self.faults = Faults(faults)
        self.aws_regions = sorted({parse_zone(z).region for r in instance_types() if r.cloud == "aws" for z in r.zones})
        self.network = Network(network)  # mode from SAILOR_EMBEDDED_NETWORK unless given
        self.identities = Identities()
        self.trace_files = trace_files
        self.keep_ended_disks = False  # an ended instance's disk is removed unless asked (before start) to keep it
        self.aws = MotoEC2(regions=self.aws_regions, capacity=self.capacity, faults=self.faults, on_change=self.reconcile,
                           on_launch=self._aws_launched, disk=self.disk)
        self.gce = GCEFake(project=PROJECT, capacity=self.capacity, faults=self.faults, boot_s=boot_s,
                           on_running=self._gce_running, on_halt=self._gce_halt, addresses=self._gce_addresses)
        self.gcp_iam = GcpIam(project=PROJECT, bucket_exists=lambda name: (self.disk.root / name).is_dir())
        self.gcp_iam.add_account(SERVICE_ACCOUNT_ID)
        self.gce.iam = self.gcp_iam
        self.machines: Machines | None = None
        self.preemptions: list[dict] = []  # history: what was preempted, when, why
        self._preempting: set[str] = set()
        self._seen: dict[str, float] = {}  # first sighting: "newest first" when reclaiming
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._trace_events_done = 0
        self.shutdown_requested = threading.Event()  # a standalone daemon waits on it
        self.started = False
        self.door = MetadataDoor(by_address=self.network.enforced)
        # The control API's secret: the controller's alone (this process, and the Sailor home's file
        # `control_secret_file` for the CLI); never in an instance's environment or metadata.
        self.control_secret = secrets.token_urlsafe(32)
        self.aws_keys: tuple[str, str] = ("", "")  # the administrator's, made at start

    # ---- life cycle --------------------------------------------------------------

    def start(self) -> EmbeddedCloud:
        # the account's administrator: the controller's credentials (every other key is refused)
        self.aws_keys = controller_keys()
        self.network.start()
        host = self.network.host_address  # where the instances reach the endpoints
        self.disk.start(host=host)
        self.aws.start(host=host)
        self.gce.start(host=host)
        self.network.admit_to_host([urlsplit(url).port for url in (self.aws_endpoint, self.gce_endpoint,
                                                                   self.instance_gcs_endpoint)])
        self.machines = Machines(self.state_dir / "instances", metadata_url=f"{self.gce.endpoint}/metadata",
                                 image=image_for_this_machine(), network=self.network,
                                 endpoint_env=self.instance_endpoint_env(), notice_s=self.notice_s,
                                 trace_files=self.trace_files, keep_ended_disks=self.keep_ended_disks)
        self.gce.metadata_handler = self._metadata
        self.gce.control_handler = self.control
        self.gce.control_secret = self.control_secret
        self.gce.admin_token = admin_gcp_token(self.aws_keys)
        self.gce.token_account = self.identities.token_account
        self._write_control_secret()
        if not self.network.enforced:
            log.warning("embedded cloud (host network): every instance is 127.0.0.1, so the metadata server cannot "
                        "tell instances apart: an instance names itself and could name another (docs/clouds.md)")
        self._ticker = threading.Thread(target=self._tick_loop, name="embedded-cloud", daemon=True)
        self._ticker.start()
        self.started = True
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        if self.machines is not None:
            self.machines.halt_all()
        self.aws.stop()
        self.gce.stop()
        self.disk.stop()
        self.network.stop()
        self.control_secret_file.unlink(missing_ok=True)  # it opened nothing that still runs
        self.started = False

    @property
    def control_secret_file(self) -> Path:
        """The control secret, readable by its owner only (0600), under the cloud's state folder."""
        return self.state_dir / "control-secret"

    def _write_control_secret(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.control_secret_file.unlink(missing_ok=True)
        fd = os.open(self.control_secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.control_secret)

    def __enter__(self) -> EmbeddedCloud:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def aws_endpoint(self) -> str:
        return self.aws.endpoint

    @property
    def gce_endpoint(self) -> str:
        return self.gce.endpoint

    @property
    def s3_endpoint(self) -> str:
        """The embedded S3 (the same server as EC2: its guard, then the buckets on disk)."""
        return self.aws.endpoint

    @property
    def gcs_endpoint(self) -> str:
        """The embedded GCS for this machine's processes (the buckets' owner: no guard)."""
        return self.disk.gcs_endpoint

    @property
    def instance_gcs_endpoint(self) -> str:
        """The embedded GCS the instances reach: each request checked against the bucket's IAM policy."""
        return self.disk.instance_gcs_endpoint

    def instance_endpoint_env(self) -> dict[str, str]:
        """What an embedded instance is told about its cloud (a real one knows its endpoints):
        where S3 and GCS are and its region.  Never a credential: those come from the metadata server."""
        return {"AWS_ENDPOINT_URL_S3": self.s3_endpoint, "AWS_REGION": "us-east-1",
                "GOOGLE_BASE_URL": self.instance_gcs_endpoint}

    def providers(self, *, retry: RetryPolicy | None = None) -> dict:
        return providers_for(self.aws_endpoint, self.gce_endpoint, retry=retry, aws_regions=self.aws_regions,
                             aws_keys=self.aws_keys)

    def reset(self) -> None:
        """Back to an empty cloud (tests share one): no instances, capacity or faults."""
        for inst in self.live_instances():
            self._end_now(inst)
        mine = {inst.id for inst in self.aws.instances()}
        for region in self.aws_regions:
            backend = self.aws._backend(region)
            for inst in backend.all_instances():
                if inst.id in mine and inst.state != "terminated":
                    inst.terminate()
            for rid, reservation in list(backend.reservations.items()):
                if any(i.id in mine for i in reservation.instances):
                    del backend.reservations[rid]
        with self.gce._lock:
            self.gce.instances.clear()
            self.gce.operations.clear()
            self.gce.firewalls.clear()
        self.gcp_iam.reset(keep=(SERVICE_ACCOUNT,))
        self.capacity = self.aws.capacity = self.gce.capacity = Capacity()
        self.faults.configure(FaultRates())
        with self._lock:
            self.preemptions.clear()
            self._preempting.clear()
            self._seen.clear()
            self._trace_events_done = 0

    # ---- instances of both clouds --------------------------------------------------

    def live_instances(self) -> list[LiveInstance]:
        out = []
        for inst in self.aws.instances():
            if inst.state in LIVE:
                gpu, n = gpus_of_type(inst.instance_type)
                out.append(LiveInstance(cloud="aws", instance_id=inst.id, zone=inst.placement.zone, gpu=gpu,
                                        num_gpus=n, started_at=self._first_seen(inst.id),
                                        spot=inst.lifecycle == "spot"))
        with self.gce._lock:
            snapshot = list(self.gce.instances.items())
        for (zone, name), inst in snapshot:
            if inst["status"] in ("PROVISIONING", "STAGING", "RUNNING", "STOPPING"):
                gpu, n = self.gce.gpus_of(inst)
                out.append(LiveInstance(cloud="gcp", instance_id=name, zone=zone, gpu=gpu, num_gpus=n,
                                        started_at=self._first_seen(name),
                                        spot=(inst.get("scheduling") or {}).get("provisioningModel") == "SPOT"))
        return out

    def _first_seen(self, instance_id: str) -> float:
        with self._lock:
            return self._seen.setdefault(instance_id, time.monotonic())

    def _find(self, instance_id: str) -> LiveInstance | None:
        return next((i for i in self.live_instances() if i.instance_id == instance_id), None)

    # ---- preemption --------------------------------------------------------------

    def preempt(self, instance_id: str, *, wait: bool = False, reason: str = "requested") -> bool:
        """Reclaim one spot instance (after the notice period). False if not live or on demand."""
        inst = self._find(instance_id)
        thread = self._preempt(inst, reason=reason) if inst is not None and inst.spot else None
        if thread is not None and wait:
            thread.join()
        return thread is not None

    def preempt_zone(self, zone: str, *, gpu: str | None = None, num_gpus: int | None = None,
                     wait: bool = False, reason: str = "requested") -> list[str]:
        """Reclaim spot instances in ``zone`` (of ``gpu``), newest first, until ``num_gpus`` are taken."""
        zone = parse_zone(zone).name
        victims = sorted(
            (i for i in self.live_instances()
             if i.spot and i.zone == zone and (gpu is None or i.gpu == gpu) and i.instance_id not in self._preempting),
            key=lambda i: -i.started_at,
        )
        taken, threads, chosen = 0, [], []
        for inst in victims:
            if num_gpus is not None and taken >= num_gpus:
                break
            thread = self._preempt(inst, reason=reason)
            if thread is not None:
                threads.append(thread)
                chosen.append(inst.instance_id)
                taken += inst.num_gpus
        if wait:
            for thread in threads:
                thread.join()
        return chosen

    def _preempt(self, inst: LiveInstance, *, reason: str) -> threading.Thread | None:
        with self._lock:
            if inst.instance_id in self._preempting:
                return None
            self._preempting.add(inst.instance_id)
            self.preemptions.append({"time": time.time(), "cloud": inst.cloud, "instance_id": inst.instance_id,
                                     "zone": inst.zone, "gpu": inst.gpu, "num_gpus": inst.num_gpus, "reason": reason})
        if inst.cloud == "gcp":
            self.gce.begin_preemption(inst.zone, inst.instance_id)
        self.machines.give_notice(inst.instance_id, self.notice_s)
        thread = threading.Thread(target=self._finish_preemption, args=(inst,), daemon=True)
        thread.start()
        return thread

    def _finish_preemption(self, inst: LiveInstance) -> None:
        time.sleep(self.notice_s)
        self.machines.halt(inst.instance_id)
        if inst.cloud == "aws":
            self.aws.spot_interrupt(inst.instance_id)
        else:
            self.gce.finish_preemption(inst.zone, inst.instance_id)

    def _end_now(self, inst: LiveInstance) -> None:
        if self.machines is not None:
            self.machines.halt(inst.instance_id)

    # ---- capacity, faults, trace ---------------------------------------------------

    def set_capacity(self, gpu: str, zone: str, num_gpus: int | None) -> None:
        self.capacity.set(gpu, zone, num_gpus)

    def set_faults(self, rates: FaultRates) -> None:
        self.faults.configure(rates)

    def play_trace(self, path: str | Path, *, time_scale: float = 1.0) -> None:
        """Drive capacity (and so preemptions) from an availability trace, starting now."""
        if time_scale <= 0:
            raise InputError(f"time_scale must be > 0, got {time_scale}")
        with self._lock:
            self._trace_events_done = 0
        self.capacity.load_trace(path, time_scale=time_scale)

    # ---- the ticker: machines follow the clouds' state ---------------------------

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.reconcile()
                self._enforce_capacity()
                self.apply_rules()
            except Exception:  # noqa: BLE001 - the ticker must outlive one bad tick
                log.exception("embedded cloud tick failed")

    def reconcile(self) -> None:
        """Boot EC2 instances moto reports running; halt the ones it reports ended."""
        if self.machines is None:
            return
        for inst in self.aws.instances():
            machine = self.machines.get(inst.id)
            if inst.state == "running" and machine is None:
                self.machines.boot(instance_id=inst.id, cloud="aws", zone=inst.placement.zone,
                                   script=self.aws.user_data(inst), hardware=self._hardware(inst.id, "aws", inst.placement.zone,
                                                                                           *gpus_of_type(inst.instance_type)))
            elif inst.state not in LIVE and machine is not None and not machine.ended and inst.id not in self._preempting:
                self.machines.halt(inst.id, grace_s=self.halt_grace_s)

    def _enforce_capacity(self) -> None:
        pools = self.capacity.limited_pools()
        if not pools:
            return
        live = [i for i in self.live_instances() if i.instance_id not in self._preempting]
        for gpu, zone in pools:
            available = self.capacity.available(gpu, zone)
            if available is None:
                continue
            used = sum(i.num_gpus for i in live if i.gpu == gpu and i.zone == zone)
            if used > available:
                self.preempt_zone(zone, gpu=gpu, num_gpus=used - available, reason=f"capacity fell to {available} GPUs")
        self._trace_preemption_events()

    def _trace_preemption_events(self) -> None:
        """A trace's preemption event takes ``num_gpus`` of the pool: we lose what we held
        beyond the rest (a reclaim hits idle capacity first). Events that only restate a
        count drop thus take nothing more than the drop itself already took."""
        trace, now_s = self.capacity.playing()
        if trace is None or now_s is None:
            return
        with self._lock:
            due = [e for e in trace.preemptions[self._trace_events_done:] if e.time_s <= now_s]
            self._trace_events_done += len(due)
        for event in due:
            key = (event.gpu, event.zone)
            before = trace.counts_at(max(event.time_s - 1e-6, 0.0)).get(key, 0)
            used = sum(i.num_gpus for i in self.live_instances()  # an event reclaims spot capacity only
                       if i.spot and (i.gpu, i.zone) == key and i.instance_id not in self._preempting)
            excess = used - max(before - event.num_gpus, 0)
            if excess > 0:
                self.preempt_zone(event.zone, gpu=event.gpu, num_gpus=excess, reason="trace preemption event")

    # ---- what the instances see ------------------------------------------------------

    def _hardware(self, instance_id: str, cloud: str, zone: str, gpu: str | None, num_gpus: int) -> Hardware:
        addr = self.network.allocate(instance_id, cloud, zone)
        return Hardware(gpu=gpu, num_gpus=num_gpus, private_ip=addr.private, public_ip=addr.public)

    def _aws_launched(self, instance_ids: list[str]) -> None:
        """Addresses for instances moto just launched, before anyone can describe them."""
        for iid in instance_ids:
            inst = self.aws.find(iid)
            if inst is not None:
                addr = self.network.allocate(iid, "aws", inst.placement.zone)
                self.aws.set_addresses(iid, addr.private, addr.public)

    def _gce_addresses(self, name: str, zone: str) -> tuple[str, str]:
        addr = self.network.allocate(name, "gcp", zone)
        return addr.private, addr.public

    def _gce_running(self, inst: dict) -> None:
        script = next((i["value"] for i in (inst.get("metadata") or {}).get("items", []) if i.get("key") == "startup-script"), None)
        zone = inst["zone"].rsplit("/", 1)[-1]
        gpu, n = self.gce.gpus_of(inst)
        self.machines.boot(instance_id=inst["name"], cloud="gcp", zone=zone, script=script,
                           hardware=self._hardware(inst["name"], "gcp", zone, gpu, n))

    def _gce_halt(self, inst: dict) -> None:
        if inst["name"] not in self._preempting:
            threading.Thread(target=self.machines.halt, args=(inst["name"],),
                             kwargs={"grace_s": self.halt_grace_s}, daemon=True).start()

    def _metadata(self, caller: str, path: str, method: str, headers, body) -> tuple[int, str]:
        """The calling instance's metadata server: preemption notices, identity, its role's credentials."""
        machine, path = self.door.caller(self.machines, caller, path) if self.machines else (None, path)
        if machine is None:
            return 404, "no such instance"
        answer = self.door.check(machine.instance_id, path, method, headers)
        if answer is not None:
            return answer
        if path == "sailor/preempt" and method == "POST":
            return self._preempt_for(machine, str(body().get("instance_id", "")))
        answer = self.identities.metadata(self, machine, path, method)
        if answer is not None:
            return answer
        target = (machine.metadata_dir / path).resolve()
        if machine.metadata_dir.resolve() not in target.parents or not target.is_file():
            return 404, "not found"
        return 200, target.read_text()

    def _preempt_for(self, machine, victim: str) -> tuple[int, str]:
        """A preemption an instance asks for (``--preempt-at``: the agent that sees each step asks):
        only of an instance of its own job, never another's, and without the control secret."""
        job = self.job_of(machine.cloud, machine.instance_id)
        inst = self._find(victim)
        if job is None or inst is None or self.job_of(inst.cloud, victim) != job:
            return 404, "no such live spot instance of this instance's job"
        return (200, json.dumps({"preempted": [victim]})) if self.preempt(victim) else (404, "not a live spot instance")

    def job_of(self, cloud: str, instance_id: str) -> str | None:
        """The job an instance was launched for (its ``sailor-job`` tag or label)."""
        if cloud == "aws":
            inst = self.aws.find(instance_id)
            tags = {t["key"]: t["value"] for t in inst.get_tags()} if inst is not None else {}
            return tags.get(JOB_LABEL)
        with self.gce._lock:
            found = next((i for (_, name), i in self.gce.instances.items() if name == instance_id), None)
            return ((found or {}).get("labels") or {}).get(JOB_LABEL)

    def _gcs_guard(self, token: str, method: str, path: str, copy_source: str = "") -> str | None:
        """A GCS request of an instance, by its token's account and the bucket's IAM policy."""
        return self.gcp_iam.refusal(self.identities.token_account(token), method, path, copy_source)

    # ---- the jobs' network rules, enforced in the instances' namespaces ---------------

    def apply_rules(self) -> None:
        """Each live machine's inbound rules from its security groups / firewall rules, as recorded now."""
        if self.machines is None or not self.network.enforced:
            return
        by_id = {}
        for inst in self.aws.instances():
            if inst.state in LIVE:
                by_id[inst.id] = aws_allows(self.aws, inst)
        with self.gce._lock:
            snapshot = [json_copy(i) for i in self.gce.instances.values()]
            firewalls = [json_copy(f) for f in self.gce.firewalls.values()]
        for inst in snapshot:
            by_id[inst["name"]] = gce_allows(inst, snapshot, firewalls)
        for machine in self.machines.all():
            if not machine.ended and machine.instance_id in by_id:
                self.network.apply(machine.instance_id, by_id[machine.instance_id])

    def control(self, method: str, route: str, params: dict) -> tuple[int, dict]:
        """The HTTP control surface (``<gce_endpoint>/sailor/<route>``) for other processes."""
        try:
            if route == "status" and method == "GET":
                return 200, self.status()
            if method != "POST":
                return 405, {"error": f"{method} {route} not supported"}
            if route == "preempt":
                wait = bool(params.get("wait", False))
                if params.get("instance_id"):
                    ok = self.preempt(str(params["instance_id"]), wait=wait)
                    return (200, {"preempted": [params["instance_id"]]}) if ok else (404, {"error": "no such live spot instance"})
                ids = self.preempt_zone(str(params["zone"]), gpu=params.get("gpu"), num_gpus=params.get("num_gpus"), wait=wait)
                return 200, {"preempted": ids}
            if route == "capacity":
                self.set_capacity(str(params["gpu"]), str(params["zone"]), params.get("num_gpus"))
                return 200, {"capacity": self.capacity.describe()}
            if route == "faults":
                text = ",".join(f"{k}={v}" for k, v in params.items())
                self.set_faults(parse_fault_rates(text))
                return 200, {"faults": self.faults.rates.to_dict()}
            if route == "trace":
                self.play_trace(str(params["path"]), time_scale=float(params.get("time_scale", 1.0)))
                return 200, {"capacity": self.capacity.describe()}
            if route == "shutdown":
                self.shutdown_requested.set()
                return 200, {"stopping": True}
            return 404, {"error": f"no control route {route!r}"}
        except KeyError as exc:
            return 400, {"error": f"missing parameter {exc}"}
        except SailorError as exc:
            return 400, {"error": str(exc)}

    def status(self) -> dict:
        live = self.live_instances()
        return {
            "aws_endpoint": self.aws_endpoint,
            "gce_endpoint": self.gce_endpoint,
            "gcs_endpoint": self.gcs_endpoint,
            "instance_gcs_endpoint": self.instance_gcs_endpoint,
            "buckets_dir": str(self.disk.root),
            "project": PROJECT,
            "network": self.network.mode,
            "metadata_tells_instances_apart": self.network.enforced,
            "notice_s": self.notice_s,
            "live_instances": [{"cloud": i.cloud, "instance_id": i.instance_id, "zone": i.zone, "gpu": i.gpu,
                                "num_gpus": i.num_gpus} for i in live],
            "num_live_instances": len(live),
            "capacity": self.capacity.describe(),
            "faults": self.faults.rates.to_dict(),
            "faults_injected": dict(self.faults.injected),
            "preemptions": list(self.preemptions),
        }


def json_copy(value):
    return json.loads(json.dumps(value))


def providers_for(aws_endpoint: str, gce_endpoint: str, *, retry: RetryPolicy | None = None,
                  aws_regions: list[str] | None = None, aws_keys: tuple[str, str]) -> dict:
    """Providers aimed at an embedded cloud (this process's or a standalone one), signing with its
    administrator's keys (``aws_keys``: the cloud's ``aws_keys``, or its state file's)."""
    # Imported here: the cloud itself (e.g. the daemon) needs neither SDK's client.
    from google.oauth2.credentials import Credentials  # lazy: google-auth, only for the clients

    from infra.aws import AWSProvider  # lazy: boto3, only for the clients
    from infra.gcp import GCPProvider  # lazy: google-cloud-compute (~2.4 s), only for the clients

    return {
        "aws": AWSProvider(endpoint_url=aws_endpoint, ami_id=FIXED_AMI, regions=aws_regions,
                           spot_prices_from_api=False, retry=retry, session=_local_session(*aws_keys)),
        "gcp": GCPProvider(project=PROJECT, api_endpoint=gce_endpoint, retry=retry,
                           credentials=Credentials(token=admin_gcp_token(aws_keys)),
                           service_account=SERVICE_ACCOUNT),
    }


def admin_gcp_token(aws_keys: tuple[str, str]) -> str:
    """The embedded project owner's GCP access token: the same administrator as the AWS account's
    keys (the controller holds both), derived from its secret so that nothing more needs keeping."""
    return "ya29.sailor-admin-" + hmac.new(aws_keys[1].encode(), b"gcp-owner", hashlib.sha256).hexdigest()


@functools.lru_cache(maxsize=4)
def _local_session(key_id: str, secret: str):
    """One session per embedded account for all its providers: each new one re-reads EC2's service
    model (~0.5 s).  Its own keys: never pick up (or send) the user's real AWS credentials locally."""
    import boto3  # lazy: boto3, only for the clients (see providers_for)

    return boto3.Session(aws_access_key_id=key_id, aws_secret_access_key=secret, region_name="us-east-1")
