"""A third cloud is its facts (clouds.json), its catalog rows (instances.json), its provider module
and one line of infra/providers.py: registering one here, in the test only, makes its zones parse,
its notice, continent, offers and instance identity come from its data, and calls route to its
provider, with no change anywhere else."""

from __future__ import annotations

import copy
import http.server
import threading

import pytest

import infra.providers
from infra import config
from infra.bootstrap import metadata_probes
from infra.errors import CloudConfigError
from infra.instance_boot import BootError, identity
from infra.provider import CloudProvider, Feature
from infra.records import InstanceInfo
from sailor_core import settings
from sailor_core.catalog import clouds as catalog_clouds
from sailor_core.catalog import instances as catalog_instances
from sailor_core.catalog._load import load_data_file
from sailor_core.catalog.clouds import rented_clouds
from sailor_core.catalog.instances import catalog_offers, gpu_price_usd_per_hr, offer_for
from sailor_core.network import model as network_model
from sailor_core.ports import free_port
from sailor_core.replay.costs import ChangeCosts
from sailor_core.zones import parse_zone
from tasks.job_resources import delete_job_resources, job_leftovers

ZONE, OTHER_REGION_ZONE, OTHER_CONTINENT_ZONE = "acme-eu-west1-z1", "acme-eu-north1-z2", "acme-us-east1-z1"

ACME = {
    "name": "acme", "title": "Acme", "rents": True,
    "zone_pattern": r"^acme-(?P<region>[a-z]+-[a-z]+\d)-z\d$", "zone_example": ZONE,
    "continent_of_region_prefix": {"eu": "europe", "us": "america"},
    "network_scope": "global", "preemption_notice_s": 45.0, "storage_scheme": "acme",
    "metadata": {"probe_order": -1, "base_url": "http://127.0.0.1:1", "headers": {"Acme-Flavor": "yes"},
                 "token": None, "instance_id_path": "meta/id", "zone_path": "meta/zone",
                 "notice_path": "meta/notice", "notice_text": None},
}
ACME_ROW = {"cloud": "acme", "instance_type": "acme.t4", "gpu": "T4", "gpus_per_node": 1,
            "on_demand_usd_per_hr": 0.4, "spot_usd_per_hr": 0.1, "zones": [ZONE, OTHER_REGION_ZONE]}


class AcmeProvider(CloudProvider):
    """A provider declaring no optional feature: instances only, from the catalog."""

    cloud = "acme"
    made: list = []

    @classmethod
    def from_settings(cls) -> "AcmeProvider":
        provider = cls()
        cls.made.append(provider)
        return provider

    def list_offers(self, gpu_types=None, regions=None):
        return [offer_for(r, z) for r in catalog_instances.instance_types() if r.cloud == "acme" for z in r.zones]

    def run_instances(self, *, zone, instance_type, count, labels, spot=True, startup_script=None):
        return []

    def query_instances(self, labels, *, include_ended=True) -> list[InstanceInfo]:
        return []

    def terminate_instances(self, labels, *, instance_ids=None) -> list[str]:
        return []


def _caches() -> list:
    return [catalog_clouds._registry, catalog_instances._data, catalog_instances.instance_types,
            catalog_instances._all_offers, catalog_instances._offers_of, catalog_instances.catalog_zones, catalog_instances.rentable_gpus,
            catalog_instances.gpu_price_usd_per_hr, parse_zone, network_model._default_egress_usd_per_gb]


@pytest.fixture
def acme(monkeypatch):
    def with_acme(name: str) -> dict:
        data = copy.deepcopy(load_data_file(name))
        if name == "clouds.json":
            data["clouds"].append(ACME)
        elif name == "instances.json":
            data["instances"].append(ACME_ROW)
        return data

    monkeypatch.setattr(catalog_clouds, "load_data_file", with_acme)
    monkeypatch.setattr(catalog_instances, "load_data_file", with_acme)
    monkeypatch.setitem(infra.providers.PROVIDERS, "acme", f"{__name__}:AcmeProvider")
    for cache in _caches():
        cache.cache_clear()
    yield
    for cache in _caches():
        cache.cache_clear()


