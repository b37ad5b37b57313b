"""Download: create -> Ready through the whole pipeline vs `hf download` vs `curl` of the same files.

    .venv/bin/python bench/download.py [--quick] [--repeat 3]

A ~1 GiB model (4 safetensors shards plus small files; `--quick`: 128 MiB) served by the loopback Hub
server in its own process. curl fetches the same files with `--parallel` (the raw limit of this
server and disk), `hf download` fetches them with its defaults, and weightkeeper runs declare +
ensure-model (resolve, claim, slot, fetch with hashing, record size) into a fresh volume. The fetch
alone (`weightkeeper.hub.fetch_snapshot`: ranged GETs, hashing, partial files) is timed too, so the
transfer engine and the orchestration around it can be told apart. Every tool
runs `--repeat` times, interleaved; the best time of each counts. The Prefect server is warmed up
with a tiny model first: a running deployment has its server up already.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _setup import MIB, HubProcess, prepare_environment, row, sh, timed, write_config, write_repo


def fetch_with_curl(url: str, names: list[str], dest: Path) -> None:
    args = ["curl", "-sSf", "--parallel", "--parallel-max", "8", "--create-dirs"]
    for name in names:
        args += ["-o", str(dest / name), f"{url}/bench/big/resolve/main/{name}"]
    sh(*args)


def fetch_with_hf(url: str, dest: Path) -> None:
    hf = str(Path(sys.executable).parent / "hf")
    sh(hf, "download", "bench/big", "--local-dir", str(dest), "--include", "*.safetensors", "--include", "*.json",
       env=dict(os.environ, HF_ENDPOINT=url))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    shard_mib = 32 if args.quick else 255
    with tempfile.TemporaryDirectory(prefix="wk-bench-download-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        prepare_environment(root)
        write_repo(root / "src", shards=4, shard_mib=shard_mib)
        write_repo(root / "tiny", shards=1, shard_mib=1, seed="tiny")
        names = sorted(p.name for p in (root / "src").iterdir())
        total = sum((root / "src" / n).stat().st_size for n in names)
        hub = HubProcess(root / "hub", {"bench/big": root / "src", "bench/tiny": root / "tiny"})
        write_config(root, hub.url, {"bench": root / "volume"})
        subprocess.run(["cat", *(str(p) for p in (root / "hub" / "blobs").iterdir())], stdout=subprocess.DEVNULL)

        from weightkeeper.anchored import Dir
        from weightkeeper.flows.delete_model import delete_model
        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.config import load_settings
        from weightkeeper.hub import fetch_snapshot, resolve_snapshot
        from weightkeeper.layout import HfSource
        from weightkeeper.runs import run_here
        from weightkeeper.service import declare_model
        from weightkeeper.registry import registry_for

        settings = load_settings()
        registry = registry_for(settings)

        def pipeline(name: str, source: str) -> None:
            declare_model(settings, registry, name=name, source=source, owner_name="bench", owner_uid=0,
                          workspaces=["bench"], subpath=f"models/{name}")
            assert run_here(ensure_model, name) == "Ready", registry.get_model(name).message

        def fetch_only(dest: Path) -> None:
            snapshot = resolve_snapshot(HfSource("bench/big", "main"), hub.url, None)
            with Dir.root(dest, create=True) as target:  # fetch_snapshot writes through the anchored layer
                fetch_snapshot(HfSource("bench/big", snapshot.commit), snapshot, target, hub.url, None,
                               lambda done: None, time.monotonic() + 600)

        pipeline("warm-up", "hf://bench/tiny")
        best: dict[str, float] = {}
        for attempt in range(args.repeat):
            runs = {
                "curl": lambda: fetch_with_curl(hub.url, names, root / "curl"),
                "hf": lambda: fetch_with_hf(hub.url, root / "hf"),
                "weightkeeper": lambda: pipeline(f"big-{attempt}", "hf://bench/big"),
                "fetch": lambda: fetch_only(root / "fetch"),
            }
            for tool, run in runs.items():
                sh("sync")
                elapsed = timed(run)
                best[tool] = min(best.get(tool, elapsed), elapsed)
                print(f"{tool:>12}: {elapsed:6.2f} s  {total / MIB / elapsed:7.1f} MiB/s", flush=True)
                shutil.rmtree(root / tool, ignore_errors=True)
            # deleted as a user would (untimed): nothing of it is left to reuse, and the registry knows it is gone
            assert run_here(delete_model, f"big-{attempt}") == "Released"
        hub.stop()

    def rate(tool: str) -> str:
        return f"{best[tool]:.2f} s ({total / MIB / best[tool]:.0f} MiB/s)"

    what = f"download {total / MIB:.0f} MiB (4 shards + 4 small files), create -> Ready"
    row(f"{what}, vs `hf download`", rate("weightkeeper"), rate("hf"),
        f"{best['hf'] / best['weightkeeper']:.2f}x hf's speed")
    row(f"{what}, vs `curl --parallel` (raw limit)", rate("weightkeeper"), rate("curl"),
        f"{best['curl'] / best['weightkeeper']:.2f}x the raw limit")
    row(f"download {total / MIB:.0f} MiB, the fetch alone (ranged GETs, sha256, partial files) vs `curl --parallel`",
        rate("fetch"), rate("curl"), f"{best['curl'] / best['fetch']:.2f}x the raw limit")


if __name__ == "__main__":
    main()
