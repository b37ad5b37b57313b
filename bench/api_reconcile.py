"""Reconcile pass time and API list latency with many models in the registry, on SQLite and PostgreSQL.

    .venv/bin/python bench/api_reconcile.py [--models 10000] [--requests 50] [--db sqlite|postgresql|both]
        [--due 0.01] [--only api|reconcile|both] [--quick]

The reconcile half inserts models Ready with realistic rows: two own copies each, a 10-file manifest (as
`set_snapshot` records it) and the files on disk (hard links to one set of small files: the size check still
stats every file, the hash still reads every byte). It times a pass with nothing due (every copy checked and
hashed within its interval), then one where every copy is due for its size check and `--due` of them for a
full hash, each best of 3.
The API half inserts models Ready (two paths each, no manifest); the API is called in process through its
ASGI app (no network). PostgreSQL uses a scratch database on 127.0.0.1:5432 that is dropped afterwards.
Prints its figures, then rows of bench/run_all.py's table (a page against the whole list before pagination);
`--quick`: 1,000 models.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

from _setup import postgres_database, row

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
TOKEN = "bench-token"


def scratch(prefix: str = "wk-bench-") -> Path:
    """A temporary directory, removed when this process exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


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


VIEWER_TOKEN = "viewer-token"


def add_viewer(config: Path, root: Path) -> None:
    """A private workspace of `bench` and a second user, `viewer`, who sees bench's models only through public
    workspaces (so the list applies the visibility rule)."""
    import hashlib

    (root / "private" / "models").mkdir(parents=True)
    with open(config, "a") as f:
        f.write(f'[[workspaces]]\nname = "private"\nvolume = "{root / "private"}"\npublic = false\nowner = "bench"\n'
                f'[[users]]\nname = "viewer"\nuid = 1001\n'
                f'token_sha256 = "{hashlib.sha256(VIEWER_TOKEN.encode()).hexdigest()}"\n')


def fill(registry, root: Path, count: int) -> None:
    """`count` Ready models of `bench`, two paths each (every tenth only in the private workspace, twice), with
    distinct creation times and sizes."""
    from datetime import timedelta

    from sqlalchemy.orm import Session

    from weightkeeper.registry.common import utcnow
    from weightkeeper.registry.schema import LocalPathRow, ModelRow

    now = utcnow()
    with Session(registry.engine) as s, s.begin():
        for i in range(count):
            spaces = ("private", "private") if i % 10 == 9 else ("team-a", "team-b")
            row = ModelRow(name=f"m-{i:05d}", owner_name="bench", owner_uid=1000, source=f"hf://acme/m{i}",
                           repo_id=f"acme/m{i}", revision="main", phase="Ready", message="",
                           created_at=now - timedelta(seconds=(i * 7919) % count), updated_at=now, cleanup_attempts=0,
                           targets=sorted(set(spaces)), size_bytes=((i * 104729) % 1000) << 20)
            row.paths = [LocalPathRow(workspace=ws, cluster="local",
                                      path=str(root / ws / "models" / f"acme--m{i}" / str(n)), status="Ready",
                                      message="", size_bytes=1 << 30, bytes_done=1 << 30, bytes_total=1 << 30,
                                      owned=True, updated_at=now) for n, ws in enumerate(spaces)]
            s.add(row)


SHARD_BYTES = 16 * 1024
MANIFEST_FILES = [f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)] + [
    "config.json", "tokenizer.json", "tokenizer_config.json"]


def write_template(root: Path) -> list[dict]:
    """One set of the manifest's files under `root/template`, and their entries as `set_snapshot` records them."""
    import hashlib
    import random

    template = root / "template"
    template.mkdir()
    entries = []
    for name in MANIFEST_FILES:
        data = random.Random(name).randbytes(SHARD_BYTES if name.endswith(".safetensors") else 700)
        (template / name).write_bytes(data)
        lfs = name.endswith(".safetensors")
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entries.append({"path": name, "size": len(data), "blobId": blob,
                        "sha256": hashlib.sha256(data).hexdigest() if lfs else None, "md5": None})
    return entries


