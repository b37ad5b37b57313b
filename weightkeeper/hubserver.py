"""A small Hugging Face Hub-protocol HTTP server for tests, offline demos and benchmarks.

It speaks enough of the Hub API for the real ``huggingface_hub`` client (``model_info``/``repo_info``,
``list_repo_tree``, ``hf_hub_download``, ``snapshot_download``) and the ``hf download`` CLI, pointed at it with
``endpoint=`` or ``HF_ENDPOINT=http://127.0.0.1:PORT``. Plain HTTP is spoken (https given a TLS context), with no
Xet headers. By default ``/resolve/`` serves bodies itself; with ``cdn_redirects`` set, LFS files redirect (302) to a "CDN" URL on another
origin of this server (``localhost`` for ``127.0.0.1``), as the Hub does, which needs no token.

File contents are stored content-addressed under ``root/blobs/<sha256>`` and streamed from disk with
``socket.sendfile`` in 1 MiB chunks, so gigabyte-sized repos cost no memory. Every request is recorded, and faults
(throttling, injected error statuses, dropped connections, a whole-Hub outage, bodies that drip, redirects to any
URL, and model metadata answering anything) can be injected per repo.

With ``set_rate_limit`` a bucket (``api``: ``/api/...``; ``resolvers``: ``/resolve/``) answers 429 past a number of
requests per fixed window (starting with the window's first request), with the headers the Hub sends: ``Retry-After``,
``RateLimit: "api";r=0;t=<seconds to reset>`` and ``RateLimit-Policy: "fixed window";"api";q=<limit>;w=<window>``.

Access control follows the Hub: a gated repo's metadata and tree are public but its files answer 401 (no token) or
403 (wrong token) with ``X-Error-Code: GatedRepo``; a private repo answers 401/404 ``RepoNotFound`` everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK_SIZE = 1 << 20
LISTING = "?listing"  # as `filename` of `redirect` or `drip`: the rule applies to a revision's model info instead
LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".h5", ".msgpack", ".gguf", ".onnx")
LFS_MIN_SIZE = 10 * 1024 * 1024
LFS_POINTER_SIZE = 134

# A repo id is "name" or "owner/name"; regex backtracking sorts out which segments belong to it.
_API_RE = re.compile(
    r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<rest>/.*)?)?$"
)
_RESOLVE_RE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN_RE = re.compile(r"^/cdn/(?P<repo>[^/]+(?:/[^/]+)?)/(?P<rev>[0-9a-f]{40})/(?P<path>.+)$")  # a "signed" CDN URL
_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")


@dataclass(frozen=True)
class _File:
    """One file of a commit, with its hashes computed once at add time."""

    path: str
    blob: Path
    size: int
    blob_id: str  # git blob sha1
    sha256: str

    @property
    def is_lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES) or self.size > LFS_MIN_SIZE

    @property
    def etag(self) -> str:
        return self.sha256 if self.is_lfs else self.blob_id


@dataclass(frozen=True)
class _Commit:
    sha: str
    files: dict[str, _File]
    date: str


@dataclass
class _Repo:
    repo_id: str
    created: str
    gated: bool = False
    private: bool = False
    token: str | None = None
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, _Commit] = field(default_factory=dict)

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header grants access (any token does when the repo has none set)."""
        if authorization is None:
            return False
        return self.token is None or authorization == f"Bearer {self.token}"


@dataclass
class RequestRecord:
    """One request, appended on arrival and updated while it is answered (status, body bytes sent so far).

    ``repo_id`` is set for API and ``/resolve/`` requests, ``filename`` only for ``/resolve/``. Token values are never
    kept, only whether an ``Authorization`` header was present.
    """

    method: str
    path: str
    range: str | None
    status: int
    bytes_sent: int
    authorization_present: bool
    repo_id: str | None = None
    filename: str | None = None
    client_port: int = 0  # which connection the request came on


