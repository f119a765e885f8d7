"""The one interface every cloud implements (verbs after SkyPilot's ``sky/provision``).

Besides the instance verbs every cloud has, a provider declares the optional features it
implements (``features``, after SkyPilot's ``Cloud._CLOUD_UNSUPPORTED_FEATURES``); callers ask
``supports`` instead of probing for methods, and a verb of a feature a provider does not declare
says so in one line.
"""

from __future__ import annotations

import abc
import enum
import logging
import time
from collections.abc import Iterable, Mapping, Sequence

from infra.errors import CloudConfigError, PreemptedError, TransientCloudError
from infra.records import JOB_LABEL, PREEMPTED, RUNNING, ClusterInfo, InstanceInfo
from infra.retry import RetryPolicy, with_retries
from sailor_core.catalog.instances import Offer

log = logging.getLogger("sailor.infra")


class Feature(enum.Enum):
    """What a cloud may do for a job besides renting instances."""

    # Rules opening the job's ports among its own instances (and to its peers in other
    # networks): open_job_network, set_job_peers, job_network_leftovers, delete_job_network
    JOB_NETWORK = "job network"
    # An identity the job's instances run as, allowed the job's bucket prefixes only:
    # create_job_identity, job_identity_leftovers, delete_job_identity
    JOB_IDENTITY = "job identity"


class CloudProvider(abc.ABC):
    """One cloud. Every method talks to the cloud; nothing is cached between calls,
    so a new process (or a restarted flow) sees the same state by querying labels."""

    cloud: str
    features: frozenset[Feature] = frozenset()
    # The account this cloud's instances run as, which another cloud's job identity may trust
    # (a GCP service account assuming the job's AWS role); None where instances have none to offer
    instance_account: str | None = None

    def __init__(self, *, retry: RetryPolicy | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self.num_retries = 0  # transient errors absorbed so far (for tests and reports)

    @classmethod
    @abc.abstractmethod
    def from_settings(cls) -> "CloudProvider":
        """The provider of the real cloud, configured from Sailor's settings (infra/providers.py)."""

    def supports(self, feature: Feature) -> bool:
        return feature in self.features

    def _unsupported(self, feature: Feature):
        return CloudConfigError(f"{self.cloud} has no {feature.value} (its provider does not declare it)",
                                cloud=self.cloud)

    def _call(self, fn, what: str):
        def note(exc, attempt):
            self.num_retries += 1
            log.info("%s %s: %s; retry %d", self.cloud, what, exc, attempt)

        return with_retries(fn, self.retry, on_retry=note)

    @abc.abstractmethod
    def list_offers(
        self, gpu_types: Sequence[str] | None = None, regions: Sequence[str] | None = None
    ) -> list[Offer]:
        """Instance types with GPUs offered per zone, with spot and on-demand USD/h."""

    @abc.abstractmethod
    def run_instances(
        self,
        *,
        zone: str,
        instance_type: str,
        count: int,
        labels: Mapping[str, str],
        spot: bool = True,
        startup_script: str | None = None,
    ) -> list[InstanceInfo]:
        """Launch ``count`` instances (all or nothing). Raises CapacityError, QuotaError, ..."""

    @abc.abstractmethod
    def query_instances(
        self, labels: Mapping[str, str], *, include_ended: bool = True
    ) -> list[InstanceInfo]:
        """Instances carrying all ``labels``, with their state as the cloud reports it now."""

    @abc.abstractmethod
    def terminate_instances(
        self, labels: Mapping[str, str], *, instance_ids: Iterable[str] | None = None
    ) -> list[str]:
        """Terminate every live instance carrying ``labels`` (only ``instance_ids`` of
        them, if given); returns the ids terminated."""

    def wait_instances(
        self,
        labels: Mapping[str, str],
        *,
        state: str = RUNNING,
        timeout_s: float = 600.0,
        poll_s: float = 0.2,
        instance_ids: Iterable[str] | None = None,
    ) -> list[InstanceInfo]:
        """Poll until every live instance with ``labels`` is in ``state``.

        Raises PreemptedError if one of ``instance_ids`` (or of the live set seen
        first) ends preempted while waiting, TransientCloudError on timeout.
        """
        deadline = time.monotonic() + timeout_s
        wanted = set(instance_ids) if instance_ids is not None else None
        while True:
            found = self.query_instances(labels)
            if wanted is None:
                wanted = {i.instance_id for i in found if i.live}
            mine = [i for i in found if i.instance_id in wanted]
            lost = [i for i in mine if i.state == PREEMPTED]
            if lost:
                raise PreemptedError(
                    f"{lost[0].instance_id} in {lost[0].zone} was preempted while starting "
                    f"({lost[0].state_reason})",
                    cloud=self.cloud,
                    zone=lost[0].zone,
                    code=lost[0].state_reason or "",
                )
            if len(mine) == len(wanted) and all(i.state == state for i in mine):
                return mine
            if time.monotonic() > deadline:
                raise TransientCloudError(
                    f"{self.cloud}: instances not {state} after {timeout_s:.0f} s",
                    cloud=self.cloud,
                )
            time.sleep(poll_s)

    def get_cluster_info(self, labels: Mapping[str, str]) -> ClusterInfo:
        found = self.query_instances(labels, include_ended=False)
        return ClusterInfo(job_id=labels.get(JOB_LABEL, ""), instances=tuple(found))

    # ---- Feature.JOB_NETWORK ------------------------------------------------------------

    def open_job_network(self, job_id: str) -> None:
        """Open the job's ports among its own instances (a cloud may do it per region at launch)."""
        raise self._unsupported(Feature.JOB_NETWORK)

    def set_job_peers(self, job_id: str, cidrs: Sequence[str]) -> None:
        """Open the job's ports to exactly these outside addresses (peers in other networks or clouds)."""
        raise self._unsupported(Feature.JOB_NETWORK)

    def job_network_leftovers(self, job_id: str) -> list[str]:
        """The job's rules still in the cloud, by name or id."""
        raise self._unsupported(Feature.JOB_NETWORK)

    def delete_job_network(self, job_id: str) -> list[str]:
        raise self._unsupported(Feature.JOB_NETWORK)

    # ---- Feature.JOB_IDENTITY -----------------------------------------------------------

    def job_instance_account(self, job_id: str) -> str | None:
        """The account the job's instances run as in this cloud (another cloud's job identity may
        trust it): the job's own where the cloud makes one per job, else ``instance_account``."""
        return self.instance_account

    def create_job_identity(self, job_id: str, *, read_write: Sequence[str], read_only: Sequence[str] = (),
                            read_objects: Sequence[str] = (), trusted_accounts: Mapping[str, str] | None = None) -> str:
        """An identity for the job's instances that may read and write the prefixes ``read_write``,
        read the prefixes ``read_only`` and the single objects ``read_objects`` (URLs of this
        cloud's object store), nothing else; ``trusted_accounts``
        (cloud -> account) are other clouds' instance accounts that may assume it."""
        raise self._unsupported(Feature.JOB_IDENTITY)

    def job_identity_leftovers(self, job_id: str) -> list[str]:
        raise self._unsupported(Feature.JOB_IDENTITY)

    def delete_job_identity(self, job_id: str) -> list[str]:
        raise self._unsupported(Feature.JOB_IDENTITY)
