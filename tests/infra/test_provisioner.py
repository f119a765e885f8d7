"""The provisioner across two clouds and three zones, on the embedded cloud."""

from __future__ import annotations

import pytest

from infra.provisioner import GpuNeed, ProvisionError, Provisioner
from infra.records import RUNNING

# T4 is sold by both clouds; these three zones have three different spot prices.
ZONES = ["us-central1-a", "europe-west4-a", "us-east-1a"]


def cheapest_first(offers):
    """Zones by the price of one T4 node there, cheapest first (independent of the provisioner)."""
    best = {}
    for o in offers:
        if o.gpu == "T4" and o.gpus_per_node == 1:
            best[o.zone] = min(best.get(o.zone, float("inf")), o.spot_usd_per_hr)
    return sorted(best, key=best.get)


def test_cheapest_zone_out_of_capacity_lands_in_the_next_cheapest(cloud, providers):
    prov = Provisioner(providers)
    offers = prov.offers(["T4"], zones=ZONES)
    assert {o.cloud for o in offers} == {"aws", "gcp"}
    order = cheapest_first(offers)
    assert sorted(order) == sorted(ZONES) and len(order) == 3
    cloud.set_capacity("T4", order[0], 0)

    result = prov.provision([GpuNeed(gpu="T4", zone=None, num_gpus=2)], job_id="prov-1", offers=offers)
    assert result.complete
    (alloc,) = result.allocations
    # two T4s there: as two 1-GPU nodes, or one 2-GPU node where that is cheaper (right-sizing)
    assert alloc.offer.zone == order[1] and sum(i.gpus_per_node for i in alloc.instances) == 2
    assert all(i.state == RUNNING and i.zone == order[1] for i in alloc.instances)
    assert [(h.zone, h.outcome) for h in result.history] == [(order[0], "capacity"), (order[1], "ok")]
    assert result.history[0].message in ("InsufficientInstanceCapacity", "ZONE_RESOURCE_POOL_EXHAUSTED")
    assert result.availability() == {("T4", order[1]): 2}
    cheapest = min(o.spot_usd_per_hr * (2 // o.gpus_per_node) for o in offers
                   if o.zone == order[1] and o.gpu == "T4" and o.gpus_per_node in (1, 2))
    assert result.usd_per_hr == pytest.approx(cheapest)

    # Both cheaper zones full (the second holds just our 2): it crosses to the remaining zone.
    cloud.set_capacity("T4", order[1], 2)
    second = prov.provision([GpuNeed(gpu="T4", zone=None, num_gpus=1)], job_id="prov-1", attempt=1, offers=offers)
    assert second.allocations[0].offer.zone == order[2]
    assert [h.outcome for h in second.history] == ["capacity", "capacity", "ok"]

    assert len(prov.teardown("prov-1")) == len(alloc.instances) + 1
    assert prov.leftovers("prov-1") == []


def test_requested_zone_first_then_substitutes_and_all_or_nothing_teardown(cloud, providers):
    prov = Provisioner(providers)
    offers = prov.offers(["T4", "A100-40"], zones=ZONES + ["us-central1-b"])
    # The requested (dearest) zone is tried first, even though others are cheaper.
    order = cheapest_first(offers)
    result = prov.provision([GpuNeed(gpu="T4", zone=order[-1], num_gpus=1)], job_id="prov-2", offers=offers)
    assert [a.offer.zone for a in result.allocations] == [order[-1]]

    # A second need nobody can meet: the first need's instances are given back too.
    for zone in ("us-central1-a", "us-central1-b", "europe-west4-a", "us-east-1a"):
        cloud.set_capacity("A100-40", zone, 0)
    with pytest.raises(ProvisionError) as info:
        prov.provision([GpuNeed(gpu="T4", zone="us-central1-a", num_gpus=1),
                        GpuNeed(gpu="A100-40", zone="us-central1-a", num_gpus=8, min_gpus_per_node=8)],
                       job_id="prov-2", attempt=1, offers=offers)
    assert "A100-40" in str(info.value)
    assert {h.outcome for h in info.value.history} >= {"ok", "capacity"}
    live = prov.leftovers("prov-2")
    assert [i.labels["sailor-attempt"] for i in live] == ["0"]  # attempt 1 left nothing

    # Without all-or-nothing, what was got is kept and the rest reported missing.
    partial = prov.provision([GpuNeed(gpu="T4", zone="us-central1-a", num_gpus=1),
                              GpuNeed(gpu="A100-40", zone="us-central1-a", num_gpus=8)],
                             job_id="prov-2", attempt=2, offers=offers, all_or_nothing=False)
    assert not partial.complete and [n.gpu for n in partial.missing] == ["A100-40"]
    assert partial.availability() == {("T4", "us-central1-a"): 1}
    prov.teardown("prov-2")
    assert prov.leftovers("prov-2") == []


def test_substitution_off_keeps_the_zone(cloud, providers):
    prov = Provisioner(providers)
    offers = prov.offers(["T4"], zones=ZONES)
    cloud.set_capacity("T4", "us-east-1a", 0)
    with pytest.raises(ProvisionError):
        prov.provision([GpuNeed(gpu="T4", zone="us-east-1a", num_gpus=1)], job_id="prov-3",
                       offers=offers, substitute_zones=False)
    assert prov.leftovers("prov-3") == []


def test_quota_skips_the_rest_of_the_region(cloud, providers):
    from infra.local.faults import FaultRates

    prov = Provisioner(providers)
    offers = [o for o in prov.offers(["T4"], zones=["us-central1-a", "us-central1-b"]) if o.gpus_per_node == 1]
    cloud.set_faults(FaultRates(quota=1.0))
    with pytest.raises(ProvisionError) as info:
        prov.provision([GpuNeed(gpu="T4", zone=None, num_gpus=1)], job_id="prov-q", offers=offers)
    assert [h.outcome for h in info.value.history] == ["quota", "skipped"]
    cloud.set_faults(FaultRates())
    assert prov.leftovers("prov-q") == []
