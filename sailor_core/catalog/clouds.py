"""What Sailor knows about each cloud, as data (``data/clouds.json``): the registry the core asks.

A zone's cloud and region, a region's continent, the preemption notice, how an instance finds
out who it is: each cloud's entry says it, so no code guesses a cloud from a zone's shape or
compares a cloud's name.  The providers that talk to the clouds are in ``infra/providers.py``;
``docs/clouds.md`` ("Adding a cloud") lists every place a new cloud touches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sailor_core.catalog._load import load_data_file
from sailor_core.errors import UnknownNameError

NETWORK_SCOPES = ("region", "global")  # one default network per region (AWS VPCs) or one for the cloud (GCP)


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudFacts:
    """One cloud's entry of ``clouds.json``."""

    name: str
    title: str
    rents: bool  # instances are rented there ("local" is this machine: zones only)
    zone_pattern: re.Pattern[str]  # a named group ``region``, unless ``region`` is fixed
    zone_example: str
    continent_of_region_prefix: dict[str, str]  # a region's first word -> its continent, where they differ
    network_scope: str  # what instances share a private network in: "region" or "global"
    preemption_notice_s: float
    storage_scheme: str  # the URL scheme of its object store (s3, gs)
    metadata: dict[str, Any] | None  # the instance metadata server: paths, headers, token (infra reads it)
    region: str | None = None  # the region of every zone, where the pattern names none

    def __post_init__(self) -> None:
        if self.network_scope not in NETWORK_SCOPES:
            raise ValueError(f"clouds.json: {self.name}'s network_scope must be one of {NETWORK_SCOPES}, "
                             f"got {self.network_scope!r}")
        if self.region is None and "region" not in self.zone_pattern.groupindex:
            raise ValueError(f"clouds.json: {self.name}'s zone_pattern names no region and no region is given")

    def region_of(self, zone: str) -> str | None:
        """The zone's region, or None when the zone is not one of this cloud's."""
        m = self.zone_pattern.match(zone)
        if m is None:
            return None
        return self.region if self.region is not None else m["region"]

    def continent(self, region: str) -> str:
        """The continent egress is priced by: the region's first word, as the cloud spells continents."""
        prefix = region.split("-", 1)[0]
        return self.continent_of_region_prefix.get(prefix, prefix)

    def network_of(self, region: str) -> str:
        """Which private network an instance in ``region`` joins: instances of one talk by private address."""
        return region if self.network_scope == "region" else ""


def _facts(row: dict) -> CloudFacts:
    return CloudFacts(
        name=row["name"], title=row["title"], rents=bool(row["rents"]),
        zone_pattern=re.compile(row["zone_pattern"]), zone_example=row["zone_example"],
        continent_of_region_prefix=dict(row["continent_of_region_prefix"]),
        network_scope=row["network_scope"], preemption_notice_s=float(row["preemption_notice_s"]),
        storage_scheme=row["storage_scheme"], metadata=row.get("metadata"), region=row.get("region"),
    )


@lru_cache(maxsize=1)
def _registry() -> dict[str, CloudFacts]:
    return {row["name"]: _facts(row) for row in load_data_file("clouds.json")["clouds"]}


def all_clouds() -> tuple[CloudFacts, ...]:
    """Every cloud of the registry, rented or not, in its order."""
    return tuple(_registry().values())


def rented_clouds() -> tuple[str, ...]:
    """The clouds instances are rented from (what a job's ``clouds`` may name)."""
    return tuple(c.name for c in _registry().values() if c.rents)


def cloud_facts(name: str) -> CloudFacts:
    try:
        return _registry()[name]
    except KeyError:
        raise UnknownNameError(f"unknown cloud {name!r}; known: {', '.join(_registry())}") from None


def check_rented(names) -> None:
    """One clear line for a cloud no instance can be rented from."""
    known = rented_clouds()
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise UnknownNameError(f"unknown cloud {unknown[0]!r}; known: {', '.join(known)}")


def zone_owner(zone: str) -> tuple[CloudFacts, str]:
    """(the cloud whose zone names match ``zone``, its region); exactly one cloud may claim a zone."""
    found = [(c, r) for c in _registry().values() if (r := c.region_of(zone)) is not None]
    if len(found) > 1:  # two clouds' patterns overlap: a data bug that would send a zone to either
        raise ValueError(f"clouds.json: zone {zone!r} matches the zone patterns of "
                         f"{' and '.join(c.name for c, _ in found)}")
    if not found:
        examples = [f"{c.zone_example!r} ({c.title})" for c in _registry().values()]
        raise UnknownNameError(f"unknown zone {zone!r}: expected a zone like {', '.join(examples[:-1])} "
                               f"or {examples[-1]}")
    return found[0]
