"""sailor_core.storage on every scheme: a local directory, s3:// (moto's server) and gs:// (tests/gcs_fake.py).

The same assertions run on each, so the three behave alike: whole writes, range reads with a
file's semantics, sizes, directory listing, directory deletion, FileNotFoundError for a missing
object and a one-line StorageError for an endpoint that refuses.
"""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from sailor_core.errors import InputError
from sailor_core.storage import StorageError, open_storage

BUCKET = "bkt-test"


@pytest.fixture(params=["local", "s3", "gs"])
def url(request, tmp_path):
    """A storage URL below a prefix, with a sibling prefix holding objects that must stay out of sight."""
    bucket = f"bkt-{uuid.uuid4().hex[:12]}"  # moto's buckets outlive its server (one state per process)
    if request.param == "local":
        root = str(tmp_path / "store")
    elif request.param == "s3":
        import boto3

        endpoint = request.getfixturevalue("moto_s3")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        root = f"s3://{bucket}"
    else:
        request.getfixturevalue("gcs_fake").create_bucket(bucket)
        root = f"gs://{bucket}"
    open_storage(f"{root}/jobs/other").put("step_00000009/x", b"not mine")
    return f"{root}/jobs/j1"


def test_round_trip_and_overwrite(url):
    store = open_storage(url)
    store.put("a/b.bin", b"hello")
    assert store.get("a/b.bin") == b"hello"
    store.put("a/b.bin", b"bye")
    assert store.get("a/b.bin") == b"bye"
    store.put("empty", b"")
    assert store.get("empty") == b"" and store.size("empty") == 0
    assert open_storage(url + "/").get("a/b.bin") == b"bye"  # a trailing slash names the same place


def test_put_atomic_readers_see_the_old_or_the_new_object_whole(url):
    store = open_storage(url)
    old, new = b"o" * 200_000, b"n" * 300_000
    store.put_atomic("MANIFEST.json", old)
    seen, done = set(), threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(store.get("MANIFEST.json"))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(5):
            store.put_atomic("MANIFEST.json", new)
            store.put_atomic("MANIFEST.json", old)
    finally:
        done.set()
        reader.join()
    assert seen <= {old, new}


def test_get_range_reads_like_a_file(url):
    store = open_storage(url)
    data = bytes(range(100))
    store.put("tokens.bin", data)
    assert store.size("tokens.bin") == 100
    assert store.get_range("tokens.bin", 0, 10) == data[:10]  # start
    assert store.get_range("tokens.bin", 40, 57) == data[40:57]  # middle
    assert store.get_range("tokens.bin", 90, 100) == data[90:]  # end
    assert store.get_range("tokens.bin", 95, 120) == data[95:]  # past the end: short
    assert store.get_range("tokens.bin", 100, 110) == b""  # at the end: nothing
    assert store.get_range("tokens.bin", 150, 160) == b""  # beyond it: nothing
    assert store.get_range("tokens.bin", 7, 7) == b""
    with pytest.raises(InputError, match="bad byte range"):
        store.get_range("tokens.bin", 10, 5)
    with pytest.raises(InputError, match="bad byte range"):
        store.get_range("tokens.bin", -1, 5)


def test_list_dirs_names_the_directories_right_under_the_prefix(url):
    store = open_storage(url)
    assert store.list_dirs() == []
    names = [f"step_{i:08d}" for i in range(7)]  # more than the gs fake's page of 3
    for name in reversed(names):
        store.put(f"{name}/layer_0000.pt", b"x")
        store.put(f"{name}/deeper/more.bin", b"y")
    store.put("state.json", b"{}")  # an object right under the prefix is no directory
    assert store.list_dirs() == names
    assert open_storage(url + "/step_00000003").list_dirs() == ["deeper"]


