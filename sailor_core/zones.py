"""Zone names: which cloud and region a zone belongs to (each cloud's zone pattern is in
``catalog/data/clouds.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog.clouds import cloud_facts, zone_owner


@dataclass(frozen=True, slots=True, kw_only=True)
class Zone:
    cloud: str  # a name of clouds.json: "aws", "gcp", ... or "local"
    region: str
    name: str

    def same_region(self, other: "Zone") -> bool:
        return self.cloud == other.cloud and self.region == other.region

    @property
    def continent(self) -> str:
        return cloud_facts(self.cloud).continent(self.region)


@lru_cache(maxsize=4096)
def parse_zone(name: str) -> Zone:
    """The Zone for a name of some cloud of the registry: ``us-east-1a``, ``us-central1-a``, ``local``."""
    facts, region = zone_owner(name)
    return Zone(cloud=facts.name, region=region, name=name)


@lru_cache(maxsize=4096)
def ring_order_key(name: str) -> tuple[str, str, str, str]:
    """Where a zone goes in a ring: by cloud, then continent, then region, then name.  Sorting a
    ring's zones by it keeps every cloud, continent and region contiguous, so a ring around them
    crosses each of those boundaries as few times as any ring can (once into and once out of each
    group when there are several); ``plan.types.Stage`` documents the ring-order contract."""
    zone = parse_zone(name)
    return (zone.cloud, zone.continent, zone.region, name)


def ring_zone_order(zones) -> list[str]:
    """The distinct ``zones`` in ring order (``ring_order_key``)."""
    return sorted(set(zones), key=ring_order_key)