def test_the_registries_of_the_core_and_of_infra_name_the_same_clouds():
    assert rented_clouds() == infra.providers.cloud_names()


def test_a_third_clouds_zones_continents_and_notice_come_from_its_facts(acme):
    zone = parse_zone(ZONE)
    assert (zone.cloud, zone.region, zone.continent) == ("acme", "eu-west1", "europe")
    assert parse_zone(OTHER_CONTINENT_ZONE).continent == "america"
    assert parse_zone("us-central1-a").cloud == "gcp"  # the others' zones are theirs still
    assert ChangeCosts().notice_s(ZONE) == 45.0
    egress = network_model.DEFAULT_EGRESS_USD_PER_GB
    assert network_model._default_egress_usd_per_gb(ZONE, OTHER_REGION_ZONE) == egress["cross_region"]
    assert network_model._default_egress_usd_per_gb(ZONE, OTHER_CONTINENT_ZONE) == egress["cross_continent"]
    assert network_model._default_egress_usd_per_gb(ZONE, "europe-west4-a") == egress["cross_cloud"]
    assert "acme" in rented_clouds()
    with pytest.raises(Exception, match="'acme-eu-west1-z1' \\(Acme\\)"):  # the example in the error
        parse_zone("mars-1a")


def test_a_third_clouds_offers_and_prices_come_from_its_catalog_rows(acme):
    offers = catalog_offers(clouds=["acme"])
    assert {(o.instance_type, o.zone) for o in offers} == {("acme.t4", ZONE), ("acme.t4", OTHER_REGION_ZONE)}
    assert gpu_price_usd_per_hr("T4", ZONE) == pytest.approx(0.1)
    with pytest.raises(Exception, match="unknown cloud 'nope'"):
        catalog_offers(clouds=["nope"])


def test_calls_route_to_a_third_clouds_provider_by_its_name(acme, monkeypatch):
    monkeypatch.setenv(settings.CLOUDS_ENV, "acme")
    providers = config.get_providers(["acme"])
    assert list(providers) == ["acme"] and isinstance(providers["acme"], AcmeProvider)
    assert providers["acme"].list_offers()[0].cloud == "acme"
    with pytest.raises(CloudConfigError, match="unknown cloud 'nope'; known: aws, gcp, acme"):
        config.get_providers(["nope"])


def test_a_provider_declaring_no_optional_feature_is_never_asked_for_one(acme):
    provider = AcmeProvider()
    assert not provider.supports(Feature.JOB_NETWORK) and not provider.supports(Feature.JOB_IDENTITY)
    assert job_leftovers("job-x", {"acme": provider}) == []
    delete_job_resources({"acme": provider}, "job-x", reason="test")  # asks nothing, raises nothing
    with pytest.raises(CloudConfigError, match="acme has no job network"):
        provider.open_job_network("job-x")


class _Metadata(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        answers = {"/meta/id": "acme-i-1", "/meta/zone": f"regions/eu/zones/{ZONE}"}
        if self.headers.get("Acme-Flavor") != "yes" or self.path not in answers:
            self.send_error(404)
            return
        body = answers[self.path].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_instance_learns_who_it_is_from_the_metadata_server_its_clouds_facts_describe(acme, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setitem(ACME["metadata"], "base_url", f"http://127.0.0.1:{server.server_port}")
    env_names = {"instance_id": settings.INSTANCE_ID_ENV, "cloud": settings.CLOUD_ENV, "zone": settings.ZONE_ENV}
    for name in env_names.values():
        monkeypatch.delenv(name, raising=False)
    probes = metadata_probes()
    assert [p["cloud"] for p in probes] == ["acme", "gcp", "aws"]  # by each cloud's probe_order
    cfg = {"env_names": env_names, "cloud": "acme", "metadata_probes": probes}
    try:
        assert identity(cfg) == ("acme-i-1", "acme", ZONE)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(BootError, match="no metadata server answers \\(asked acme\\)"):
        identity(cfg)


def test_sailor_doctor_reports_a_cloud_without_checks_as_unchecked():
    from infra.doctor import WARN, check_cloud

    (check,) = check_cloud(AcmeProvider())
    assert (check.cloud, check.status) == ("acme", WARN) and "no doctor checks" in check.detail
