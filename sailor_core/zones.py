"""Zone names: which cloud and region a zone belongs to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from sailor_core.errors import UnknownNameError

_AWS_ZONE = re.compile(r"^(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-\d+)(?P<suffix>[a-z])$")
_GCP_ZONE = re.compile(r"^(?P<region>[a-z]+-[a-z]+\d+)-(?P<suffix>[a-z])$")
LOCAL_ZONE = "local"


@dataclass(frozen=True, slots=True, kw_only=True)
class Zone:
    cloud: str  # "aws", "gcp" or "local"
    region: str
    name: str

    def same_region(self, other: "Zone") -> bool:
        return self.cloud == other.cloud and self.region == other.region


@lru_cache(maxsize=4096)
def parse_zone(name: str) -> Zone:
    """Return the Zone for an AWS (``us-east-1a``), GCP (``us-central1-a``) or ``local`` name."""
    if name == LOCAL_ZONE or name.startswith("local-"):
        return Zone(cloud="local", region="local", name=name)
    if m := _GCP_ZONE.match(name):
        return Zone(cloud="gcp", region=m["region"], name=name)
    if m := _AWS_ZONE.match(name):
        return Zone(cloud="aws", region=m["region"], name=name)
    raise UnknownNameError(
        f"unknown zone {name!r}: expected an AWS zone like 'us-east-1a', "
        f"a GCP zone like 'us-central1-a', or 'local'"
    )
