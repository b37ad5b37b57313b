"""`weightkeeper serve`: everything needed to run weightkeeper from the Prefect UI, on schedules and over
the API, on one host: a Prefect server (started unless `PREFECT_API_URL` names one), the download limit,
the work pools, every deployment, one process worker per pool, and the REST API."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from prefect.settings import PREFECT_API_URL, temporary_settings

from weightkeeper.config import Settings
from weightkeeper.errors import WeightkeeperError

SERVER_START_SECONDS = 90


def _healthy(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


@contextlib.contextmanager
def prefect_server(settings: Settings, port: int) -> Iterator[str]:
    """The Prefect API URL: `PREFECT_API_URL` if set, else a server started here (with the filesystem lease
    storage that `weightkeeper.cli.main` sets, so a restart leaks no concurrency slot)."""
    if url := PREFECT_API_URL.value():
        if not _healthy(url):
            raise WeightkeeperError(f"the Prefect server at {url} (PREFECT_API_URL) does not answer")
        yield url
        return
    url = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ)
    log = settings.home / "logs" / "prefect-server.log"
    server = _spawn(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], log, env)
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not _healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise WeightkeeperError(f"the Prefect server did not start; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        _stop(server)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


def start_workers(settings: Settings, api_url: str) -> list[subprocess.Popen]:
    """One process worker per work pool of this host (a Kubernetes pool's worker runs in its cluster:
    `weightkeeper kubernetes worker-manifests`)."""
    env = dict(os.environ, PREFECT_API_URL=api_url)
    if settings.config_path:
        env["WEIGHTKEEPER_CONFIG"] = str(settings.config_path)
    return [_spawn(["prefect", "worker", "start", "--pool", pool, "--type", "process", "--name", f"{pool}-worker"],
                   settings.home / "logs" / f"worker-{pool}.log", env)
            for pool in settings.pools if pool not in settings.kubernetes_pools]


def serve(settings: Settings, port: int, api_host: str, api_port: int | None) -> int:
    """Serve until interrupted; the API in the foreground unless `api_port` is None."""
    import uvicorn

    from weightkeeper.api import create_app
    from weightkeeper.deployments import apply_deployments

    # A supervisor stops services with SIGTERM; make it unwind the `finally`s so no worker or server is left
    # behind (uvicorn re-raises the signal after its own shutdown, which would otherwise kill us on the spot).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with prefect_server(settings, port) as url, temporary_settings({PREFECT_API_URL: url}):
        names = apply_deployments(settings)
        workers = start_workers(settings, url)
        print(f"Prefect API {url}; deployments: {', '.join(names)}; workers for {', '.join(settings.pools)} "
              f"(logs in {settings.home / 'logs'})", flush=True)
        try:
            if api_port is None:
                while all(w.poll() is None for w in workers):
                    time.sleep(1)
                raise WeightkeeperError(f"a worker exited; see {settings.home / 'logs'}")
            uvicorn.run(create_app(settings), host=api_host, port=api_port, log_level="info")
        finally:
            for worker in workers:
                _stop(worker)
    return 0
