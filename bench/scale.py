"""Scale: 100 models over 4 workspaces with the download limit at 4, against the ideal time.

    .venv/bin/python bench/scale.py [--quick] [--concurrency 16] [--prefect-db sqlite|postgresql|both (default)]

Each model is its own repository: one 64 MiB shard plus small files, so that its transfer is not
dwarfed by the second or so of Prefect and registry work around it (`--quick`: 20 models of 8 MiB).

As in a deployment, the flow runs are created one by one (as the API or a reconcile pass starts
them), then run by `--concurrency` worker processes, one run at a time each: a process worker with
that limit, started before the clock (its process start per run is not counted), each run in a
process of its own rather than sharing one interpreter with the others. 16, 4x the download limit,
keeps runs queued on a slot so that their orchestration overlaps the downloads; more only loads the
2 cores here. The Prefect client's retries (503 answers) are counted.

The Prefect server is `weightkeeper.prefectserver` in a process of its own, as `weightkeeper serve`
runs it, on SQLite (the default) or on a database of its own in the PostgreSQL at 127.0.0.1:5432,
dropped at the end. (Prefect's stock server, whose SQLite answers concurrent writes 503, "database is
locked", took 106 s here against 60 to 66 s, and 43 of 100 flow-run creations failed past the
client's 5 retries when all 100 runs started at once in threads.) The Hub server runs in this
process to time each repository's requests and to count the downloads with bytes flowing; each
worker notes when it held a download slot. The ideal is total bytes / throughput, the throughput being that of `curl
--parallel` fetching the same files from the same server. Exits 1 unless every model is Ready.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

from _setup import MIB, postgres_database, prepare_environment, row, sh, timed, write_config, write_repo
from weightkeeper.hubserver import HubServer

class TimedHub(HubServer):
    """Notes per repository when its metadata was first asked for and when its bodies began and ended."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.asked: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def reset_stats(self) -> None:
        super().reset_stats()
        for times in (self.asked, self.first, self.last):
            times.clear()

    def _check_faults(self, repo_id: str | None, path: str) -> None:
        if repo_id and "/resolve/" not in path:
            self.asked.setdefault(repo_id, time.perf_counter())
        super()._check_faults(repo_id, path)

    def _begin_body(self, repo_id: str, filename: str, length: int) -> int:
        self.first.setdefault(repo_id, time.perf_counter())
        return super()._begin_body(repo_id, filename, length)

    def _end_body(self, repo_id: str) -> None:
        self.last[repo_id] = time.perf_counter()
        super()._end_body(repo_id)


class Slots:
    """Wraps `download_slot` in a worker process: when each slot was acquired, its work done, and it released."""

    def __init__(self, download_slot):
        self.download_slot, self.held = download_slot, []

    @contextlib.contextmanager
    def __call__(self, settings, on_wait) -> Iterator[None]:
        with self.download_slot(settings, on_wait):
            acquired = time.perf_counter()
            try:
                yield
            finally:
                done = time.perf_counter()
        self.held.append((acquired, done, time.perf_counter()))


class Retries(logging.Filter):
    """Counts the Prefect client's retries of 503 answers (debug records, dropped after counting)."""

    def __init__(self):
        super().__init__()
        self.count, self.lock = 0, threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if "retryable status code 503" in record.getMessage():
            with self.lock:
                self.count += 1
        return record.levelno >= logging.WARNING


SLOTS: Slots  # in a worker process, set by start_worker
RETRIES: Retries


class Run(NamedTuple):
    name: str
    outcome: str
    started: float  # time.perf_counter(): the same clock in every process
    ended: float
    slots: list[tuple[float, float, float]]
    retries: int
    cpu: float


def start_worker(ready: multiprocessing.synchronize.Barrier) -> None:
    """A worker process: the flow imported, slots and the client's 503 retries counted; waits for the others."""
    global SLOTS, RETRIES
    import fastapi.encoders  # noqa: F401 - what Prefect imports at a process's first subflow call
    import weightkeeper.runtime
    from weightkeeper.flows.ensure_model import ensure_model  # noqa: F401 - imported before the clock starts

    SLOTS = weightkeeper.runtime.download_slot = Slots(weightkeeper.runtime.download_slot)
    RETRIES = Retries()
    logging.getLogger("prefect.client").setLevel(logging.DEBUG)
    logging.getLogger("prefect.client").addFilter(RETRIES)
    ready.wait()


def run_model(name: str, run_id: UUID) -> Run:
    """Run a created ensure-model flow run in this worker process, as a worker does."""
    from prefect import get_client
    from prefect.flow_engine import run_flow

    from weightkeeper.flows.ensure_model import ensure_model

    slots, retries, cpu, started = len(SLOTS.held), RETRIES.count, time.process_time(), time.perf_counter()
    try:
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(run_id)
        outcome = run_flow(ensure_model, flow_run=flow_run, parameters={"name": name})
    except Exception as e:  # noqa: BLE001 - counted as not Ready, with its cause
        outcome = f"{type(e).__name__}: {str(e)[:160]}"
    return Run(name, outcome, started, time.perf_counter(), SLOTS.held[slots:], RETRIES.count - retries,
               time.process_time() - cpu)


