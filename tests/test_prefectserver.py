"""The Prefect server weightkeeper starts (`weightkeeper.prefectserver`): concurrent writes wait their turn on
SQLite instead of failing, or it refuses to start; the embedded default (`weightkeeper demo`, no
`PREFECT_API_URL`) starts one, runs the whole lifecycle against it and stops it; each home keeps its own under
it; every client of the process uses it and none starts Prefect's temporary server; it never outlives the
process that started it; beyond loopback it requires a credential (the served case: tests/test_serve.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import certifi
import httpx
import pytest
from conftest import tiny_files
from served import wait_until

from weightkeeper.errors import WeightkeeperError
from weightkeeper.prefectserver import (
    PARENT_ENV,
    free_port,
    healthy,
    is_loopback,
    prefect_api,
    prefect_credential,
    queue_sqlite_writes,
    start_server,
    stop,
    writes_take_the_lock_first,
)

# Run as `python -c STARTER HOME [wait]`: the embedded server of HOME, a flow made there, then what a thread
# started without the context (as a lease renewer is) and a child process see; with `wait`, it stays up.
STARTER = """import json, os, pathlib, subprocess, sys, threading, time
from prefect.client.orchestration import get_client
from weightkeeper.prefectserver import prefect_api
home = pathlib.Path(sys.argv[1])
with prefect_api(home) as api:
    with get_client(sync_client=True) as client:
        client.create_flow_from_name(f"made-in-{home.name}")
    seen = {}
    def look():
        from prefect.settings import get_current_settings
        with get_client(sync_client=True) as client:
            seen.update(api=str(client.api_url).rstrip("/"), flows=sorted(f.name for f in client.read_flows()))
        settings = get_current_settings()
        seen.update(cafile=settings.api.ssl_cert_file, csrf=settings.client.csrf_support_enabled)
    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('PREFECT_API_URL'), "
                            "os.environ.get('PREFECT_SERVER_ALLOW_EPHEMERAL_MODE'), "
                            "os.environ.get('PREFECT_API_SSL_CERT_FILE'), "
                            "os.environ.get('PREFECT_CLIENT_CSRF_SUPPORT_ENABLED'))"], capture_output=True, text=True)
    print(json.dumps(dict(seen, url=api, child=child.stdout.split())), flush=True)
    if sys.argv[2:] == ["wait"]:
        time.sleep(600)
"""


def without_prefect_api_url(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "WEIGHTKEEPER_CONFIG")}
    return dict(env, PREFECT_HOME=str(tmp_path / "prefect-home"), TMPDIR=str(tmp_path), COLUMNS="200")


def processes_naming(text: str) -> dict[int, str]:
    """The processes but this one whose command line or environment names `text`: {pid: command line}."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline, environ = (proc / "cmdline").read_bytes(), (proc / "environ").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if text.encode() in cmdline + environ:
            found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


