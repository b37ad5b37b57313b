"""The SQLite patch of `weightkeeper.prefectserver` (write transactions begin IMMEDIATE) against Prefect's
stock server (`prefect server start`, DEFERRED), measured in the same run.

    .venv/bin/python bench/prefect_sqlite.py [--quick] [--rounds 2]

Each round starts a fresh server of each kind in turn (stock first, then weightkeeper's; same settings,
a home and SQLite database of its own) and, in a process of its own so that every Prefect client is new:

- burst: 8 clients at once each create 5 flow runs and move each to Running then Completed; over plain
  HTTP without retries, the writes refused (503 "database is locked", or the connection reset); through
  Prefect's client (which sleeps 2 s, 4 s, ... and retries on a 503, as flows do), the wall time;
- lifecycle: tiny models created -> Ready and deleted -> released one after the other, in process as
  `weightkeeper model create --wait` runs them (20 per round, `--quick` 5): how many took over 1.5 s
  (a 503 and the Prefect client's 2 s sleep), and the mean.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from _setup import ENV, row, tiny_pipeline, timed

from weightkeeper.prefectserver import LEASE_STORAGE, LOOPBACK, free_port, healthy, spawn, stop

SLOW = 1.5  # seconds: a creation or deletion that slept on a 503
KINDS = {"stock": ["prefect", "server", "start"], "weightkeeper": ["weightkeeper.prefectserver"]}


def start(kind: str, home: Path) -> tuple[subprocess.Popen, str]:
    """A Prefect server of `kind` (a key of KINDS) with its home at `home`, and its API URL once it answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(ENV, PREFECT_HOME=str(home), PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=LEASE_STORAGE)
    server = spawn([*KINDS[kind], "--host", LOOPBACK, "--port", str(port)], home / "server.log", env)
    url = f"http://{LOOPBACK}:{port}/api"
    deadline = time.monotonic() + 90
    while not healthy(url):
        if server.poll() is not None or time.monotonic() > deadline:
            stop(server)
            sys.exit(f"the {kind} Prefect server did not start; see {home / 'server.log'}")
        time.sleep(0.2)
    return server, url


def burst(api: str) -> tuple[Counter, float]:
    """8 clients x 5 flow runs x (create, Running, Completed), no retries: the answers (status codes, or
    "reset" for a connection reset) and the wall time. A refused creation skips its run's state changes."""
    import httpx

    flow = httpx.post(f"{api}/flows/", json={"name": "burst"}, timeout=30).json()["id"]
    codes: Counter = Counter()

    def client() -> None:
        with httpx.Client(base_url=api, timeout=120) as c:
            for _ in range(5):
                try:
                    run = c.post("/flow_runs/", json={"flow_id": flow, "state": {"type": "PENDING"}})
                    codes[run.status_code] += 1
                    for state in ("RUNNING", "COMPLETED") if run.status_code == 201 else ():
                        codes[c.post(f"/flow_runs/{run.json()['id']}/set_state",
                                     json={"state": {"type": state}}).status_code] += 1
                except httpx.TransportError:  # the stock server resets some connections it answered 503 on
                    codes["reset"] += 1

    return codes, at_once(client)


def burst_through_prefects_client() -> float:
    """The same writes through Prefect's client, with its retries: the wall time."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Pending, Running

    @flow(name="burst")
    def burst_flow() -> None:
        pass

    def client() -> None:
        with get_client(sync_client=True) as c:
            for _ in range(5):
                run = c.create_flow_run(burst_flow, state=Pending())
                c.set_flow_run_state(run.id, Running())
                c.set_flow_run_state(run.id, Completed())

    return at_once(client)


def at_once(client) -> float:
    """`client` in 8 threads at once: the wall time."""
    threads = [threading.Thread(target=client) for _ in range(8)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - began


def child(kind: str, root: Path, models: int) -> None:
    """One round on one server kind, in this process: prints the figures as JSON."""
    os.environ.update(ENV, HF_HOME=str(root / "hf-home"))
    os.environ.pop("HF_TOKEN", None)
    server, api = start(kind, root / "prefect-home")
    try:
        os.environ["PREFECT_API_URL"] = api
        codes, burst_seconds = burst(api)
        retried_seconds = burst_through_prefects_client()
        hub, declare = tiny_pipeline(root)
        from weightkeeper.flows.delete_model import delete_model
        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.runs import run_here

        def create(name: str) -> None:
            declare(name)
            if run_here(ensure_model, name) != "Ready":
                sys.exit(f"{name} did not get Ready")

        create("warm-up")  # the imports and the server's first requests
        run_here(delete_model, "warm-up")
        up, down = [], []
        for i in range(models):
            up.append(timed(lambda: create(f"tiny-{i}")))
            down.append(timed(lambda: run_here(delete_model, f"tiny-{i}") == "Released" or sys.exit("delete failed")))
        hub.stop()
    finally:
        stop(server)
    print(json.dumps({"codes": codes, "burst": burst_seconds, "retried": retried_seconds, "up": up, "down": down}))


def summary(figures: list[dict], key: str) -> str:
    times = [t for f in figures for t in f[key]]
    slow = [t for t in times if t > SLOW]
    spread = f", {min(slow):.1f} to {max(slow):.1f} s" if slow else ""
    return f"{len(slow)} of {len(times)} over {SLOW} s{spread}, mean {statistics.mean(times):.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    models = 5 if args.quick else 20
    if args.child:
        child(args.child[0], Path(args.child[1]), models)
        return
    figures: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="wk-bench-prefect-sqlite-", dir="/var/tmp") as tmp:
        for r in range(args.rounds):
            for kind in KINDS:
                root = Path(tmp) / f"{kind}-{r}"
                root.mkdir()
                out = subprocess.run([sys.executable, __file__, "--child", kind, str(root),
                                      *(["--quick"] if args.quick else [])], stdout=subprocess.PIPE, text=True,
                                     check=True).stdout
                figures[kind].append(json.loads(out.strip().splitlines()[-1]))
    ours, stock = figures["weightkeeper"], figures["stock"]

    def refused(fs: list[dict]) -> str:
        writes = sum(n for f in fs for n in f["codes"].values())
        failed = sum(n for f in fs for code, n in f["codes"].items() if code != "201")
        return f"{failed} of {writes} writes refused (503 or reset), {statistics.mean(f['burst'] for f in fs):.1f} s"

    row(f"Prefect on SQLite, 8 writers at once (5 flow runs each, 3 writes a run, no retries), {len(ours)} rounds",
        refused(ours), f"{refused(stock)} (Prefect's stock server)", "")
    retried_ours, retried_stock = (statistics.mean(f["retried"] for f in fs) for fs in (ours, stock))
    row("Prefect on SQLite, the same through Prefect's client (its 503 retries), wall time", f"{retried_ours:.1f} s",
        f"{retried_stock:.1f} s (Prefect's stock server)", f"{retried_stock / retried_ours:.2f}x faster")
    for key, what in (("up", "create -> Ready"), ("down", "delete -> released")):
        mean_ours = statistics.mean(t for f in ours for t in f[key])
        mean_stock = statistics.mean(t for f in stock for t in f[key])
        row(f"Prefect on SQLite, tiny model {what}, one at a time", summary(ours, key),
            f"{summary(stock, key)} (Prefect's stock server)", f"{mean_stock / mean_ours:.2f}x faster on average")


if __name__ == "__main__":
    main()
