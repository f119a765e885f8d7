"""Where a job's checkpoint bucket is, and what its bytes cost to and from the workers' zones.

A checkpoint written to, or read from, a bucket in another region or cloud than the rank that
moves it is billed as inter-region or internet egress.  The ledger names such a pair's bucket side
``bucket:<cloud>:<region>`` (``BucketPlace.name``) beside the zones of the engine's own transfers,
and ``pair_usd_per_byte`` prices every pair of the ledger: zone to zone as the network model
does, zone to bucket by region at the same class prices (``model.regions_egress_usd_per_gb``).

A bucket's cloud is its URL's (the scheme each cloud's ``storage_scheme`` in ``clouds.json``
names); its region is what the flow asked of the cloud or what ``--checkpoint-region`` says.  A
region not known is priced as the farthest its cloud can be from the rank: across continents on
the rank's own cloud, over the internet from another (``UNKNOWN_REGION``).  A folder on this
machine (a path, ``file://``, or a bucket of region ``local``: the embedded cloud's buckets made
without a region, which serve every zone from this machine's disk) is billed by no cloud and
never metered.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from sailor_core.catalog.clouds import all_clouds
from sailor_core.errors import InputError
from sailor_core.network.model import DEFAULT_EGRESS_USD_PER_GB, NetworkModel, regions_egress_usd_per_gb
from sailor_core.zones import Zone, parse_zone

BUCKET_PREFIX = "bucket:"
UNKNOWN_REGION = "?"
_LOCAL = LOCAL_REGION = "local"  # a bucket of this machine (a folder; the embedded cloud's), whatever its URL
_REGION = re.compile(r"^[a-z]+(-[a-z]+)*-?\d+$")


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketPlace:
    """A checkpoint bucket's cloud and region (None: not known, priced as the farthest)."""

    cloud: str
    region: str | None

    @property
    def name(self) -> str:
        """The bucket's side of a ledger pair: ``bucket:aws:us-west-2``, ``bucket:gcp:?``."""
        return f"{BUCKET_PREFIX}{self.cloud}:{self.region or UNKNOWN_REGION}"

    @property
    def metered(self) -> bool:
        """Whether any cloud bills its bytes (a folder on this machine: none)."""
        return self.cloud != _LOCAL

    def crosses(self, zone: str) -> bool:
        """Whether bytes between a rank in ``zone`` and this bucket leave the rank's region."""
        if not self.metered:
            return False
        z = parse_zone(zone)
        return z.cloud != _LOCAL and (self.region is None or (z.cloud, z.region) != (self.cloud, self.region))

    def usd_per_byte(self, zone: str) -> float:
        """The price of a byte between a rank in ``zone`` and this bucket, either way."""
        if not self.crosses(zone):
            return 0.0
        z = parse_zone(zone)
        if self.region is None:
            farthest = "cross_continent" if z.cloud == self.cloud else "cross_cloud"
            return DEFAULT_EGRESS_USD_PER_GB[farthest] / 1e9
        return regions_egress_usd_per_gb(z, Zone(cloud=self.cloud, region=self.region, name=self.name)) / 1e9


def bucket_place(url: str, region: str = "") -> BucketPlace:
    """The place of the bucket behind ``url`` (a path, ``file://``, ``s3://``, ``gs://``), in
    ``region`` when given (one of the URL's cloud's region names), else not known."""
    scheme = urllib.parse.urlsplit(url).scheme if "://" in url else ""
    if scheme in ("", "file") or region == LOCAL_REGION:
        return BucketPlace(cloud=_LOCAL, region=_LOCAL)
    clouds = [c.name for c in all_clouds() if c.storage_scheme == scheme]
    if not clouds:
        raise InputError(f"{url}: no cloud of the registry keeps buckets behind {scheme}://")
    if region_problem(region):
        raise InputError(f"--checkpoint-region {region_problem(region)}")
    return BucketPlace(cloud=clouds[0], region=region or None)


def place_named(text: str) -> BucketPlace:
    """The place ``cloud:region`` (``aws:us-west-2``), ``cloud`` (region not known) or ``local``
    names: the replay's checkpoint bucket, which has no URL."""
    cloud, _, region = text.strip().partition(":")
    if cloud == LOCAL_REGION:
        return BucketPlace(cloud=_LOCAL, region=_LOCAL)
    names = sorted(c.name for c in all_clouds() if c.name != _LOCAL)
    if cloud not in names:
        raise InputError(f"{text!r}: expected cloud:region (clouds: {', '.join(names)}) or local")
    if region_problem(region) or region == LOCAL_REGION:
        raise InputError(f"{text!r}: the region is not a cloud's region name such as us-west-2")
    return BucketPlace(cloud=cloud, region=region or None)


def region_problem(region: str) -> str:
    """What is wrong with ``region`` as a bucket's region name ('' when nothing, or when empty)."""
    if region and region != LOCAL_REGION and not _REGION.match(region):
        return f"expected a cloud's region name such as us-west-2 or us-central1 (or local), got {region!r}"
    return ""


def parse_bucket(name: str) -> BucketPlace | None:
    """The bucket a ledger pair's side names (``BucketPlace.name``), or None for a zone."""
    if not name.startswith(BUCKET_PREFIX):
        return None
    cloud, _, region = name[len(BUCKET_PREFIX):].partition(":")
    return BucketPlace(cloud=cloud, region=None if region in ("", UNKNOWN_REGION) else region)


def pair_usd_per_byte(network: NetworkModel, src: str, dst: str) -> float:
    """The price of a byte sent from ``src`` to ``dst``, each a zone or a bucket (``parse_bucket``)."""
    src_bucket, dst_bucket = parse_bucket(src), parse_bucket(dst)
    if src_bucket is None and dst_bucket is None:
        return network.egress_usd_per_byte(src, dst)
    if src_bucket is not None and dst_bucket is not None:
        raise InputError(f"egress from bucket {src} to bucket {dst}: no rank moves such bytes")
    return src_bucket.usd_per_byte(dst) if src_bucket is not None else dst_bucket.usd_per_byte(src)


def is_bucket_pair(src: str, dst: str) -> bool:
    """Whether a ledger pair is a checkpoint's (one side a bucket)."""
    return src.startswith(BUCKET_PREFIX) or dst.startswith(BUCKET_PREFIX)
