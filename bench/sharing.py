"""Bytes on disk for 10 models on one snapshot: shared (reuse-if-exists) vs 10 own copies.

    .venv/bin/python bench/sharing.py [--models 10] [--mib 64] [--quick]

Runs the real pipeline (ensure-model through Prefect, the real client, the loopback Hub server)
and measures each volume with `du -sB1` (allocated bytes), the reference a user would run. The
reference is `hf download` into each model's directory: 10 own copies. (weightkeeper's own
`always-download` models are no such reference any more: on one volume they hard-link the files of a
verified copy already there.) Prints a row of bench/run_all.py's table; `--quick` uses 4 models of 16 MiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _setup import prepare_environment, sh


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
        (root / "shared").mkdir()
        (root / "config.toml").write_text(f'home = "{root}"\nhf_endpoint = "{hub.url}"\n[[workspaces]]\n'
                                          f'name = "shared"\nvolume = "{root / "shared"}"\n')
        os.environ["WEIGHTKEEPER_CONFIG"] = str(root / "config.toml")
        settings = load_settings()
        registry = registry_for(settings)
        hf, env = str(Path(sys.executable).parent / "hf"), dict(os.environ, HF_ENDPOINT=hub.url)
        for i in range(args.models):
            declare_model(settings, registry, name=f"shared-{i}", source="hf://bench/shared", owner_name="bench",
                          owner_uid=os.getuid(), workspaces=["shared"], subpath=f"models/m{i}",
                          download_policy="reuse-if-exists")
            assert run_here(ensure_model, f"shared-{i}") == "Ready"
            sh(hf, "download", "bench/shared", "--local-dir", str(root / "copies" / f"m{i}"), env=env)
        for cache in (root / "copies").glob("*/.cache"):  # hf's own bookkeeping, not the model's bytes
            subprocess.run(["rm", "-rf", str(cache)], check=True)
        shared, copies = du(root / "shared"), du(root / "copies")
        hub.stop()
    print(f"| sharing: {args.models} models on one {args.mib} MiB snapshot, bytes on disk | {shared:,} (reuse-if-exists) "
          f"| {copies:,} (`hf download` into each model's directory; `du -sB1`) | {copies / shared:.2f}x less with "
          "sharing |")


if __name__ == "__main__":
    main()