def peak(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    return max(itertools.accumulate(delta for _, delta in events), default=0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.1f} s, max {max(values):.1f} s" if values else "none"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=16, help="ensure-model runs in flight at once")
    parser.add_argument("--prefect-db", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    if args.prefect_db == "both":
        return max(subprocess.run([sys.executable, __file__, *(["--quick"] if args.quick else []), "--concurrency",
                                   str(args.concurrency), "--prefect-db", db]).returncode
                   for db in ("sqlite", "postgresql"))
    models, shard_mib, limit = (20, 8, 4) if args.quick else (100, 64, 4)
    workspaces = [f"ws-{i}" for i in range(4)]
    if args.prefect_db == "postgresql":
        os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] = postgres_database("asyncpg")  # dropped after the server
    with tempfile.TemporaryDirectory(prefix="wk-bench-scale-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        server = prepare_environment(root)
        hub = TimedHub(root / "hub").start()
        names = [f"m{i:03d}" for i in range(models)]
        urls, total = [], 0
        for name in names:
            src = root / "src" / name
            write_repo(src, shards=1, shard_mib=shard_mib, seed=name)
            files = {p.name: p for p in src.iterdir()}
            hub.add_repo(f"bench/{name}", files)
            urls += [(f"{name}/{f}", f"{hub.url}/bench/{name}/resolve/main/{f}") for f in files]
            total += sum(p.stat().st_size for p in files.values())
        write_config(root, hub.url, {w: root / w for w in workspaces}, max_concurrent_downloads=limit)
        sh("cat", *(str(p) for p in (root / "hub" / "blobs").iterdir()))

        curl = ["curl", "-sSf", "--parallel", "--parallel-max", "8", "--create-dirs"]
        for rel, url in urls:
            curl += ["-o", str(root / "curl" / rel), url]
        reference = timed(lambda: sh(*curl))
        sh("rm", "-rf", str(root / "curl"))

        from prefect import get_client

        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.config import load_settings
        from weightkeeper.service import declare_model
        from weightkeeper.registry import registry_for

        settings = load_settings()
        registry = registry_for(settings)
        declare_model(settings, registry, name="warm-up", source="hf://bench/m000", owner_name="bench",
                      owner_uid=0, workspaces=[workspaces[0]], subpath="models/warm-up")
        assert ensure_model("warm-up") == "Ready"
        for i, name in enumerate(names):
            declare_model(settings, registry, name=name, source=f"hf://bench/{name}", owner_name="bench",
                          owner_uid=0, workspaces=[workspaces[i % len(workspaces)]])
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.concurrency, spawn, initializer=start_worker,
                                 initargs=(spawn.Barrier(args.concurrency, timeout=600),)) as pool:
            workers = timed(lambda: list(pool.map(int, range(args.concurrency))))  # each worker takes one
            hub.reset_stats()
            cpu = cpu_seconds(server.pid), cpu_seconds(os.getpid())
            begun = time.perf_counter()
            with get_client(sync_client=True) as client:  # one by one, as the API or a reconcile pass starts them
                run_ids = [client.create_flow_run(ensure_model, name=f"ensure-{n}", parameters={"name": n}).id
                           for n in names]
            created = time.perf_counter() - begun
            runs = {r.name: r for r in pool.map(run_model, names, run_ids)}
            ours = time.perf_counter() - begun
            cpu = cpu_seconds(server.pid) - cpu[0], cpu_seconds(os.getpid()) - cpu[1]
        hub.stop()
    failed = {r.name: r.outcome for r in runs.values() if r.outcome != "Ready"}
    throughput = total / reference
    held = [slot for r in runs.values() for slot in r.slots]
    started, ended = ({n: getattr(r, f) for n, r in runs.items()} for f in ("started", "ended"))
    asked, first, last = ({n: t[f"bench/{n}"] for n in names if f"bench/{n}" in t}
                          for t in (hub.asked, hub.first, hub.last))
    most = peak([(acquired, done) for acquired, done, _ in held])  # releasing, a slot may be taken already
    prefect = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[args.prefect_db]
    print(f"{models} models, {total / MIB:.0f} MiB, {args.concurrency} worker processes (started in {workers:.0f} s, "
          f"not counted), Prefect on {prefect}: {len(failed)} not Ready; curl --parallel {throughput / MIB:.0f} MiB/s; "
          f"the Prefect clients retried {sum(r.retries for r in runs.values())} answers 503", flush=True)
    for name, outcome in list(failed.items())[:5]:
        print(f"  not Ready: {name}: {outcome}", flush=True)
    print(f"creating the {models} flow runs one by one: {created:.1f} s", flush=True)
    for what, start, end in [("run start -> metadata request (flow run Running, run lease, resolve task)",
                              started, asked),
                             ("metadata -> first byte (download task, path claim, waiting for a slot)", asked, first),
                             ("first -> last byte", first, last),
                             ("last byte -> run end (slot release, record size, finish, publish)", last, ended)]:
        print(f"per model, {what}: {spread([end[n] - start[n] for n in names if n in start and n in end])}",
              flush=True)
    print(f"a download slot is held {spread([released - start for start, _, released in held])} (until released); on "
          f"average {sum(released - start for start, _, released in held) / ours:.2f} slots were held and "
          f"{sum(last[n] - first[n] for n in first) / ours:.2f} downloads had bytes flowing", flush=True)
    print(f"CPU during the runs: Prefect server process {cpu[0]:.0f} s, "
          f"workers {sum(r.cpu for r in runs.values()):.0f} s, Hub server {cpu[1]:.0f} s, "
          f"of {ours:.0f} s x {os.cpu_count()} cores", flush=True)
    row(f"scale: {models} models ({total / MIB:.0f} MiB) over 4 workspaces, limit {limit}, {args.concurrency} runs "
        f"at a time, Prefect on {prefect}: wall time",
        f"{ours:.1f} s, peak {most} downloads at once ({hub.peak_concurrent_repos} with bytes flowing)",
        f"{reference:.1f} s ideal ({throughput / MIB:.0f} MiB/s, `curl --parallel`)",
        f"{ours / reference:.1f}x the ideal" + (f"; {len(failed)} of {models} not Ready" if failed else "")
        + (f"; peak {most} is not the limit {limit}" if most != limit else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
