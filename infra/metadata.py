"""What a worker on an instance polls to learn it is about to be preempted (stdlib only).

Each cloud's metadata server says it at a path of its own (``clouds.json``: ``notice_path``):
AWS IMDSv2 ``/latest/meta-data/spot/instance-action`` (404 until a notice, then JSON with
``action`` and ``time``, two minutes ahead), GCE ``/computeMetadata/v1/instance/preempted``
(``FALSE`` / ``TRUE``, ~30 s ahead: ``notice_text``).  The embedded cloud serves the same paths
under ``$SAILOR_METADATA_URL`` and asks for the same as the real servers (an IMDSv2 token, GCE's
``Metadata-Flavor`` header), so one poller works in both.
"""

from __future__ import annotations

from infra.instance_boot import ask_metadata, metadata_headers
from sailor_core import settings
from sailor_core.catalog.clouds import all_clouds


def preemption_notice(cloud: str | None = None, *, timeout_s: float = 0.5) -> str | None:
    """The cloud's preemption notice for this instance, or None while there is none (or when the
    instance's cloud is unknown or has no metadata server)."""
    cloud = cloud or settings.instance_cloud()
    probe = next((c.metadata for c in all_clouds() if c.name == cloud), None)
    if probe is None:
        return None
    probe = {**probe, "base_url": settings.metadata_url() or probe["base_url"]}  # the embedded cloud's: its own
    text = ask_metadata(f"{probe['base_url']}/{probe['notice_path']}", metadata_headers(probe, timeout_s), timeout_s)
    want = probe["notice_text"]
    return text if text and (want is None or text.upper() == want) else None
