"""Errors raised at the cloud boundary, translated from boto3 / google-cloud errors.

Callers decide by type: capacity moves on to the next zone at once, transient
errors are retried with backoff, quota and config errors stop with a message.
"""

from __future__ import annotations

from sailor_core.errors import SailorError


class CloudError(SailorError):
    """Base of the errors a cloud provider raises; ``zone`` is where it happened."""

    exit_code = 5

    def __init__(self, message: str, *, cloud: str = "", zone: str = "", code: str = "") -> None:
        super().__init__(message)
        self.cloud = cloud
        self.zone = zone
        self.code = code  # the cloud's own error code, e.g. "InsufficientInstanceCapacity"


class CapacityError(CloudError):
    """The zone has no capacity for this instance type now: try the next zone."""


class QuotaError(CloudError):
    """An account quota (vCPUs, GPUs, spot instances) would be exceeded."""


class TransientCloudError(CloudError):
    """Throttling, a 5xx or a timeout: safe to retry after a backoff."""


class PreemptedError(CloudError):
    """A spot instance was reclaimed by the cloud."""


class CloudConfigError(CloudError):
    """Missing or wrong credentials, endpoint, project or permissions: no retry helps."""
