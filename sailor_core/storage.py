"""Bytes behind a URL: a local directory, ``file://``, ``s3://bucket/prefix`` or ``gs://bucket/prefix``.

Every scheme goes through obstore (Rust's ``object_store``): signing, retries with backoff,
multipart uploads of large objects and the clouds' credential chains are the library's,
none of them ours.  A local directory is obstore's ``LocalStore`` over the file system, so
local runs take the same code path as the clouds.

Configuration comes from the standard environment, read by obstore itself, plus:

- ``s3://``: keys from ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
  or, with none set, the instance's role (IMDSv2, ECS, web identity).  The region is
  ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (else us-east-1); ``AWS_ENDPOINT_URL_S3`` or
  ``AWS_ENDPOINT_URL`` names another endpoint (moto in the tests, MinIO), plain http only
  when that endpoint says ``http://``.  Named profiles, SSO and ~/.aws are not read.
- ``gs://``: obstore's ``GCSStore`` (GCS's XML API) with Google's standard credentials:
  ``GOOGLE_APPLICATION_CREDENTIALS`` (a service-account key file), else the user's
  ``gcloud auth application-default login``, else the VM's service account from the metadata
  server.  ``GOOGLE_BASE_URL`` names another endpoint (the tests' local fake), plain http
  only when it says ``http://``; such an endpoint takes ``GOOGLE_SERVICE_ACCOUNT`` pointing
  at a key file with ``"disable_oauth": true``.  Why GCSStore rather than GCS's S3-compatible
  endpoint: a VM's own service account works with no key to hand out (HMAC keys would be
  one more secret on every instance).

Every write is atomic: a reader sees the old object or the whole new one, never a part
(one PUT, or a multipart upload that appears whole when completed; locally obstore writes
aside and renames).  A missing object raises ``FileNotFoundError``; an endpoint, credential,
permission or bucket problem raises ``StorageError`` with one line naming the URL.  obstore is
not fork-safe: a process forked (without exec) after this one used storage gets a
``StorageError`` instead of a hang; start such processes with spawn or forkserver.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import urllib.parse
from pathlib import Path

import obstore
from obstore.exceptions import BaseError as _ObstoreError
from obstore.store import GCSStore, LocalStore, S3Store

from sailor_core.errors import InputError, SailorError

_DELETE_BATCH = 1000  # S3's DeleteObjects limit
# where the libraries ask for an instance's credentials when the environment has none
_METADATA_HOSTS = ("169.254.169.254", "metadata.google.internal")
_runtime_pid: int | None = None  # the process whose obstore (tokio) runtime this module started


class StorageError(SailorError):
    """Storage that cannot be reached or refuses: endpoint, credentials, permissions, bucket."""


class Storage:
    """Keys are '/'-separated paths relative to the URL this storage was opened at."""

    def __init__(self, url: str, store: LocalStore | S3Store | GCSStore, prefix: str, *,
                 local_root: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self._store = store
        self._prefix = prefix.strip("/")
        self._local_root = local_root

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def _path(self, key: str) -> str:
        key = key.strip("/")
        return f"{self._prefix}/{key}" if self._prefix and key else (self._prefix or key)

    def _call(self, verb: str, key: str, fn):
        _refuse_a_forked_child(self.url)
        try:
            return fn()
        except FileNotFoundError:
            if verb == "write":  # a 404 on a PUT means the bucket, not the key, is missing
                where = "bucket" if self._local_root is None else "directory"
                raise StorageError(f"{self.url}: cannot write {key!r}: no such {where}") from None
            raise FileNotFoundError(errno.ENOENT, "no such object", f"{self.url}/{key}") from None
        except (_ObstoreError, OSError) as exc:
            raise StorageError(f"{self.url}: cannot {verb} {key!r}: {_reason(exc)}") from None

    def put(self, key: str, data: bytes) -> None:
        self._call("write", key, lambda: obstore.put(self._store, self._path(key), data))

    def put_atomic(self, key: str, data: bytes) -> None:
        # Every put is atomic (see the module's docstring); the name says that the caller relies on it.
        self.put(key, data)

    def get(self, key: str) -> bytes:
        return self._call("read", key, lambda: bytes(obstore.get(self._store, self._path(key)).bytes()))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object, like a file's read: short at its end, empty past it."""
        if not 0 <= start <= end:
            raise InputError(f"{self.url}/{key}: bad byte range [{start}, {end})")
        if start == end:
            return b""
        try:
            return self._call("read", key, lambda: bytes(
                obstore.get_range(self._store, self._path(key), start=start, end=end)))
        except StorageError:
            # the stores refuse a range that starts at or past the end; a file read returns nothing
            if start >= self.size(key):
                return b""
            raise

    def size(self, key: str) -> int:
        return int(self._call("read", key, lambda: obstore.head(self._store, self._path(key))["size"]))

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except FileNotFoundError:
            return False

    def list_dirs(self) -> list[str]:
        """The names of the "directories" right under the root (common prefixes of its keys)."""
        found = self._call("list", "", lambda: obstore.list_with_delimiter(self._store, self._prefix or None))
        cut = len(self._prefix) + 1 if self._prefix else 0
        return sorted(p[cut:].strip("/") for p in found["common_prefixes"])

    def list_files(self, name: str = "") -> list[str]:
        """The names of the objects right under ``name/`` (the root by default), not in its "directories"."""
        under = self._path(name) or None
        found = self._call("list", name, lambda: obstore.list_with_delimiter(self._store, under))
        return sorted(meta["path"].rsplit("/", 1)[-1] for meta in found["objects"])

    def delete_dir(self, name: str) -> None:
        """Delete every object under ``name/``; a missing directory is no error."""
        under = self._path(name) + "/"
        paths = self._call("list", name, lambda: [meta["path"] for page in obstore.list(self._store, under)
                                                  for meta in page])
        for i in range(0, len(paths), _DELETE_BATCH):
            self._call("delete", name, lambda batch=paths[i:i + _DELETE_BATCH]: self._delete(batch))
        if self._local_root is not None:
            # a file system keeps the emptied directories, and they would still be listed
            shutil.rmtree(self._local_root / name, ignore_errors=True)

    def delete(self, key: str) -> None:
        """Delete one object; a missing one is no error."""
        self._call("delete", key, lambda: self._delete([self._path(key)]))

    def _delete(self, paths: list[str]) -> None:
        try:
            obstore.delete(self._store, paths)
        except FileNotFoundError:  # some stores refuse a batch holding an object already gone
            for path in paths:
                try:
                    obstore.delete(self._store, path)
                except FileNotFoundError:
                    pass


