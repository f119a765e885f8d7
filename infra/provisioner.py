"""Turn GPU needs into running instances, zone by zone in price order, across clouds.

Capacity errors move on to the next zone at once; quota errors skip the rest of
that cloud region (quotas are regional); transient errors have already been
retried by the provider. Every try is kept in the history. If a need cannot be
met anywhere, everything this call launched is terminated (all-or-nothing) or,
with ``all_or_nothing=False``, what was got is returned for the planner to
re-plan on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra.errors import (
    CapacityError,
    CloudConfigError,
    CloudError,
    PreemptedError,
    QuotaError,
    TransientCloudError,
)
from infra.provider import CloudProvider, log
from infra.records import InstanceInfo, job_labels
from sailor_core.catalog import normalize_gpu_name
from sailor_core.catalog.instances import Offer
from sailor_core.errors import InputError
from sailor_core.zones import parse_zone


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuNeed:
    """``num_gpus`` GPUs of one type in one zone (``None``: any zone), on nodes of at
    least ``min_gpus_per_node`` (a replica's TP group must share a node), on the spot
    market or on demand (``spot``; ``None``: the ``provision`` call's market, so a mixed
    plan's on-demand nodes are rented in the same all-or-nothing call as its spot ones)."""

    gpu: str
    zone: str | None
    num_gpus: int
    min_gpus_per_node: int = 1
    spot: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu", normalize_gpu_name(self.gpu))
        if self.zone is not None:
            parse_zone(self.zone)
        if self.num_gpus < 1 or self.min_gpus_per_node < 1:
            raise InputError(f"a GPU need must ask for >= 1 GPU on nodes of >= 1 GPU, got {self}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One try of the failover: where, what, and how it went."""

    cloud: str
    zone: str
    instance_type: str
    count: int
    outcome: str  # "ok", "capacity", "quota", "transient", "preempted", "error", "skipped"
    message: str
    at_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    need: GpuNeed
    offer: Offer
    instances: tuple[InstanceInfo, ...]
    spot: bool

    @property
    def num_gpus(self) -> int:
        return self.offer.gpus_per_node * len(self.instances)

    @property
    def usd_per_hr(self) -> float:
        price = self.offer.spot_usd_per_hr if self.spot else self.offer.on_demand_usd_per_hr
        return price * len(self.instances)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvisionResult:
    job_id: str
    attempt: int
    allocations: tuple[Allocation, ...]
    missing: tuple[GpuNeed, ...]
    history: tuple[Attempt, ...]

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def instances(self) -> tuple[InstanceInfo, ...]:
        return tuple(i for a in self.allocations for i in a.instances)

    @property
    def usd_per_hr(self) -> float:
        return sum(a.usd_per_hr for a in self.allocations)

    def availability(self) -> dict[tuple[str, str], int]:
        """GPUs actually got per (type, zone): the planner's availability input."""
        out: dict[tuple[str, str], int] = {}
        for a in self.allocations:
            key = (a.offer.gpu, a.offer.zone)
            out[key] = out.get(key, 0) + a.num_gpus
        return out

    def history_lines(self) -> list[str]:
        return [f"{h.cloud}/{h.zone} {h.instance_type} x{h.count}: {h.outcome} {h.message}".rstrip() for h in self.history]


class ProvisionError(CapacityError):
    """No zone could supply a need; ``history`` says what was tried and why it failed."""

    def __init__(self, message: str, *, history: Sequence[Attempt]) -> None:
        super().__init__(message)
        self.history = tuple(history)


def _nodes_for(need: GpuNeed, offer: Offer) -> int | None:
    size = offer.gpus_per_node
    if size < need.min_gpus_per_node or size % need.min_gpus_per_node:
        return None
    return math.ceil(need.num_gpus / size)


class Provisioner:
    def __init__(self, providers: Mapping[str, CloudProvider], *, wait_timeout_s: float = 600.0) -> None:
        if not providers:
            raise CloudConfigError("no cloud providers configured")
        self.providers = dict(providers)
        self.wait_timeout_s = wait_timeout_s

    def offers(self, gpus: Sequence[str], zones: Sequence[str] | None = None) -> list[Offer]:
        out: list[Offer] = []
        for cloud, provider in self.providers.items():
            try:
                found = provider.list_offers(gpu_types=sorted(set(gpus)))
            except (TransientCloudError, CloudConfigError) as exc:
                log.warning("no offers from %s: %s", cloud, exc)
                continue
            out.extend(o for o in found if zones is None or o.zone in zones)
        return out

    def candidates(self, need: GpuNeed, offers: Sequence[Offer], *, spot: bool, substitute_zones: bool) -> list[tuple[Offer, int]]:
        """(offer, node count) to try for a need: its own zone first, then others by price."""
        options = []
        for offer in offers:
            if offer.gpu != need.gpu:
                continue
            count = _nodes_for(need, offer)
            if count is None:
                continue
            if need.zone is not None and offer.zone != need.zone and not substitute_zones:
                continue
            price = (offer.spot_usd_per_hr if spot else offer.on_demand_usd_per_hr) * count
            own_zone_first = 0 if (need.zone is None or offer.zone == need.zone) else 1
            options.append(((own_zone_first, price, count, offer.cloud, offer.zone, offer.instance_type), offer, count))
        options.sort(key=lambda t: t[0])
        # Per zone only the cheapest fitting type: a capacity error is about the zone.
        seen, out = set(), []
        for _, offer, count in options:
            if (offer.cloud, offer.zone) not in seen:
                seen.add((offer.cloud, offer.zone))
                out.append((offer, count))
        return out

    def provision(
        self,
        needs: Sequence[GpuNeed],
        *,
        job_id: str,
        attempt: int = 0,
        spot: bool = True,
        substitute_zones: bool = True,
        all_or_nothing: bool = True,
        startup_script: str | None = None,
        zones: Sequence[str] | None = None,
        offers: Sequence[Offer] | None = None,
    ) -> ProvisionResult:
        labels = job_labels(job_id, attempt)
        if offers is None:
            offers = self.offers([n.gpu for n in needs], zones)
        elif zones is not None:
            offers = [o for o in offers if o.zone in zones]
        history: list[Attempt] = []
        allocations: list[Allocation] = []
        missing: list[GpuNeed] = []
        blocked_regions: set[tuple[str, str]] = set()
        # What already ran under these labels is not ours to undo; anything else is,
        # including a launch whose answer was lost in a timeout.
        existing = self._live_ids(labels)
        t0 = time.monotonic()

        def note(offer: Offer, count: int, outcome: str, message: str = "") -> None:
            history.append(Attempt(cloud=offer.cloud, zone=offer.zone, instance_type=offer.instance_type, count=count,
                                   outcome=outcome, message=message, at_s=round(time.monotonic() - t0, 3)))

        try:
            for need in needs:
                got, on_spot = None, (spot if need.spot is None else need.spot)
                for offer, count in self.candidates(need, offers, spot=on_spot, substitute_zones=substitute_zones):
                    region = (offer.cloud, offer.region)
                    if region in blocked_regions:
                        note(offer, count, "skipped", "quota exhausted in this region")
                        continue
                    provider = self.providers[offer.cloud]
                    launched: list[InstanceInfo] = []
                    try:
                        launched = provider.run_instances(zone=offer.zone, instance_type=offer.instance_type,
                                                          count=count, labels=labels, spot=on_spot,
                                                          startup_script=startup_script)
                        ready = provider.wait_instances(labels, timeout_s=self.wait_timeout_s,
                                                        instance_ids=[i.instance_id for i in launched])
                    except (CapacityError, QuotaError, PreemptedError, TransientCloudError) as exc:
                        if launched:  # started but lost or never became ready: give it back
                            self._terminate_ids(provider, labels, [i.instance_id for i in launched])
                        outcome = {CapacityError: "capacity", QuotaError: "quota",
                                   PreemptedError: "preempted"}.get(type(exc), "transient")
                        if isinstance(exc, QuotaError):
                            blocked_regions.add(region)
                        note(offer, count, outcome, exc.code if outcome in ("capacity", "quota") and exc.code else str(exc))
                        continue
                    note(offer, count, "ok", f"{count * offer.gpus_per_node} x {offer.gpu}")
                    got = Allocation(need=need, offer=offer, instances=tuple(ready), spot=on_spot)
                    break
                if got is None:
                    missing.append(need)
                    if all_or_nothing:
                        break
                else:
                    allocations.append(got)
        except BaseException:
            self._undo(labels, existing)  # config errors, bugs, Ctrl-C: leave nothing behind
            raise
        result = ProvisionResult(job_id=job_id, attempt=attempt, allocations=tuple(allocations),
                                 missing=tuple(missing), history=tuple(history))
        if missing and all_or_nothing:
            self._undo(labels, existing)
            need = missing[0]
            tried = "; ".join(result.history_lines()) or "no zone sells it"
            raise ProvisionError(
                f"could not get {need.num_gpus} x {need.gpu} in {need.zone or 'any zone'} (tried: {tried})",
                history=history,
            )
        return result

    @staticmethod
    def _terminate_ids(provider: CloudProvider, labels, instance_ids: list[str]) -> None:
        try:
            provider.terminate_instances(labels, instance_ids=instance_ids)
        except CloudError as exc:
            log.warning("cleanup after a failed start: %s", exc)

    def _live_ids(self, labels) -> set[str]:
        return {i.instance_id for p in self.providers.values()
                for i in p.query_instances(labels, include_ended=False) if i.live}

    def _undo(self, labels, existing: set[str]) -> None:
        for cloud, provider in self.providers.items():
            try:
                mine = [i.instance_id for i in provider.query_instances(labels, include_ended=False)
                        if i.live and i.instance_id not in existing]
                if mine:
                    provider.terminate_instances(labels, instance_ids=mine)
            except CloudError as exc:
                log.error("could not give back %s instances labelled %s: %s", cloud, labels, exc)

    def teardown(self, job_id: str, attempt: int | None = None) -> list[str]:
        """Terminate everything labelled with the job (and attempt) on every cloud."""
        labels = job_labels(job_id, attempt)
        ended: list[str] = []
        errors: list[str] = []
        for cloud, provider in self.providers.items():
            try:
                ended.extend(provider.terminate_instances(labels))
            except CloudError as exc:
                errors.append(f"{cloud}: {exc}")
        if errors:
            raise TransientCloudError("teardown incomplete, run it again: " + "; ".join(errors))
        return ended

    def leftovers(self, job_id: str) -> list[InstanceInfo]:
        """Live instances of the job on any cloud (should be empty after a teardown)."""
        labels = job_labels(job_id)
        return [i for p in self.providers.values() for i in p.query_instances(labels, include_ended=False) if i.live]