@dataclass
class _Rule:
    """A fault-injection rule, used up by the next ``remaining`` matching requests."""

    remaining: int
    repo_id: str | None
    needle: str | None  # path substring (fail_next) or exact filename (drop_after); None matches all
    status: int = 0
    retry_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # fail_next: more headers to answer with
    nbytes: int = 0
    every: float = 0.0  # drip: seconds between two sends of nbytes
    url: str = ""  # redirect: where to
    method: str | None = None  # redirect: only requests of this method (None: any)


class _HubError(Exception):
    """An error response: ``X-Error-Code``/``X-Error-Message`` headers plus a ``{"error": ...}`` body."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, dict(headers or {})
        if code is not None:
            self.headers["X-Error-Code"] = code
        self.headers["X-Error-Message"] = message.encode("ascii", "backslashreplace").decode()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def _model_json(repo: _Repo, commit: _Commit, blobs: bool) -> dict:
    siblings = []
    for f in sorted(commit.files.values(), key=lambda f: f.path):
        sibling: dict = {"rfilename": f.path}
        if blobs:
            sibling.update(size=f.size, blobId=f.blob_id)
            if f.is_lfs:
                sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": LFS_POINTER_SIZE}
        siblings.append(sibling)
    return {
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
        "sha": commit.sha,
        "lastModified": commit.date,
        "createdAt": repo.created,
        "private": repo.private,
        "gated": "auto" if repo.gated else False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "usedStorage": sum(f.size for f in commit.files.values()),
    }


def _tree_json(commit: _Commit, path: str, recursive: bool) -> list[dict]:
    """Entries under directory ``path`` ("" = root): direct children, or all descendants if ``recursive``."""
    dirs: dict[str, list[_File]] = {}
    for f in commit.files.values():
        parts = f.path.split("/")
        for i in range(1, len(parts)):
            dirs.setdefault("/".join(parts[:i]), []).append(f)
    if path and path not in dirs:
        raise _HubError(404, f"{path} does not exist on this revision", "EntryNotFound")
    prefix = f"{path}/" if path else ""

    def wanted(p: str) -> bool:
        return p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])

    entries = []
    for d, members in dirs.items():
        if wanted(d):
            manifest = "".join(f"{m.path}\0{m.blob_id}\n" for m in sorted(members, key=lambda m: m.path))
            oid = hashlib.sha1(manifest.encode()).hexdigest()
            entries.append({"type": "directory", "oid": oid, "size": 0, "path": d})
    for f in commit.files.values():
        if wanted(f.path):
            entry: dict = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
            if f.is_lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": LFS_POINTER_SIZE}
            entries.append(entry)
    return sorted(entries, key=lambda e: e["path"])


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Inclusive byte range of a ``Range`` header; None if absent/unsupported; 416 if unsatisfiable."""
    m = _RANGE_RE.fullmatch(header.strip()) if header else None
    if m is None or m.groups() == ("", ""):
        return None
    first, last = m.groups()
    if first:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    else:
        start, end = max(0, size - int(last)), size - 1
    if start >= size or end < start:
        raise _HubError(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 120  # reap idle keep-alive connections
    server: _HTTPServer
    record: RequestRecord

    def log_message(self, format, *args):  # noqa: A002 - silence the default per-request stderr logging
        pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def send_response(self, code, message=None):
        self.record.status = code  # set before any byte reaches the client
        super().send_response(code, message)

    def do_GET(self):
        hub = self.server.hub
        url = urlsplit(self.path)
        api, resolve = _API_RE.match(url.path), _RESOLVE_RE.match(url.path) or _CDN_RE.match(url.path)
        self.record = RequestRecord(
            self.command, self.path, self.headers.get("Range"), 0, 0, "Authorization" in self.headers,
            repo_id=(api or resolve)["repo"] if api or resolve else None,
            filename=unquote(resolve["path"]) if resolve else None, client_port=self.client_address[1],
        )
        with hub._lock:
            hub.requests.append(self.record)
        try:
            hub._check_faults(self.record.repo_id, self.path)
            if api or resolve and resolve.re is _RESOLVE_RE:
                hub._check_rate("api" if api else "resolvers")
            if api:
                self._api(api, parse_qs(url.query))
            elif resolve and resolve.re is _CDN_RE:
                self._cdn(resolve["rev"], self.record.filename)
            elif resolve:
                self._resolve(unquote(resolve["rev"]), self.record.filename)
            else:
                raise _HubError(404, "Not Found")
        except _HubError as e:
            self._send_json(e.status, {"error": e.message}, e.headers)

    do_HEAD = do_GET

    def _send_json(self, status: int, obj, headers: dict[str, str] | None = None, drip: _Rule | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command == "HEAD":
            return
        if drip is None:
            self.wfile.write(body)
            return
        with contextlib.suppress(OSError):  # the client gave up
            for i in range(0, len(body), drip.nbytes):
                self.wfile.write(body[i:i + drip.nbytes])
                self.wfile.flush()
                time.sleep(drip.every)

    def _api(self, m: re.Match, query: dict[str, list[str]]) -> None:
        revision = unquote(m["rev"]) if m["rev"] else "main"
        repo, commit = self.server.hub._lookup(self.record.repo_id, revision, self.headers.get("Authorization"))
        if m["kind"] == "tree":
            recursive = query.get("recursive", ["false"])[-1].lower() in ("true", "1")
            path = unquote(m["rest"] or "").strip("/")
            self._send_json(200, _tree_json(commit, path, recursive))
        elif m["rest"] is None:
            hub = self.server.hub
            if location := hub._redirect_for(repo.repo_id, LISTING, self.command):
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            blobs = query.get("blobs", ["false"])[-1].lower() in ("true", "1")
            with hub._lock:
                drip = hub._take(hub._drips, repo.repo_id, lambda name: name == LISTING)
            self._send_json(200, hub._tampered_json(repo.repo_id, _model_json(repo, commit, blobs)), drip=drip)
        else:
            raise _HubError(404, "Not Found")

    def _resolve(self, revision: str, filename: str) -> None:
        hub = self.server.hub
        if location := hub._redirect_for(self.record.repo_id, filename, self.command):
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        _, commit = hub._lookup(self.record.repo_id, revision, self.headers.get("Authorization"), files=True)
        headers = {"X-Repo-Commit": commit.sha}
        f = commit.files.get(filename)
        if f is None:
            raise _HubError(404, "Entry not found", "EntryNotFound", headers)
        headers.update({"ETag": f'"{f.etag}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"})
        if f.is_lfs:
            headers.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)})
            if hub.cdn_redirects:  # as the Hub does: LFS bodies come from another origin
                host, port = self.server.server_address[:2]
                cdn_host = "localhost" if host == "127.0.0.1" else "127.0.0.1"
                location = f"http://{cdn_host}:{port}/cdn/{self.record.repo_id}/{commit.sha}/{quote(filename)}"
                self.send_response(302)
                for name, value in {**headers, "Location": location, "Content-Length": "0"}.items():
                    self.send_header(name, value)
                self.end_headers()
                return
        self._send_file(f, headers)

    def _cdn(self, sha: str, filename: str) -> None:
        """A CDN URL the Hub redirected to: no authorization needed (the URL is the credential)."""
        with self.server.hub._lock:
            repo = self.server.hub._repos.get(self.record.repo_id)
            f = repo.commits[sha].files.get(filename) if repo and sha in repo.commits else None
        if f is None:
            raise _HubError(404, "Not Found")
        self._send_file(f, {"ETag": f'"{f.sha256 or f.etag}"', "Accept-Ranges": "bytes",
                            "Content-Type": "application/octet-stream"})

    def _send_file(self, f: _File, headers: dict[str, str]) -> None:
        byte_range = None
        if self.command == "GET":
            try:
                byte_range = _parse_range(self.headers.get("Range"), f.size)
            except _HubError as e:
                raise _HubError(e.status, e.message, headers={**headers, **e.headers}) from None
        start, end = byte_range or (0, f.size - 1)
        self.send_response(206 if byte_range else 200)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(end - start + 1))
        if byte_range:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if self.command == "GET" and end >= start:
            self._stream(f, start, end - start + 1)

    def _stream(self, f: _File, start: int, length: int) -> None:
        """Send ``length`` bytes of ``f`` from ``start``, honouring throttling and connection drops.

        Accounting happens *before* each chunk is sent (bytes counted, and the body leaves the in-flight set before
        its last chunk), so a client that has just received a whole file always sees up-to-date stats.
        """
        hub, rec = self.server.hub, self.record
        limit, drip = hub._begin_body(rec.repo_id, f.path, length)
        in_flight = True
        try:
            with open(f.blob, "rb") as fh:
                while rec.bytes_sent < limit and not hub._stopping:
                    bps = hub._throttle_for(rec.repo_id)
                    count = min(limit - rec.bytes_sent, CHUNK_SIZE if not bps else max(1, min(CHUNK_SIZE, bps // 10)))
                    if drip:
                        count = min(count, drip.nbytes)
                        time.sleep(drip.every)
                    elif bps:
                        time.sleep(count / bps)  # pace before sending, so the client sees the limit
                    if in_flight and rec.bytes_sent + count >= limit:
                        hub._end_body(rec.repo_id)
                        in_flight = False
                    sent_before = rec.bytes_sent
                    rec.bytes_sent += count
                    rec.bytes_sent = sent_before + self.connection.sendfile(fh, start + sent_before, count)
                    if rec.bytes_sent == sent_before:
                        break
        finally:
            if in_flight:
                hub._end_body(rec.repo_id)
        if rec.bytes_sent < length:
            self.close_connection = True  # the client sees a body shorter than Content-Length


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    hub: HubServer


class HubServer:
    """Hub-protocol server over a local directory. Thread-safe; use as a context manager or start()/stop()."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None):
        """`tls`: a server context to speak https with (the handshake happens in each request's thread)."""
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.hub = self
        if tls:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.url = f"{'https' if tls else 'http'}://{host}:{self._httpd.server_address[1]}"
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._repos: dict[str, _Repo] = {}
        self._hash_cache: dict[tuple, tuple[int, str, str]] = {}
        self.requests: list[RequestRecord] = []
        self.peak_concurrent_repos = 0
        self._inflight: Counter[str | None] = Counter()
        self._throttle: dict[str | None, int] = {}
        self._faults: list[_Rule] = []
        self._drops: list[_Rule] = []
        self._drips: list[_Rule] = []
        self._redirects: list[_Rule] = []
        self._tampering: dict[str, dict[str | None, dict]] = {}
        self._offline = False
        self._rate_limits: dict[str, tuple[int, float]] = {}  # bucket: (requests, per seconds)
        self._rate_windows: dict[str, tuple[float, int]] = {}  # bucket: (window start, requests in it)
        self._throttled: Counter[str] = Counter()  # 429 answers of the rate limit, by bucket
        self.cdn_redirects = False  # True: LFS files redirect to a CDN URL on another origin, as on the Hub

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> HubServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="hubserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True  # lets in-flight (e.g. throttled) bodies end early
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> HubServer:
        return self if self._thread else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- content ----------------------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], *, revision: str = "main", gated: bool = False,
                 private: bool = False, token: str | None = None) -> str:
        """Add a repo (or a new commit to it) and point ``revision`` at it; returns the 40-hex commit sha.

        The sha is deterministic: sha1 of ``repo_id`` plus the sorted (path, sha256) manifest. Path values are
        hard-linked (or copied) into ``root``, bytes are written there. The access settings (gated, private,
        token) given by the latest call apply to the whole repo.
        """
        stored = {path: _File(path, *self._store(content)) for path, content in files.items()}
        manifest = "".join(f"{p}\0{stored[p].sha256}\n" for p in sorted(stored))
        sha = hashlib.sha1(f"{repo_id}\n{manifest}".encode()).hexdigest()
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo(repo_id, created=_now()))
            repo.gated, repo.private, repo.token = gated, private, token
            repo.commits.setdefault(sha, _Commit(sha, stored, _now()))
            repo.refs[revision] = sha
        return sha

    def _store(self, content: bytes | Path) -> tuple[Path, int, str, str]:
        """Put ``content`` in the blob store; returns (blob path, size, git blob sha1, sha256)."""
        is_bytes = isinstance(content, (bytes, bytearray, memoryview))
        size, blob_id, sha256 = self._hash_bytes(bytes(content)) if is_bytes else self._hash_file(Path(content))
        dest = self.root / "blobs" / sha256
        if not dest.exists():
            tmp = dest.with_name(f".{sha256}.{threading.get_ident()}.tmp")
            if is_bytes:
                tmp.write_bytes(content)
            else:
                try:
                    os.link(content, tmp)
                except OSError:
                    shutil.copyfile(content, tmp)
            os.replace(tmp, dest)
        return dest, size, blob_id, sha256

    @staticmethod
    def _hash_bytes(data: bytes) -> tuple[int, str, str]:
        return len(data), hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), hashlib.sha256(data).hexdigest()

    def _hash_file(self, src: Path) -> tuple[int, str, str]:
        """(size, git blob sha1, sha256) of a file, hashed in one streaming pass and memoized per file version."""
        st = src.stat()
        key = (str(src.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._hash_cache:
                return self._hash_cache[key]
        git, sha = hashlib.sha1(b"blob %d\0" % st.st_size), hashlib.sha256()
        with open(src, "rb") as fh:
            while chunk := fh.read(8 * CHUNK_SIZE):
                git.update(chunk)
                sha.update(chunk)
        with self._lock:
            self._hash_cache[key] = (st.st_size, git.hexdigest(), sha.hexdigest())
            return self._hash_cache[key]

    def _lookup(self, repo_id: str, revision: str, auth: str | None, *, files: bool = False) -> tuple[_Repo, _Commit]:
        """Resolve repo + revision (branch, tag or sha) for a request, enforcing private/gated access."""
        with self._lock:
            repo = self._repos.get(repo_id)
            commit = repo.commits.get(repo.refs.get(revision, revision)) if repo else None
        if repo is None or (repo.private and not repo.allows(auth)):
            raise _HubError(401 if repo and auth is None else 404, "Repository not found", "RepoNotFound")
        if files and repo.gated and not repo.allows(auth):
            message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            raise _HubError(401 if auth is None else 403, message, "GatedRepo")
        if commit is None:
            raise _HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo, commit

    # -- instrumentation --------------------------------------------------------------------------------------

    def get_count(self, repo_id: str | None = None, filename: str | None = None) -> int:
        """Number of successful ``GET /resolve/`` (body download) requests matching repo and filename."""
        with self._lock:
            return sum(
                1
                for r in self.requests
                if r.method == "GET" and r.filename is not None and r.status in (200, 206)
                and repo_id in (None, r.repo_id) and filename in (None, r.filename)
            )

    def bytes_served(self, repo_id: str | None = None) -> int:
        """Total file-body bytes sent by ``/resolve/`` responses (partial bodies included)."""
        with self._lock:
            return sum(r.bytes_sent for r in self.requests if r.filename is not None and repo_id in (None, r.repo_id))

    def throttled_count(self, bucket: str | None = None) -> int:
        """Number of 429 answers the rate limit sent (to ``bucket``'s requests, or to any)."""
        with self._lock:
            return sum(n for b, n in self._throttled.items() if bucket in (None, b))

    def reset_stats(self) -> None:
        with self._lock:
            self._throttled.clear()
            self.requests.clear()
            self.peak_concurrent_repos = sum(1 for n in self._inflight.values() if n)

    def _begin_body(self, repo_id: str, filename: str, length: int) -> tuple[int, _Rule | None]:
        """Register a body in flight; returns how many bytes to send before a drop_after rule cuts it, and the
        drip rule that paces it (None: none does)."""
        with self._lock:
            self._inflight[repo_id] += 1
            self.peak_concurrent_repos = max(self.peak_concurrent_repos, sum(1 for n in self._inflight.values() if n))
            drop = self._take(self._drops, repo_id, lambda name: name == filename)
            drip = self._take(self._drips, repo_id, lambda name: name == filename)
            return length if drop is None else min(length, drop.nbytes), drip

    def _end_body(self, repo_id: str) -> None:
        with self._lock:
            self._inflight[repo_id] -= 1

    # -- fault injection --------------------------------------------------------------------------------------

    def set_throttle(self, bytes_per_second: int | None, repo_id: str | None = None) -> None:
        """Limit body streaming speed for ``repo_id`` (or globally); None removes the limit."""
        with self._lock:
            if bytes_per_second is None:
                self._throttle.pop(repo_id, None)
            else:
                self._throttle[repo_id] = bytes_per_second

    @contextlib.contextmanager
    def throttled(self, bytes_per_second: int, repo_id: str | None = None) -> Iterator[None]:
        """``set_throttle`` for the duration of a ``with`` block."""
        self.set_throttle(bytes_per_second, repo_id)
        try:
            yield
        finally:
            self.set_throttle(None, repo_id)

    def _throttle_for(self, repo_id: str) -> int | None:
        with self._lock:
            return self._throttle.get(repo_id, self._throttle.get(None))

    def fail_next(self, n: int, status: int, *, retry_after: int | None = None, repo_id: str | None = None,
                  path_contains: str | None = None, headers: dict[str, str] | None = None) -> None:
        """Answer the next ``n`` matching requests (any endpoint) with ``status``, optional ``Retry-After`` and
        ``headers`` (any text, e.g. a garbage ``RateLimit``)."""
        with self._lock:
            self._faults.append(_Rule(n, repo_id, path_contains, status=status, retry_after=retry_after,
                                      headers=dict(headers or {})))

    def clear_faults(self) -> None:
        """Drop the `fail_next` rules not used up yet."""
        with self._lock:
            self._faults.clear()

    def set_rate_limit(self, bucket: str, limit: int | None, window: float = 300.0) -> None:
        """Answer 429 to the requests of ``bucket`` (``api`` or ``resolvers``) past ``limit`` in a fixed window of
        ``window`` seconds, as the Hub does; None removes the limit."""
        with self._lock:
            self._rate_windows.pop(bucket, None)
            if limit is None:
                self._rate_limits.pop(bucket, None)
            else:
                self._rate_limits[bucket] = (limit, window)

    def _check_rate(self, bucket: str) -> None:
        with self._lock:
            if (rule := self._rate_limits.get(bucket)) is None:
                return
            limit, window = rule
            now = time.monotonic()
            start, count = self._rate_windows.get(bucket, (now, 0))
            if now >= start + window:
                start, count = now, 0
            self._rate_windows[bucket] = (start, count + 1)
            if count < limit:
                return
            self._throttled[bucket] += 1
        reset = max(1, math.ceil(start + window - now))
        headers = {"Retry-After": str(reset), "RateLimit": f'"{bucket}";r=0;t={reset}',
                   "RateLimit-Policy": f'"fixed window";"{bucket}";q={limit};w={math.ceil(window)}'}
        raise _HubError(429, f"We had to rate limit you, you hit the quota of {limit} {bucket} requests per "
                             f"{window:g} seconds period.", "RateLimited", headers)

    def drop_after(self, nbytes: int, *, count: int = 1, repo_id: str | None = None,
                   filename: str | None = None) -> None:
        """Make the next ``count`` matching body GETs close the connection after ``nbytes`` of body."""
        with self._lock:
            self._drops.append(_Rule(count, repo_id, filename, nbytes=nbytes))

    def drip(self, nbytes: int, every: float, *, count: int = 1, repo_id: str | None = None,
             filename: str | None = None) -> None:
        """Make the next ``count`` matching body GETs (``filename=LISTING``: model infos) send ``nbytes`` every
        ``every`` seconds (a stalling server)."""
        with self._lock:
            self._drips.append(_Rule(count, repo_id, filename, nbytes=nbytes, every=every))

    def redirect(self, url: str, *, count: int = 1, repo_id: str | None = None, filename: str | None = None,
                 method: str | None = None) -> None:
        """Answer the next ``count`` matching ``/resolve/`` requests (of ``method``, or any; ``filename=LISTING``: model
        infos) with a 302 to ``url``."""
        with self._lock:
            self._redirects.append(_Rule(count, repo_id, filename, url=url, method=method))

    def tamper(self, repo_id: str, path: str | None = None, **fields) -> None:
        """Make the repo's model info answer ``fields`` (any JSON) over what it holds: at the top level (e.g.
        ``sha="not-hex"``), or in the entry of file ``path`` (e.g. ``blobId=""``, ``size=-1``)."""
        with self._lock:
            self._tampering.setdefault(repo_id, {}).setdefault(path, {}).update(fields)

    def _tampered_json(self, repo_id: str, info: dict) -> dict:
        with self._lock:
            for path, fields in self._tampering.get(repo_id, {}).items():
                for entry in [info] if path is None else [s for s in info["siblings"] if s["rfilename"] == path]:
                    entry.update(fields)
        return info

    def _redirect_for(self, repo_id: str, filename: str, method: str) -> str | None:
        with self._lock:
            rules = [r for r in self._redirects if r.method in (None, method)]
            rule = self._take(rules, repo_id, lambda name: name == filename)
        return rule.url if rule else None

    def set_offline(self, offline: bool) -> None:
        """While offline, every request answers 503."""
        with self._lock:
            self._offline = offline

    def _check_faults(self, repo_id: str | None, path: str) -> None:
        with self._lock:
            if self._offline:
                raise _HubError(503, "Service Unavailable")
            fault = self._take(self._faults, repo_id, lambda needle: needle in path)
        if fault is not None:
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            raise _HubError(fault.status, HTTPStatus(fault.status).phrase, headers={**headers, **fault.headers})

    @staticmethod
    def _take(rules: list[_Rule], repo_id: str | None, matches) -> _Rule | None:
        """Use up one application of the first live rule matching the request; the caller holds the lock."""
        for rule in (r for r in rules if r.remaining > 0 and r.repo_id in (None, repo_id)):
            if rule.needle is None or matches(rule.needle):
                rule.remaining -= 1
                return rule
        return None


def main(argv: list[str] | None = None) -> None:
    """Serve directories as Hub repos (a commit each, on ``main`` or the revision given) until Ctrl-C; prints the
    URL on stdout."""
    parser = argparse.ArgumentParser(prog="python -m weightkeeper.hubserver", description=main.__doc__)
    parser.add_argument("--root", type=Path, required=True, help="directory where served blobs are stored")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--repo", action="append", default=[], metavar="OWNER/NAME[@REVISION]=SRC_DIR",
                        help="a commit of the directory, at REVISION (default main); repeat a repo for more commits")
    args = parser.parse_args(argv)
    server = HubServer(args.root, host=args.host, port=args.port)
    for spec in args.repo:
        repo, sep, src = spec.partition("=")
        repo_id, _, revision = repo.partition("@")
        if not sep or not Path(src).is_dir():
            parser.error(f"--repo expects OWNER/NAME[@REVISION]=SRC_DIR with an existing directory, got {spec!r}")
        src_dir = Path(src)
        files = {
            p.relative_to(src_dir).as_posix(): p
            for p in sorted(src_dir.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(src_dir).parts
        }
        commit = server.add_repo(repo_id, files, revision=revision or "main")
        print(f"{repo_id}@{revision or 'main'}: {len(files)} files @ {commit}", file=sys.stderr)
    with server.start():
        print(server.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
