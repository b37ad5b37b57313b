"""`weightkeeper serve`: everything needed to run weightkeeper from the Prefect UI, on schedules and over
the API, on one host: a Prefect server (`weightkeeper.prefectserver`, unless `PREFECT_API_URL` names one),
the download limit, the work pools, every deployment, one process worker per pool, and the REST API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from weightkeeper.config import Settings
from weightkeeper.errors import WeightkeeperError
from weightkeeper.prefectserver import prefect_api, spawn, stop


def start_workers(settings: Settings, api_url: str) -> list[subprocess.Popen]:
    """One process worker per work pool of this host (a Kubernetes pool's worker runs in its cluster:
    `weightkeeper kubernetes worker-manifests`)."""
    env = dict(os.environ, PREFECT_API_URL=api_url)
    if settings.config_path:
        env["WEIGHTKEEPER_CONFIG"] = str(settings.config_path)
    return [spawn(["prefect", "worker", "start", "--pool", pool, "--type", "process", "--name", f"{pool}-worker"],
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
    with prefect_api(settings.home, port) as url:
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
                stop(worker)
    return 0
