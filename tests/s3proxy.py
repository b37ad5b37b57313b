"""A pass-through HTTP proxy in front of the test S3 server (moto in server mode) that injects faults.

The S3 server is real; the proxy only forwards requests unchanged, counts them per key, and on
demand refuses deletes (403 AccessDenied, as a bucket policy would), refuses uploads after N
(to interrupt a staging run part-way), takes an upload's bytes slowly or not at all (a bucket that drips),
or rewrites object listings (a hostile server's answers).
"""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


def _s3_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
            "</Error>").encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def _body(self) -> bytes | None:
        drip = self.server.proxy.dripping
        if drip is not None and self.command == "PUT" and int(self.headers.get("Content-Length") or 0):
            return self._dripped(*drip)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return data
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _dripped(self, step: int, every: float) -> bytes | None:
        """The body read `step` bytes every `every` seconds (none while `step` is 0) until the proxy is reset; None
        when it stopped short (the client went away, or the proxy was reset: its request is dropped)."""
        proxy, left, data = self.server.proxy, int(self.headers["Content-Length"]), bytearray()
        released = proxy.released
        with proxy.lock:
            proxy.drips += 1
        while left:
            if released.wait(every) or not step:
                released.wait()
                self.close_connection = True
                return None
            chunk = self.rfile.read1(min(step, left))
            if not chunk:
                self.close_connection = True
                return None
            data += chunk
            left -= len(chunk)
            with proxy.lock:
                proxy.dripped += len(chunk)
        return bytes(data)

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes, head: bool = False) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in HOP_BY_HOP and (head or k.lower() != "content-length"):
                self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.end_headers()

    def _forward(self) -> None:
        proxy = self.server.proxy
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        body = self._body()
        if body is None:
            return
        key = unquote(url.path)
        upload = self.command == "PUT" and (body or "partNumber" in query) and "x-amz-copy-source" not in self.headers
        delete = self.command == "DELETE" or (self.command == "POST" and "delete" in query)
        with proxy.lock:
            proxy.requests[(self.command, key)] += 1
            refuse = (delete and proxy.refuse_deletes) or (upload and proxy.uploads_left is not None
                                                          and proxy.uploads_left <= 0)
            if upload and proxy.uploads_left is not None:
                proxy.uploads_left -= 1
            if upload and not refuse:
                proxy.uploads[key] += 1
        if refuse:
            self._reply(403, [("Content-Type", "application/xml")], _s3_error("AccessDenied", "Access Denied"))
            return
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"expect"}}
            headers["Content-Length"] = str(len(body))
            path = self.path
            if self.command == "GET" and "list-type" in query and proxy.rewrite_listing:  # its own tokens: the
                path = url.path + "?" + "&".join(  # server is asked for the first page each time
                    f"{k}={quote(v, safe='')}" for k, vs in query.items() if k != "continuation-token" for v in vs)
            conn.request(self.command, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            if self.command == "GET" and "list-type" in query and proxy.rewrite_listing and response.status == 200:
                data = proxy.rewrite_listing(data, query)
            if self.command == "GET" and "uploads" in query and proxy.rewrite_uploads and response.status == 200:
                data = proxy.rewrite_uploads(data)
            self._reply(response.status, response.getheaders(), data, head=self.command == "HEAD")
        finally:
            conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: S3Proxy


class S3Proxy:
    """`refuse_deletes`: answer every delete with AccessDenied. `allow_uploads(n)`: accept n more
    uploads (PUT object or part), then refuse them; `allow_uploads(None)` lifts the limit. `drip_uploads(step,
    every)`: read the body of each upload (a PUT of an object or a part) `step` bytes every `every` seconds, none
    at all while `step` is 0, until `reset()` (`drips` counts those bodies, `dripped` their bytes). `rewrite_listing`:
    a function that rewrites each ListObjectsV2 answer (its XML body and the request's query); `rewrite_uploads`:
    one that rewrites each ListMultipartUploads answer."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.lock = threading.Lock()
        self.refuse_deletes = False
        self.uploads_left: int | None = None
        self.dripping: tuple[int, float] | None = None
        self.drips, self.dripped = 0, 0  # upload bodies read dripping, and their bytes read
        self.released = threading.Event()  # set when the proxy is reset: a dripping read ends, its request dropped
        self.requests: Counter = Counter()  # (method, /bucket/key) -> count
        self.uploads: Counter = Counter()  # /bucket/key -> accepted uploads (objects or parts)
        self.rewrite_listing = None  # (ListObjectsV2 answer, query) -> the answer sent instead
        self.rewrite_uploads = None  # ListMultipartUploads answer -> the answer sent instead
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> S3Proxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()

    def allow_uploads(self, n: int | None) -> None:
        with self.lock:
            self.uploads_left = n

    def drip_uploads(self, step: int, every: float = 0.1) -> None:
        with self.lock:
            self.dripping = (step, every)

    def reset(self) -> None:
        with self.lock:
            self.dripping, self.drips, self.dripped = None, 0, 0
            self.released.set()
            self.released = threading.Event()
            self.refuse_deletes, self.uploads_left, self.rewrite_listing, self.rewrite_uploads = False, None, None, None
            self.requests.clear()
            self.uploads.clear()

    def count(self, method: str, prefix: str = "/") -> int:
        with self.lock:
            return sum(n for (m, key), n in self.requests.items() if m == method and key.startswith(prefix))
