"""The bytes a rank's checkpoint saves and loads move between its zone and a bucket in another region.

The worker opens the checkpoint storage through ``metered`` when the bucket lies outside the
rank's region (``network/storage_egress.BucketPlace.crosses``): every object written counts as
sent from the rank's zone to the bucket (``bucket:<cloud>:<region>``), every object or range read
as sent from the bucket to the rank's zone.  The writes of a background save
(``runtime/checkpoint_writer.py``) count from its thread, hence the lock.  The worker takes the
counts with the engine's own (``take_moved_bytes``) into the step's status all-reduce
(``runtime/egress_meter.py``), so the flow charges them as it charges the engine's transfers.
"""

from __future__ import annotations

import threading

from sailor_core.network.storage_egress import bucket_place
from sailor_core.storage import Storage, open_storage

_lock = threading.Lock()
_moved_bytes: dict[tuple[str, str], float] = {}  # (src, dst) -> bytes since the last take


def take_moved_bytes() -> dict[tuple[str, str], float]:
    """Bytes moved per (source, destination) since the last call (this rank's), and start over."""
    with _lock:
        out = dict(_moved_bytes)
        _moved_bytes.clear()
    return out


def _count(src: str, dst: str, num_bytes: int) -> None:
    if num_bytes:
        with _lock:
            _moved_bytes[(src, dst)] = _moved_bytes.get((src, dst), 0.0) + num_bytes


class MeteredStorage:
    """A ``Storage`` whose object reads and writes are counted as bytes to and from its bucket."""

    def __init__(self, storage: Storage, *, zone: str, bucket: str) -> None:
        self._storage, self._zone, self._bucket = storage, zone, bucket

    def __getattr__(self, name: str):  # listing, sizes, deletes: no object's bytes move
        return getattr(self._storage, name)

    def __repr__(self) -> str:
        return f"MeteredStorage({self._storage.url!r}, {self._zone} <-> {self._bucket})"

    def put(self, key: str, data: bytes) -> None:
        self._storage.put(key, data)
        _count(self._zone, self._bucket, len(data))

    def put_atomic(self, key: str, data: bytes) -> None:
        self._storage.put_atomic(key, data)
        _count(self._zone, self._bucket, len(data))

    def get(self, key: str) -> bytes:
        data = self._storage.get(key)
        _count(self._bucket, self._zone, len(data))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        data = self._storage.get_range(key, start, end)
        _count(self._bucket, self._zone, len(data))
        return data


def open_checkpoints(url: str, region: str, *, zone: str) -> Storage | MeteredStorage:
    """The checkpoint storage at ``url`` (its bucket in ``region``, '' when not known) of a rank in
    ``zone``: counted when the bucket lies outside the zone's region, else as it is."""
    storage, place = open_storage(url), bucket_place(url, region)
    return MeteredStorage(storage, zone=zone, bucket=place.name) if place.crosses(zone) else storage
