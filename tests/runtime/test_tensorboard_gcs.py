"""`tensorboard --logdir gs://...` on a job's curves: TensorBoard without TensorFlow reads gs://
through fsspec, i.e. gcsfs (`sailor[gcs]`), which speaks GCS's JSON API. The embedded cloud's GCS
front speaks the XML API only, so the bucket here is `gcp-storage-emulator`'s (a JSON-API GCS on
disk), reached as gcsfs reaches any emulator: ``STORAGE_EMULATOR_HOST``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailor_core.runtime.trackers import ATTEMPTS_RUN, Trackers, write_attempt_events
from tests.runtime.test_trackers import read_tensorboard

BUCKET = "sailor-jobs"


@pytest.fixture
def gcs_emulator(tmp_path, monkeypatch):
    """A JSON-API GCS on a free loopback port, its objects under ``tmp_path``; gcsfs told where it is
    and to send no credentials (what `sailor status` tells a user of an emulator)."""
    import importlib

    import gcsfs.core
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", 0, in_memory=False, default_bucket=BUCKET,
                           data_dir=str(tmp_path / "gcs"))
    server.start()
    try:
        host, port = server._api._httpd.server_address
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{host}:{port}")
        # gcsfs's token="anon" (no metadata-server probe: up to ~30 s of google.auth's retries).  A
        # user's FSSPEC_GCS_TOKEN=anon says so, but fsspec reads it once, when it is first imported,
        # which in a test process is long before this fixture: its configuration is set instead
        monkeypatch.setitem(importlib.import_module("fsspec.config").conf, "gs", {"token": "anon"})
        # gcsfs's default file system first asks GCS's gRPC control API for the bucket's layout, which
        # an emulator lacks (a minute's retries per bucket); GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
        # chooses the plain JSON-API one, but only when gcsfs is first imported: here, fsspec's registry
        monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "gs", gcsfs.core.GCSFileSystem)
        # fsspec caches file systems by their arguments, not by the environment they were made under
        gcsfs.core.GCSFileSystem.clear_instance_cache()
        yield gcsfs.core.GCSFileSystem(token="anon")
    finally:
        gcsfs.core.GCSFileSystem.clear_instance_cache()
        server.stop()


def _job_curves(folder: Path) -> None:
    """A job's event files as its workers and its flow write them: attempt 1 logs steps 1..4 (its
    last checkpoint at 2, so 3 and 4 are redone), attempt 2 resumes from step 2 and logs 3..5."""
    for attempt, start, stop in ((1, 0, 4), (2, 2, 5)):
        trackers = Trackers(job_id="job-gcs-test", tensorboard_url=str(folder), attempt=attempt, config={})
        trackers.started(start, plan_text="2 x T4", state_from="scratch" if start == 0 else "checkpoint")
        for step in range(start + 1, stop + 1):
            trackers.log(step, {"train/loss": 10.0 * attempt + step, "train/lr": 1e-3})
            if step == 2:
                trackers.flush()
        if attempt == 1:
            trackers.preempted(stop)
        trackers.close()
        write_attempt_events(str(folder), step=start, attempt=attempt, text=f"attempt {attempt}: 2 x T4",
                             scalars={"number": attempt, "preemptions": attempt - 1})


def _upload(gcs, local: Path, url: str) -> dict[str, bytes]:
    """Each event file under ``local`` to ``url`` as a resumable upload (its size as the chunk size:
    one chunk).  Not gcsfs's default for small files, a multipart upload: the emulator parses that
    with Python's email parser, which takes a trailing ``\r`` of the content for the line end before
    the closing boundary and drops it, and an event file ends in its last record's CRC, whose last
    byte is 0x0D one time in 256; TensorBoard then reads the file as truncated, silently, without
    that record (a test run uploads five files: ~2 % of runs lost a curve's point)."""
    files = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("events.out.tfevents.*")}
    for name, data in files.items():
        gcs.pipe_file(f"{url}/{name}", data, chunksize=len(data))
    return files


def test_tensorboard_reads_a_jobs_curves_from_gcs_through_gcsfs(gcs_emulator, tmp_path):
    local = tmp_path / "tensorboard"
    _job_curves(local)
    url = f"gs://{BUCKET}/job-gcs-test/tensorboard"
    files = _upload(gcs_emulator, local, url.removeprefix("gs://"))
    # the bucket holds the workers' and the flow's files, byte for byte
    assert {p.removeprefix(f"{url.removeprefix('gs://')}/"): gcs_emulator.cat_file(p)
            for p in gcs_emulator.find(url)} == files

    acc, flow = read_tensorboard(url), read_tensorboard(f"{url}/{ATTEMPTS_RUN}")
    # one step axis: attempt 1's steps past its checkpoint give way to attempt 2's
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == \
        [(1, 11.0), (2, 12.0), (3, 23.0), (4, 24.0), (5, 25.0)]
    assert [(e.step, e.value) for e in acc.Scalars("events/attempt")] == [(0, 1.0), (2, 2.0)]
    assert [e.value for e in flow.Scalars("attempt/number")] == [1, 2]
    assert [e.value for e in flow.Scalars("attempt/preemptions")] == [0, 1]
