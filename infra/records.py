"""Values that cross the provider boundary (SkyPilot ``sky/provision`` style)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sailor_core.errors import InputError

JOB_LABEL = "sailor-job"
ATTEMPT_LABEL = "sailor-attempt"
# Set by the embedded cloud on its instances: the address their processes listen on.
LOCAL_ADDRESS_LABEL = "sailor-local-address"
# What a job's security group / firewall rule opens among its instances: torch's rendezvous
# port, and Linux's ephemeral range, where gloo's and NCCL's pairs listen.
RENDEZVOUS_PORT = 29500
COLLECTIVE_PORTS = (32768, 60999)
JOB_PORTS = ((RENDEZVOUS_PORT, RENDEZVOUS_PORT), COLLECTIVE_PORTS)


def job_resource_name(job_id: str, suffix: str = "") -> str:
    """The name of a job's security group, firewall rule, role or tag (GCE's 63-character names)."""
    job = job_id.replace("_", "-")[:40].strip("-") or "job"
    return f"sailor-{job}" + (f"-{suffix}" if suffix else "")

# States of an instance as Sailor sees it, the same for every cloud.
PENDING, RUNNING, STOPPING, PREEMPTED, TERMINATED = (
    "pending",
    "running",
    "stopping",
    "preempted",
    "terminated",
)
LIVE_STATES = frozenset({PENDING, RUNNING, STOPPING})

_LABEL_VALUE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def job_labels(job_id: str, attempt: int | None = None) -> dict[str, str]:
    """Labels that mark a job's resources; valid on both clouds (GCP is the strict one)."""
    if not _LABEL_VALUE.match(job_id):
        raise InputError(
            f"job id {job_id!r} must be 1-63 lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit (it becomes a cloud label)"
        )
    labels = {JOB_LABEL: job_id}
    if attempt is not None:
        if attempt < 0:
            raise InputError(f"attempt must be >= 0, got {attempt}")
        labels[ATTEMPT_LABEL] = str(attempt)
    return labels


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceInfo:
    cloud: str
    instance_id: str  # AWS "i-...", GCP the instance name (unique per project and zone)
    zone: str
    instance_type: str  # the catalog's offer name
    gpu: str | None
    gpus_per_node: int
    spot: bool
    state: str  # one of PENDING, RUNNING, STOPPING, PREEMPTED, TERMINATED
    labels: dict[str, str] = field(default_factory=dict)
    private_ip: str | None = None
    state_reason: str | None = None  # the cloud's words, e.g. "Server.SpotInstanceTermination"
    public_ip: str | None = None  # what peers outside its VPC (another region, another cloud) reach

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    """What torch rendezvous needs: the instances of a job and their addresses."""

    job_id: str
    instances: tuple[InstanceInfo, ...]

    @property
    def head(self) -> InstanceInfo | None:
        running = [i for i in self.instances if i.state == RUNNING]
        return min(running, key=lambda i: (i.cloud, i.zone, i.instance_id)) if running else None

    @property
    def addresses(self) -> dict[str, str | None]:
        return {i.instance_id: i.private_ip for i in self.instances if i.state == RUNNING}
