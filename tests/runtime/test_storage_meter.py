"""A rank's checkpoint bytes to and from a bucket outside its region, counted and carried in the
step's egress slots beside the engine's own transfers (real storage: a folder through obstore)."""

from __future__ import annotations

from sailor_core.network.storage_egress import bucket_place
from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime import storage_meter
from sailor_core.runtime.egress_meter import EgressSlots
from sailor_core.storage import open_storage

A, B = "us-east-1a", "us-east-1b"
FAR = bucket_place("s3://b", "us-west-2")


def _plan(*zones: str):
    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2, "stages": [
        {"layers": [0, 4], "replicas": [{"gpu": "cpu", "tp": 1, "zone": z} for z in zones]}]})


def test_writes_and_reads_are_counted_by_direction_and_taken_once(tmp_path):
    storage_meter.take_moved_bytes()
    store = storage_meter.MeteredStorage(open_storage(str(tmp_path)), zone=A, bucket=FAR.name)
    store.put("s/a.pt", b"x" * 100)
    store.put_atomic("s/manifest.json", b"y" * 10)
    assert store.get("s/a.pt") == b"x" * 100 and store.get_range("s/a.pt", 0, 30) == b"x" * 30
    assert store.list_dirs() == ["s"] and store.size("s/a.pt") == 100  # what moves no object's bytes
    assert storage_meter.take_moved_bytes() == {(A, FAR.name): 110.0, (FAR.name, A): 130.0}
    assert storage_meter.take_moved_bytes() == {}


def test_only_a_bucket_outside_the_ranks_region_is_metered(tmp_path):
    assert isinstance(storage_meter.open_checkpoints(str(tmp_path), "", zone=A), type(open_storage(str(tmp_path))))


def test_the_bucket_takes_slots_beside_the_zones_when_some_rank_is_outside_its_region():
    one_zone = _plan(A)
    assert EgressSlots.of(one_zone, 3, 0).num_slots == 0
    assert EgressSlots.of(one_zone, 3, 0, bucket=bucket_place("s3://b", "us-east-1")).num_slots == 0
    slots = EgressSlots.of(_plan(A, B), 3, 1, bucket=FAR)
    assert slots.zones == (A, B, FAR.name) and slots.num_slots == 9
    status = [0.0] * (3 + slots.num_slots)
    slots.fill(status, {A: 5.0}, {(B, FAR.name): 100.0, (FAR.name, B): 40.0})
    assert slots.pairs(status) == [[B, A, 5.0], [B, FAR.name, 100.0], [FAR.name, B, 40.0]]
    assert slots.own_pairs({}, {(B, FAR.name): 7.0}) == [[B, FAR.name, 7.0]]
