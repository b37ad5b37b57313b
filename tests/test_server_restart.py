"""Download slots are Prefect leases: renewed while held, also across a Prefect server restart, and freed once
their holder is dead (filesystem lease storage: a restart leaks none); a slot request the server refuses for
a moment is retried by Prefect's client, and a renewal or release it keeps refusing fails no download."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from conftest import start_session_server, stop_session_server
from served import wait_until

HOLD = """
import sys, threading, time
from types import SimpleNamespace
from weightkeeper.runtime import download_slot
with download_slot(SimpleNamespace(downloads_limited=True), lambda *_: None):
    print("holding", flush=True)
    if sys.argv[1] == "until-renewal-given-up":  # Prefect's renewal thread has ended, its failure handled
        while any(t.name.startswith("concurrency-lease-renewal-") for t in threading.enumerate()):
            time.sleep(0.1)
    sys.stdin.readline()
print("released", flush=True)
"""
WITNESS = "slot-lease-witness"


def slots(name: str | None = None) -> int:
    from prefect.client.orchestration import get_client

    from weightkeeper.runtime import slots_in_use

    if name is None:
        return slots_in_use()[0]
    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name).active_slots


def hold(env: dict[str, str], until: str = "released") -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, until], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


def release(holder: subprocess.Popen) -> None:
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    assert holder.wait(60) == 0


def test_a_slot_is_renewed_across_a_server_restart_and_a_dead_holders_slot_is_freed(wk, monkeypatch, download_limit):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    from weightkeeper.runtime import SLOT_LEASE_SECONDS, download_slot, ensure_download_limit

    ensure_download_limit(wk.settings)
    with download_slot(wk.settings, lambda *_: None):  # ours, held throughout
        holder = hold(dict(os.environ))  # another process's
        try:
            assert slots() == 2
            stop_session_server(crash=True)  # the server dies, then the other holder with it (kill -9)
            holder.kill()
            holder.wait()
            monkeypatch.setenv("PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS", "1")
            start_session_server()
        finally:
            holder.kill()
        assert slots() == 2  # both leases survived the restart on disk
        # A lease as long as a slot's, taken now and never renewed: once the server has freed it, it has freed
        # every lease that ran out before, the dead holder's, and ours unless it was renewed.
        with get_client(sync_client=True) as client:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=WITNESS, limit=1))
            except ObjectAlreadyExists:
                pass
            client.increment_concurrency_slots_with_lease([WITNESS], 1, "concurrency", SLOT_LEASE_SECONDS)
        wait_until(lambda: slots(WITNESS) == 0, timeout=SLOT_LEASE_SECONDS + 30, every=1,
                   what="the server to free an expired lease")
        assert slots() == 1  # the dead holder's lease expired; ours was renewed
    assert slots() == 0


class _Refusing(BaseHTTPRequestHandler):
    """Forwards to the Prefect server, but refuses slot requests as `faults` says: `busy` (503 without
    forwarding, as a Prefect server whose SQLite was locked), `dropped` (the connection closed unanswered),
    `refused` (forwarded, then answered 500); `endpoint: (fault, times, requests expected)`, times None: every
    time."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    faults: dict[str, tuple[str, int | None, int]] = {}
    seen: Counter = Counter()

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        endpoint = self.path.rsplit("/", 1)[-1]
        self.seen[endpoint] += 1
        fault, times, _ = self.faults.get(endpoint, (None, 0, 0))
        if fault and (times is None or self.seen[endpoint] <= times):
            if fault == "dropped":
                self.close_connection = True
                return
            if fault == "busy":
                self._answer(503, {"Content-Type": "application/json"}, b'{"exception_message": "Service Unavailable"}')
                return
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        conn.request(self.command, self.path, body, {k: v for k, v in self.headers.items() if k.lower() != "host"})
        response = conn.getresponse()
        status, data = response.status, response.read()
        headers = {k: v for k, v in response.getheaders() if k.lower() not in ("transfer-encoding", "connection")}
        conn.close()
        if fault == "refused" and (times is None or self.seen[endpoint] <= times):
            status, data = 500, b'{"exception_message": "Internal Server Error"}'
        self._answer(status, headers, data)

    def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward


FAULTS = {
    # Prefect's client retries a 503 and a dropped connection (weightkeeper relies on it, having no retry of its own)
    "busy-then-dropped": {"increment-with-lease": ("busy", 1, 2), "decrement-with-lease": ("dropped", 1, 2)},
    # Prefect gives up renewing after 3 tries and lets the download go on; a release refused is let go
    "refused-for-good": {"renew": ("refused", None, 3), "decrement-with-lease": ("refused", None, 1)},
}


@pytest.mark.parametrize("faults", FAULTS.values(), ids=FAULTS.keys())
def test_slot_requests_the_server_refuses_are_retried_or_outlived(wk, faults, download_limit):
    from prefect.settings import PREFECT_API_URL

    from weightkeeper.runtime import ensure_download_limit

    ensure_download_limit(wk.settings)
    api = PREFECT_API_URL.value()
    _Refusing.upstream, _Refusing.faults, _Refusing.seen = api, faults, Counter()
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:  # in a process of its own: Prefect's slot service keeps the API URL of its process's first request
        env = dict(os.environ, PREFECT_API_URL=api.replace(urlsplit(api).netloc, f"127.0.0.1:{proxy.server_port}"))
        holder = hold(env, "until-renewal-given-up" if "renew" in faults else "released")
        try:
            assert slots() == 1
            release(holder)  # exit status 0: the download was not failed
        finally:
            holder.kill()
    finally:
        proxy.shutdown()
    assert slots() == 0
    assert {endpoint: _Refusing.seen[endpoint] for endpoint in faults} == {e: n for e, (_, _, n) in faults.items()}