def test_delete_dir_removes_everything_under_it_and_nothing_else(url):
    store = open_storage(url)
    for name in ("step_1", "step_10", "step_2"):
        store.put(f"{name}/a", b"1")
        store.put(f"{name}/nested/b", b"2")
    store.delete_dir("step_1")
    assert store.list_dirs() == ["step_10", "step_2"]  # step_10 shares the name's first characters
    assert not store.exists("step_1/a") and not store.exists("step_1/nested/b")
    assert store.get("step_10/nested/b") == b"2"
    store.delete_dir("never_there")
    assert open_storage(url.replace("/j1", "/other")).get("step_00000009/x") == b"not mine"


def test_a_missing_object_raises_file_not_found(url):
    store = open_storage(url)
    assert not store.exists("nope.json")
    for read in (lambda: store.get("nope.json"), lambda: store.size("nope.json"),
                 lambda: store.get_range("nope.json", 0, 4)):
        with pytest.raises(FileNotFoundError, match="nope.json") as info:
            read()
        assert url in str(info.value)
    assert open_storage(url + "/not/yet/there").list_dirs() == []


def test_a_local_directory_is_created_by_the_first_write_only(tmp_path):
    root = tmp_path / "a" / "b"
    store = open_storage(f"file://{root}")
    assert store.list_dirs() == [] and not store.exists("x") and not root.exists()
    store.put("x/y", b"1")
    assert (root / "x" / "y").read_bytes() == b"1"
    assert open_storage(str(tmp_path / "a" / ".." / "a" / "b")).get("x/y") == b"1"
    store.delete_dir("x")
    assert not (root / "x").exists()  # the emptied directory goes too


def test_urls_that_name_no_storage_are_refused():
    for bad, why in (("s3:///prefix", "names no bucket"), ("gs://", "names no bucket"),
                     ("http://host/x", "only local paths, file://, s3:// and gs://")):
        with pytest.raises(InputError, match=why):
            open_storage(bad)


def test_a_refusing_endpoint_is_one_line_naming_the_url(gcs_fake, monkeypatch):
    gcs_fake.create_bucket(BUCKET)
    gcs_fake.refuse = True
    # the S3-only variable wins over the general one: an in-process `sailor train` of another test may have left it
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gcs_fake.url)  # an S3 endpoint that answers 403 as well
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    for url in (f"gs://{BUCKET}/ckpt", f"s3://{BUCKET}/ckpt"):
        store = open_storage(url)
        for call in (lambda: store.get("a"), lambda: store.put("a", b"1"), store.list_dirs,
                     lambda: store.exists("a")):
            with pytest.raises(StorageError) as info:
                call()
            message = str(info.value)
            assert message.startswith(f"{url}: cannot ") and "\n" not in message
            assert "403" in message or "privileges" in message


def test_a_missing_bucket_is_a_storage_error_on_write(gcs_fake, moto_s3):
    for url in ("gs://no-such-bucket/p", "s3://no-such-bucket/p"):
        with pytest.raises(StorageError, match="no such bucket"):
            open_storage(url).put("a", b"1")
        with pytest.raises(StorageError, match=url):
            open_storage(url).list_dirs()


@pytest.mark.slow
def test_an_unreachable_endpoint_is_a_storage_error_after_the_retries(monkeypatch):
    """obstore retries (10 times, with backoff) before giving up: seconds, so not in the default run."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)  # another test's embedded cloud may have set it
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with pytest.raises(StorageError, match="s3://bkt-test/p: cannot read 'a'"):
        open_storage("s3://bkt-test/p").get("a")


def test_a_forked_child_gets_an_error_not_a_hang(tmp_path):
    """obstore's runtime does not survive fork(); the child is told so instead of waiting forever."""
    store = open_storage(str(tmp_path))
    store.put("a", b"1")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child touches nothing but the storage call and the pipe
        try:
            store.get("a")
            os.write(write, b"no error")
        except StorageError as exc:
            os.write(write, str(exc).encode())
        finally:
            os._exit(0)
    os.close(write)
    message = os.read(read, 1000).decode()
    os.waitpid(pid, 0)
    assert "forked" in message and "spawn" in message
    assert store.get("a") == b"1"  # the parent goes on
