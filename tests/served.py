"""A served weightkeeper for tests: deployments on the session's Prefect server, real process workers
(one per work pool), and the REST API on loopback, all reading one config file."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from conftest import SESSION_DIR, Env, write_config

from weightkeeper.prefectserver import free_port

TOKENS = {"alice": "alice-token", "bob": "bob-token", "root": "root-token"}
POOL, POOL_B = "wk-test", "wk-test-b"


def wait_until(predicate, timeout: float = 120, what: str = "condition", every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Served:
    env: Env
    api: httpx.Client
    workers: list[subprocess.Popen] = field(default_factory=list)

    def as_user(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKENS[user]}"}

    def start_workers(self) -> None:
        """A worker for each pool that has none alive (a test may have killed one)."""
        env = dict(os.environ, WEIGHTKEEPER_CONFIG=str(self.env.config), PREFECT_WORKER_QUERY_SECONDS="1")
        alive = {w.args[w.args.index("--pool") + 1] for w in self.workers if w.poll() is None}
        for pool in {POOL, POOL_B} - alive:
            log = open(SESSION_DIR / f"worker-{pool}.log", "ab")
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def kill_workers(self, sig: int = signal.SIGKILL) -> None:
        """Kill each worker with every process under it (flow runs live in sessions of their own)."""
        for worker in self.workers:
            for pid in [worker.pid, *_descendants(worker.pid)]:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            worker.wait()
        self.workers.clear()

    def wait_phase(self, name: str, phase: str, timeout: float = 150) -> dict:
        def reached():
            r = self.api.get(f"/api/v1/models/{name}", headers=self.as_user("alice"))
            return r.status_code == 200 and r.json()["phase"] == phase and r.json()
        return wait_until(reached, timeout, f"model {name} to be {phase}")

    def wait_released(self, name: str, timeout: float = 150) -> None:
        wait_until(lambda: self.api.get(f"/api/v1/models/{name}", headers=self.as_user("alice")).status_code == 404,
                   timeout, f"model {name} to be released")


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@contextmanager
def served_weightkeeper(root: Path, hub, registry_url: str | None):
    import uvicorn

    from weightkeeper.api import create_app
    from weightkeeper.config import load_settings
    from weightkeeper.deployments import apply_deployments

    volumes = {name: root / "volumes" / name for name in ("team-a", "team-b")}
    for v in volumes.values():
        v.mkdir(parents=True)
    env = Env(root, root / "config.toml", volumes)
    env._registry_url = registry_url or f"sqlite:///{root / 'registry.db'}"
    env._workspaces = [{"name": "team-a", "volume": str(volumes["team-a"])},
                       {"name": "team-b", "volume": str(volumes["team-b"]), "work_pool": POOL_B}]
    write_config(env, hf_endpoint=hub.url, work_pool=POOL, cleanup_retry_max_seconds=2)
    with open(env.config, "a") as f:
        for i, (user, token) in enumerate(TOKENS.items()):
            f.write(f'[[users]]\nname = "{user}"\nuid = {1000 + i}\n'
                    f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
                    + ("admin = true\n" if user == "root" else ""))
    previous = os.environ.get("WEIGHTKEEPER_CONFIG")
    os.environ["WEIGHTKEEPER_CONFIG"] = str(env.config)
    settings = load_settings(env.config)
    apply_deployments(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the API to start", every=0.1)
    served = Served(env, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30))
    served.start_workers()
    try:
        yield served
    finally:
        served.kill_workers(signal.SIGTERM)
        server.should_exit = True
        thread.join(10)
        if previous is None:
            os.environ.pop("WEIGHTKEEPER_CONFIG", None)
        else:
            os.environ["WEIGHTKEEPER_CONFIG"] = previous
