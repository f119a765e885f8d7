"""A local fake of the Compute Engine v1 REST API, enough for ``infra.gcp``.

The real ``google.cloud.compute_v1`` clients talk to it (``api_endpoint`` =
``http://127.0.0.1:PORT``, anonymous credentials). It keeps state like the real
API: numeric string ids, camelCase JSON, zone operations, instance statuses
PROVISIONING -> RUNNING -> STOPPING -> TERMINATED, labels and list filters on
them, spot preemption recorded as a ``compute.instances.preempted`` operation.
Operations finish before the call returns (status DONE), so the client's own
operation poller, which ignores ``api_endpoint``, is never needed.

The same server also answers ``/metadata/...`` (the calling instance's metadata:
``infra/local/metadata_door.py``) and ``/sailor/...`` (control of the embedded cloud,
only with its secret: ``Authorization: Bearer <control_secret>``); both are plugged
in by ``EmbeddedCloud``.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from infra.doctor import gcp_gpu_quota_metric
from infra.local.capacity import Capacity
from infra.local.faults import Faults
from sailor_core.catalog.instances import gpu_for_accelerator, instance_types
from sailor_core.zones import parse_zone

_log = logging.getLogger(__name__)

API = "/compute/v1/projects/"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_FILTER = re.compile(r'labels\.([\w-]+)\s*=\s*"?([^"\s)]+)"?')
_ids = itertools.count(int(time.time() * 1000) % 10**12 * 1000)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())


def _catalog_zones() -> dict[str, dict]:
    """Per zone: machine types (with built-in GPUs) and accelerator types (max per VM)."""
    zones: dict[str, dict] = {}
    for row in instance_types():
        if row.cloud != "gcp":
            continue
        for zone in row.zones:
            z = zones.setdefault(zone, {"machine_types": {}, "accelerators": {}})
            builtin = not row.attached_gpus
            z["machine_types"][row.machine_type] = (row.accelerator_type, row.gpus_per_node) if builtin else None
            acc = z["accelerators"]
            acc[row.accelerator_type] = max(acc.get(row.accelerator_type, 0), row.gpus_per_node)
    for z in zones.values():  # general-purpose types exist everywhere GPUs do
        for n in (4, 8, 16, 32, 64):
            z["machine_types"].setdefault(f"n1-standard-{n}", None)
    return zones


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (an instance halted mid-request, a timed-out client) is routine;
        anything else is logged, not printed: the fake runs inside `sailor train`, whose stderr
        is the user's."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            return
        _log.warning("GCE fake: request from %s failed", client_address[0], exc_info=exc)


class GCEFake:
    def __init__(
        self,
        *,
        project: str = "sailor-local",
        capacity: Capacity | None = None,
        faults: Faults | None = None,
        boot_s: float = 0.2,
        on_running: Callable[[dict], None] | None = None,
        on_halt: Callable[[dict], None] | None = None,
        addresses: Callable[[str, str], tuple[str, str]] | None = None,
    ) -> None:
        self.project = project
        self.capacity = capacity or Capacity()
        self.faults = faults or Faults()
        self.boot_s = boot_s
        self.on_running = on_running
        self.on_halt = on_halt  # an instance stops existing as a machine (delete)
        self.addresses = addresses  # (name, zone) -> (network IP, external IP) its machine will have
        self.firewalls: dict[str, dict] = {}  # name -> firewall rule (global)
        # (caller's address, path, method, headers, body) -> (status, text)
        self.metadata_handler: Callable[..., tuple[int, str]] | None = None
        self.control_handler: Callable[[str, str, dict], tuple[int, dict]] | None = None
        self.admin_token: str | None = None  # the project owner's (the controller's) access token; None: open
        self.token_account: Callable[[str], str | None] | None = None  # an instance's token -> its account
        self.iam = None  # the embedded GCP's IAM (infra/local/gcp_iam.py): its APIs, and accounts instances run as
        self.control_secret: str | None = None  # None: control open (a fake run on its own, without a cloud)
        self.zones = _catalog_zones()
        self._lock = threading.RLock()
        self.instances: dict[tuple[str, str], dict] = {}
        self.operations: dict[tuple[str, str], dict] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- server ------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: tests and the daemon have their own logs
                pass

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                return json.loads(raw) if raw.strip() else {}

            def _handle(self, method: str) -> None:
                try:
                    status, payload, ctype = fake.dispatch(method, self.path, self._body, headers=self.headers,
                                                           caller=self.client_address[0])
                except Exception as exc:  # noqa: BLE001 - every failure answers as the API would
                    if not isinstance(exc, ApiError):
                        bad_input = isinstance(exc, (ValueError, KeyError, TypeError))
                        exc = ApiError(400 if bad_input else 500, "invalid" if bad_input else "backendError",
                                       f"{type(exc).__name__}: {exc}")
                    status, ctype = exc.code, "application/json"
                    payload = {"error": {"code": exc.code, "message": exc.message,
                                         "errors": [{"domain": "global", "reason": exc.reason, "message": exc.message}]}}
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                if self.path.startswith("/metadata/"):  # what clients check to know the server is GCE's
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_DELETE(self):
                self._handle("DELETE")

            def do_PUT(self):  # the AWS-style metadata's IMDSv2 token
                self._handle("PUT")

        self._server = _Server((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="gce-fake", daemon=True)
        self._thread.start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- routing -----------------------------------------------------------------

    def _authorize(self, headers) -> None:
        """The compute, IAM and Cloud Storage JSON APIs answer the project's owner only (the controller,
        as the user's own credentials on GCP); a job's service account holds no role on them, so an
        instance's token is refused (403) and a request without a known token is unauthenticated (401)."""
        if self.admin_token is None:  # a fake run on its own, without a cloud
            return
        got = headers.get("Authorization", "")
        if hmac.compare_digest(got.encode(), f"Bearer {self.admin_token}".encode()):
            return
        token = got[len("Bearer "):] if got.startswith("Bearer ") else ""
        if token and self.token_account is not None and self.token_account(token):
            raise ApiError(403, "forbidden", "Permission denied: the caller's service account has no role on "
                                             "the project's compute, IAM or storage administration")
        raise ApiError(401, "unauthenticated", "Request is missing valid authentication credentials")

    def dispatch(self, method: str, raw_path: str, body: Callable[[], dict], *, headers=None, caller: str = ""):
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        headers = headers if headers is not None else {}
        if path.startswith("/metadata/"):
            if self.metadata_handler is None:
                raise ApiError(404, "notFound", "no metadata here")
            status, text = self.metadata_handler(caller, path[len("/metadata/"):], method, headers, body)
            return status, text, "text/plain"
        if path.startswith("/sailor/"):
            if self.control_handler is None:
                raise ApiError(404, "notFound", "no control here")
            if self.control_secret is not None and not hmac.compare_digest(
                    headers.get("Authorization", "").encode(), f"Bearer {self.control_secret}".encode()):
                raise ApiError(401, "unauthorized", "the embedded cloud's control needs its secret "
                                                    "(Authorization: Bearer <secret>, docs/clouds.md)")
            status, payload = self.control_handler(method, path[len("/sailor/"):], body() if method == "POST" else query)
            return status, payload, "application/json"
        self._authorize(headers)
        if path.startswith(("/v1/projects/", "/storage/v1/")) and self.iam is not None:
            status, payload = self.iam.handle(method, path, body)  # IAM's and Cloud Storage's JSON APIs
            return status, payload, "application/json"
        if not path.startswith(API):
            raise ApiError(404, "notFound", f"no such path {path}")
        parts = path[len(API):].strip("/").split("/")
        project, rest = parts[0], parts[1:]
        if project != self.project:
            raise ApiError(404, "notFound", f"The resource 'projects/{project}' was not found")
        launch = method == "POST" and rest[-1:] == ["instances"]
        forced_capacity = self._maybe_fault(launch=launch) == "capacity"
        return 200, self._route(method, rest, query, body, forced_capacity), "application/json"

    def _maybe_fault(self, *, launch: bool) -> str | None:
        kind = self.faults.draw(launch=launch)
        if kind == "throttle":
            raise ApiError(429, "rateLimitExceeded", "Rate Limit Exceeded (injected)")
        if kind == "server_error":
            raise ApiError(503, "backendError", "Backend Error (injected)")
        if kind == "timeout":
            time.sleep(self.faults.rates.timeout_s)
            raise ApiError(503, "backendError", "Deadline exceeded (injected timeout)")
        if kind == "quota":
            raise ApiError(403, "quotaExceeded", "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally. (injected)")
        return kind

    def _route(self, method: str, rest: list[str], query: dict, body, forced_capacity: bool = False):
        if rest[:1] == ["global"]:
            return self._global(method, rest[1:], body)
        if rest[:1] == ["aggregated"] and method == "GET":
            with self._lock:  # snapshots: other requests and the ticker change these dicts
                instances, operations = list(self.instances.values()), list(self.operations.values())
            if rest[1:] == ["instances"]:
                return self._aggregated("instances", self._filter_instances(instances, query))
            if rest[1:] == ["operations"]:
                return self._aggregated("operations", operations)
        if rest[:1] == ["regions"] and len(rest) == 2 and method == "GET":
            return self._region(rest[1])
        if rest[:1] != ["zones"]:
            raise ApiError(404, "notFound", "unsupported collection")
        if len(rest) == 1 and method == "GET":
            return {"kind": "compute#zoneList", "id": f"projects/{self.project}/zones",
                    "items": [self._zone(z) for z in sorted(self.zones)]}
        zone = rest[1]
        if zone not in self.zones:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}' was not found")
        sub = rest[2:]
        if not sub and method == "GET":
            return self._zone(zone)
        if sub == ["machineTypes"] and method == "GET":
            return {"kind": "compute#machineTypeList", "items": [self._machine_type(zone, m) for m in sorted(self.zones[zone]["machine_types"])]}
        if sub == ["acceleratorTypes"] and method == "GET":
            return {"kind": "compute#acceleratorTypeList", "items": [self._accel_type(zone, a, n) for a, n in sorted(self.zones[zone]["accelerators"].items())]}
        if sub == ["instances"]:
            if method == "GET":
                with self._lock:
                    found = [i for (z, _), i in self.instances.items() if z == zone]
                return {"kind": "compute#instanceList", "items": self._filter_instances(found, query)}
            if method == "POST":
                return self._insert(zone, body(), forced_capacity=forced_capacity)
        if len(sub) == 2 and sub[0] == "instances":
            if method == "GET":
                return self._get_instance(zone, sub[1])
            if method == "DELETE":
                return self._delete(zone, sub[1])
        if sub == ["operations"] and method == "GET":
            with self._lock:
                return {"kind": "compute#operationList",
                        "items": [json.loads(json.dumps(o)) for (z, _), o in self.operations.items() if z == zone]}
        if len(sub) in (2, 3) and sub[0] == "operations":
            with self._lock:
                op = self.operations.get((zone, sub[1]))
            if op is None:
                raise ApiError(404, "notFound", f"The resource 'operations/{sub[1]}' was not found")
            return op  # GET and POST .../wait alike: every operation is already DONE
        raise ApiError(404, "notFound", f"unsupported {method} {'/'.join(rest)}")

    # ---- firewall rules (global) and their operations -----------------------------

    def _global(self, method: str, rest: list[str], body):
        if rest == ["firewalls"] and method == "GET":
            with self._lock:
                return {"kind": "compute#firewallList", "items": [json.loads(json.dumps(f)) for f in self.firewalls.values()]}
        if rest == ["firewalls"] and method == "POST":
            rule = body()
            name = str(rule.get("name", ""))
            if not _NAME.match(name):
                raise ApiError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'")
            if not rule.get("allowed") and not rule.get("denied"):
                raise ApiError(400, "invalid", "Invalid value for field 'resource.allowed': the rule allows nothing")
            with self._lock:
                if name in self.firewalls:
                    raise ApiError(409, "alreadyExists", f"The resource 'projects/{self.project}/global/firewalls/{name}' already exists")
                self.firewalls[name] = {"kind": "compute#firewall", "id": str(next(_ids)), "name": name,
                                        "network": rule.get("network") or self._link("global", "networks", "default"),
                                        "direction": rule.get("direction", "INGRESS"), "priority": rule.get("priority", 1000),
                                        "allowed": rule.get("allowed", []), "sourceRanges": rule.get("sourceRanges", []),
                                        "sourceTags": rule.get("sourceTags", []), "targetTags": rule.get("targetTags", []),
                                        "description": rule.get("description", ""), "creationTimestamp": _now(),
                                        "selfLink": self._link("global", "firewalls", name)}
            return self._global_operation("insert", self._link("global", "firewalls", name))
        if len(rest) == 2 and rest[0] == "firewalls":
            with self._lock:
                rule = self.firewalls.get(rest[1])
                if rule is None:
                    raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/global/firewalls/{rest[1]}' was not found")
                if method == "DELETE":
                    self.firewalls.pop(rest[1])
                elif method == "PATCH" or method == "PUT":
                    rule.update({k: v for k, v in body().items() if k in ("allowed", "sourceRanges", "sourceTags", "targetTags")})
                else:
                    return json.loads(json.dumps(rule))
            return self._global_operation(method.lower(), self._link("global", "firewalls", rest[1]))
        if len(rest) in (2, 3) and rest[0] == "operations":
            with self._lock:
                op = self.operations.get(("global", rest[1]))
            if op is None:
                raise ApiError(404, "notFound", f"The resource 'operations/{rest[1]}' was not found")
            return op
        raise ApiError(404, "notFound", f"unsupported {method} global/{'/'.join(rest)}")

    def _global_operation(self, kind: str, target: str) -> dict:
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
        op = {"kind": "compute#operation", "id": str(next(_ids)), "name": name, "operationType": kind,
              "targetLink": target, "status": "DONE", "progress": 100, "insertTime": _now(), "startTime": _now(),
              "endTime": _now(), "selfLink": self._link("global", "operations", name)}
        with self._lock:
            self.operations[("global", name)] = op
        return op

    # ---- resources ---------------------------------------------------------------

    def _link(self, *parts: str) -> str:
        return f"https://www.googleapis.com/compute/v1/projects/{self.project}/" + "/".join(parts)

    def _zone(self, zone: str) -> dict:
        region = parse_zone(zone).region
        return {"kind": "compute#zone", "id": str(abs(hash(zone)) % 10**15), "name": zone, "status": "UP",
                "region": self._link("regions", region), "selfLink": self._link("zones", zone)}

    def _machine_type(self, zone: str, name: str) -> dict:
        built_in = self.zones[zone]["machine_types"][name]
        cpus = 12 if built_in else int(name.rsplit("-", 1)[-1])  # n1-standard-N: N vCPUs
        out = {"kind": "compute#machineType", "id": str(abs(hash(name)) % 10**15), "name": name, "zone": zone,
               "guestCpus": cpus, "memoryMb": cpus * 3840, "selfLink": self._link("zones", zone, "machineTypes", name)}
        if built_in:
            out["accelerators"] = [{"guestAcceleratorType": built_in[0], "guestAcceleratorCount": built_in[1]}]
        return out

    def _region(self, region: str) -> dict:
        """A region with its GPU quotas: what the embedded capacity allows (64 per type unless limited)."""
        zones = [z for z in self.zones if parse_zone(z).region == region]
        if not zones:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/regions/{region}' was not found")
        quotas = []
        for accel in sorted({a for z in zones for a in self.zones[z]["accelerators"]}):
            gpu = gpu_for_accelerator("gcp", accel)
            limits = [self.capacity.available(gpu, z) for z in zones]
            limit = 64 if any(v is None for v in limits) else sum(limits)
            usage = sum(self.gpus_in_use(gpu, z) for z in zones)
            for preemptible in (False, True):
                quotas.append({"metric": gcp_gpu_quota_metric(accel, preemptible=preemptible), "limit": float(limit),
                               "usage": float(usage)})
        return {"kind": "compute#region", "name": region, "status": "UP", "quotas": quotas,
                "selfLink": self._link("regions", region), "zones": [self._link("zones", z) for z in zones]}

    def _accel_type(self, zone: str, name: str, max_cards: int) -> dict:
        return {"kind": "compute#acceleratorType", "id": str(abs(hash(name)) % 10**15), "name": name,
                "description": name, "zone": self._link("zones", zone), "maximumCardsPerInstance": max_cards,
                "selfLink": self._link("zones", zone, "acceleratorTypes", name)}

    def _aggregated(self, key: str, items: list[dict]) -> dict:
        grouped: dict[str, dict] = {}
        for item in items:
            scope = f"zones/{item['zone'].rsplit('/', 1)[-1]}" if item.get("zone") else "global"
            grouped.setdefault(scope, {key: []})[key].append(item)
        return {"kind": f"compute#{key}AggregatedList", "items": grouped}

    def _filter_instances(self, instances, query: dict) -> list[dict]:
        wanted = _LABEL_FILTER.findall(query.get("filter", ""))
        with self._lock:
            return [json.loads(json.dumps(i)) for i in instances
                    if all(i.get("labels", {}).get(k) == v for k, v in wanted)]

    def _get_instance(self, zone: str, name: str) -> dict:
        with self._lock:
            inst = self.instances.get((zone, name))
            if inst is None:
                raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found")
            return json.loads(json.dumps(inst))

    def _operation(self, zone: str, kind: str, target: str, *, error: dict | None = None, status_code: int | None = None) -> dict:
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
        op = {"kind": "compute#operation", "id": str(next(_ids)), "name": name, "zone": self._link("zones", zone),
              "operationType": kind, "targetLink": self._link("zones", zone, "instances", target),
              "status": "DONE", "progress": 100, "insertTime": _now(), "startTime": _now(), "endTime": _now(),
              "selfLink": self._link("zones", zone, "operations", name)}
        if error:
            op["error"] = {"errors": [error]}
            op["httpErrorStatusCode"] = status_code or 400
            op["httpErrorMessage"] = error.get("message", "")
        with self._lock:
            self.operations[(zone, name)] = op
        return op

    def gpus_of(self, inst: dict) -> tuple[str | None, int]:
        accels = inst.get("guestAccelerators") or []
        if not accels:
            mt = inst["machineType"].rsplit("/", 1)[-1]
            built_in = self.zones.get(inst["zone"].rsplit("/", 1)[-1], {}).get("machine_types", {}).get(mt)
            accels = [{"acceleratorType": built_in[0], "acceleratorCount": built_in[1]}] if built_in else []
        if not accels:
            return None, 0
        acc = accels[0]
        return gpu_for_accelerator("gcp", acc["acceleratorType"].rsplit("/", 1)[-1]), int(acc.get("acceleratorCount", 0))

    def gpus_in_use(self, gpu: str, zone: str) -> int:
        with self._lock:
            return sum(n for (z, _), i in self.instances.items()
                       if z == zone and i["status"] in ("PROVISIONING", "STAGING", "RUNNING", "STOPPING")
                       for g, n in [self.gpus_of(i)] if g == gpu)

    def _insert(self, zone: str, body: dict, *, forced_capacity: bool = False) -> dict:
        name = body.get("name", "")
        if not _NAME.match(name):
            raise ApiError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'")
        mt = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if mt not in self.zones[zone]["machine_types"]:
            raise ApiError(400, "invalid", f"Invalid value for field 'resource.machineType': '{body.get('machineType')}'. Machine type with name '{mt}' does not exist in zone '{zone}'.")
        for acc in body.get("guestAccelerators") or []:
            acc_name = acc["acceleratorType"].rsplit("/", 1)[-1]
            if acc_name not in self.zones[zone]["accelerators"]:
                raise ApiError(400, "invalid", f"Invalid value for field 'resource.guestAccelerators[0].acceleratorType': accelerator type '{acc_name}' does not exist in zone '{zone}'.")
        for account in body.get("serviceAccounts") or []:
            if self.iam is not None and not self.iam.has_account(str(account.get("email", ""))):
                raise ApiError(400, "invalid", f"The resource 'projects/{self.project}/serviceAccounts/"
                                               f"{account.get('email')}' was not found")
        inst = {
            "kind": "compute#instance", "id": str(next(_ids)), "name": name, "zone": self._link("zones", zone),
            "machineType": self._link("zones", zone, "machineTypes", mt), "status": "PROVISIONING",
            "creationTimestamp": _now(), "labels": dict(body.get("labels") or {}),
            "scheduling": body.get("scheduling") or {}, "metadata": body.get("metadata") or {},
            "guestAccelerators": body.get("guestAccelerators") or [], "disks": body.get("disks") or [],
            "networkInterfaces": [self._interface(name, zone, body)],
            "tags": {"items": list((body.get("tags") or {}).get("items") or [])},
            "serviceAccounts": list(body.get("serviceAccounts") or []),
            "selfLink": self._link("zones", zone, "instances", name),
        }
        with self._lock:
            if (zone, name) in self.instances:
                raise ApiError(409, "alreadyExists", f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists")
            gpu, count = self.gpus_of(inst)
            available = self.capacity.available(gpu, zone)
            if forced_capacity or (available is not None and self.gpus_in_use(gpu, zone) + count > available):
                return self._operation(zone, "insert", name, status_code=503, error={
                    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                    "message": f"The zone 'projects/{self.project}/zones/{zone}' does not have enough resources available to fulfill the request.  Try a different zone, or try again later."})
            self.instances[(zone, name)] = inst
        op = self._operation(zone, "insert", name)
        op["targetId"] = inst["id"]
        threading.Timer(self.boot_s, self._boot, args=(zone, name)).start()
        return op

    def _interface(self, name: str, zone: str, body: dict) -> dict:
        private, public = self.addresses(name, zone) if self.addresses else ("127.0.0.1", "127.0.0.1")
        nic = {"name": "nic0", "network": self._link("global", "networks", "default"), "networkIP": private}
        asked = (body.get("networkInterfaces") or [{}])[0].get("accessConfigs") or []
        if asked:  # an external address only when asked for, as on GCE
            nic["accessConfigs"] = [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT",
                                     "name": asked[0].get("name", "External NAT"), "natIP": public}]
        return nic

    def _boot(self, zone: str, name: str) -> None:
        with self._lock:
            inst = self.instances.get((zone, name))
            if inst is None or inst["status"] != "PROVISIONING":
                return
            inst["status"] = "RUNNING"
            inst["lastStartTimestamp"] = _now()
            snapshot = json.loads(json.dumps(inst))
        if self.on_running:
            self.on_running(snapshot)

    def _delete(self, zone: str, name: str) -> dict:
        with self._lock:
            inst = self.instances.get((zone, name))
            if inst is None:
                raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found")
            inst["status"] = "STOPPING"
            snapshot = json.loads(json.dumps(inst))
        if self.on_halt:
            self.on_halt(snapshot)
        with self._lock:
            self.instances.pop((zone, name), None)
        return self._operation(zone, "delete", name)

    # ---- preemption (driven by EmbeddedCloud) ------------------------------------

    def begin_preemption(self, zone: str, name: str) -> bool:
        """The ACPI soft-off: the instance is STOPPING while its notice runs."""
        with self._lock:
            inst = self.instances.get((zone, name))
            if inst is None or inst["status"] not in ("PROVISIONING", "STAGING", "RUNNING"):
                return False
            inst["status"] = "STOPPING"
            return True

    def finish_preemption(self, zone: str, name: str) -> None:
        """Record the preemption, TERMINATE, then delete (spot termination action DELETE)."""
        with self._lock:
            inst = self.instances.get((zone, name))
            if inst is None:
                return
            inst["status"] = "TERMINATED"
            op = self._operation(zone, "compute.instances.preempted", name)
            op["targetId"] = inst["id"]
            op["statusMessage"] = "Instance was preempted."
            action = (inst.get("scheduling") or {}).get("instanceTerminationAction", "STOP")
            if action == "DELETE":
                self.instances.pop((zone, name), None)
