"""Test session: one real Prefect server, one Hub-protocol server, a fresh registry per test.

Environment is fixed before Prefect is imported anywhere. `WK_TEST_DB=postgresql` runs the
registry on the real PostgreSQL at 127.0.0.1:5432 instead of SQLite (one fresh database per
session). The Prefect server keeps its own SQLite database unless `WK_TEST_PREFECT_DB=postgresql`: then a
fresh PostgreSQL database of its own. Each session (each pytest-xdist worker) has all of these to itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from weightkeeper.prefectserver import free_port, start_server, stop

SESSION_DIR = Path(tempfile.mkdtemp(prefix="wk-tests-"))


PREFECT_PORT = free_port()
os.environ.update({
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_XET": "1",
    "HF_HOME": str(SESSION_DIR / "hf-home"),
    "PREFECT_HOME": str(SESSION_DIR / "prefect-home"),
    "PREFECT_API_URL": f"http://127.0.0.1:{PREFECT_PORT}/api",
    "PREFECT_LOGGING_LEVEL": "INFO",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_TASKS_DEFAULT_RETRY_DELAY_SECONDS": "0",
})
os.environ.pop("HF_ENDPOINT", None)
os.environ.pop("HF_TOKEN", None)

import pytest  # noqa: E402

from weightkeeper.hubserver import HubServer  # noqa: E402

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def start_prefect_server(port: int, home: Path, database_url: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_API_PORT=str(port))
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    env.pop("PREFECT_API_URL", None)
    return start_server(port, home.parent / f"prefect-server-{port}.log", env)


SESSION_SERVER: dict[str, subprocess.Popen] = {}


def stop_session_server(crash: bool = False) -> None:
    """Stop the session's Prefect server: gracefully, or with SIGKILL like a crash."""
    proc = SESSION_SERVER["proc"]
    if crash:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
    else:
        stop(proc)


def start_session_server() -> None:
    """Start the session's Prefect server again on its port; it serves the rest of the session."""
    SESSION_SERVER["proc"] = start_prefect_server(PREFECT_PORT, Path(os.environ["PREFECT_HOME"]),
                                                  SESSION_SERVER.get("database"))


@contextlib.contextmanager
def fresh_database(prefix: str):
    """A new database on the real PostgreSQL server, dropped afterwards: its name."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def prefect_database():
    """The session Prefect server's own PostgreSQL database (`WK_TEST_PREFECT_DB=postgresql`), else None."""
    if os.environ.get("WK_TEST_PREFECT_DB") != "postgresql":
        yield None
        return
    with fresh_database("wk_prefect") as name:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"


def pytest_configure(config):
    config.addinivalue_line("markers", "without_prefect_server: the module's tests never talk to Prefect")