@contextlib.contextmanager
def leaving_nothing_that_names(path: Path) -> Iterator[None]:
    """A test that fails leaves no process behind: SIGKILL to those that name `path` (`processes_naming`)."""
    try:
        yield
    finally:
        for pid in processes_naming(str(path)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def temporary_servers(processes: dict[int, str]) -> list[str]:
    """Prefect's temporary servers among `processes` (how `SubprocessASGIServer` starts them)."""
    return [cmdline for cmdline in processes.values() if "prefect.server.api.server:create_app" in cmdline]


@pytest.mark.without_prefect_server
def test_the_sqlite_write_patch_holds_or_the_server_refuses_to_start(monkeypatch):
    """The premise of `queue_sqlite_writes`, checked against the installed Prefect: with it, a write transaction
    holds the write lock from its first statement (another writer waits); with Prefect's own DEFERRED begin it
    does not. `queue_sqlite_writes` raises when the check fails, and the server then exits with that error.
    bench/prefect_sqlite.py measures what the patch is worth."""
    from prefect.server.database.configurations import AioSqliteConfiguration

    # setting it to itself makes monkeypatch put Prefect's own back after the test
    monkeypatch.setattr(AioSqliteConfiguration, "begin_transaction", AioSqliteConfiguration.begin_transaction)
    assert not writes_take_the_lock_first()
    queue_sqlite_writes()
    assert writes_take_the_lock_first()
    monkeypatch.setattr(AioSqliteConfiguration, "begin_sqlite_stmt", lambda self, conn: None)  # ignores the mode
    with pytest.raises(WeightkeeperError, match=r"Prefect \S+ no longer begins its server's SQLite write transactions "
                                                r"as weightkeeper.prefectserver sets them \(IMMEDIATE\)"):
        queue_sqlite_writes()


def test_concurrent_writes_wait_their_turn_instead_of_failing_with_a_locked_database():
    """Flow runs created and moved through their states from 8 clients at once, with no client retries: Prefect's
    stock SQLite transactions answer some of these with 503 ("database is locked"); this server answers all."""
    api = os.environ["PREFECT_API_URL"]
    flow = httpx.post(f"{api}/flows/", json={"name": "write-contention"}, timeout=30).json()["id"]
    codes: list[int] = []

    def client() -> None:
        with httpx.Client(base_url=api, timeout=60) as c:
            for _ in range(5):
                run = c.post("/flow_runs/", json={"flow_id": flow, "state": {"type": "PENDING"}})
                codes.append(run.status_code)
                for state in ("RUNNING", "COMPLETED") if run.status_code == 201 else ():
                    codes.append(c.post(f"/flow_runs/{run.json()['id']}/set_state",
                                        json={"state": {"type": state}}).status_code)

    threads = [threading.Thread(target=client) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        httpx.delete(f"{api}/flows/{flow}", timeout=30)  # and its runs: other tests read recent runs
    assert Counter(codes) == {201: 8 * 5 * 3}


def test_the_demo_starts_its_own_prefect_server_runs_the_lifecycle_and_stops_it(tmp_path):
    demo = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "demo", "--offline"], cwd=tmp_path,
                          env=without_prefect_api_url(tmp_path), capture_output=True, text=True, timeout=240)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "demo complete" in out and "registry: 0 model(s) left" in out
    assert "1. declare model demo" in out and "[bold]" not in out  # the console shows no markup: the demo's neither
    assert "made a new, empty registry" not in out  # its registry is the default under its home: new by design
    assert "Error logging to API" not in out  # run logs were sent before the server stopped
    assert len(list(tmp_path.glob("weightkeeper-demo-*/prefect/prefect.db"))) == 1  # a server of its own, in its home
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()
    ui = re.search(r"Prefect UI at (http://127\.0\.0\.1:\d+)", out)
    assert ui, out
    with pytest.raises(httpx.ConnectError):  # stopped with the demo
        httpx.get(f"{ui.group(1)}/api/health", timeout=2)


def test_each_home_keeps_its_own_prefect_server_under_it_and_sees_only_its_own_runs(tmp_path):
    """Two homes one after the other, with no Prefect home set: each server's database is under its home, none in
    ~/.prefect, and neither sees the other's flows (artifacts such as `paths-<model>` would collide). It holds the
    Secret blocks and their key: another user of the host (nobody) cannot read it, though an earlier version left
    home-b's open."""
    env = {k: v for k, v in without_prefect_api_url(tmp_path).items() if k != "PREFECT_HOME"}
    env["HOME"] = str(tmp_path / "user")
    (tmp_path / "user").mkdir()
    homes = Path(tempfile.mkdtemp(prefix="wk-homes-", dir="/var/tmp"))  # a place other users may walk through
    try:
        homes.chmod(0o755)
        (homes / "home-b" / "prefect").mkdir(parents=True, mode=0o755)
        for name in ("home-a", "home-b"):
            out = subprocess.run([sys.executable, "-c", STARTER, str(homes / name)], env=env, capture_output=True,
                                 text=True, timeout=240)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["flows"] == [f"made-in-{name}"]
            database = homes / name / "prefect" / "prefect.db"
            assert database.exists() and stat.S_IMODE(database.parent.stat().st_mode) == 0o700
            (homes / name).chmod(0o755)
            other = subprocess.run([sys.executable, "-c", "import os, sys; os.setgid(65534); os.setuid(65534); "
                                    "open(sys.argv[1], 'rb').read(1)", str(database)], capture_output=True, text=True)
            assert other.returncode != 0 and "PermissionError" in other.stderr
    finally:
        shutil.rmtree(homes)
    assert not (tmp_path / "user" / ".prefect" / "prefect.db").exists()


