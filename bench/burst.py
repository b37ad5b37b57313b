"""Burst: many tiny models created at once through the REST API of a running `weightkeeper serve`.

    .venv/bin/python bench/burst.py [--quick] [--models 1000] [--clients 8] [--run-limit N (default: the setting's)]

A Prefect server (`weightkeeper.prefectserver`) on a PostgreSQL database of its own and a registry on
another (127.0.0.1:5432, both dropped at the end); `weightkeeper serve --api-port P` against them, as an
operator runs it: the deployments, a run-limited process worker per work queue, the API. `--clients`
threads POST `/api/v1/models` as fast as the API answers, each model a 1 MiB repository of the Hub server
(a process of its own) into one workspace. Prints each create's latency (p50/p99), the answers 5xx (there
must be none), and models per minute from the first create until every model is Ready. Exits 1 unless every
model is Ready with no 5xx answer.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from _setup import HubProcess, postgres_database, prepare_environment, row, write_config, write_repo
from weightkeeper.prefectserver import free_port

TOKEN = "burst-token"
TIMEOUT_SECONDS = 3 * 3600


def phases(registry) -> dict[str, int]:
    from sqlalchemy import func, select

    from weightkeeper.registry.schema import ModelRow

    with registry.engine.connect() as conn:
        return dict(conn.execute(select(ModelRow.phase, func.count()).group_by(ModelRow.phase)).all())


def not_ready(registry, count: int) -> list[tuple[str, str, str]]:
    """The first `count` models not Ready: name, phase, message."""
    from sqlalchemy import select

    from weightkeeper.registry.schema import ModelRow

    with registry.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(ModelRow.name, ModelRow.phase, ModelRow.message)
                                               .where(ModelRow.phase != "Ready").order_by(ModelRow.name).limit(count))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="50 models")
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8, help="API calls in flight at once")
    parser.add_argument("--run-limit", type=int, help="worker_run_limit (default: the setting's default)")
    args = parser.parse_args()
    args.models = 50 if args.quick else args.models
    os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] = postgres_database("asyncpg")
    with tempfile.TemporaryDirectory(prefix="wk-bench-burst-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        prepare_environment(root)
        write_repo(root / "tiny", shards=1, shard_mib=1, seed="burst")
        hub = HubProcess(root / "hub", {"bench/tiny": root / "tiny"})
        extra = {"worker_run_limit": args.run_limit} if args.run_limit else {}
        config = write_config(root, hub.url, {"burst": root / "volume"}, registry_url=postgres_database("psycopg"),
                              **extra)
        with open(config, "a") as f:
            f.write(f'[[users]]\nname = "bench"\nuid = {os.getuid()}\nadmin = true\n'
                    f'token_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"\n')
        from weightkeeper.config import load_settings
        from weightkeeper.registry import registry_for

        settings = load_settings()
        registry = registry_for(settings)
        port = free_port()
        with open(root / "serve.log", "w") as log:
            serve = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "serve", "--api-port", str(port)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"},
                           timeout=120, limits=httpx.Limits(max_connections=args.clients))
        try:
            deadline = time.monotonic() + 300
            while not _answers(api):
                if serve.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"weightkeeper serve did not start; see {root / 'serve.log'}")
                time.sleep(1)

            def create(i: int) -> tuple[float, int]:
                start = time.perf_counter()
                r = api.post("/api/v1/models", json={"name": f"burst-{i:04d}", "source": "hf://bench/tiny",
                                                        "subpath": f"models/burst-{i:04d}"})
                return time.perf_counter() - start, r.status_code

            begun = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                answers = list(pool.map(create, range(args.models)))
            created = time.perf_counter() - begun
            counts = phases(registry)
            while counts.get("Ready", 0) + counts.get("Failed", 0) < args.models and serve.poll() is None \
                    and time.perf_counter() - begun < TIMEOUT_SECONDS:
                time.sleep(2)
                counts = phases(registry)
            ready = time.perf_counter() - begun
            for name, phase, message in not_ready(registry, 3):
                print(f"  {name} {phase}: {message}", flush=True)
        finally:
            serve.terminate()
            serve.wait(120)
            hub.stop()
    latencies = sorted(1000 * seconds for seconds, _ in answers)
    errors = sum(1 for _, code in answers if code >= 500)
    refused = sum(1 for _, code in answers if code != 201)
    p50, p99 = statistics.median(latencies), latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    done = counts.get("Ready", 0)
    print(f"{args.models} models created through the API in {created:.1f} s by {args.clients} clients "
          f"({refused} not 201, {errors} 5xx); every model settled after {ready:.0f} s: {counts}; worker run limit "
          f"{settings.worker_run_limit}", flush=True)
    row(f"burst: {args.models} tiny models created through the API of `weightkeeper serve` (Prefect on PostgreSQL, "
        f"worker run limit {settings.worker_run_limit})",
        f"create p50 {p50:.0f} ms, p99 {p99:.0f} ms; {errors} answers 5xx",
        f"{done} Ready in {ready:.0f} s", f"{60 * done / ready:.1f} models per minute")
    return 0 if done == args.models and errors == 0 else 1


def _answers(api: httpx.Client) -> bool:
    try:
        return api.get("/api/v1/models/none-yet").status_code == 404
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())