def fill_with_files(registry, root: Path, count: int) -> None:
    """`count` Ready models, two own copies each, with a 10-file manifest and the files on disk (hard links)."""
    from sqlalchemy.orm import Session

    from weightkeeper.registry.common import utcnow
    from weightkeeper.registry.schema import LocalPathRow, ModelRow

    files, now = write_template(root), utcnow()
    with Session(registry.engine) as s, s.begin():
        for i in range(count):
            row = ModelRow(name=f"m-{i:05d}", owner_name="bench", owner_uid=1000, source=f"hf://acme/m{i}",
                           repo_id=f"acme/m{i}", revision="main", commit=f"{i:040x}", files=files, phase="Ready",
                           message="", created_at=now, updated_at=now, cleanup_attempts=0)
            row.paths = []
            for ws in ("team-a", "team-b"):
                path = root / ws / "models" / f"acme--m{i}"
                path.mkdir()
                for f in files:
                    os.link(root / "template" / f["path"], path / f["path"])
                st = path.stat()
                row.paths.append(LocalPathRow(
                    workspace=ws, cluster="local", path=str(path), status="Ready", message="",
                    size_bytes=sum(f["size"] for f in files), bytes_done=0, bytes_total=0, owned=True,
                    made=f"{st.st_dev}:{st.st_ino}", verified_at=now, updated_at=now))
            s.add(row)


def set_due(registry, settings, share: float, check_all: bool) -> int:
    """Make every `1/share`-th copy due for a full hash (verified longer than the interval ago), the rest verified
    now; every copy due for its size check (`check_all`) or none; how many are due for a hash."""
    from datetime import timedelta

    from sqlalchemy import func, select, update

    from weightkeeper.registry.common import utcnow
    from weightkeeper.registry.schema import LocalPathRow

    every = max(1, round(1 / share)) if share else 0
    now = utcnow()
    old = now - timedelta(seconds=settings.verify_interval_seconds + 60)
    with registry.engine.begin() as conn:
        conn.execute(update(LocalPathRow).values(verified_at=now, checked_at=None if check_all else now))
        if every:
            conn.execute(update(LocalPathRow).where(LocalPathRow.id % every == 0).values(verified_at=old))
        return conn.execute(select(func.count()).where(LocalPathRow.verified_at == old)).scalar_one() if every else 0


def bench_reconcile(label: str, registry_url: str, count: int, due: float) -> None:
    """A reconcile pass over `count` models with files on disk: nothing due, then `due` of the copies due."""
    from collections import Counter

    from weightkeeper.flows.reconcile import reconcile
    from weightkeeper.config import load_settings
    from weightkeeper.prefectserver import prefect_api
    from weightkeeper.registry import open_registry
    from weightkeeper.runs import run_here

    root = scratch()
    config = write_config(root, registry_url)
    os.environ["WEIGHTKEEPER_CONFIG"] = str(config)
    settings = load_settings(config)
    registry = open_registry(settings.registry_url)
    start = time.perf_counter()
    fill_with_files(registry, root, count)
    print(f"{label}: inserted {count} models with {len(MANIFEST_FILES)}-file manifests and 2 copies on disk "
          f"in {time.perf_counter() - start:.1f}s")
    with prefect_api(root):  # the Prefect server `weightkeeper reconcile` starts
        run_here(reconcile)  # warm-up: flow registration, imports
        for what, share, check_all in (("nothing due", 0.0, False),
                                       (f"every copy due for its size check, {due:.1%} for a hash", due, True)):
            passes = []
            for _ in range(3):
                due_copies = set_due(registry, settings, share, check_all)
                start, cpu = time.perf_counter(), time.process_time()
                outcomes = run_here(reconcile)
                passes.append((time.perf_counter() - start, time.process_time() - cpu))
            tally = Counter(outcomes.values())
            best, cpu = min(passes)
            print(f"{label}: reconcile, {what}: {best:.2f} s  ({best / count * 1e6:7.1f} us/model, best of 3; "
                  f"CPU of this process {cpu:.2f} s; {due_copies} copies due for a hash; outcomes: "
                  f"{', '.join(f'{n} {o}' for o, n in sorted(tally.items()))})")
            row(f"reconcile pass, {count:,} models (2 copies, 10-file manifests), {what}, registry on {label}, "
                "best of 3", f"{best:.2f} s ({best / count * 1e6:.0f} µs/model)", "none (no reference tool)", "")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def whole_list(registry, settings, user) -> str:
    """Today's answer before pagination: every model the user sees, in one JSON list."""
    import json

    from weightkeeper.tenancy import redact, visible

    return json.dumps([redact(m.to_json(), user, settings) for m in registry.list_models()
                       if visible(m, user, settings)])


