"""The Prefect server weightkeeper starts: Prefect's own, with its SQLite writes queued instead of refused.

    python -m weightkeeper.prefectserver [options of `prefect server start` but --background]

Prefect's server opens its SQLite write transactions DEFERRED: one that has read and then meets
another connection's write fails at once with "database is locked" (the busy timeout cannot help a
stale read snapshot), answered 503, and Prefect's client sleeps 2 s. Here they begin IMMEDIATE: they
take the write lock first, so a second writer waits its turn under the busy timeout; the server refuses
to start if Prefect no longer honours that (bench/prefect_sqlite.py measures it). PostgreSQL is
unaffected. Concurrency-slot leases are kept on disk (unless `PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE`
says otherwise), so a restart leaks no slot. Task-run states, which clients send as events, are written
in batches of up to 50 at least every second (unless `PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_*` say
otherwise) rather than one transaction per event: a task run costs the server about a quarter of the
CPU, and shows in the UI up to a second later.

`prefect_api` starts it with its Prefect home (database, leases) under weightkeeper's home, so homes
share nothing, and points every Prefect client of the process, in any thread, and every process it
starts, at it, with Prefect's temporary server disabled.

Authentication: Prefect's basic auth (`PREFECT_SERVER_API_AUTH_STRING` on the server, `PREFECT_API_AUTH_STRING`
in clients). The server `prefect_api` starts always requires it, on loopback too (whoever reaches the port reads
every Secret block), with the credential of `prefect_credential`, passed to processes in their environment only;
`start_server` refuses to listen beyond loopback without it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx

from weightkeeper.anchored import Dir
from weightkeeper.errors import WeightkeeperError, redact_urls
from weightkeeper.watchdog import ORPHANED

LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"
TASK_RUN_BATCHES = {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "50",
                    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1"}
START_SECONDS = 90
KILL_AFTER_SECONDS = 60  # a process whose parent is gone gets this long to end after SIGTERM
PARENT_ENV = "WEIGHTKEEPER_PREFECT_SERVER_PARENT"  # set by `prefect_api`: the server exits when that process is gone
LOOPBACK = "127.0.0.1"
AUTH_ENV = "PREFECT_API_AUTH_STRING"  # the operator's credential, if set; what Prefect clients send
SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"  # what Prefect's server requires
AUTH_FILE = "prefect-auth"  # under weightkeeper's home: the credential generated when the operator set none
PREFECT_DIR = "prefect"  # under weightkeeper's home: the Prefect home of the server started here
NO_TEMPORARY_SERVER = {"PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false"}  # a client without an API URL fails


def queue_sqlite_writes() -> None:
    """Make the SQLite configuration of Prefect's server begin every write transaction IMMEDIATE; a
    WeightkeeperError if Prefect no longer honours it."""
    import prefect
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
    if not writes_take_the_lock_first():
        raise WeightkeeperError(f"Prefect {prefect.__version__} no longer begins its server's SQLite write "
                                f"transactions as weightkeeper.prefectserver sets them (IMMEDIATE): use the Prefect "
                                f"version weightkeeper pins, or run a Prefect server on PostgreSQL and set "
                                f"PREFECT_API_URL")


def writes_take_the_lock_first() -> bool:
    """Whether a write transaction of Prefect's SQLite configuration holds the database's write lock from its
    first statement, so that another writer waits (checked on a scratch database)."""
    import asyncio
    import sqlite3
    import tempfile

    import sqlalchemy as sa
    from prefect.server.database.configurations import AioSqliteConfiguration

    async def check(path: str) -> bool:
        config = AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{path}")
        engine = await config.engine()
        try:
            async with await config.session(engine) as session, config.begin_transaction(session):
                await session.execute(sa.text("SELECT 1"))  # reads nothing: only the BEGIN can lock
                other = sqlite3.connect(path, timeout=0, isolation_level=None)
                try:
                    other.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError:  # database is locked
                    return True
                finally:
                    other.close()
                return False
        finally:
            await engine.dispose()

    with tempfile.TemporaryDirectory(prefix="weightkeeper-sqlite-check-") as scratch:
        return asyncio.run(check(f"{scratch}/check.db"))


def exit_with_parent(parent: int) -> None:
    """SIGTERM this process (uvicorn shuts down, a flow run stops) once `parent` is no longer its parent (at
    once if it is not now), SIGKILL if it still runs KILL_AFTER_SECONDS later: killed, a parent runs no
    `finally`, and a process in a session of its own gets no hang-up from the terminal either."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        ORPHANED.set()  # every fetch stops, in whichever thread it runs
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(KILL_AFTER_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main() -> None:
    if {"--background", "-b"} & set(sys.argv[1:]):
        sys.exit("weightkeeper.prefectserver runs Prefect's server in this process: no --background")
    os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE", LEASE_STORAGE)
    for name, value in TASK_RUN_BATCHES.items():
        os.environ.setdefault(name, value)
    if parent := os.environ.pop(PARENT_ENV, None):
        exit_with_parent(int(parent))
    try:
        queue_sqlite_writes()
    except WeightkeeperError as e:
        sys.exit(f"error: {e}")
    from prefect.cli import app

    sys.argv = ["prefect", "server", "start", *sys.argv[1:]]
    app()


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; any other host (0.0.0.0, a name, an address) is reachable from
    elsewhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prefect_credential(home: Path) -> str:
    """The credential (`user:password`) of the Prefect server started here: `PREFECT_API_AUTH_STRING` if the
    operator set it, else `home/prefect-auth`, generated once (random, mode 0600). Never printed or logged."""
    if value := os.environ.get(AUTH_ENV):
        return value
    path = home / AUTH_FILE
    home.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_credential(path)
    value = f"weightkeeper:{secrets.token_urlsafe(32)}"
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return value


def _read_credential(path: Path) -> str:
    problem = f"the Prefect credential {path} must be a regular file of this user with mode 0600"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise WeightkeeperError(f"{problem}: {e.strerror}; remove it and a new one is made") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise WeightkeeperError(f"{problem}: chmod 600 it, or remove it and a new one is made")
        value = f.read().strip()
    if not value:
        raise WeightkeeperError(f"the Prefect credential {path} is empty; remove it and a new one is made")
    return value


def connect_host(host: str) -> str:
    """The address clients on this machine use for a server listening on `host` (a wildcard: loopback)."""
    if host in ("0.0.0.0", ""):
        return LOOPBACK
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def healthy(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`python -m <args>` in a session of its own, its output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop(*procs: subprocess.Popen) -> None:
    """SIGTERM to each process group at once, then SIGKILL to those still running 20 s later (one deadline)."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start_server(port: int, log: Path, env: dict[str, str], host: str = LOOPBACK) -> subprocess.Popen:
    """`python -m weightkeeper.prefectserver` on `host`:`port`, returned once it answers; stopped again if it
    does not start within START_SECONDS or the wait is interrupted. Beyond loopback only with a credential
    (`PREFECT_SERVER_API_AUTH_STRING` in `env`)."""
    if not is_loopback(host) and not env.get(SERVER_AUTH_ENV):
        raise WeightkeeperError(f"refusing to start the Prefect server on {host} without authentication: "
                                f"{SERVER_AUTH_ENV} is not set; listen on 127.0.0.1 or set it")
    server = spawn(["weightkeeper.prefectserver", "--host", host, "--port", str(port)], log, env)
    try:
        deadline = time.monotonic() + START_SECONDS
        while not healthy(f"http://{connect_host(host)}:{port}/api"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise WeightkeeperError(f"the Prefect server did not start; see {log}")
            time.sleep(0.2)
    except BaseException:
        stop(server)
        raise
    return server


@contextlib.contextmanager
def prefect_api(home: Path, port: int | None = None, host: str = LOOPBACK) -> Iterator[str]:
    """The Prefect API URL, in effect for this context (`clients_use`): `PREFECT_API_URL` if set, else a server
    started here (on `host`:`port`, or a free loopback port; its Prefect home `home/prefect`, its log
    `home/logs/prefect-server.log`) and stopped at exit, or when this process dies. It replaces Prefect's
    temporary server, which would run Prefect's stock SQLite transactions in `~/.prefect`, shared by every home.
    The server requires `prefect_credential`; clients in this context send it."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_PROFILES_PATH

    if url := PREFECT_API_URL.value():
        try:  # any answer will do: a Prefect Cloud workspace may want credentials even here
            httpx.get(f"{url}/health", timeout=5)
        except httpx.HTTPError as e:
            raise WeightkeeperError(f"the Prefect server at {redact_urls(url)} (PREFECT_API_URL) does not answer: "
                                    f"{redact_urls(str(e))}") from None
        with clients_use(url, PREFECT_API_AUTH_STRING.value()):
            yield url
        return
    if port and not port_free(port, host):
        raise WeightkeeperError(f"port {port} is in use: to use the Prefect server there, set PREFECT_API_URL; "
                                f"else pick another port")
    port = port or free_port()
    url = f"http://{connect_host(host)}:{port}/api"
    _private(home / PREFECT_DIR)
    env = dict(os.environ, **{PARENT_ENV: str(os.getpid())}, PREFECT_HOME=str(home / PREFECT_DIR),
               PREFECT_PROFILES_PATH=str(PREFECT_PROFILES_PATH.value()))  # the operator's profile still applies
    env.setdefault("PREFECT_UI_API_URL", "/api")  # the UI asks the server that serves it, whatever its address
    credential = env[SERVER_AUTH_ENV] = prefect_credential(home)  # on loopback too: other users may reach it
    server = start_server(port, home / "logs" / "prefect-server.log", env, host)
    stop_server = functools.partial(stop, server)
    atexit.register(stop_server)  # also when an interrupt abandons a thread that is still inside this context
    try:
        with clients_use(url, credential, client_environment(url, home)):
            try:
                yield url
            finally:
                _send_queued_logs_and_events()
    finally:
        stop_server()
        atexit.unregister(stop_server)


def _private(directory: Path) -> None:
    """Make the server's Prefect home the operator's alone (0700, also one an earlier version left open): its
    database holds the Secret blocks and the key they are encrypted with."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.lstat().st_mode) & 0o077:
        directory.chmod(0o700)


def client_environment(url: str, home: Path) -> dict[str, str]:
    """Settings that spare the clients of the Prefect server started here (at `url`, plain HTTP) work they do for
    nothing. Prefect's client loads a bundle of CA certificates (`SSL_CERT_FILE`, else certifi's ~150) into a TLS
    context for every client it makes (18 ms of CPU; a model's lifecycle makes about 7), which plain HTTP never
    uses: it is given a bundle of one certificate (`home/prefect/unused-ca.pem`) instead. The server has no CSRF
    protection (unless `PREFECT_SERVER_CSRF_PROTECTION_ENABLED`), so its clients do not ask it for a token first
    (one request per client)."""
    values = {}
    if url.startswith("http://"):
        values["PREFECT_API_SSL_CERT_FILE"] = str(_unused_ca_bundle(home / PREFECT_DIR))
    protected = os.environ.get("PREFECT_SERVER_CSRF_PROTECTION_ENABLED", "").lower() in ("1", "true", "yes")
    if not protected and "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED" not in os.environ:
        values["PREFECT_CLIENT_CSRF_SUPPORT_ENABLED"] = "false"
    return values


def _unused_ca_bundle(directory: Path) -> Path:
    """A bundle of one CA certificate (certifi's first), written once: loads in under a millisecond."""
    import re

    import certifi

    path = directory / "unused-ca.pem"
    if not path.is_file():
        first = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n",
                          Path(certifi.where()).read_text(), re.S)
        with Dir.root(directory, create=True) as home:
            home.write_atomic(path.name, first.group(0).encode())
    return path


@contextlib.contextmanager
def clients_use(url: str, credential: str | None, settings: dict[str, str] | None = None) -> Iterator[None]:
    """Every Prefect client of this process, in any thread, and every process it starts use the server at `url`
    (sending `credential`), and none starts Prefect's temporary server. Prefect's settings are context variables:
    a thread started without this context would otherwise find no API URL and start a temporary server, which
    outlives a killed command. So they are also set in the environment, and Prefect's process-wide settings
    (what such a thread sees) reread from it; after this context a late client fails instead. `settings`
    (`client_environment`) apply for the context too."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE
    from prefect.settings import temporary_settings

    values = {"PREFECT_API_URL": url, **({AUTH_ENV: credential} if credential else {}), **(settings or {})}
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values, **NO_TEMPORARY_SERVER)  # the latter stays
    refresh_global_settings_context()
    try:
        with temporary_settings({PREFECT_API_URL: url, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE: False,
                                 **({PREFECT_API_AUTH_STRING: credential} if credential else {})}):
            yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        refresh_global_settings_context()


def _send_queued_logs_and_events() -> None:
    """Send the run logs and events still queued for the server before it stops (at exit, too late)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    EventsWorker.drain_all(timeout=5)


if __name__ == "__main__":
    main()
