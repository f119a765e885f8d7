"""What a worker on an instance polls to learn it is about to be preempted (stdlib only).

Real clouds: AWS IMDSv2 ``/latest/meta-data/spot/instance-action`` (404 until a
notice, then JSON with ``action`` and ``time``, two minutes ahead) and GCE
``/computeMetadata/v1/instance/preempted`` (``FALSE`` / ``TRUE``, ~30 s ahead).
The embedded cloud serves the same paths under ``$SAILOR_METADATA_URL`` (and as
files under ``$SAILOR_METADATA_DIR``), so one poller works in both.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from sailor_core import settings

AWS_IMDS = "http://169.254.169.254"
GCE_METADATA = "http://metadata.google.internal"
AWS_NOTICE_PATH = "latest/meta-data/spot/instance-action"
GCE_PREEMPTED_PATH = "computeMetadata/v1/instance/preempted"


def _get(url: str, *, headers: dict | None = None, timeout_s: float = 0.5) -> str | None:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None  # 404 (no notice yet), no metadata server, or a slow one: no notice


def _aws_token(timeout_s: float) -> str | None:
    req = urllib.request.Request(f"{AWS_IMDS}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def preemption_notice(cloud: str | None = None, *, timeout_s: float = 0.5) -> str | None:
    """The cloud's preemption notice for this instance, or None while there is none."""
    cloud = cloud or settings.instance_cloud()
    base = settings.metadata_url()
    if base:  # the embedded cloud
        if cloud == "gcp":
            text = _get(f"{base}/{GCE_PREEMPTED_PATH}", timeout_s=timeout_s)
            return text if text and text.strip().upper() == "TRUE" else None
        return _get(f"{base}/{AWS_NOTICE_PATH}", timeout_s=timeout_s)
    if cloud == "gcp":
        text = _get(f"{GCE_METADATA}/{GCE_PREEMPTED_PATH}", headers={"Metadata-Flavor": "Google"}, timeout_s=timeout_s)
        return text if text and text.strip().upper() == "TRUE" else None
    if cloud == "aws":
        token = _aws_token(timeout_s)
        headers = {"X-aws-ec2-metadata-token": token} if token else {}
        return _get(f"{AWS_IMDS}/{AWS_NOTICE_PATH}", headers=headers, timeout_s=timeout_s)
    return None
