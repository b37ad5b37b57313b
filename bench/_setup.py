"""Shared set-up for the benchmarks: environment, a loopback Hub server process, a weightkeeper config.

Benchmarks run from the repository root as `python bench/<name>.py`; this module is importable
because the script's directory is on `sys.path`.
"""

from __future__ import annotations

import atexit
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from weightkeeper.prefectserver import (SERVER_AUTH_ENV, client_environment, free_port, prefect_credential, start_server,
                                        stop)

MIB = 1 << 20
ENV = {
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_XET": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}


def prepare_environment(root: Path) -> subprocess.Popen:
    """Before Prefect is imported: quiet clients, a private HF home, and a Prefect server of its own
    (`weightkeeper.prefectserver` in a process, as `weightkeeper serve` runs it, requiring its credential;
    returned) with its home under `root`; it stops when this process exits."""
    os.environ.update(ENV, HF_HOME=str(root / "hf-home"), PREFECT_HOME=str(root / "prefect-home"))
    os.environ.pop("HF_TOKEN", None)
    (root / "prefect-home").mkdir(parents=True, exist_ok=True)
    port = free_port()
    credential = prefect_credential(root)  # required, as by every server weightkeeper starts
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    server = start_server(port, root / "prefect-server.log", {**env, SERVER_AUTH_ENV: credential})
    atexit.register(stop, server)
    os.environ.update(PREFECT_API_URL=(url := f"http://127.0.0.1:{port}/api"), PREFECT_API_AUTH_STRING=credential)
    os.environ.update(client_environment(url, root))  # as `prefect_api` gives the clients of its server
    return server


def postgres_database(driver: str) -> str:
    """A database of its own in the local PostgreSQL (127.0.0.1:5432, trust auth), dropped at exit
    (WITH FORCE: connections still open are closed); its SQLAlchemy URL with `driver`."""
    import psycopg

    name = f"wk_bench_{os.getpid()}_{time.monotonic_ns()}"

    def run(sql: str) -> None:
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as conn:
            conn.execute(sql)

    run(f"CREATE DATABASE {name}")
    atexit.register(run, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return f"postgresql+{driver}://postgres@127.0.0.1:5432/{name}"


def write_repo(directory: Path, shards: int, shard_mib: int, seed: str = "bench") -> None:
    """A model repository on disk: safetensors shards (random bytes) plus the small files loading needs."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    block = rng.randbytes(MIB)
    for i in range(shards):
        with open(directory / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as f:
            for j in range(shard_mib):
                f.write(block[(i * 7919 + j) % MIB:] + block[:(i * 7919 + j) % MIB])
    (directory / "config.json").write_text('{"model_type": "bench"}\n')
    (directory / "tokenizer.json").write_bytes(rng.randbytes(2 * MIB))
    (directory / "tokenizer_config.json").write_text("{}\n")
    (directory / "generation_config.json").write_text("{}\n")


class HubProcess:
    """`python -m weightkeeper.hubserver` in a process of its own, so serving costs the pipeline no GIL."""

    def __init__(self, root: Path, repos: dict[str, Path]):
        args = [sys.executable, "-m", "weightkeeper.hubserver", "--root", str(root)]
        for repo_id, directory in repos.items():
            args += ["--repo", f"{repo_id}={directory}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        atexit.register(self.stop)  # also when the benchmark fails before it stops the server
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError("the Hub server did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def write_config(root: Path, endpoint: str, volumes: dict[str, Path], **settings) -> Path:
    lines = [f'home = "{root / "wk-home"}"', f'hf_endpoint = "{endpoint}"']
    lines += [f"{k} = {v!r}" for k, v in settings.items()]
    for name, volume in volumes.items():
        volume.mkdir(parents=True, exist_ok=True)
        lines += ["[[workspaces]]", f'name = "{name}"', f'volume = "{volume}"']
    path = root / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    os.environ["WEIGHTKEEPER_CONFIG"] = str(path)
    return path


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_of(n: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(n))


def sh(*args: str, env: dict | None = None) -> None:
    """Run a reference tool with its output silenced (its errors still fail the benchmark)."""
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def row(benchmark: str, ours: str, reference: str, ratio: str) -> None:
    print(f"| {benchmark} | {ours} | {reference} | {ratio} |", flush=True)


def tiny_pipeline(root: Path):
    """A tiny repository `bench/tiny` served by a Hub process and one workspace `bench`: (hub, declare),
    where `declare(name)` declares a model of it at `models/<name>`."""
    write_repo(root / "tiny", shards=1, shard_mib=1, seed="tiny")
    hub = HubProcess(root / "hub", {"bench/tiny": root / "tiny"})
    write_config(root, hub.url, {"bench": root / "volume"})
    from weightkeeper.config import load_settings
    from weightkeeper.service import declare_model
    from weightkeeper.registry import registry_for

    settings = load_settings()
    registry = registry_for(settings)

    def declare(name: str) -> None:
        declare_model(settings, registry, name=name, source="hf://bench/tiny", owner_name="bench", owner_uid=0,
                      workspaces=["bench"], subpath=f"models/{name}")

    return hub, declare
