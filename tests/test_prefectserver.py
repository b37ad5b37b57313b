"""The Prefect server weightkeeper starts (`weightkeeper.prefectserver`): concurrent writes wait their turn on
SQLite instead of failing; the embedded default (`weightkeeper demo`, no `PREFECT_API_URL`) starts one, runs
the whole lifecycle against it and stops it; it never outlives the process that started it; beyond loopback
it requires a credential (the served case: tests/test_serve.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections import Counter

import httpx
import pytest
from served import wait_until

from weightkeeper.errors import WeightkeeperError
from weightkeeper.prefectserver import (
    PARENT_ENV,
    free_port,
    healthy,
    is_loopback,
    needs_auth,
    prefect_api,
    prefect_credential,
    start_server,
    stop,
)


def without_prefect_api_url(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "WEIGHTKEEPER_CONFIG")}
    return dict(env, PREFECT_HOME=str(tmp_path / "prefect-home"), TMPDIR=str(tmp_path), COLUMNS="200")


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
    assert "Error logging to API" not in out  # run logs were sent before the server stopped
    assert (tmp_path / "prefect-home" / "prefect.db").exists()  # the runs were recorded in a server of its own
    ui = re.search(r"Prefect UI at (http://127\.0\.0\.1:\d+)", out)
    assert ui, out
    with pytest.raises(httpx.ConnectError):  # stopped with the demo
        httpx.get(f"{ui.group(1)}/api/health", timeout=2)


def test_the_server_stops_when_the_process_that_started_it_is_killed(tmp_path):
    port = free_port()
    starter = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, sys, time; from weightkeeper.prefectserver import prefect_api\n"
         f"with prefect_api(pathlib.Path({str(tmp_path)!r}), {port}):\n    print('up', flush=True); time.sleep(600)"],
        env=without_prefect_api_url(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout.readline() == "up\n"
        assert healthy(f"http://127.0.0.1:{port}/api")
    finally:
        starter.send_signal(signal.SIGKILL)  # no `finally`, no atexit
        starter.wait()
    try:
        wait_until(lambda: not healthy(f"http://127.0.0.1:{port}/api"), 30, "the orphaned server to stop")
    finally:  # a failure leaves no server behind
        subprocess.run(["pkill", "-f", f"weightkeeper.prefectserver --host 127.0.0.1 --port {port}"])


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


def test_the_server_requires_the_credential_whenever_it_listens_beyond_loopback(monkeypatch):
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"):
        assert is_loopback(host) and not needs_auth(host) and needs_auth(host, always=True)
    for host in ("0.0.0.0", "::", "", "192.0.2.2", "fd00::2", "::ffff:127.0.0.1", "prefect.example",
                 "127.0.0.1.nip.io"):
        assert not is_loopback(host) and needs_auth(host)
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "ops:chosen")  # the operator set one: it is required
    assert needs_auth("127.0.0.1")


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