def test_clients_of_the_server_started_here_load_one_ca_certificate_and_ask_no_csrf_token(tmp_path):
    """Plain HTTP on loopback uses no TLS and the server no CSRF protection: every client of the process (a thread
    started without the context too) and every child is given a one-certificate bundle under the home, not the
    machine's (`SSL_CERT_FILE`) or certifi's (18 ms each), and asks for no CSRF token; its runs still work."""
    env = dict(without_prefect_api_url(tmp_path), SSL_CERT_FILE=certifi.where())
    out = subprocess.run([sys.executable, "-c", STARTER, str(tmp_path / "home")], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    bundle = tmp_path / "home" / "prefect" / "unused-ca.pem"
    assert seen["flows"] == ["made-in-home"] and seen["cafile"] == str(bundle) and seen["csrf"] is False
    assert seen["child"][2:] == [str(bundle), "false"]
    assert bundle.read_text().count("BEGIN CERTIFICATE") == 1
    assert ssl.create_default_context(cafile=str(bundle)).cert_store_stats()["x509_ca"] == 1


def test_the_server_started_here_records_task_runs_in_batches_flushed_every_second():
    """Task-run states arrive as events; the server started here (the session's) writes them 50 at a time, at
    least every second, not one transaction per event, as its own settings say."""
    settings = httpx.get(f"{os.environ['PREFECT_API_URL']}/admin/settings", timeout=10).json()
    recorder = settings["server"]["services"]["task_run_recorder"]
    assert (recorder["batch_size"], recorder["flush_interval"]) == (50, 1)


def test_the_server_stops_when_the_process_that_started_it_is_killed(tmp_path):
    """...and while it runs, a thread started without the context (as a lease renewer is) and a child process use
    it, with Prefect's temporary server disabled: no temporary server is started to outlive the process."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path / "home"), "wait"],
                               env=without_prefect_api_url(tmp_path), stdout=subprocess.PIPE, text=True)
    with leaving_nothing_that_names(tmp_path):
        try:
            seen = json.loads(starter.stdout.readline())
            assert healthy(seen["url"])
            # another user of the host reaches the loopback port: without the home's credential, no Secret block
            credential = (tmp_path / "home" / "prefect-auth").read_text()
            for auth in (None, ("weightkeeper", "guess")):
                assert httpx.post(f"{seen['url']}/block_documents/filter", json={}, auth=auth, timeout=10
                                  ).status_code == 401
            assert httpx.post(f"{seen['url']}/block_documents/filter", json={}, auth=tuple(credential.split(":", 1)),
                              timeout=10).status_code == 200
            assert seen["api"] == seen["url"] and seen["flows"] == ["made-in-home"]
            assert seen["child"][:2] == [seen["url"], "false"]
            running = processes_naming(str(tmp_path))
            assert len(running) == 2 and not temporary_servers(running), running  # the starter and its server
        finally:
            starter.send_signal(signal.SIGKILL)  # no `finally`, no atexit
            starter.wait()
        wait_until(lambda: not processes_naming(str(tmp_path)), 30, "the orphaned server to stop")


def test_a_cli_command_killed_mid_download_leaves_no_prefect_server_behind(wk, hub, tmp_path):
    """`weightkeeper model create --wait` on the embedded server, killed with SIGKILL while the Hub sends bytes
    slowly: neither its Prefect server nor a temporary one outlives it."""
    hub.add_repo("acme/slow", tiny_files("slow"))
    env = dict(without_prefect_api_url(tmp_path), WEIGHTKEEPER_CONFIG=str(wk.config))
    with hub.throttled(16 * 1024, "acme/slow"), open(tmp_path / "cli.out", "w") as out, \
            leaving_nothing_that_names(tmp_path):
        cli = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "model", "create", "slow", "--source",
                                "hf://acme/slow", "--workspace", "team-a", "--wait"], env=env, stdout=out,
                               stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: (model := wk.registry.find_model("slow")) and any(p.bytes_done for p in
                                                                                  model.local_paths), 120,
                       "bytes to flow")
            running = processes_naming(str(tmp_path))
            assert len(running) == 2 and not temporary_servers(running), running  # the command and its server
        finally:
            cli.send_signal(signal.SIGKILL)
            cli.wait()
        wait_until(lambda: not processes_naming(str(tmp_path)), 30, "the command's Prefect server to stop")
    assert "temporary server" not in (tmp_path / "cli.out").read_text()


def test_a_port_in_use_is_refused_not_joined(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as taken, temporary_settings(restore_defaults={PREFECT_API_URL}):
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(WeightkeeperError, match=f"port {port} is in use: to use the Prefect server there, set "
                                                    "PREFECT_API_URL"):
            with prefect_api(tmp_path, port):
                pass


def test_a_prefect_api_url_that_does_not_answer_is_reported(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = f"http://127.0.0.1:{free_port()}/api"
    with temporary_settings({PREFECT_API_URL: url}):
        with pytest.raises(WeightkeeperError, match=re.escape(f"the Prefect server at {url} (PREFECT_API_URL) "
                                                              "does not answer")):
            with prefect_api(tmp_path):
                pass


def test_loopback_is_told_from_every_address_others_may_reach():
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"):
        assert is_loopback(host)
    for host in ("0.0.0.0", "::", "", "192.0.2.2", "fd00::2", "::ffff:127.0.0.1", "prefect.example",
                 "127.0.0.1.nip.io"):
        assert not is_loopback(host)


def test_the_server_is_never_started_beyond_loopback_without_a_credential(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_API_AUTH_STRING"}
    env[PARENT_ENV] = str(os.getpid())  # were one started after all, it would not outlive the test
    started = []
    try:
        with pytest.raises(WeightkeeperError, match="refusing to start the Prefect server on 0.0.0.0 without "
                                                    "authentication: PREFECT_SERVER_API_AUTH_STRING is not set"):
            started.append(start_server(free_port(), tmp_path / "server.log", env, "0.0.0.0"))
    finally:
        for server in started:
            stop(server)
    assert not (tmp_path / "server.log").exists()  # nothing was started


def test_the_credential_is_generated_once_private_to_the_operator_or_theirs(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
    home = tmp_path / "home"
    credential = prefect_credential(home)
    path = home / "prefect-auth"
    assert credential.startswith("weightkeeper:") and len(credential) > 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == credential
    assert prefect_credential(home) == credential != prefect_credential(tmp_path / "other")
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "ops:chosen")
    assert prefect_credential(home) == "ops:chosen" and path.read_text() == credential
    monkeypatch.delenv("PREFECT_API_AUTH_STRING")

    path.chmod(0o644)  # readable by others: refused, not used
    with pytest.raises(WeightkeeperError, match="must be a regular file of this user with mode 0600"):
        prefect_credential(home)
    path.unlink()
    (tmp_path / "planted").write_text("attacker:known")  # a link put in its place is not followed
    path.symlink_to(tmp_path / "planted")
    with pytest.raises(WeightkeeperError, match="must be a regular file of this user with mode 0600"):
        prefect_credential(home)
    path.unlink()
    path.write_bytes(b"")
    path.chmod(0o600)
    with pytest.raises(WeightkeeperError, match="is empty; remove it"):
        prefect_credential(home)
