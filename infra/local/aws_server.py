"""moto's EC2 server, in this process, behind a thin WSGI layer that adds what moto lacks.

Every request is authenticated and authorised first (``infra/local/aws_auth.py``: moto's IAM
access control, for this server alone).  moto accepts any launch; the layer refuses launches
beyond the zone's GPU capacity (``InsufficientInstanceCapacity``, as EC2 does) and injects API faults.
Running in-process gives direct access to moto's backend objects, which is the
only way to end an instance with the reason ``Server.SpotInstanceTermination``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import parse_qs

os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # ~1.3 s per region otherwise

from moto.core import DEFAULT_ACCOUNT_ID  # noqa: E402
from moto.ec2.models import ec2_backends  # noqa: E402
from moto.ec2.models.instances import StateReason  # noqa: E402
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app  # noqa: E402
from werkzeug.serving import WSGIRequestHandler, make_server  # noqa: E402
from werkzeug.wsgi import get_input_stream  # noqa: E402

from infra.local.aws_auth import query_refusal, s3_refusal  # noqa: E402
from infra.local.capacity import Capacity  # noqa: E402
from infra.local.faults import Faults  # noqa: E402
from sailor_core.catalog.instances import get_instance_type  # noqa: E402
from sailor_core.errors import UnknownNameError  # noqa: E402

SPOT_INTERRUPTION = "Server.SpotInstanceTermination"
FIXED_AMI = "ami-0sailor000000001"  # any id: moto does not check images when none are loaded
_REGION = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/ec2/")
LIVE = ("pending", "running", "stopping", "shutting-down")


def _error(code: str, message: str, status: int):
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()
    return status, body


# Bucket settings moto keeps (its S3 in memory); objects and listings are the disk's.
_BUCKET_SETTINGS = frozenset({
    "publicAccessBlock", "encryption", "ownershipControls", "policy", "policyStatus", "acl", "versioning",
    "tagging", "cors", "lifecycle", "location", "logging", "website", "notification", "replication",
    "object-lock", "accelerate", "requestPayment"})


def _bucket_setting(method: str, path: str, query: str) -> bool:
    """Whether an S3 request is about a bucket itself (create, check, delete, its settings) or moto's
    own API, rather than objects: those go to moto, the rest to the disk."""
    if path.startswith("/moto-api"):
        return True
    bucket, _, key = path.lstrip("/").partition("/")
    if not bucket or key:
        return False
    if set(parse_qs(query, keep_blank_values=True)) & _BUCKET_SETTINGS:
        return True
    return method in ("PUT", "HEAD", "DELETE")


def _read_body(environ) -> bytes:
    """The request's body, read once and put back for whoever reads it next."""
    raw = get_input_stream(environ).read()  # by its length, or to its end when sent chunked
    environ["wsgi.input"] = io.BytesIO(raw)
    environ["CONTENT_LENGTH"] = str(len(raw))
    environ.pop("wsgi.input_terminated", None)
    return raw


def _answer(start_response, status: int, body: bytes):
    start_response(f"{status} Error", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


def gpus_of_type(instance_type: str) -> tuple[str | None, int]:
    try:
        row = get_instance_type("aws", instance_type)
    except UnknownNameError:
        return None, 0
    return row.gpu, row.gpus_per_node


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args, **kwargs):
        pass


