"""Bytes on disk for 10 models on one snapshot: shared (reuse-if-exists) vs 10 own copies.

    .venv/bin/python bench/sharing.py [--models 10] [--mib 64] [--quick]

Runs the real pipeline (ensure-model through Prefect, the real client, the loopback Hub server)
and measures each volume with `du -sB1` (allocated bytes), the reference a user would run. Prints a
row of bench/run_all.py's table; `--quick` uses 4 models of 16 MiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from _setup import prepare_environment


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.models, args.mib = 4, 16
    with tempfile.TemporaryDirectory(prefix="wk-bench-sharing-") as tmp:
        root = Path(tmp)
        prepare_environment(root)
        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.config import load_settings
        from weightkeeper.hubserver import HubServer
        from weightkeeper.runs import run_here
        from weightkeeper.service import declare_model
        from weightkeeper.registry import registry_for

        hub = HubServer(root / "hub").start()
        hub.add_repo("bench/shared", {"model.safetensors": os.urandom(args.mib << 20), "config.json": b"{}"})
        lines = [f'home = "{root}"', f'hf_endpoint = "{hub.url}"']
        for policy in ("reuse-if-exists", "always-download"):
            (root / policy).mkdir()
            lines += ["[[workspaces]]", f'name = "{policy}"', f'volume = "{root / policy}"']
        (root / "config.toml").write_text("\n".join(lines) + "\n")
        os.environ["WEIGHTKEEPER_CONFIG"] = str(root / "config.toml")
        settings = load_settings()
        registry = registry_for(settings)
        for policy in ("reuse-if-exists", "always-download"):
            for i in range(args.models):
                name = f"{policy[:5]}-{i}"
                declare_model(settings, registry, name=name, source="hf://bench/shared", owner_name="bench",
                              owner_uid=os.getuid(), workspaces=[policy], subpath=f"models/m{i}",
                              download_policy=policy)
                assert run_here(ensure_model, name) == "Ready"
        shared, copies = du(root / "reuse-if-exists"), du(root / "always-download")
        hub.stop()
    print(f"| sharing: {args.models} models on one {args.mib} MiB snapshot, bytes on disk | {shared:,} (reuse-if-exists) "
          f"| {copies:,} (always-download; `du -sB1`) | {copies / shared:.2f}x less with sharing |")


if __name__ == "__main__":
    main()