def bench(label: str, registry_url: str, count: int, requests: int) -> None:
    """The list API at `count` models: today's whole list against one page of 100, by filter and sort."""
    from fastapi.testclient import TestClient

    from weightkeeper.api import create_app
    from weightkeeper.config import load_settings
    from weightkeeper.registry import open_registry

    root = scratch()
    config = write_config(root, registry_url)
    add_viewer(config, root)
    os.environ["WEIGHTKEEPER_CONFIG"] = str(config)
    settings = load_settings(config)
    registry = open_registry(settings.registry_url)
    start = time.perf_counter()
    fill(registry, root, count)
    print(f"{label}: inserted {count} models in {time.perf_counter() - start:.1f}s")
    whole, whole_cpu = [], []
    for _ in range(3):
        start, start_cpu = time.perf_counter(), time.process_time()
        whole_list(registry, settings, settings.users[1])
        whole.append(time.perf_counter() - start)
        whole_cpu.append(time.process_time() - start_cpu)
    before = percentile(whole, 50), percentile(whole, 99)
    print(f"{label}: before: whole list of {count} (registry list_models + view, as the old endpoint did)  "
          f"p50 {before[0] * 1e3:7.1f} ms  p99 {before[1] * 1e3:7.1f} ms  (CPU p50 "
          f"{percentile(whole_cpu, 50) * 1e3:7.1f} ms; 3 runs)")
    with TestClient(create_app(settings, registry)) as client:  # its start-up runs, as in a server
        pages(client, label, before[1], max(requests, 200))
        one = [0.0] * requests
        for i in range(requests):
            start = time.perf_counter()
            assert client.get(f"/api/v1/models/m-{i:05d}", headers=USERS["bench"]).status_code == 200
            one[i] = time.perf_counter() - start
    print(f"{label}: API get one model  p50 {percentile(one, 50) * 1e3:6.1f} ms  "
          f"p99 {percentile(one, 99) * 1e3:6.1f} ms")
    row(f"API `GET /api/v1/models/{{name}}`, {count:,} models, registry on {label}",
        f"p50 {percentile(one, 50) * 1e3:.1f} ms, p99 {percentile(one, 99) * 1e3:.1f} ms", "none (no reference tool)", "")


USERS = {"bench": {"Authorization": f"Bearer {TOKEN}"}, "viewer": {"Authorization": f"Bearer {VIEWER_TOKEN}"}}
LISTS = (("bench", "sort=name", {}), ("viewer", "sort=name", {}), ("viewer", "sort=-created", {"sort": "-created"}),
         ("viewer", "sort=size", {"sort": "size"}),
         ("viewer", "workspace+phase", {"workspace": "team-b", "phase": "Ready"}),
         ("viewer", "includeDeleting", {"includeDeleting": "true"}),
         ("viewer", "search (1 in 10)", {"search": "M-01"}), ("viewer", "search (10 match)", {"search": "m-0999"}))


def pages(client, label: str, whole_p99: float, count: int) -> None:
    """`count` pages of 100 of each list in `LISTS`, walking it (from the start again at its end)."""
    for who, what, params in LISTS:
        times, cpu, cursor = [], [], None
        for _ in range(count):
            start, start_cpu = time.perf_counter(), time.process_time()
            response = client.get("/api/v1/models", params={**params, **({"cursor": cursor} if cursor else {})},
                                  headers=USERS[who])
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            assert response.status_code == 200, response.text
            cursor = response.json()["nextCursor"]
            assert len(response.json()["items"]) == 100 or cursor is None
        p50, p99 = percentile(times, 50), percentile(times, 99)
        print(f"{label}: after: page of 100, {what:18s} as {who:6s}  p50 {p50 * 1e3:6.1f} ms  p99 {p99 * 1e3:6.1f} ms"
              f"  ({whole_p99 / p99:4.0f}x the whole list at p99; this process's CPU p50 "
              f"{percentile(cpu, 50) * 1e3:5.1f} ms, p99 {percentile(cpu, 99) * 1e3:5.1f} ms; {count} pages)")
        row(f"API page of 100, {what} as {who}, registry on {label}", f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms",
            f"p99 {whole_p99 * 1e3:.0f} ms (the whole list, as before pagination)",
            f"{whole_p99 / p99:.0f}x faster at p99")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--due", type=float, default=0.01, help="share of copies due for a full hash in pass 2")
    parser.add_argument("--only", choices=["api", "reconcile", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="1,000 models")
    args = parser.parse_args()
    if args.quick:
        args.models = 1_000
    for label in ("sqlite", "postgresql"):
        if args.db not in (label, "both"):
            continue
        url = (lambda: f"sqlite:///{scratch('wk-bench-db-')}/registry.db") if label == "sqlite" \
            else (lambda: postgres_database("psycopg"))
        if args.only in ("reconcile", "both"):
            bench_reconcile(label, url(), args.models, args.due)
        if args.only in ("api", "both"):
            bench(label, url(), args.models, args.requests)

if __name__ == "__main__":
    main()
