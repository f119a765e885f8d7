"""The instance catalog: coverage of Sailor's zones, per-GPU prices, every GPU priced."""

import pytest

from sailor_core.catalog import gpu_names
from sailor_core.catalog.instances import (
    _offers_of,
    catalog_offers,
    get_instance_type,
    gpu_price_usd_per_hr,
    instance_types,
    reference_gpu_prices,
)
from sailor_core.errors import UnknownNameError

SAILOR_ZONES = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b"]


@pytest.mark.parametrize("zone", SAILOR_ZONES)
def test_sailor_zones_match_sailors_on_demand_prices(zone):
    # Sailor's simulator priced these per GPU-hour; cost figures must compare.
    assert gpu_price_usd_per_hr("A100-40", zone, spot=False) == pytest.approx(3.673385)
    assert gpu_price_usd_per_hr("V100-16", zone, spot=False) == pytest.approx(2.859998)
    assert {o.gpu for o in catalog_offers(zones=[zone])} >= {"A100-40", "V100-16"}


def test_every_catalog_gpu_has_a_positive_price_spot_cheaper_or_equal():
    for gpu in gpu_names():
        for zone in ["us-central1-a", "us-east-1a", "local"]:
            spot = gpu_price_usd_per_hr(gpu, zone)
            on_demand = gpu_price_usd_per_hr(gpu, zone, spot=False)
            assert 0 < spot <= on_demand, (gpu, zone)
    assert gpu_price_usd_per_hr("GH-96", "us-central1-a", spot=False) == 11.06


def test_offers_are_consistent_with_the_gpu_catalog():
    names = set(gpu_names())
    for row in instance_types():
        assert row.gpu in names and row.gpus_per_node >= 1 and row.zones
        assert 0 < row.spot_usd_per_hr < row.on_demand_usd_per_hr
        if row.cloud == "gcp":
            assert row.accelerator_type
    clouds = {o.cloud for o in catalog_offers(gpus=["H200"])}
    assert clouds == {"aws", "gcp"}
    assert not set(reference_gpu_prices()) & {o.gpu for o in catalog_offers()}


def test_filters_and_unknown_names():
    offers = catalog_offers(gpus=["a100"], clouds=["gcp"], zones=["us-central1-a"])
    assert offers and all(o.gpu == "A100-40" and o.cloud == "gcp" for o in offers)
    assert sorted(o.gpus_per_node for o in offers) == [1, 2, 4, 8, 16]
    with pytest.raises(UnknownNameError):
        catalog_offers(clouds=["azure"])
    with pytest.raises(UnknownNameError):
        gpu_price_usd_per_hr("B300", "us-central1-a")
    with pytest.raises(UnknownNameError):
        get_instance_type("aws", "x9.huge")
    assert get_instance_type("gcp", "n1-standard-8-v100x1").machine_type == "n1-standard-8"


def test_a_gpus_own_offers_are_the_catalogs_in_its_order():
    # Pricing a GPU builds its offers alone (_offers_of); they must be the catalog's, in order,
    # so the smallest node and cheapest offer picked are the same.
    for gpu in gpu_names():
        assert _offers_of(gpu) == tuple(o for o in catalog_offers() if o.gpu == gpu)
