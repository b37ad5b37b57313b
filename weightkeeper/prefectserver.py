"""The Prefect server weightkeeper starts: Prefect's own, with its SQLite writes queued instead of refused.

    python -m weightkeeper.prefectserver [options of `prefect server start` but --background]

Prefect's server opens its SQLite write transactions DEFERRED: one that has read and then meets
another connection's write fails at once with "database is locked" (the busy timeout cannot help a
stale read snapshot), answered 503, and Prefect's client sleeps 2 s. Here they begin IMMEDIATE: they
take the write lock first, so a second writer waits its turn under the busy timeout. PostgreSQL is
unaffected. Concurrency-slot leases are kept on disk (unless `PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE`
says otherwise), so a restart leaks no slot.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx

from weightkeeper.errors import WeightkeeperError

LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"
START_SECONDS = 90
PARENT_ENV = "WEIGHTKEEPER_PREFECT_SERVER_PARENT"  # set by `prefect_api`: the server exits when that process is gone


def queue_sqlite_writes() -> None:
    """Make the SQLite configuration of Prefect's server begin every write transaction IMMEDIATE."""
    from prefect.server.database import configurations

    @contextlib.asynccontextmanager
    async def begin_transaction(self, session, with_for_update: bool = False) -> AsyncIterator:
        token = configurations.SQLITE_BEGIN_MODE.set("IMMEDIATE")
        try:
            async with session.begin() as transaction:
                yield transaction
        finally:
            configurations.SQLITE_BEGIN_MODE.reset(token)

    configurations.AioSqliteConfiguration.begin_transaction = begin_transaction


def exit_with_parent(parent: int) -> None:
    """SIGTERM this process (uvicorn shuts down) once `parent` is no longer its parent: killed, it runs no
    `finally`, and a server in a session of its own gets no hang-up from the terminal either."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main() -> None:
    if {"--background", "-b"} & set(sys.argv[1:]):
        sys.exit("weightkeeper.prefectserver runs Prefect's server in this process: no --background")
    os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE", LEASE_STORAGE)
    if parent := os.environ.pop(PARENT_ENV, None):
        exit_with_parent(int(parent))
    queue_sqlite_writes()
    from prefect.cli import app

    sys.argv = ["prefect", "server", "start", *sys.argv[1:]]
    app()


def healthy(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`python -m <args>` in a session of its own, its output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL after 20 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_server(port: int, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`python -m weightkeeper.prefectserver` on 127.0.0.1:`port`, returned once it answers; stopped again if it
    does not start within START_SECONDS or the wait is interrupted."""
    server = spawn(["weightkeeper.prefectserver", "--host", "127.0.0.1", "--port", str(port)], log, env)
    try:
        deadline = time.monotonic() + START_SECONDS
        while not healthy(f"http://127.0.0.1:{port}/api"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise WeightkeeperError(f"the Prefect server did not start; see {log}")
            time.sleep(0.2)
    except BaseException:
        stop(server)
        raise
    return server


@contextlib.contextmanager
def prefect_api(home: Path, port: int | None = None) -> Iterator[str]:
    """The Prefect API URL, in effect for this context: `PREFECT_API_URL` if set, else a server started here
    (on `port`, or a free one; its log in `home/logs/prefect-server.log`) and stopped at exit, or when this
    process dies. It replaces Prefect's ephemeral server, which would run Prefect's stock SQLite transactions."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if url := PREFECT_API_URL.value():
        try:  # any answer will do: a Prefect Cloud workspace may want credentials even here
            httpx.get(f"{url}/health", timeout=5)
        except httpx.HTTPError as e:
            raise WeightkeeperError(f"the Prefect server at {url} (PREFECT_API_URL) does not answer: {e}") from None
        yield url
        return
    if port and not port_free(port):
        raise WeightkeeperError(f"port {port} is in use: to use the Prefect server there, set PREFECT_API_URL; "
                                f"else pick another port")
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/api"
    server = start_server(port, home / "logs" / "prefect-server.log",
                          dict(os.environ, **{PARENT_ENV: str(os.getpid())}))
    stop_server = functools.partial(stop, server)
    atexit.register(stop_server)  # also when an interrupt abandons a thread that is still inside this context
    try:
        with temporary_settings({PREFECT_API_URL: url}):
            try:
                yield url
            finally:
                _send_queued_logs_and_events()
    finally:
        stop_server()
        atexit.unregister(stop_server)


def _send_queued_logs_and_events() -> None:
    """Send the run logs and events still queued for the server before it stops (at exit, too late)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    EventsWorker.drain_all(timeout=5)


if __name__ == "__main__":
    main()
