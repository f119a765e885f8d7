"""Byte storage for checkpoints behind a URL: a local directory or S3.

S3 is spoken directly (REST + SigV4 over urllib) because ``sailor_core`` may
not import boto3 and s3fs does not install beside this project's botocore.
Credentials, region and endpoint come from the usual AWS environment
variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``), so the
same URL works against moto's server and real S3.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from sailor_core.errors import InputError


class Storage:
    """Keys are '/'-separated paths relative to the storage root."""

    def put(self, key: str, data: bytes) -> None: ...
    def put_atomic(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list_dirs(self) -> list[str]: ...
    def delete_dir(self, name: str) -> None: ...


class LocalStorage(Storage):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    def put_atomic(self, key: str, data: bytes) -> None:
        # A reader sees either no file or the whole file: write aside, then rename.
        tmp = self._path(key + ".tmp")
        self.put(key + ".tmp", data)
        os.replace(tmp, self._path(key))

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_dirs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def delete_dir(self, name: str) -> None:
        shutil.rmtree(self._path(name), ignore_errors=True)


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        self.endpoint = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                         or f"https://s3.{self.region}.amazonaws.com").rstrip("/")
        self.access_key = os.environ.get("AWS_ACCESS_KEY_ID", "")
        self.secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        self.token = os.environ.get("AWS_SESSION_TOKEN")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _request(self, method: str, key: str = "", query: dict | None = None,
                 data: bytes = b"") -> bytes:
        path = "/" + self.bucket + ("/" + urllib.parse.quote(key, safe="/~") if key else "")
        query = query or {}
        qs = "&".join(f"{urllib.parse.quote(k, safe='~')}={urllib.parse.quote(str(v), safe='~')}"
                      for k, v in sorted(query.items()))
        url = self.endpoint + path + (f"?{qs}" if qs else "")
        host = urllib.parse.urlsplit(self.endpoint).netloc
        now = _dt.datetime.now(_dt.UTC)
        amz_date, date = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(data).hexdigest()
        headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
        if self.token:
            headers["x-amz-security-token"] = self.token
        signed = ";".join(sorted(headers))
        canonical = "\n".join([method, path, qs,
                               "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                               signed, payload_hash])
        scope = f"{date}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        k = ("AWS4" + self.secret_key).encode()
        for part in (date, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={sig}")
        send = {k: v for k, v in headers.items() if k != "host"}
        # urllib would label a body as a form, which servers may then parse away
        send["content-type"] = "application/octet-stream"
        req = urllib.request.Request(url, data=data if method == "PUT" else None, method=method,
                                     headers=send)
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.read()

    def put(self, key: str, data: bytes) -> None:
        self._request("PUT", self._key(key), data=data)

    def put_atomic(self, key: str, data: bytes) -> None:
        self.put(key, data)  # one PUT is atomic on S3: readers see the old state or the whole object

    def get(self, key: str) -> bytes:
        return self._request("GET", self._key(key))

    def exists(self, key: str) -> bool:
        try:
            self._request("HEAD", self._key(key))
            return True
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise

    def _list(self, prefix: str, delimiter: str | None) -> tuple[list[str], list[str]]:
        keys, dirs, token = [], [], None
        ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if delimiter:
                query["delimiter"] = delimiter
            if token:
                query["continuation-token"] = token
            root = ET.fromstring(self._request("GET", query=query))
            keys += [e.text for e in root.iter(f"{ns}Key")]
            dirs += [e.find(f"{ns}Prefix").text for e in root.iter(f"{ns}CommonPrefixes")]
            token_el = root.find(f"{ns}NextContinuationToken")
            if token_el is None or not token_el.text:
                return keys, dirs
            token = token_el.text

    def list_dirs(self) -> list[str]:
        base = self._key("") if self.prefix else ""
        base = base if base.endswith("/") or not base else base + "/"
        _, dirs = self._list(base, "/")
        return sorted(d[len(base):].strip("/") for d in dirs)

    def delete_dir(self, name: str) -> None:
        keys, _ = self._list(self._key(name) + "/", None)
        for key in keys:
            self._request("DELETE", key)


def open_storage(url: str) -> Storage:
    """``file:///dir``, a plain path, or ``s3://bucket/prefix``."""
    parsed = urllib.parse.urlsplit(str(url))
    if parsed.scheme in ("", "file"):
        return LocalStorage(parsed.path if parsed.scheme else url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise InputError(f"checkpoint URL {url!r} names no bucket")
        return S3Storage(parsed.netloc, parsed.path)
    raise InputError(f"checkpoint URL {url!r}: only local paths, file:// and s3:// are supported")
