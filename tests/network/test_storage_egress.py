"""A checkpoint bucket's place and what its bytes cost to and from the ranks' zones."""

from __future__ import annotations

import pytest

from sailor_core.errors import InputError
from sailor_core.network.model import DEFAULT_EGRESS_USD_PER_GB, default_network
from sailor_core.network.storage_egress import bucket_place, is_bucket_pair, pair_usd_per_byte, parse_bucket

GB = 1e9


def test_a_bucket_in_the_ranks_region_costs_nothing_from_any_of_its_zones():
    place = bucket_place("s3://b/ckpt", "us-east-1")
    assert place.name == "bucket:aws:us-east-1"
    for zone in ("us-east-1a", "us-east-1b"):
        assert not place.crosses(zone) and place.usd_per_byte(zone) == 0.0


def test_another_region_continent_or_cloud_costs_its_class_price_either_way():
    net = default_network()
    west = bucket_place("s3://b", "us-west-2")
    assert west.usd_per_byte("us-east-1a") * GB == pytest.approx(DEFAULT_EGRESS_USD_PER_GB["cross_region"])
    assert bucket_place("s3://b", "eu-west-1").usd_per_byte("us-east-1a") * GB == pytest.approx(
        DEFAULT_EGRESS_USD_PER_GB["cross_continent"])
    assert west.usd_per_byte("us-central1-a") * GB == pytest.approx(DEFAULT_EGRESS_USD_PER_GB["cross_cloud"])
    # a ledger pair prices its bucket side by region and its zone pairs as the network model does
    assert pair_usd_per_byte(net, "us-east-1a", west.name) == pair_usd_per_byte(net, west.name, "us-east-1a") \
        == west.usd_per_byte("us-east-1a")
    assert pair_usd_per_byte(net, "us-central1-a", "us-central1-b") == net.egress_usd_per_byte(
        "us-central1-a", "us-central1-b")
    assert is_bucket_pair("us-east-1a", west.name) and not is_bucket_pair("us-central1-a", "us-central1-b")
    assert parse_bucket(west.name) == west and parse_bucket("us-east-1a") is None


def test_a_region_not_known_is_priced_as_the_farthest_and_a_local_folder_never():
    gcs = bucket_place("gs://b/ckpt")
    assert gcs.name == "bucket:gcp:?" and parse_bucket(gcs.name) == gcs
    assert gcs.usd_per_byte("us-central1-a") * GB == pytest.approx(DEFAULT_EGRESS_USD_PER_GB["cross_continent"])
    assert gcs.usd_per_byte("us-east-1a") * GB == pytest.approx(DEFAULT_EGRESS_USD_PER_GB["cross_cloud"])
    for url in ("/tmp/ckpt", "file:///tmp/ckpt"):
        assert not bucket_place(url).metered and not bucket_place(url).crosses("us-east-1a")
    assert not bucket_place("s3://b", "us-west-2").crosses("local")  # this machine: billed by no cloud
    assert not bucket_place("s3://sailor-jobs/j", "local").metered  # the embedded cloud's jobs bucket


def test_bad_places_are_one_line_errors():
    with pytest.raises(InputError, match="--checkpoint-region expected a cloud's region name"):
        bucket_place("s3://b", "US West")
    with pytest.raises(InputError, match="no cloud of the registry keeps buckets behind az://"):
        bucket_place("az://b")
    with pytest.raises(InputError, match="no rank moves such bytes"):
        pair_usd_per_byte(default_network(), "bucket:aws:us-east-1", "bucket:gcp:?")
