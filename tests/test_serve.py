"""`weightkeeper serve` as an operator runs it: one command sets up the limit, the pools and every deployment,
starts a worker per pool and the API, and leaves nothing running once a supervisor stops it (SIGTERM); the
Prefect server it starts beyond loopback answers only to its credential."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urljoin

import httpx
import pytest
from conftest import tiny_files, write_config
from served import wait_until

from weightkeeper.prefectserver import free_port


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def processes(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout.split()


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
        except OSError:
            continue
    return found


def end(pid: int) -> None:
    """Kill what a failed test would leave running."""
    if not gone(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_serve_sets_everything_up_and_stops_cleanly(wk):
    from prefect.client.orchestration import get_client

    workspaces = [{**ws, "work_pool": f"serve-{ws['name']}"} for ws in wk._workspaces]
    write_config(wk, workspaces=workspaces, work_pool="serve-control", max_concurrent_downloads=3)
    wk.registry  # made here: serve's first line is the Prefect API's
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


def non_loopback_address() -> str | None:
    """The IPv4 address this machine would send from to elsewhere, if it has a route (a UDP connect sends
    nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_prefect_server_serve_starts_beyond_loopback_answers_only_to_its_credential(wk, hub, tmp_path):
    """The attacker reaches the Prefect port and has no credential: reading Secret blocks and starting
    delete-model answer 401. The workers and serve's own clients have it: a model still gets Ready through the
    REST API. The credential is in a 0600 file, and in no log and no command line. The UI, served on that host
    and port (not Prefect's default 4200), calls its API there. Without a non-loopback address here, serve runs
    on loopback, where it requires the credential too."""
    host = non_loopback_address()
    write_config(wk, workspaces=[{**wk._workspaces[0], "work_pool": "auth-team-a"}], work_pool="auth-control",
                 hf_endpoint=hub.url)
    with open(wk.config, "a") as f:
        f.write(f'[[users]]\nname = "alice"\nuid = 1000\n'
                f'token_sha256 = "{hashlib.sha256(b"alice-token").hexdigest()}"\n')
    hub.add_repo("acme/behind-auth", tiny_files("behind-auth"))
    prefect_port, api_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")}
    env.update(WEIGHTKEEPER_CONFIG=str(wk.config), PREFECT_HOME=str(tmp_path / "prefect-home"),
               PREFECT_WORKER_QUERY_SECONDS="1")
    where = ["--prefect-host", host] if host else []
    with open(tmp_path / "serve.out", "w") as out:
        serve = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "serve", "--prefect-port",
                                  str(prefect_port), "--api-port", str(api_port), *where], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    credential_file = wk.root / "prefect-auth"
    try:
        server = f"http://{host or '127.0.0.1'}:{prefect_port}"
        wait_until(lambda: "Prefect API" in (tmp_path / "serve.out").read_text(), 120, "serve to start")
        assert f"Prefect API {server}/api (credential: {credential_file});" in (tmp_path / "serve.out").read_text()
        credential = credential_file.read_text()
        secret = credential.split(":", 1)[1]
        assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600 and len(credential) > 40
        auth = {"Authorization": f"Basic {base64.b64encode(credential.encode()).decode()}"}
        wrong = {"Authorization": f"Basic {base64.b64encode(b'weightkeeper:guess').decode()}"}
        prefect = httpx.Client(base_url=f"{server}/api", timeout=30)
        assert prefect.get("/health").status_code == 200  # probes stay open
        for headers in ({}, wrong):
            assert prefect.post("/block_documents/filter", json={}, headers=headers).status_code == 401
        assert prefect.post("/block_documents/filter", json={}, headers=auth).status_code == 200
        delete = prefect.get("/deployments/name/delete-model/delete-model", headers=auth).json()["id"]
        later = {"parameters": {"name": "no-such-model"},
                 "state": {"type": "SCHEDULED", "state_details": {"scheduled_time": "2999-01-01T00:00:00Z"}}}
        for headers in ({}, wrong):
            assert prefect.post(f"/deployments/{delete}/create_flow_run", json=later, headers=headers).status_code \
                == 401
        assert prefect.post(f"/deployments/{delete}/create_flow_run", json=later, headers=auth).status_code == 201
        ui = httpx.get(f"{server}/ui-settings", timeout=10).json()
        assert ui["auth"] == "BASIC"  # the UI asks for it
        assert urljoin(f"{server}/ui-settings", ui["api_url"]) == f"{server}/api"  # where it was served, not :4200

        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", headers={"Authorization": "Bearer alice-token"},
                           timeout=30)
        wait_until(lambda: status(f"http://127.0.0.1:{api_port}/api/v1/models") == 401, 60, "the API")
        created = api.post("/api/v1/models", json={"name": "behind-auth", "source": "hf://acme/behind-auth"})
        assert created.status_code == 201, created.text
        wait_until(lambda: api.get("/api/v1/models/behind-auth").json()["phase"] == "Ready", 150, "Ready")
        commands = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
        assert "weightkeeper.worker --pool auth-team-a" in commands and secret not in commands
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
    logs = [(tmp_path / "serve.out").read_text(),
            *(log.read_text(errors="replace") for log in (wk.root / "logs").iterdir())]
    assert len(logs) >= 4  # serve's output, the Prefect server's and each worker's log
    for text in logs:
        assert secret not in text and auth["Authorization"].split()[1] not in text


