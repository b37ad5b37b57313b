"""Download slots are leased: renewed while held, and a Prefect server restart leaks none (filesystem lease storage)."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from conftest import start_session_server, stop_session_server
from served import wait_until

HOLD = """
import sys, time
from weightkeeper.config import load_settings
from weightkeeper.runtime import download_slot, ensure_download_limit
settings = load_settings()
ensure_download_limit(settings)
with download_slot(settings, lambda *_: None):
    print("holding", flush=True)
    time.sleep(600)
"""


def slots() -> int:
    from weightkeeper.runtime import slots_in_use

    return slots_in_use()[0]


def test_a_server_restart_while_a_slot_is_held_leaks_no_slot(wk, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", HOLD], env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert slots() == 1
        stop_session_server(crash=True)  # the server dies, then the holder with it (kill -9)
        holder.kill()
        holder.wait()
        monkeypatch.setenv("PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS", "2")
        start_session_server()
    finally:
        holder.kill()
    assert slots() == 1  # the lease survived the restart on disk ...
    wait_until(lambda: slots() == 0, timeout=150, what="the expired lease to free its slot", every=2)  # ... and expires


def test_a_slot_held_longer_than_its_lease_is_renewed_then_freed_on_release(wk):
    from weightkeeper.config import load_settings
    from weightkeeper.runtime import SLOT_LEASE_SECONDS, download_slot, ensure_download_limit

    settings = load_settings()
    ensure_download_limit(settings)
    with download_slot(settings, lambda *_: None):
        time.sleep(SLOT_LEASE_SECONDS + 20)  # past the lease and past a pass of the server's repossessor (15 s)
        assert slots() == 1
    assert slots() == 0


class _LockedOnce(BaseHTTPRequestHandler):
    """Forwards to the Prefect server, but answers the first request of each slot endpoint 503, as a
    Prefect server whose SQLite was locked does (or, with `drop_release`, drops the first release's
    connection unanswered)."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    seen: Counter = Counter()
    drop_release = False

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        endpoint = self.path.rsplit("/", 1)[-1]
        self.seen[endpoint] += 1
        if endpoint == "decrement-with-lease" and self.seen[endpoint] == 1 and self.drop_release:
            self.close_connection = True
            return
        if endpoint in ("increment-with-lease", "decrement-with-lease") and self.seen[endpoint] == 1:
            status, headers, data = 503, {"Content-Type": "application/json"}, b'{"detail": "database is locked"}'
        else:
            up = urlsplit(self.upstream)
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
            conn.request(self.command, self.path, body, {k: v for k, v in self.headers.items() if k.lower() != "host"})
            response = conn.getresponse()
            status, data = response.status, response.read()
            headers = {k: v for k, v in response.getheaders() if k.lower() not in ("transfer-encoding", "connection")}
            conn.close()
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward


@pytest.mark.parametrize("drop_release", [False, True], ids=["503", "dropped-release"])
def test_a_locked_server_database_is_polled_at_once_not_waited_out_in_the_clients_backoff(wk, drop_release):
    from prefect.settings import PREFECT_API_URL

    from weightkeeper.config import load_settings
    from weightkeeper.runtime import download_slot, ensure_download_limit, prefect_settings

    settings = load_settings()
    ensure_download_limit(settings)
    api = PREFECT_API_URL.value()
    _LockedOnce.upstream, _LockedOnce.seen, _LockedOnce.drop_release = api, Counter(), drop_release
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _LockedOnce)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with prefect_settings({PREFECT_API_URL: api.replace(urlsplit(api).netloc, f"127.0.0.1:{proxy.server_port}")}):
            start = time.monotonic()
            with download_slot(settings, lambda *_: None):
                assert slots() == 1
                acquired = time.monotonic() - start
            released = time.monotonic()
        assert slots() == 0
    finally:
        proxy.shutdown()
    assert _LockedOnce.seen["increment-with-lease"] == 2 and _LockedOnce.seen["decrement-with-lease"] == 2
    # Prefect's client would have slept 2 s (with jitter) before even returning the 503
    assert acquired < 1.0 and time.monotonic() - released < 1.0