def open_storage(url: str) -> Storage:
    """A plain path, ``file:///dir``, ``s3://bucket/prefix`` or ``gs://bucket/prefix``."""
    url = str(url)
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("", "file"):
        root = Path(os.path.abspath(urllib.parse.unquote(parsed.path) if parsed.scheme else url))
        # rooted at "/" with the directory as a key prefix: opening a directory that does not
        # exist yet creates nothing (reads find nothing; the first write creates it)
        return Storage(url, _local_store(), str(root), local_root=root)
    if parsed.scheme in ("s3", "gs"):
        if not parsed.netloc:
            raise InputError(f"storage URL {url!r} names no bucket")
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_"))))
        try:
            store = (_s3_store if parsed.scheme == "s3" else _gcs_store)(parsed.netloc, env)
        except (_ObstoreError, ValueError) as exc:
            raise StorageError(f"{url}: {_reason(exc)}") from None
        return Storage(url, store, parsed.path)
    raise InputError(f"storage URL {url!r}: only local paths, file://, s3:// and gs:// are supported")


@functools.cache
def _local_store() -> LocalStore:
    return LocalStore()


# One store per bucket and environment: a store keeps its connections and the credentials it
# fetched (an instance role's, a VM's token) across calls, which come often (the flow polls).
@functools.lru_cache(maxsize=32)
def _s3_store(bucket: str, env: tuple[tuple[str, str], ...]) -> S3Store:
    vars_ = dict(env)
    region = vars_.get("AWS_REGION") or vars_.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = vars_.get("AWS_ENDPOINT_URL_S3") or vars_.get("AWS_ENDPOINT_URL")
    kwargs = {"endpoint": endpoint.rstrip("/")} if endpoint else {}
    return S3Store(bucket, region=region, client_options=_client_options(endpoint), **kwargs)


@functools.lru_cache(maxsize=32)
def _gcs_store(bucket: str, env: tuple[tuple[str, str], ...]) -> GCSStore:
    base_url = dict(env).get("GOOGLE_BASE_URL")
    kwargs = {"base_url": base_url.rstrip("/")} if base_url else {}
    return GCSStore(bucket, client_options=_client_options(base_url), **kwargs)


def _refuse_a_forked_child(url: str) -> None:
    # obstore's runtime threads do not survive fork(): a forked child's first call would hang forever
    global _runtime_pid
    if _runtime_pid is None:
        _runtime_pid = os.getpid()
    elif _runtime_pid != os.getpid():
        raise StorageError(f"{url}: storage was used before this process was forked, and obstore cannot "
                           "run in a forked child; start it with spawn or forkserver, or exec a program")


def _reason(exc: Exception) -> str:
    """The library's message on one line: its first line, without the server's XML body."""
    line = (str(exc).splitlines() or [type(exc).__name__])[0].split(": <?xml")[0].strip()[:300]
    if any(host in line for host in _METADATA_HOSTS):
        line += " (no credentials in the environment, and no instance or VM role answered)"
    return line


def _client_options(endpoint: str | None) -> dict:
    return {"allow_http": True} if endpoint and endpoint.startswith("http://") else {}
