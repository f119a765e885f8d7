"""Who is asking the embedded metadata server, and whether they ask as the real servers demand.

The caller is named by its network address, as on a cloud: in ``netns`` network mode each
instance has its own addresses, and the server answers ``<endpoint>/metadata/<path>`` with the
metadata of the instance the request comes from; no path names an instance, so none can ask for
another's identity or credentials.  In ``host`` mode every instance is 127.0.0.1: the instance
names itself (``<endpoint>/metadata/<id>/<path>``) and so could name any other (the documented
weaker mode, said at the cloud's start).

AWS paths (``latest/...``) need an IMDSv2 session token: ``PUT latest/api/token`` with the TTL
header (1 to 21600 s) gives one, bound to the instance that asked; every other request carries
it (401 without, with another instance's or an expired one).  GCE paths (``computeMetadata/...``)
need ``Metadata-Flavor: Google`` (403 without).  Both refuse a request with ``X-Forwarded-For``
(one relayed by a proxy on the instance), as the real servers do.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping

TOKEN_PATH = "latest/api/token"
TTL_HEADER = "x-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "x-aws-ec2-metadata-token"
MAX_TTL_S = 21600


class MetadataDoor:
    """The caller's machine from its address (or its named id in host mode), and the checks of
    the AWS and GCE metadata protocols; thread-safe."""

    def __init__(self, *, by_address: bool) -> None:
        self.by_address = by_address
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, float]] = {}  # IMDSv2 token -> (instance id, monotonic expiry)

    def caller(self, machines, address: str, path: str):
        """(the calling instance's machine or None, the metadata path it asks for)."""
        path = path.strip("/")
        if self.by_address:
            found = next((m for m in machines.all() if not m.ended
                          and address in (m.hardware.public_ip, m.hardware.private_ip)), None)
            return found, path
        instance_id, _, rest = path.partition("/")
        found = machines.get(instance_id)
        return (found if found is not None and not found.ended else None), rest

    def check(self, instance_id: str, path: str, method: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """A refusal, or the answer to an IMDSv2 token request; None when the request may go on."""
        headers = {k.lower(): v for k, v in headers.items()}
        if "x-forwarded-for" in headers and (path.startswith(("latest/", "computeMetadata/"))):
            return 403, "Forbidden: a relayed request (X-Forwarded-For)"
        if path == TOKEN_PATH:
            return self._issue(instance_id, method, headers.get(TTL_HEADER))
        if path.startswith("latest/"):
            if method != "GET":
                return 405, "Method Not Allowed"
            return None if self._valid(instance_id, headers.get(TOKEN_HEADER, "")) else (401, "Unauthorized")
        if path.startswith("computeMetadata/") and headers.get("metadata-flavor", "") != "Google":
            return 403, "Missing required header: Metadata-Flavor: Google"
        return None

    def _issue(self, instance_id: str, method: str, ttl: str | None) -> tuple[int, str]:
        if method != "PUT":
            return 405, "Method Not Allowed"
        try:
            ttl_s = int(ttl or "")
        except ValueError:
            return 400, f"Bad Request: {TTL_HEADER} must be a number of seconds"
        if not 1 <= ttl_s <= MAX_TTL_S:
            return 400, f"Bad Request: {TTL_HEADER} must be 1 to {MAX_TTL_S}"
        token = secrets.token_urlsafe(40)
        now = time.monotonic()
        with self._lock:
            self._tokens = {t: v for t, v in self._tokens.items() if v[1] > now}
            self._tokens[token] = (instance_id, now + ttl_s)
        return 200, token

    def _valid(self, instance_id: str, token: str) -> bool:
        with self._lock:
            held = self._tokens.get(token)
        return held is not None and held[0] == instance_id and held[1] > time.monotonic()
