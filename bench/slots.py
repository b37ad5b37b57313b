"""Download slots: Prefect's public `concurrency`, as `weightkeeper.runtime.download_slot` uses it, against the
client weightkeeper had before (its own requests through the Prefect client's private `_send_with_retry`,
polling a 503 at 50 ms; kept below as the reference), in the same run, against the same server.

    .venv/bin/python bench/slots.py [--quick] [--threads 8] [--each 20] [--hold 0.2] [--limits 8,4]
                                    [--server ours|stock|both]

`--threads` threads in one process (as the download tasks of an in-process run) each take a slot `--each`
times (`--quick`: 5), hold it `--hold` s and release it. The two clients run in turns, twice each, after a
warm-up; a row per server and limit compares their best wall times, with the wait for a slot (p50 / p95),
the release (p50), the answers 503 ("database is locked") and the peak of slots held at once (which must
not pass the limit). Each run's figures are printed above the rows, with the ideal (acquisitions x hold /
min(limit, threads)) and the 423s Prefect logged for a slot taken in between by another (lost races).
`ours` is `weightkeeper.prefectserver` (SQLite writes queued), `stock` is Prefect's `prefect server start`
(SQLite writes answered 503 when they meet another); each is measured from a process of its own, since
Prefect's slot service keeps the API URL of its process's first request. Exits 1 if a limit was passed.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from uuid import UUID

from _setup import ENV
from weightkeeper.prefectserver import free_port, healthy, spawn, start_server, stop

LEASE_SECONDS = 60.0
OLD, NEW = "old", "new"


class Count(logging.Filter):
    """Counts the log records that contain `text` (and drops them, or the debug records it was turned on for)."""

    def __init__(self, text: str):
        super().__init__()
        self.text, self.count, self.lock = text, 0, threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.text in record.getMessage():
            with self.lock:
                self.count += 1
            return False
        return record.levelno >= logging.WARNING


# -- the client weightkeeper had before (weightkeeper/runtime.py until issue 16), kept as the baseline --------

def _post(client, path: str, body: dict, seen: Count):
    import httpx

    http = client._client
    response = http._send_with_retry(request=http.build_request("POST", path, json=body),
                                     send=functools.partial(httpx.Client.send, http), send_args=(), send_kwargs={})
    if response.status_code == 503:
        with seen.lock:
            seen.count += 1
    return response


@contextmanager
def old_download_slot(on_wait: Callable[[int, int], None], seen: Count) -> Iterator[None]:
    from prefect.client.orchestration import get_client

    from weightkeeper.config import DOWNLOAD_LIMIT_NAME
    from weightkeeper.runtime import slots_in_use

    with get_client(sync_client=True) as client:
        body = {"names": [DOWNLOAD_LIMIT_NAME], "slots": 1, "mode": "concurrency", "lease_duration": LEASE_SECONDS}
        busy = 0.05
        while True:
            response = _post(client, "/v2/concurrency_limits/increment-with-lease", body, seen)
            if response.status_code == 423:
                busy = 0.05
                on_wait(*slots_in_use())
                time.sleep(min(max(float(response.headers.get("Retry-After") or 1.0), 0.25), 1.0))
            elif response.status_code == 503:
                time.sleep(busy)
                busy = min(2 * busy, 1.0)
            else:
                response.raise_for_status()
                lease_id = UUID(response.json()["lease_id"])
                break
        released = threading.Event()

        def renew() -> None:
            while not released.wait(LEASE_SECONDS / 4):
                with get_client(sync_client=True) as renewer:
                    renewer.renew_concurrency_lease(lease_id, lease_duration=LEASE_SECONDS)

        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        try:
            yield
        finally:
            released.set()
            renewer.join()
            busy = 0.05
            while _post(client, "/v2/concurrency_limits/decrement-with-lease", {"lease_id": str(lease_id)},
                        seen).status_code == 503:
                time.sleep(busy)
                busy = min(2 * busy, 1.0)


# -- the measurement ------------------------------------------------------------------------------------------

def measure(slot: Callable[[Callable[[int, int], None]], object], threads: int, each: int, hold: float) -> dict:
    held, peak, waits, releases, lock = [0], [0], [], [], threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(each):
                start = time.perf_counter()
                with slot(lambda in_use, limit: None):
                    acquired = time.perf_counter()
                    with lock:
                        held[0] += 1
                        peak[0] = max(peak[0], held[0])
                    time.sleep(hold)
                    with lock:
                        held[0] -= 1
                    done = time.perf_counter()
                with lock:
                    waits.append(acquired - start)
                    releases.append(time.perf_counter() - done)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    start = time.perf_counter()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return {"wall": time.perf_counter() - start, "waits": sorted(waits), "releases": sorted(releases),
            "peak": peak[0]}


def child(args: argparse.Namespace) -> int:
    """In a process whose PREFECT_API_URL is the server under test: both clients, in turns."""
    from weightkeeper.runtime import download_slot, ensure_download_limit

    seen = Count("retryable status code 503")  # the Prefect client's retries of 503 answers
    logging.getLogger("prefect.client").setLevel(logging.DEBUG)
    logging.getLogger("prefect.client").addFilter(seen)
    lost = Count("failed to process item")  # Prefect's slot service logs each 423 it hands back (a lost race)
    logging.getLogger("prefect._internal.concurrency").addFilter(lost)
    clients = {
        OLD: lambda settings: lambda on_wait: old_download_slot(on_wait, seen),
        NEW: lambda settings: functools.partial(download_slot, settings),
    }
    server = {"ours": "weightkeeper.prefectserver", "stock": "Prefect's stock server"}[args.server]
    exceeded = False
    for limit in map(int, args.limits.split(",")):
        settings = SimpleNamespace(downloads_limited=True, max_concurrent_downloads=limit)
        ensure_download_limit(settings)
        ideal = args.threads * args.each * args.hold / min(limit, args.threads)
        for make in clients.values():
            measure(make(settings), args.threads, 2, 0.0)  # warm-up: connections, Prefect's slot service
        best: dict[str, dict] = {}
        for _ in range(2):
            for name, make in clients.items():
                seen.count = lost.count = 0
                r = measure(make(settings), args.threads, args.each, args.hold)
                r.update(answers_503=seen.count, lost=lost.count)
                print(f"  {args.server}, limit {limit}, {name}: {summary(r)}, {r['wall'] / args.each:.3f} s per "
                      f"slot and thread (the ideal {ideal:.1f} s in all), {r['lost']} lost races", flush=True)
                exceeded |= r["peak"] > limit
                if name not in best or r["wall"] < best[name]["wall"]:
                    best[name] = r
        new, old = best[NEW], best[OLD]
        print(f"| slots: {args.threads} threads x {args.each}, hold {args.hold} s, limit {limit}, {server}: "
              f"wall time | {summary(new)} (Prefect's `concurrency`) | {summary(old)} (the client before, "
              f"`_send_with_retry`) | {new['wall'] / old['wall']:.2f}x the time |", flush=True)
    return 1 if exceeded else 0


def summary(r: dict) -> str:
    w, rel = r["waits"], r["releases"]
    return (f"{r['wall']:.2f} s, wait p50 / p95 {statistics.median(w):.2f} / {w[int(len(w) * 0.95)]:.2f} s, "
            f"release p50 {statistics.median(rel) * 1e3:.0f} ms, {r['answers_503']} answers 503, peak {r['peak']}")


def serve(kind: str, root: Path) -> tuple[subprocess.Popen, str]:
    home = root / kind
    home.mkdir(parents=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(ENV, PREFECT_HOME=str(home))
    if kind == "ours":
        return start_server(port, home / "server.log", env), f"http://127.0.0.1:{port}/api"
    server = spawn(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], home / "server.log", env)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    while not healthy(url):
        if server.poll() is not None or time.monotonic() > deadline:
            stop(server)
            sys.exit(f"Prefect's stock server did not start; see {home / 'server.log'}")
        time.sleep(0.2)
    return server, url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--each", type=int)
    parser.add_argument("--hold", type=float, default=0.2)
    parser.add_argument("--limits", default="8,4")
    parser.add_argument("--server", choices=["ours", "stock", "both"], default="both")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.each = args.each or (5 if args.quick else 20)
    if args.child:
        sys.exit(child(args))
    failed = False
    with tempfile.TemporaryDirectory(prefix="wk-bench-slots-", dir="/var/tmp") as tmp:
        for kind in ["ours", "stock"] if args.server == "both" else [args.server]:
            server, url = serve(kind, Path(tmp))
            try:
                argv = ["--threads", str(args.threads), "--each", str(args.each), "--hold", str(args.hold),
                        "--limits", args.limits, "--server", kind, "--child"]
                env = dict(os.environ, **ENV, PREFECT_API_URL=url, PREFECT_HOME=str(Path(tmp) / kind))
                failed |= subprocess.run([sys.executable, __file__, *argv], env=env).returncode != 0
            finally:
                stop(server)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
