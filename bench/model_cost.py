"""What one model's lifecycle costs in CPU, one model at a time: the process that runs `ensure-model` and the
Prefect server (`weightkeeper.prefectserver` in a process of its own, on SQLite), per model.

    .venv/bin/python bench/model_cost.py [--quick] [--models 30]

Each model is its own repository with a 1 MiB shard, served by the Hub test server in this process, downloaded
into one local workspace; two models warm up first. The server's CPU is read after a pause, once its batched
services (the task-run recorder, the event persister) caught up. The reference is `curl` fetching the same files
of each model from the same server (its CPU, as a child process's), one model at a time: what the bytes alone
cost. This is where the scale benchmark's time per model goes. It also prints the Prefect API calls a model makes
(those this process sends, by method and path).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import tempfile
import time
from pathlib import Path

from _setup import prepare_environment, row, sh, write_config, write_repo

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ApiCalls:
    """Counts the requests this process sends to the Prefect API while `on`, by method and path (ids as `{id}`)."""

    def __init__(self):
        import httpx

        self.on, self.counts = False, collections.Counter()
        sync_send, async_send = httpx.Client.send, httpx.AsyncClient.send

        def count(request) -> None:
            if self.on and "/api/" in request.url.path:
                self.counts[f"{request.method} {UUID.sub('{id}', request.url.path.split('/api', 1)[1])}"] += 1

        def send(client, request, **kwargs):
            count(request)
            return sync_send(client, request, **kwargs)

        async def asend(client, request, **kwargs):
            count(request)
            return await async_send(client, request, **kwargs)

        httpx.Client.send, httpx.AsyncClient.send = send, asend

    def per_model(self, models: int) -> str:
        return f"{sum(self.counts.values()) / models:.1f} (" + ", ".join(
            f"{n / models:.1f} {what}" for what, n in self.counts.most_common()) + ")"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=int, default=30)
    args = parser.parse_args()
    args.models = 10 if args.quick else args.models
    with tempfile.TemporaryDirectory(prefix="wk-bench-model-cost-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        server = prepare_environment(root)
        from weightkeeper.hubserver import HubServer

        hub = HubServer(root / "hub").start()
        names = [f"m{i}" for i in range(args.models + 2)]
        for name in names:
            write_repo(root / "src" / name, shards=1, shard_mib=1, seed=name)
            hub.add_repo(f"bench/{name}", {p.name: p for p in (root / "src" / name).iterdir()})
        write_config(root, hub.url, {"ws-0": root / "ws-0"}, max_concurrent_downloads=4)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        for name in names[2:]:
            curl = ["curl", "-sSf", "--create-dirs"]
            for f in (root / "src" / name).iterdir():
                curl += ["-o", str(root / "curl" / name / f.name), f"{hub.url}/bench/{name}/resolve/main/{f.name}"]
            sh(*curl)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        reference = (after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime) / args.models

        import fastapi.encoders  # noqa: F401 - what Prefect imports at a process's first subflow call

        from weightkeeper.config import load_settings
        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.registry import registry_for
        from weightkeeper.runs import run_here
        from weightkeeper.service import declare_model

        settings, calls = load_settings(), ApiCalls()
        registry = registry_for(settings)
        for name in names:
            declare_model(settings, registry, name=name, source=f"hf://bench/{name}", owner_name="bench", owner_uid=0,
                          workspaces=["ws-0"])
        for name in names[:2]:
            assert run_here(ensure_model, name) == "Ready"
        time.sleep(2)
        calls.on = True
        server_cpu, cpu, begun = cpu_seconds(server.pid), time.process_time(), time.perf_counter()
        for name in names[2:]:
            assert run_here(ensure_model, name) == "Ready"
        cpu, wall = time.process_time() - cpu, time.perf_counter() - begun
        calls.on = False
        time.sleep(3)  # the server's batched services catch up
        server_cpu = cpu_seconds(server.pid) - server_cpu
        hub.stop()
    n = args.models
    ours = (cpu + server_cpu) / n
    row(f"model cost: one model of 1 MiB at a time ({n} models), CPU per model",
        f"{ours * 1000:.0f} ms (ensure-model's process {cpu / n * 1000:.0f} ms, the Prefect server "
        f"{server_cpu / n * 1000:.0f} ms; {wall / n * 1000:.0f} ms wall)", f"{reference * 1000:.0f} ms (`curl`)",
        f"{ours / reference:.0f}x curl's CPU")
    print(f"Prefect API calls per model: {calls.per_model(n)}")


if __name__ == "__main__":
    main()
