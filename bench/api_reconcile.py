"""Reconcile pass time and API list latency with many models in the registry, on SQLite and PostgreSQL.

    .venv/bin/python bench/api_reconcile.py [--models 10000] [--requests 50] [--db sqlite|postgresql|both]

Models are inserted Ready (two paths each, no manifest, so the pass decides and checks leases and
orphans but hashes nothing); the API is called in process through its ASGI app (no network).
PostgreSQL uses a scratch database on 127.0.0.1:5432 that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _setup import postgres_database

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
TOKEN = "bench-token"


def write_config(root: Path, registry_url: str) -> Path:
    import hashlib

    for ws in ("team-a", "team-b"):
        (root / ws / "models").mkdir(parents=True, exist_ok=True)
    config = root / "config.toml"
    config.write_text(
        f'home = "{root}"\nregistry_url = "{registry_url}"\nmax_concurrent_downloads = -1\n'
        + "".join(f'[[workspaces]]\nname = "{ws}"\nvolume = "{root / ws}"\n' for ws in ("team-a", "team-b"))
        + f'[[users]]\nname = "bench"\nuid = 1000\ntoken_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"\n')
    return config


def fill(registry, root: Path, count: int) -> None:
    from sqlalchemy.orm import Session

    from weightkeeper.registry.common import utcnow
    from weightkeeper.registry.schema import LocalPathRow, ModelRow

    now = utcnow()
    with Session(registry.engine) as s, s.begin():
        for i in range(count):
            row = ModelRow(name=f"m-{i:05d}", owner_name="bench", owner_uid=1000, source=f"hf://acme/m{i}",
                           repo_id=f"acme/m{i}", revision="main", phase="Ready", message="", created_at=now,
                           updated_at=now, cleanup_attempts=0)
            row.paths = [LocalPathRow(workspace=ws, cluster="local", path=str(root / ws / "models" / f"acme--m{i}"),
                                      status="Ready", message="", size_bytes=1 << 30, bytes_done=1 << 30,
                                      bytes_total=1 << 30, owned=True, updated_at=now) for ws in ("team-a", "team-b")]
            s.add(row)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench(label: str, registry_url: str, count: int, requests: int) -> None:
    from fastapi.testclient import TestClient

    from weightkeeper.flows.reconcile import reconcile
    from weightkeeper.api import create_app
    from weightkeeper.config import load_settings
    from weightkeeper.prefectserver import prefect_api
    from weightkeeper.registry import open_registry
    from weightkeeper.runs import run_here

    root = Path(tempfile.mkdtemp(prefix="wk-bench-"))
    config = write_config(root, registry_url)
    os.environ["WEIGHTKEEPER_CONFIG"] = str(config)
    settings = load_settings(config)
    registry = open_registry(settings.registry_url)
    start = time.perf_counter()
    fill(registry, root, count)
    print(f"{label}: inserted {count} models in {time.perf_counter() - start:.1f}s")
    passes = []
    with prefect_api(root):  # the Prefect server `weightkeeper reconcile` starts
        run_here(reconcile)  # warm-up: flow registration, imports
        for _ in range(3):
            start = time.perf_counter()
            run_here(reconcile)
            passes.append(time.perf_counter() - start)
    best = min(passes)
    print(f"{label}: reconcile pass  {best:8.2f} s  ({best / count * 1e6:7.1f} us/model, best of 3)")
    client = TestClient(create_app(settings, registry))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for what, params in (("list all", {}), ("list workspace+phase", {"workspace": "team-b", "phase": "Ready"}),
                         ("list includeDeleting", {"includeDeleting": "true"})):
        times = []
        for _ in range(requests):
            start = time.perf_counter()
            response = client.get("/api/v1/models", params=params, headers=auth)
            times.append(time.perf_counter() - start)
            assert response.status_code == 200 and len(response.json()) == count
        p50, p99 = percentile(times, 50), percentile(times, 99)
        print(f"{label}: API {what:22s} p50 {p50 * 1e3:8.1f} ms  p99 {p99 * 1e3:8.1f} ms  "
              f"({p50 / count * 1e6:6.1f} us/model at p50)")
    one = [0.0] * requests
    for i in range(requests):
        start = time.perf_counter()
        assert client.get(f"/api/v1/models/m-{i:05d}", headers=auth).status_code == 200
        one[i] = time.perf_counter() - start
    print(f"{label}: API get one model         p50 {percentile(one, 50) * 1e3:8.1f} ms  "
          f"p99 {percentile(one, 99) * 1e3:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    if args.db in ("sqlite", "both"):
        bench("sqlite", f"sqlite:///{tempfile.mkdtemp(prefix='wk-bench-db-')}/registry.db", args.models, args.requests)
    if args.db in ("postgresql", "both"):
        bench("postgresql", postgres_database("psycopg"), args.models, args.requests)

if __name__ == "__main__":
    main()