@pytest.fixture(scope="session", autouse=True)
def prefect_server(request):
    if all(item.get_closest_marker("without_prefect_server") for item in request.session.items):
        yield None  # pure tests only (as a mutation check runs them): no server to wait ~10 s for
        shutil.rmtree(SESSION_DIR, ignore_errors=True)
        return
    home = Path(os.environ["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    with prefect_database() as database:
        SESSION_SERVER["database"] = database
        start_session_server()
        yield SESSION_SERVER["proc"]
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()
        stop(SESSION_SERVER["proc"])  # a test that restarted the server left its new process here
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def flows_run_as_weightkeeper_runs_them_here():
    """Flows a test calls (in its own thread) run as `weightkeeper.runs.run_here` runs them: without Prefect's
    flow-run heartbeat."""
    from weightkeeper.runs import without_prefect_heartbeat

    with without_prefect_heartbeat():
        yield


@pytest.fixture(autouse=True)
def no_context_left_behind(monkeypatch):
    """A test that runs the CLI in process (which `use`s its --config) leaves the next test none of it."""
    from weightkeeper import context

    monkeypatch.setattr(context, "_explicit", context._explicit)


@pytest.fixture(scope="session")
def hub():
    with HubServer(SESSION_DIR / "hub") as server:
        yield server


@pytest.fixture(scope="session")
def registry_base_url():
    """SQLite per test by default; with WK_TEST_DB=postgresql one database per session on the real server."""
    if os.environ.get("WK_TEST_DB") != "postgresql":
        yield None
        return
    with fresh_database("wk_test") as name:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


@pytest.fixture
def pg_url():
    """A fresh PostgreSQL database for one test (the registry's multi-host configuration)."""
    from weightkeeper.registry import store

    with fresh_database("wk_test") as name:
        yield (url := f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
        with store._engines_lock:
            engine = store._engines.pop(url, None)
        if engine:
            engine.dispose()


@dataclass
class Env:
    """One test's weightkeeper: config file, volumes, registry."""

    root: Path
    config: Path
    volumes: dict[str, Path]

    @property
    def settings(self):
        from weightkeeper.config import load_settings

        return load_settings(self.config)

    @property
    def registry(self):
        from weightkeeper.registry import registry_for

        return registry_for(self.settings)

    def declare(self, name: str, source: str, **kw):
        from weightkeeper.service import declare_model

        kw.setdefault("owner_name", "alice")
        kw.setdefault("owner_uid", 1000)
        return declare_model(self.settings, self.registry, name=name, source=source, **kw)

    def rewrite(self, **settings) -> None:
        write_config(self, **settings)

    def made_by_an_earlier_run(self, name: str, index: int = 0) -> Path:
        """Make the model path's directory and record it as weightkeeper's, as an interrupted run leaves it."""
        from sqlalchemy import update

        from weightkeeper.registry.schema import LocalPathRow

        entry = self.registry.get_model(name).local_paths[index]
        path = Path(entry.path)
        path.mkdir(parents=True)
        st = path.stat()
        with self.registry.engine.begin() as conn:
            conn.execute(update(LocalPathRow).where(LocalPathRow.id == entry.id).values(made=f"{st.st_dev}:{st.st_ino}"))
        return path


def write_config(env: Env, registry_url: str | None = None, workspaces: list[dict] | None = None,
                 s3: dict | None = None, **settings) -> None:
    lines = [f'home = "{env.root}"', f'registry_url = "{registry_url or env._registry_url}"']
    defaults = {"max_concurrent_downloads": 4, "lease_seconds": 5, "cleanup_retry_seconds": 0.2,
                "cleanup_retry_max_seconds": 1, "stop_timeout_seconds": 60,
                "check_interval_seconds": 0}  # every reconcile pass checks every copy (test_reconcile tests the cadence)
    defaults.update(settings)
    for key, value in defaults.items():
        lines.append(f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"')
    for ws in workspaces if workspaces is not None else env._workspaces:
        lines.append("[[workspaces]]")
        for key, value in ws.items():
            lines.append(f"{key} = " + ("true" if value is True else "false" if value is False else str(value)
                                        if isinstance(value, int) else f'"{value}"'))
    if s3 := s3 or getattr(env, "_s3", None):
        lines.append("[s3]")
        lines.extend(f"{key} = {str(value).lower()}" if isinstance(value, bool) else f'{key} = "{value}"'
                     for key, value in s3.items())
    env.config.write_text("\n".join(lines) + "\n")


@pytest.fixture
def wk(tmp_path, hub, monkeypatch, registry_base_url):
    """A weightkeeper with two public workspaces (team-a, team-b) and one private one, on the test Hub."""
    volumes = {name: tmp_path / "volumes" / name for name in ("team-a", "team-b", "private")}
    for v in volumes.values():
        v.mkdir(parents=True)
    env = Env(tmp_path, tmp_path / "config.toml", volumes)
    env._registry_url = registry_base_url or f"sqlite:///{tmp_path / 'registry.db'}"
    env._workspaces = [
        {"name": "team-a", "volume": str(volumes["team-a"])},
        {"name": "team-b", "volume": str(volumes["team-b"])},
        {"name": "private", "volume": str(volumes["private"]), "public": False, "owner": "alice"},
    ]
    write_config(env, hf_endpoint=hub.url)
    monkeypatch.setenv("WEIGHTKEEPER_CONFIG", str(env.config))
    if registry_base_url:
        _truncate(registry_base_url)
    return env


def tenants(tmp_path: Path, registry_base_url: str | None, users: dict[str, str]) -> Env:
    """A weightkeeper with one public workspace (team-a) and a private one each for alice and bob, and a
    `[[users]]` entry for each of `users` (token `<name>-token`, then the TOML lines given)."""
    volumes = {n: tmp_path / "volumes" / n for n in ("team-a", "alice-ws", "bob-ws")}
    for v in volumes.values():
        v.mkdir(parents=True)
    env = Env(tmp_path, tmp_path / "config.toml", volumes)
    env._registry_url = registry_base_url or f"sqlite:///{tmp_path / 'registry.db'}"
    env._workspaces = [{"name": "team-a", "volume": str(volumes["team-a"])},
                       {"name": "alice-ws", "volume": str(volumes["alice-ws"]), "public": False, "owner": "alice"},
                       {"name": "bob-ws", "volume": str(volumes["bob-ws"]), "public": False, "owner": "bob"}]
    env._s3 = {"bucket": "wk-staging", "prefix": "staging", "region": "us-east-1"}
    write_config(env)
    with open(env.config, "a") as f:
        for i, (user, lines) in enumerate(users.items()):
            f.write(f'[[users]]\nname = "{user}"\nuid = {1000 + i}\n'
                    f'token_sha256 = "{hashlib.sha256(f"{user}-token".encode()).hexdigest()}"\n{lines}')
    if registry_base_url:
        _truncate(registry_base_url)
    return env


def _truncate(url: str) -> None:
    from sqlalchemy import text

    from weightkeeper.registry import open_registry

    with open_registry(url).engine.begin() as conn:
        conn.execute(text("DELETE FROM leases"))
        conn.execute(text("DELETE FROM local_paths"))
        conn.execute(text("DELETE FROM artifacts"))
        conn.execute(text("DELETE FROM models"))
        conn.execute(text("DELETE FROM hub_budget"))


@pytest.fixture
def immutable():
    """Make a directory's entries impossible to remove, even for root (chattr +i), for a while."""

    @contextlib.contextmanager
    def hold(path: Path):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", str(path)], check=True)
            try:
                yield
            finally:
                subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            mode = path.stat().st_mode
            path.chmod(0o555)
            try:
                yield
            finally:
                path.chmod(mode)

    return hold


def tiny_files(seed: str, shards: int = 2, shard_size: int = 64 * 1024) -> dict[str, bytes]:
    """A small model repository: safetensors shards, configs, tokenizer, plus files never fetched."""
    import random

    def blob(tag: str, size: int) -> bytes:
        return random.Random(f"{seed}/{tag}").randbytes(size)

    files = {f"model-{i + 1:05d}-of-{shards:05d}.safetensors": blob(f"shard{i}", shard_size) for i in range(shards)}
    files.update({
        "config.json": b'{"model_type": "tiny"}\n',
        "tokenizer.json": b'{"version": "1.0"}\n',
        "tokenizer_config.json": b"{}\n",
        "README.md": b"# not fetched\n",
        "pytorch_model.bin": blob("bin", 4096),
        "original/consolidated.00.pth": blob("orig", 2048),
        "tf_model.h5": blob("h5", 1024),
    })
    return files


FETCHED = ("config.json", "tokenizer.json", "tokenizer_config.json")


def expected_size(files: dict[str, bytes]) -> int:
    return sum(len(v) for k, v in files.items() if k.endswith(".safetensors") or k in FETCHED)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server process (moto in server mode) on loopback, behind a fault-injecting proxy."""
    import boto3

    from s3proxy import S3Proxy

    port = free_port()
    log = open(SESSION_DIR / "s3-server.log", "ab")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    deadline = time.monotonic() + 60
    while True:
        try:
            client.list_buckets()
            break
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the S3 server did not start; see {log.name}") from None
            time.sleep(0.2)
    proxy = S3Proxy(url).start()
    yield client, proxy
    proxy.stop()
    stop(proc)


@dataclass
class S3:
    """One test's staging bucket: `client` talks to the S3 server directly, weightkeeper through `proxy`."""

    client: object
    proxy: object
    bucket: str
    prefix: str = "staging"

    def keys(self, prefix: str = "", bucket: str | None = None) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket or self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def put(self, key: str, body: bytes, bucket: str | None = None) -> None:
        self.client.put_object(Bucket=bucket or self.bucket, Key=key, Body=body)


@pytest.fixture
def s3(wk, hub, s3_server, monkeypatch):
    """S3 staging enabled for `wk`: a fresh bucket on the test S3 server, credentials in the environment."""
    client, proxy = s3_server
    proxy.reset()
    bucket = f"wk-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    env = S3(client, proxy, bucket)
    wk._s3 = {"bucket": bucket, "prefix": env.prefix, "endpoint_url": proxy.url, "region": "us-east-1"}
    write_config(wk, hf_endpoint=hub.url)
    return env


@pytest.fixture
def download_limit(wk):
    """The download limit, made afresh (for tests that count its slots): a process another test killed while it
    held a slot leaves its lease behind for up to a minute."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from weightkeeper.config import DOWNLOAD_LIMIT_NAME
    from weightkeeper.runtime import ensure_download_limit, slots_in_use

    with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
        client.delete_global_concurrency_limit_by_name(DOWNLOAD_LIMIT_NAME)
    ensure_download_limit(wk.settings)
    assert slots_in_use()[0] == 0
