"""Cloud instance types with their GPUs, zones and list prices (``data/instances.json``).

The clouds' own APIs say which types a zone offers; neither sells prices through
the compute API (AWS's spot price history is live but moto's is a constant), so
prices come from this file: public list prices, with the month they were read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog._load import load_data_file
from sailor_core.catalog.clouds import check_rented
from sailor_core.catalog.gpus import normalize_gpu_name
from sailor_core.errors import UnknownNameError
from sailor_core.zones import parse_zone


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One instance type sold in one zone; prices are per instance."""

    cloud: str
    zone: str
    instance_type: str
    gpu: str
    gpus_per_node: int
    spot_usd_per_hr: float
    on_demand_usd_per_hr: float

    @property
    def region(self) -> str:
        return parse_zone(self.zone).region

    def usd_per_gpu_hr(self, *, spot: bool = True) -> float:
        price = self.spot_usd_per_hr if spot else self.on_demand_usd_per_hr
        return price / self.gpus_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceType:
    """A row of the data file: what to ask the cloud for, and its US list price."""

    cloud: str
    instance_type: str  # the name offers use; for GCP n1 + GPU a synthetic "n1-standard-8-v100x1"
    machine_type: str  # what the cloud API takes (GCP machine type / EC2 instance type)
    accelerator_type: str | None  # the cloud's name for the GPU (GCP's accelerator type), where it has one
    # The GPUs are attached to the machine type at launch (GCP's n1 + accelerator rows name the
    # accelerator in the data) rather than built into it (a2/a3/g2): the one home of that rule
    attached_gpus: bool = False
    gpu: str
    gpus_per_node: int
    on_demand_usd_per_hr: float
    spot_usd_per_hr: float
    zones: tuple[str, ...]
    note: str = ""


@lru_cache(maxsize=1)
def _data() -> dict:
    return load_data_file("instances.json")


@lru_cache(maxsize=1)
def instance_types() -> tuple[InstanceType, ...]:
    data = _data()
    rows = []
    for row in data["instances"]:
        gpu = normalize_gpu_name(row["gpu"])
        cloud = row["cloud"]
        machine_type = row.get("machine_type", row["instance_type"])
        attached = row.get("accelerator_type")
        accelerator = attached or data["accelerator_types"].get(cloud, {}).get(gpu)
        rows.append(
            InstanceType(
                cloud=cloud,
                instance_type=row["instance_type"],
                machine_type=machine_type,
                accelerator_type=accelerator,
                attached_gpus=attached is not None,
                gpu=gpu,
                gpus_per_node=int(row["gpus_per_node"]),
                on_demand_usd_per_hr=float(row["on_demand_usd_per_hr"]),
                spot_usd_per_hr=float(row["spot_usd_per_hr"]),
                zones=tuple(row["zones"]),
                note=row.get("note", ""),
            )
        )
    return tuple(rows)


def get_instance_type(cloud: str, instance_type: str) -> InstanceType:
    """The catalog row by offer name (or, failing that, by the cloud's machine type name)."""
    rows = [r for r in instance_types() if r.cloud == cloud]
    for row in rows:
        if row.instance_type == instance_type:
            return row
    for row in rows:
        if row.machine_type == instance_type:
            return row
    raise UnknownNameError(f"unknown {cloud} instance type {instance_type!r} (not in the instance catalog)")


def gpu_for_accelerator(cloud: str, accelerator_type: str) -> str | None:
    """The GPU a cloud sells as ``accelerator_type`` (GCP's ``nvidia-tesla-t4``), if any."""
    for gpu, name in _data()["accelerator_types"].get(cloud, {}).items():
        if name == accelerator_type:
            return gpu
    return None


def price_read() -> str:
    """Year-month the list prices were read (shown next to prices)."""
    return str(_data()["price_read"])


def region_price_factor(region: str) -> float:
    return float(_data()["region_price_factor"].get(region, 1.0))


def reference_gpu_prices() -> dict[str, float]:
    ref = _data()["reference_usd_per_gpu_hr"]
    return {k: float(v) for k, v in ref.items() if not k.startswith("_")}


