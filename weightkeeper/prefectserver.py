"""The Prefect server weightkeeper starts: Prefect's own, with its SQLite writes queued instead of refused.

    python -m weightkeeper.prefectserver [options of `prefect server start`, but --background, --workers]

Prefect's server opens its SQLite write transactions DEFERRED: one that has read and then meets
another connection's write fails at once with "database is locked" (SQLite's busy timeout cannot
help a stale read snapshot). Prefect answers that with a 503, and its client sleeps 2 s before
trying again; on this machine that stalled 8 of 20 tiny model creations by 2 s. Run here, write
transactions begin IMMEDIATE: they take the write lock first, so a second writer waits its turn
under the busy timeout. PostgreSQL is unaffected. The server also keeps concurrency-slot leases on
disk (unless `PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE` says otherwise), so a restart leaks no slot.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx

from weightkeeper.errors import WeightkeeperError

LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"
START_SECONDS = 90
OTHER_PROCESSES = {"--background", "-b", "--workers"}  # options that would run the server without the patch


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


def main() -> None:
    if OTHER_PROCESSES & {arg.split("=")[0] for arg in sys.argv[1:]}:
        sys.exit("weightkeeper.prefectserver runs Prefect's server in this process: no --background or --workers")
    os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE", LEASE_STORAGE)
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
        os.killpg(proc.pid, 15)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


@contextlib.contextmanager
def prefect_api(home: Path, port: int | None = None) -> Iterator[str]:
    """The Prefect API URL, in effect for this context: `PREFECT_API_URL` if set, else a server started here
    (on `port`, or a free one; its log in `home/logs/prefect-server.log`) and stopped at exit. It replaces
    Prefect's ephemeral server, which would run with Prefect's stock SQLite transactions."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if url := PREFECT_API_URL.value():
        if not healthy(url):
            raise WeightkeeperError(f"the Prefect server at {url} (PREFECT_API_URL) does not answer")
        yield url
        return
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = home / "logs" / "prefect-server.log"
    server = spawn(["weightkeeper.prefectserver", "--host", "127.0.0.1", "--port", str(port)], log, dict(os.environ))
    stop_server = functools.partial(stop, server)
    atexit.register(stop_server)  # also when this context is left in a thread that an interrupt abandons
    try:
        deadline = time.monotonic() + START_SECONDS
        while not healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise WeightkeeperError(f"the Prefect server did not start; see {log}")
            time.sleep(0.2)
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
