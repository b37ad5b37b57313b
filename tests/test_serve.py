"""`weightkeeper serve` as an operator runs it: one command sets up the limit, the pools and every deployment,
starts a worker per pool and the API, and leaves nothing running once a supervisor stops it (SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
from conftest import write_config
from served import wait_until

from weightkeeper.prefectserver import free_port


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def processes(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout.split()


def test_serve_sets_everything_up_and_stops_cleanly(wk):
    from prefect.client.orchestration import get_client

    workspaces = [{**ws, "work_pool": f"serve-{ws['name']}"} for ws in wk._workspaces]
    write_config(wk, workspaces=workspaces, work_pool="serve-control", max_concurrent_downloads=3)
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "serve", "--api-port", str(port)],
                             env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert serve.stdout.readline().startswith(f"Prefect API {os.environ['PREFECT_API_URL']}")
        wait_until(lambda: status(f"http://127.0.0.1:{port}/api/v1/models") == 401, 60, "the API")
        with get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name("weightkeeper-downloads").limit == 3
            for pool in ("serve-control", "serve-team-a", "serve-team-b", "serve-private"):
                assert client.read_work_pool(pool).type == "process"
            for name, pool in [("ensure-model/ensure-model", "serve-control"), ("reconcile/reconcile", "serve-control"),
                               ("download-to-path/serve-team-a", "serve-team-a"),
                               ("clean-path/serve-private", "serve-private")]:
                assert client.read_deployment_by_name(name).work_pool_name == pool
            assert client.read_deployment_by_name("reconcile/reconcile").schedules
        wait_until(lambda: all(processes(f"--pool {pool} ") for pool in ("serve-control", "serve-team-b")), 60,
                   "a worker per pool")
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
    assert processes("--pool serve-") == []  # no worker outlives it