def offer_for(row: InstanceType, zone: str) -> Offer:
    factor = region_price_factor(parse_zone(zone).region)
    return Offer(
        cloud=row.cloud,
        zone=zone,
        instance_type=row.instance_type,
        gpu=row.gpu,
        gpus_per_node=row.gpus_per_node,
        spot_usd_per_hr=round(row.spot_usd_per_hr * factor, 6),
        on_demand_usd_per_hr=round(row.on_demand_usd_per_hr * factor, 6),
    )


@lru_cache(maxsize=1)
def rentable_gpus() -> tuple[str, ...]:
    """GPU types some cloud of the catalog rents by the hour (what a job may ask for)."""
    return tuple(sorted({row.gpu for row in instance_types()}))


@lru_cache(maxsize=1)
def catalog_zones() -> tuple[str, ...]:
    """Zones where the catalog sells some GPU instance type."""
    return tuple(sorted({zone for row in instance_types() for zone in row.zones}))


def _offer_order(o: Offer) -> tuple:
    return (o.cloud, o.zone, o.gpu, o.gpus_per_node, o.instance_type)


@lru_cache(maxsize=1)
def _all_offers() -> tuple[Offer, ...]:
    offers = [offer_for(row, zone) for row in instance_types() for zone in row.zones]
    offers.sort(key=_offer_order)
    return tuple(offers)


@lru_cache(maxsize=256)
def _offers_of(gpu: str) -> tuple[Offer, ...]:
    """``_all_offers``' offers of one GPU type, in the same order: pricing a GPU builds its own
    offers only (all 361 took ~1.4 ms of a planner's first search in a process)."""
    offers = [offer_for(row, zone) for row in instance_types() if row.gpu == gpu for zone in row.zones]
    offers.sort(key=_offer_order)
    return tuple(offers)


def catalog_offers(gpus=None, zones=None, clouds=None) -> list[Offer]:
    """Offers from the data file, optionally filtered by GPU types, zones and clouds."""
    gpu_set = {normalize_gpu_name(g) for g in gpus} if gpus else None
    zone_set = {parse_zone(z).name for z in zones} if zones else None
    if clouds:
        check_rented(clouds)
    cloud_set = set(clouds) if clouds else None
    return [
        o
        for o in _all_offers()
        if (gpu_set is None or o.gpu in gpu_set)
        and (zone_set is None or o.zone in zone_set)
        and (cloud_set is None or o.cloud in cloud_set)
    ]


@lru_cache(maxsize=4096)
def gpu_price_usd_per_hr(gpu: str, zone: str, *, spot: bool = True) -> float:
    """Price of one GPU-hour of ``gpu`` in ``zone``.

    That is the per-GPU price of the smallest instance type selling it there
    (the cheapest of those if several): one GPU rented alone, as a TP=1 replica
    would be; larger nodes can be a little cheaper per GPU (a2-megagpu-16g) but
    only when the whole node is used. Falls back, in order, to the cheapest offer in the same region, the same
    cloud, any cloud, and finally the reference table (GPUs no cloud rents,
    e.g. GH-96, the RTX cards and ``cpu``), so every catalog GPU has a price.
    """
    gpu = normalize_gpu_name(gpu)
    where = parse_zone(zone)
    offers = _offers_of(gpu)
    scopes = (
        lambda o: o.zone == where.name,
        lambda o: o.cloud == where.cloud and o.region == where.region,
        lambda o: o.cloud == where.cloud,
        lambda o: True,
    )
    for in_scope in scopes:
        here = [o for o in offers if in_scope(o)]
        if here:
            smallest = min(o.gpus_per_node for o in here)
            return min(o.usd_per_gpu_hr(spot=spot) for o in here if o.gpus_per_node == smallest)
    reference = reference_gpu_prices()
    if gpu in reference:
        return reference[gpu]
    raise UnknownNameError(  # a GPU added to gpus.json without a price: a data bug
        f"no price for GPU {gpu!r}: add it to instances.json or its reference table"
    )