def test_prefect_server_options_are_refused_when_prefect_api_url_names_the_server(wk):
    """With PREFECT_API_URL the server is the operator's: serve cannot make it listen elsewhere, and says so instead
    of pretending."""
    refused = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "serve", "--prefect-host", "0.0.0.0"],
                             capture_output=True, text=True, env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config)),
                             timeout=120)
    assert refused.returncode == 2 and "PREFECT_API_URL names one" in refused.stderr, refused.stderr


def test_a_worker_exits_with_the_serve_that_started_it_even_when_that_is_killed(tmp_path):
    """`serve` killed with SIGKILL runs no cleanup: its workers notice they lost their parent and stop."""
    starter = subprocess.Popen([sys.executable, "-c", f"""
import os, sys, time
from pathlib import Path
from weightkeeper.prefectserver import spawn
worker = spawn(["weightkeeper.worker", "--pool", "orphan-check", "--type", "process"], Path({str(tmp_path)!r}) / "w.log",
               dict(os.environ, WEIGHTKEEPER_EXIT_WITH_PARENT=str(os.getpid())))
print(worker.pid, flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    worker = int(starter.stdout.readline())
    try:
        wait_until(lambda: "started" in (tmp_path / "w.log").read_text(errors="replace"), 60, "the worker to start")
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        wait_until(lambda: gone(worker), 30, "the worker to exit")
    finally:
        starter.kill()
        end(worker)


@contextlib.contextmanager
def serving(wk, tmp_path, **config) -> Iterator[tuple[subprocess.Popen, httpx.Client]]:
    """`weightkeeper serve` with `config` and its API on a free port, for alice (token `alice-token`); stopped as a
    supervisor stops it (SIGTERM), which it must survive with exit code 0."""
    write_config(wk, **config)
    with open(wk.config, "a") as f:
        f.write(f'[[users]]\nname = "alice"\nuid = 1000\n'
                f'token_sha256 = "{hashlib.sha256(b"alice-token").hexdigest()}"\n')
    port = free_port()
    with open(tmp_path / "serve.out", "w") as out:
        serve = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "serve", "--api-port", str(port)],
                                 env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config),
                                          PREFECT_WORKER_QUERY_SECONDS="1"),
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer alice-token"},
                           timeout=30)
        wait_until(lambda: status(f"http://127.0.0.1:{port}/api/v1/models") == 401, 120, "the API")
        yield serve, api
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(90) == 0


def test_a_flow_run_of_a_serve_worker_ends_with_it_even_one_that_ignores_sigterm(tmp_path):
    """A flow-run process runs in a session of its own: when its worker is gone (killed, or stopped by `serve`
    after 20 s), it is sent SIGTERM, and SIGKILL if it goes on (here it ignores SIGTERM; KILL_AFTER_SECONDS is 1)."""
    run = ("import signal, time; import weightkeeper.prefectserver as p; p.KILL_AFTER_SECONDS = 1; "
           "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)")
    worker = subprocess.Popen([sys.executable, "-c", f"""
import os, subprocess, sys, time
run = subprocess.Popen([sys.executable, "-c", {run!r}], start_new_session=True, stdout=subprocess.PIPE, text=True,
                       env=dict(os.environ, WEIGHTKEEPER_EXIT_WITH_PARENT=str(os.getpid())))
assert run.stdout.readline() == "up\\n"
print(run.pid, flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    run_pid = int(worker.stdout.readline())
    try:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        wait_until(lambda: gone(run_pid), 30, "the flow-run process to end")
    finally:
        end(run_pid)


def test_a_run_still_downloading_ends_with_serve(wk, hub, tmp_path):
    """A supervisor stops `serve` (SIGTERM) while a model downloads: its worker stops, and so does the flow-run
    process the worker started in a session of its own, which would otherwise go on downloading, unseen."""
    hub.add_repo("acme/ends-with-serve", tiny_files("ends-with-serve", shards=1, shard_size=8 << 20))
    hub.set_throttle(64 * 1024, repo_id="acme/ends-with-serve")  # 128 s for the shard
    runs: list[int] = []
    try:
        with serving(wk, tmp_path, workspaces=wk._workspaces[:1], work_pool="ends-with-serve",
                     hf_endpoint=hub.url) as (serve, api):
            created = api.post("/api/v1/models", json={"name": "ends-with-serve",
                                                       "source": "hf://acme/ends-with-serve"})
            assert created.status_code == 201, created.text
            wait_until(lambda: (m := wk.registry.find_model("ends-with-serve")) and m.local_paths[0].bytes_done,
                       180, "bytes to arrive")
            runs = [run for worker in children(serve.pid) for run in children(worker)]
            assert runs, "no flow-run process under serve's workers"
        wait_until(lambda: all(gone(run) for run in runs), 90, "the flow-run processes to end")
    finally:
        hub.set_throttle(None, repo_id="acme/ends-with-serve")
        for run in runs:
            end(run)


def peak(intervals: list[tuple]) -> int:
    """The most intervals open at one moment (an end and a start at the same instant do not overlap)."""
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    return most


@pytest.mark.timeout(900)  # a process per run, on a loaded machine
def test_serve_runs_at_most_its_run_limit_at_once_and_a_burst_waits(wk, hub, tmp_path):
    """A burst of models created through the API at once, with `worker_run_limit = 2` and the workspace in the
    control pool (each ensure-model run waits for a path job of the same pool): every model becomes Ready, and at
    no time did more than 2 ensure-model runs, or more than 2 download-to-path runs, execute at once."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    names = [f"run-limit-{i}" for i in range(4)]  # names no other test's runs have in the session server
    for name in names:
        hub.add_repo(f"acme/{name}", tiny_files(name, shards=1))
    with serving(wk, tmp_path, workspaces=wk._workspaces[:1], work_pool="limited", worker_run_limit=2,
                 hf_endpoint=hub.url) as (_, api):
        with ThreadPoolExecutor(len(names)) as pool:  # at once
            for created in pool.map(lambda n: api.post("/api/v1/models", json={"name": n, "source": f"hf://acme/{n}"}),
                                    names):
                assert created.status_code == 201, created.text
        for name in names:
            wait_until(lambda: api.get(f"/api/v1/models/{name}").json()["phase"] == "Ready", 300, f"{name} Ready")
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(
            any_=[f"ensure-{name}" for name in names] + [f"download-{name}-team-a" for name in names])))
    assert len(runs) == 8 and all(r.state.is_completed() for r in runs)
    for kind in ("ensure-", "download-"):
        assert peak([(r.start_time, r.end_time) for r in runs if r.name.startswith(kind)]) <= 2, kind


def test_repeated_sigterms_still_stop_every_worker_before_serve_exits(wk, tmp_path):
    """A supervisor (or an impatient Ctrl-C) signals `serve` again and again while it stops a worker that is slow to
    go (here: stopped with SIGSTOP, so only the SIGKILL after 20 s ends it): every further signal is ignored, and
    serve exits 0 only once both its workers are gone, none left running (or stopped) behind it."""
    import time

    workspaces = [{**wk._workspaces[0], "work_pool": "twice-jobs"}]
    with serving(wk, tmp_path, workspaces=workspaces, work_pool="twice-control") as (serve, _):
        workers = children(serve.pid)
        assert len(workers) == 2, workers
        try:
            os.kill(workers[0], signal.SIGSTOP)
            while serve.poll() is None:
                serve.send_signal(signal.SIGTERM)
                time.sleep(0.05)
            assert serve.returncode == 0
            assert [w for w in workers if not gone(w)] == []  # stopped by serve, not later by their own watch
        finally:
            for worker in workers:
                end(worker)


def test_serve_exits_with_an_error_when_a_worker_dies_under_the_api(wk, tmp_path):
    """A worker of `serve` dies (OOM-killed) while the API runs: serve says so and exits non-zero, for its supervisor
    to start everything again, instead of accepting models that no worker will ever run."""
    write_config(wk, workspaces=wk._workspaces[:1], work_pool="dies-under-api")
    port = free_port()
    with open(tmp_path / "serve.out", "w") as out:
        serve = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "serve", "--api-port", str(port)],
                                 env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config)), stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    workers: list[int] = []
    try:
        wait_until(lambda: status(f"http://127.0.0.1:{port}/api/v1/models") == 401, 120, "the API")
        workers = children(serve.pid)
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        assert serve.wait(60) != 0
        assert "a worker exited" in (tmp_path / "serve.out").read_text()
        assert status(f"http://127.0.0.1:{port}/api/v1/models") is None
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(90)
        for worker in workers:
            end(worker)


def test_workers_already_started_are_stopped_when_serve_is_interrupted_starting_the_next(wk, monkeypatch):
    """SIGTERM or Ctrl-C lands while `serve` starts its workers: those already running are stopped, not left for
    their parent watch to notice."""
    from weightkeeper import serve
    from weightkeeper.config import load_settings

    write_config(wk, workspaces=[{**wk._workspaces[0], "work_pool": "interrupted-jobs"}], work_pool="interrupted")
    started: list[subprocess.Popen] = []

    def spawn(args, log, env):
        if started:
            raise KeyboardInterrupt
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                        start_new_session=True))
        return started[0]

    monkeypatch.setattr(serve, "spawn", spawn)
    try:
        with pytest.raises(KeyboardInterrupt):
            serve.start_workers(load_settings(wk.config))
        assert len(started) == 1 and started[0].poll() is not None
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_a_hang_up_stops_serve_as_sigterm_does(wk, tmp_path):
    """SIGHUP (the terminal serve runs in closes, or a supervisor's reload signal) stops serve as SIGTERM does: it
    exits 0 once its workers are gone, instead of dying on the spot and leaving them to their parent watch."""
    with serving(wk, tmp_path, workspaces=wk._workspaces[:1], work_pool="hang-up") as (serve, _):
        workers = children(serve.pid)
        assert workers
        try:
            serve.send_signal(signal.SIGHUP)
            assert serve.wait(90) == 0
            assert [w for w in workers if not gone(w)] == []  # stopped by serve, not later by their own watch
        finally:
            for worker in workers:
                end(worker)


SLOW_PASS = """import sys, time
from prefect import flow
import weightkeeper.flows.reconcile as module


@flow(name="orphan-check-pass")
def slow():  # a pass that takes its time (verifying a large copy, say)
    print("pass running", flush=True)
    time.sleep(600)


module.reconcile = slow  # what `reconcile --every` serves
if __name__ == "__main__":
    from weightkeeper.cli import main

    sys.exit(main(["reconcile", "--every", "3600"]))
"""


def test_a_pass_of_reconcile_every_ends_with_the_command_even_when_that_is_killed(wk, tmp_path):
    """`weightkeeper reconcile --every` killed (SIGKILL, or SIGHUP: no cleanup runs) while Prefect's runner has a pass
    running in a process of its own: that process stops too, instead of going on verifying and repairing, unseen."""
    from prefect.client.orchestration import get_client

    script = tmp_path / "slow_reconcile.py"
    script.write_text(SLOW_PASS)
    with open(tmp_path / "cli.out", "w") as out:
        cli = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT,
                               env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config),
                                        PREFECT_RUNNER_POLL_FREQUENCY="1"), start_new_session=True)
    runs: list[int] = []
    try:
        with get_client(sync_client=True) as client:
            deployment = wait_until(lambda: _deployment(client, "orphan-check-pass/reconcile"), 120,
                                    "the served deployment")
            client.create_flow_run_from_deployment(deployment.id)
        wait_until(lambda: "pass running" in (tmp_path / "cli.out").read_text(), 120, "the pass to run")
        runs = [pid for pid in children(cli.pid) if b"resource_tracker" not in
                open(f"/proc/{pid}/cmdline", "rb").read()]
        assert runs, "no run process under the command"
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        wait_until(lambda: all(gone(run) for run in runs), 75, "the orphaned pass to end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cli.pid, signal.SIGKILL)
        cli.wait()
        for run in runs:
            end(run)
        with contextlib.suppress(Exception), get_client(sync_client=True) as client:
            client.delete_deployment(client.read_deployment_by_name("orphan-check-pass/reconcile").id)


def _deployment(client, name: str):
    try:
        return client.read_deployment_by_name(name)
    except Exception:  # noqa: BLE001 - not there yet
        return None


def test_a_request_left_open_does_not_keep_serve_from_stopping(wk, tmp_path):
    """Anyone reaching the API (no token needed) sends a request's headers and the start of its body, then nothing:
    SIGTERM still stops serve and its workers within seconds (the request cancelled after API_STOP_SECONDS), instead
    of waiting for that client forever while its supervisor waits for serve."""
    import time

    from weightkeeper.serve import API_STOP_SECONDS

    with serving(wk, tmp_path, workspaces=wk._workspaces[:1], work_pool="left-open") as (serve, api):
        workers = children(serve.pid)
        with socket.create_connection(("127.0.0.1", api.base_url.port)) as held:
            held.sendall(b"POST /api/v1/models HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{")
            time.sleep(1)  # the request is under way, its body awaited
            started = time.monotonic()
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(API_STOP_SECONDS + 40) == 0
            assert time.monotonic() - started < API_STOP_SECONDS + 30
        assert [w for w in workers if not gone(w)] == []


def test_a_second_serve_on_a_taken_api_port_starts_nothing(wk, tmp_path):
    """A second `serve` while one runs (here: its API port taken) is refused before it starts anything, instead of
    starting a Prefect server and workers on the first one's databases, which could take its runs, only to stop
    them all once the API finds its port taken."""
    write_config(wk, workspaces=wk._workspaces[:1], work_pool="taken-api")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        second = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "serve", "--api-port", str(port)],
                                env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config)), capture_output=True,
                                text=True, timeout=120)
    assert second.returncode == 1 and f"cannot listen on 127.0.0.1:{port} for the API" in second.stderr, \
        second.stdout + second.stderr
    assert not list((wk.root / "logs").glob("worker-*.log"))  # no worker was started