class MotoEC2:
    def __init__(
        self,
        *,
        regions: list[str],
        capacity: Capacity,
        faults: Faults,
        on_change: Callable[[], None] | None = None,
        on_launch: Callable[[list[str]], None] | None = None,
        disk=None,
    ) -> None:
        self.regions = regions
        self.capacity = capacity
        self.faults = faults
        self.on_change = on_change
        self.on_launch = on_launch  # the ids of instances just launched, before the caller hears back
        self.disk = disk  # DiskBuckets (infra/local/object_store.py): the objects, on disk; None: moto's memory
        self._app = DomainDispatcherApplication(create_backend_app)
        self._server = None
        self._thread: threading.Thread | None = None
        self._launch_lock = threading.Lock()  # capacity check + launch are one step
        # moto's EC2 backends are one per process: another embedded cloud of this process (a test's beside
        # the flow's) shares them, so each cloud sees only the instances launched through its own server.
        self._launched: set[str] = set()

    # ---- server ------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._server = make_server(host, port, self._wsgi, threaded=True, request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-ec2", daemon=True)
        self._thread.start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _wsgi(self, environ, start_response):
        if environ.get("PATH_INFO", "/").startswith("/moto-api"):  # moto's own controls: not AWS's API
            return _answer(start_response, 403, _error("AccessDenied", "not part of the AWS API", 403)[1])
        raw = _read_body(environ)
        if environ.get("PATH_INFO", "/") != "/" or environ.get("REQUEST_METHOD") != "POST":
            return self._other_service(environ, start_response, raw)  # S3 (path-style), not EC2's Query API
        params = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        action = params.get("Action") or target.rpartition(".")[2] or "Unknown"
        denied = query_refusal(environ, raw, action)
        if denied is not None:
            return _answer(start_response, *denied)
        if target.startswith("ServiceQuotas"):
            return self._service_quota(environ, start_response)
        if not params.get("Action"):  # anything not EC2 Query
            return self._app(environ, start_response)
        refusal = self._refusal(action, params, environ)
        if refusal is not None:
            status, body = refusal
            start_response(f"{status} Error", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
            return [body]
        if action == "RunInstances":
            with self._launch_lock:
                refusal = self._capacity_refusal(params)
                if refusal is None:
                    body = b"".join(self._app(environ, start_response))
            if refusal is not None:
                status, body = refusal
                start_response(f"{status} Error", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
                return [body]
            launched = re.findall(r"<instanceId>(i-[0-9a-f]+)</instanceId>", body.decode("utf-8", "replace"))
            self._launched.update(launched)
            if self.on_launch is not None:
                self.on_launch(launched)
            self._changed()
            return [body]
        result = self._app(environ, start_response)
        if action in ("TerminateInstances", "StopInstances"):
            result = [b"".join(result)]
            self._changed()
        return result

    def _other_service(self, environ, start_response, body: bytes):
        """S3 through the same server: signed by keys the account knows, within the caller's
        policies (neither moto's S3 nor rclone checks credentials).  Then objects and listings go
        to the buckets on disk, bucket settings to moto's S3."""
        denied = s3_refusal(environ, body)
        if denied is not None:
            status, data = denied
            start_response(f"{status} Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(data)))])
            return [data]
        if self.disk is None:
            return self._app(environ, start_response)
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        if not _bucket_setting(method, path, environ.get("QUERY_STRING", "")):
            return self.disk.forward(environ, start_response)
        result = b"".join(self._app(environ, start_response))
        bucket = path.strip("/")
        if method == "PUT" and "<Error>" not in result.decode("utf-8", "replace")[:200] and bucket:
            self.disk.ensure_bucket(bucket)  # created by moto (its settings), its objects on disk
        return [result]

    def _service_quota(self, environ, start_response):
        """Service Quotas' GetServiceQuota for EC2's spot vCPU quotas (moto has none for EC2): the
        embedded account may run 256 vCPUs of each family."""
        asked = json.loads(_read_body(environ) or b"{}")
        if not environ.get("HTTP_X_AMZ_TARGET", "").endswith("GetServiceQuota") or asked.get("ServiceCode") != "ec2":
            body, status = json.dumps({"__type": "NoSuchResourceException", "message": "no such quota"}), "400 Bad Request"
        else:
            body, status = json.dumps({"Quota": {"ServiceCode": "ec2", "QuotaCode": asked.get("QuotaCode"),
                                                 "QuotaName": asked.get("QuotaCode"), "Value": 256.0,
                                                 "Unit": "None", "Adjustable": True}}), "200 OK"
        data = body.encode()
        start_response(status, [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(data)))])
        return [data]

    def _changed(self) -> None:
        if self.on_change is not None:
            threading.Thread(target=self.on_change, daemon=True).start()

    def _refusal(self, action: str, params: dict, environ) -> tuple[int, bytes] | None:
        kind = self.faults.draw(launch=action == "RunInstances")
        if kind == "throttle":
            return _error("RequestLimitExceeded", "Request limit exceeded. (injected)", 503)
        if kind == "server_error":
            return _error("InternalError", "An internal error has occurred. (injected)", 500)
        if kind == "timeout":
            time.sleep(self.faults.rates.timeout_s)
            return _error("ServiceUnavailable", "The service is unavailable. (injected timeout)", 503)
        if kind == "quota":
            return _error("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit allows. (injected)", 400)
        if kind == "capacity":
            return self._insufficient(params.get("Placement.AvailabilityZone", ""), params.get("InstanceType", ""))
        return None

    @staticmethod
    def _insufficient(zone: str, instance_type: str) -> tuple[int, bytes]:
        return _error(
            "InsufficientInstanceCapacity",
            f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested "
            f"({zone}). Our system will be working on provisioning additional capacity.",
            500,
        )

    def _capacity_refusal(self, params: dict) -> tuple[int, bytes] | None:
        zone = params.get("Placement.AvailabilityZone")
        instance_type = params.get("InstanceType", "")
        gpu, per_node = gpus_of_type(instance_type)
        if not zone or gpu is None:
            return None
        available = self.capacity.available(gpu, zone)
        need = per_node * int(params.get("MinCount", "1"))
        if available is not None and self.gpus_in_use(gpu, zone) + need > available:
            return self._insufficient(zone, instance_type)
        return None

    # ---- backend -----------------------------------------------------------------

    def _backend(self, region: str):
        return ec2_backends[DEFAULT_ACCOUNT_ID][region]

    def instances(self) -> list:
        out = []
        for region in self.regions:
            for _ in range(5):  # moto's dicts may change under us while a request is served
                try:
                    out.extend(i for i in self._backend(region).all_instances() if i.id in self._launched)
                    break
                except RuntimeError:
                    time.sleep(0.01)
        return out

    def find(self, instance_id: str):
        for inst in self.instances():
            if inst.id == instance_id:
                return inst
        return None

    def gpus_in_use(self, gpu: str, zone: str) -> int:
        total = 0
        for inst in self.instances():
            if inst.placement.zone == zone and inst.state in LIVE:
                g, n = gpus_of_type(inst.instance_type)
                total += n if g == gpu else 0
        return total

    def set_addresses(self, instance_id: str, private_ip: str, public_ip: str) -> None:
        """Give the instance the addresses its machine will have (moto draws its own otherwise)."""
        inst = self.find(instance_id)
        if inst is not None and inst.nics:
            nic = inst.nics[0]
            nic.private_ip_address = private_ip
            nic.public_ip = public_ip

    def tag(self, instance_id: str, key: str, value: str) -> None:
        inst = self.find(instance_id)
        if inst is not None:
            inst.ec2_backend.create_tags([instance_id], {key: value})

    def spot_interrupt(self, instance_id: str) -> None:
        """End the instance the way EC2 reclaims spot capacity."""
        inst = self.find(instance_id)
        if inst is None or inst.state == "terminated":
            return
        inst.terminate()
        inst._reason = f"{SPOT_INTERRUPTION}: Spot instance termination"
        inst.state_reason = StateReason(f"{SPOT_INTERRUPTION}: Spot instance termination", SPOT_INTERRUPTION)

    @staticmethod
    def user_data(inst) -> str | None:
        data = inst.user_data
        if isinstance(data, list):
            data = data[0] if data else None
        if data is None:
            return None
        raw = data.as_bytes() if hasattr(data, "as_bytes") else (data.encode() if isinstance(data, str) else data)
        try:
            return base64.b64decode(raw).decode("utf-8", "replace")
        except ValueError:
            return raw.decode("utf-8", "replace")
