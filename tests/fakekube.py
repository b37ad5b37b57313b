"""The Kubernetes API faked at the HTTP boundary: no API server can run on these machines, so the real
`kubernetes` client talks, through a kubeconfig, to this loopback server. It answers pod lists by
label selector from `pods`, accepts Jobs (kept in `jobs`, as a worker submitted them) and records each
request; nothing else of the API exists. `misbehave` makes it answer pod lists as a broken or hostile server
would: "drip" (a byte at a time, forever), "drip-headers" (its headers a byte at a time, forever), "flood" (bytes
without end), "not-a-list" (JSON, but no pods)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def do_GET(self):
        fake = self.server.fake
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        selector = parse_qs(url.query).get("labelSelector", [""])[0]
        with fake.lock:
            fake.requests.append((url.path, selector))
            if len(parts) != 5 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
                self._reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
                return
            misbehave = fake.misbehave
            labels = dict(term.partition("=")[::2] for term in selector.split(","))  # pods are kept by the first's
            value = labels[selector.partition("=")[0]]
            items = [{"metadata": {"name": pod, "namespace": parts[3], "labels": labels},
                      "status": {"phase": phase}} for pod, phase in fake.pods.get((parts[3], value), [])]
        if misbehave == "drip-headers":
            self._endless_headers()
            return
        if misbehave in ("drip", "flood"):
            self._endless(misbehave == "drip")
            return
        if misbehave == "not-a-list":
            self._reply(200, {"kind": "PodList", "apiVersion": "v1", "items": {"evil": {}}})
            return
        self._reply(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                          "items": items})

    def do_POST(self):
        fake = self.server.fake
        parts = urlsplit(self.path).path.strip("/").split("/")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with fake.lock:
            fake.requests.append((self.path, ""))
            if len(parts) != 6 or parts[:4] != ["apis", "batch", "v1", "namespaces"] or parts[5] != "jobs":
                self._reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
                return
            fake.jobs.append((parts[4], body))
            name = body["metadata"].get("name") or f"{body['metadata'].get('generateName', 'job-')}{len(fake.jobs)}"
        self._reply(201, {**body, "metadata": {**body["metadata"], "name": name, "namespace": parts[4],
                                               "uid": f"uid-{len(fake.jobs)}"}})

    def _endless(self, drip: bool) -> None:
        """A 200 pod list whose body never ends: a byte every 0.1 s, or 64 KiB as fast as it is read."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            self.wfile.write(b'{"kind": "PodList", "items": [')
            while not self.server.fake.stopped.is_set():
                self.wfile.write(b" " if drip else b" " * 65536)
                self.wfile.flush()
                time.sleep(0.1 if drip else 0)
        except OSError:
            pass

    def _endless_headers(self) -> None:
        """A 200 whose headers never end: a byte every 0.1 s, each read of them answered in time."""
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            while not self.server.fake.stopped.is_set():
                self.wfile.write(b"a")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeKubernetes


class FakeKubernetes:
    """`pods[(namespace, the value of a selector's first label: a flow run id or a model)] = [(pod name, phase), ...]`;
    `requests` lists (path, labelSelector); `jobs` lists the (namespace in the URL, Job body) created."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pods: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.requests: list[tuple[str, str]] = []
        self.jobs: list[tuple[str, dict]] = []
        self.misbehave: str | None = None
        self.stopped = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({  # JSON is YAML
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def stop(self) -> None:
        self.stopped.set()
        self._server.shutdown()
        self._server.server_close()
