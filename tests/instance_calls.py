"""Requests made as an embedded instance makes them, for tests.

The metadata server knows its caller by network address (``netns`` network): a request is run
inside the instance's network namespace, from the instance's own address, with the environment
an instance has (``SAILOR_METADATA_URL``).  In ``host`` mode every instance is 127.0.0.1 and names
itself in the path, which the same helpers do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ASK = """
import json, sys, urllib.error, urllib.request
url, method, headers, data = json.loads(sys.argv[1])
req = urllib.request.Request(url, method=method, headers=headers, data=data.encode() if data is not None else None)
try:
    with urllib.request.urlopen(req, timeout=10) as resp:
        print(json.dumps([resp.status, resp.read().decode()]))
except urllib.error.HTTPError as exc:
    print(json.dumps([exc.code, exc.read().decode()]))
"""


def metadata_base(cloud, instance_id: str) -> str:
    """The metadata URL the instance is given (``SAILOR_METADATA_URL``)."""
    base = f"{cloud.gce_endpoint}/metadata"
    return base if cloud.network.enforced else f"{base}/{instance_id}"


def run_as(cloud, instance_id: str, argv: list[str], *, env: dict[str, str] | None = None,
           timeout_s: float = 60) -> subprocess.CompletedProcess:
    """``argv`` run from the instance's network address, with its metadata URL in the environment."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "SAILOR_METADATA_URL": metadata_base(cloud, instance_id),
            **(env or {})}
    deadline = time.monotonic() + 15  # a VM is RUNNING before its machine has booted into its namespace
    while cloud.network.enforced and cloud.network.wrap(instance_id, argv) == argv and time.monotonic() < deadline:
        time.sleep(0.05)
    wrapped = cloud.network.wrap(instance_id, argv)
    assert wrapped != argv or not cloud.network.enforced, f"{instance_id} has no network namespace"
    return subprocess.run(wrapped, env=full, capture_output=True, text=True, timeout=timeout_s, check=False)


def ask(cloud, instance_id: str, url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
        data: str | None = None) -> tuple[int, str]:
    """(HTTP status, body) of one request sent from the instance's address."""
    proc = run_as(cloud, instance_id, [sys.executable, "-c", _ASK, json.dumps([url, method, headers or {}, data])])
    assert proc.returncode == 0, proc.stderr
    status, body = json.loads(proc.stdout)
    return status, body


def imds_token(cloud, instance_id: str) -> str:
    status, token = ask(cloud, instance_id, f"{metadata_base(cloud, instance_id)}/latest/api/token", method="PUT",
                        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    assert status == 200, token
    return token


def metadata(cloud, instance_id: str, path: str) -> tuple[int, str]:
    """A metadata path asked as the instance's SDKs ask: with an IMDSv2 token (``latest/...``) or
    GCE's ``Metadata-Flavor`` header."""
    headers = ({"X-aws-ec2-metadata-token": imds_token(cloud, instance_id)} if path.startswith("latest/")
               else {"Metadata-Flavor": "Google"})
    return ask(cloud, instance_id, f"{metadata_base(cloud, instance_id)}/{path}", headers=headers)


def role_credentials(cloud, instance_id: str) -> dict:
    """The instance profile's (or federated role's) credentials, as the instance gets them."""
    base = "latest/meta-data/iam/security-credentials"
    status, role = metadata(cloud, instance_id, f"{base}/")
    assert status == 200, role
    status, doc = metadata(cloud, instance_id, f"{base}/{role}")
    assert status == 200, doc
    return json.loads(doc)
