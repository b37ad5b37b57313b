"""`weightkeeper serve`: everything needed to run weightkeeper from the Prefect UI, on schedules and over
the API, on one host: a Prefect server (`weightkeeper.prefectserver`, unless `PREFECT_API_URL` names one),
the download limit, the work pools, every deployment, a run-limited process worker per work queue, and the
REST API.

The Prefect server holds Secret blocks and starts any deployment: it requires, on loopback too, the credential
of `weightkeeper.prefectserver.prefect_credential`, which the workers and this process's own clients get in their
environment or settings, never on a command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from weightkeeper.config import Settings
from weightkeeper.errors import InvalidInputError, WeightkeeperError
from weightkeeper import EXIT_WITH_PARENT_ENV
from weightkeeper.prefectserver import AUTH_ENV, AUTH_FILE, LOOPBACK, port_free, prefect_api, spawn, stop

WORKER_QUERY_SECONDS = 2  # Prefect's default, 10 s, leaves a freed run slot idle that long
API_STOP_SECONDS = 10  # requests still open this long after a stop signal are cancelled (a client may never finish one)


def start_workers(settings: Settings) -> list[subprocess.Popen]:
    """One process worker per work queue of each work pool of this host (a Kubernetes pool's worker runs in its
    cluster: `weightkeeper kubernetes worker-manifests`), each running at most `worker_run_limit` flow runs at
    once (a burst waits in the queue) and polling it every WORKER_QUERY_SECONDS unless the operator set
    `PREFECT_WORKER_QUERY_SECONDS`. They inherit the Prefect API URL and credential `prefect_api` put in the
    environment."""
    from weightkeeper.deployments import worker_queues

    env = dict(os.environ, **{EXIT_WITH_PARENT_ENV: str(os.getpid())})  # they, and their runs, end with their parent
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", str(WORKER_QUERY_SECONDS))
    if settings.config_path:
        env["WEIGHTKEEPER_CONFIG"] = str(settings.config_path)
    workers: list[subprocess.Popen] = []
    try:  # an interrupt half-way stops those already started
        for pool, queue in worker_queues(settings):
            if pool not in settings.kubernetes_pools:
                workers.append(spawn(["weightkeeper.worker", "--pool", pool, "--work-queue", queue, "--type", "process",
                                      "--limit", str(settings.worker_run_limit), "--name", f"{pool}-{queue}-worker"],
                                     settings.home / "logs" / f"worker-{pool}-{queue}.log", env))
    except BaseException:
        stop(*workers)
        raise
    return workers


def _stop_signal(signum, frame) -> None:
    """The first SIGTERM or SIGINT unwinds serve, whose `finally`s stop what it started; later ones are ignored, so
    that a second Ctrl-C or a supervisor's repeated SIGTERM cannot cut that short and leave workers running."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(0)


def _hang_up(signum, frame) -> None:
    """SIGHUP (its terminal closed, a supervisor's reload) stops serve as SIGTERM does, through whatever handles SIGTERM
    now (uvicorn's while the API runs, which hands it on to `_stop_signal`): by default it would kill serve on the spot,
    no `finally` run, its workers and Prefect server left to their parent watch."""
    os.kill(os.getpid(), signal.SIGTERM)


def _serve_api(app, host: str, port: int, workers: list[subprocess.Popen], logs) -> None:
    """The API in the foreground until interrupted, or until a worker exits: then serve exits with an error (nothing
    would run what the API starts), for its supervisor to start it again."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info",
                                           timeout_graceful_shutdown=API_STOP_SECONDS))

    def watch() -> None:
        while not server.should_exit:
            if any(w.poll() is not None for w in workers):
                server.should_exit = True
            time.sleep(1)

    threading.Thread(target=watch, name="worker-watch", daemon=True).start()
    server.run()
    if any(w.poll() is not None for w in workers):
        raise WeightkeeperError(f"a worker exited; see {logs}")
    if not server.started:
        raise WeightkeeperError(f"the API did not start on {host}:{port}; see the lines above")


def serve(settings: Settings, port: int, api_host: str, api_port: int | None, prefect_host: str | None = None) -> int:
    """Serve until interrupted; the API in the foreground unless `api_port` is None. The Prefect server started
    here listens on `prefect_host` (default loopback) and requires its credential."""
    from prefect.settings import PREFECT_API_URL

    from weightkeeper.api import create_app
    from weightkeeper.deployments import apply_deployments

    if PREFECT_API_URL.value() and prefect_host:
        raise InvalidInputError("--prefect-host sets up the Prefect server that serve starts, but PREFECT_API_URL "
                                "names one: unset it, or drop the option")
    if api_port is not None and not port_free(api_port, api_host):  # found last, it would stop all started before
        raise WeightkeeperError(f"cannot listen on {api_host}:{api_port} for the API (in use: another serve?); stop "
                                "what listens there, or pick another --api-port")
    # A supervisor stops services with SIGTERM; make it unwind the `finally`s so no worker or server is left
    # behind (uvicorn re-raises the signal after its own shutdown, which would otherwise kill us on the spot).
    signal.signal(signal.SIGTERM, _stop_signal)
    signal.signal(signal.SIGINT, _stop_signal)
    signal.signal(signal.SIGHUP, _hang_up)
    note = _credential_note(settings, bool(PREFECT_API_URL.value()))  # before prefect_api sets $PREFECT_API_AUTH_STRING
    logs = settings.home / "logs"
    with prefect_api(settings.home, port, prefect_host or LOOPBACK) as url:
        names = apply_deployments(settings)
        workers = start_workers(settings)
        try:
            print(f"Prefect API {url}{note}; deployments: {', '.join(names)}; workers for "
                  f"{', '.join(settings.pools)} (logs in {logs})", flush=True)
            if api_port is None:
                while all(w.poll() is None for w in workers):
                    time.sleep(1)
                raise WeightkeeperError(f"a worker exited; see {logs}")
            _serve_api(create_app(settings), api_host, api_port, workers, logs)
        finally:
            stop(*workers)
    return 0


def _credential_note(settings: Settings, named: bool) -> str:
    """Where the credential comes from (never the credential): the operator's `PREFECT_API_AUTH_STRING`, else for
    the server started here its file; nothing for a server `PREFECT_API_URL` names (`named`)."""
    if os.environ.get(AUTH_ENV):
        return f" (credential: ${AUTH_ENV})"
    return "" if named else f" (credential: {settings.home / AUTH_FILE})"
