"""A new revision that changes 1 of 4 shards: weightkeeper's switch in place vs `hf download` of it.

    .venv/bin/python bench/update.py [--quick]

The repository `bench/evolve` has `v1` (4 shards of 255 MiB plus the small files, about 1 GiB) and `main`,
which changes one shard and config.json. weightkeeper holds a model of v1 (a shared copy, as a tracked model
has) and switches it to main (`model update --revision main`: the new commit's copy is filled beside the
old one, the three unchanged shards hard-linked from it, then the link switched); the bytes it fetched come
from its own metric. `hf download` of main is measured into a fresh directory, and into its own cache that
already holds v1 (the cache reuses blobs by digest too). Its bytes are what it wrote (the fresh directory;
the growth of the cache's blobs). `--quick`: shards of 32 MiB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _setup import MIB, HubProcess, prepare_environment, row, sh, timed, write_config, write_repo

CHANGED = "model-00002-of-00004.safetensors"


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def hf(url: str, revision: str, **where: str) -> None:
    args = [str(Path(sys.executable).parent / "hf"), "download", "bench/evolve", "--revision", revision,
            "--include", "*.safetensors", "--include", "*.json"]
    if "local_dir" in where:
        args += ["--local-dir", where["local_dir"]]
    sh(*args, env=dict(os.environ, HF_ENDPOINT=url, **({"HF_HOME": where["home"]} if "home" in where else {})))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    shard_mib = 32 if args.quick else 255
    with tempfile.TemporaryDirectory(prefix="wk-bench-update-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        prepare_environment(root)
        write_repo(root / "v1", shards=4, shard_mib=shard_mib)
        shutil.copytree(root / "v1", root / "main")
        with open(root / "main" / CHANGED, "r+b") as f:  # one shard changed: a fine-tune of one layer
            f.write(os.urandom(MIB))
        (root / "main" / "config.json").write_text('{"model_type": "bench", "revision": 2}\n')
        changed = (root / "main" / CHANGED).stat().st_size + (root / "main" / "config.json").stat().st_size
        total = sum(p.stat().st_size for p in (root / "main").iterdir() if p.suffix in (".safetensors", ".json"))
        hub = HubProcess(root / "hub", {"bench/evolve@v1": root / "v1", "bench/evolve": root / "main"})
        write_config(root, hub.url, {"bench": root / "volume"})

        from weightkeeper.config import load_settings
        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.registry.metrics import DOWNLOADED_BYTES
        from weightkeeper.runs import run_here
        from weightkeeper.service import declare_model, switch_revision
        from weightkeeper.registry import registry_for

        settings = load_settings()
        registry = registry_for(settings)

        def fetched() -> int:
            return sum(r.count for r in registry.metric_snapshot(()).recorded.get(DOWNLOADED_BYTES.name, []))

        declare_model(settings, registry, name="evolve", source="hf://bench/evolve@v1", owner_name="bench",
                      owner_uid=0, workspaces=["bench"], download_policy="reuse-if-exists")
        assert run_here(ensure_model, "evolve") == "Ready"
        hf(hub.url, "v1", home=str(root / "hf-cache"))  # hf's cache holds v1, as weightkeeper's volume does
        before = fetched()
        sh("sync")

        def switch() -> None:
            switch_revision(registry, "evolve", "main")
            assert run_here(ensure_model, "evolve") == "Ready"

        ours = timed(switch)
        model = registry.get_model("evolve")
        assert model.message.startswith("switched from"), model.message
        ours_bytes = fetched() - before
        sh("sync")
        fresh = timed(lambda: hf(hub.url, "main", local_dir=str(root / "fresh")))
        fresh_bytes = du(root / "fresh") - du(root / "fresh" / ".cache")
        blobs = root / "hf-cache" / "hub" / "models--bench--evolve" / "blobs"
        cached_before = du(blobs)
        sh("sync")
        cached = timed(lambda: hf(hub.url, "main", home=str(root / "hf-cache")))
        cached_bytes = du(blobs) - cached_before
        hub.stop()
    what = f"new revision changing 1 of 4 shards of a {total / MIB:.0f} MiB model ({changed / MIB:.0f} MiB changed)"
    ours_text = f"{ours_bytes / MIB:.1f} MiB fetched, {ours:.2f} s (switch in place)"
    row(f"{what}, vs `hf download` into a fresh directory", ours_text,
        f"{fresh_bytes / MIB:.1f} MiB, {fresh:.2f} s", f"{fresh_bytes / max(ours_bytes, 1):.1f}x fewer bytes, "
        f"{fresh / ours:.2f}x hf's speed")
    row(f"{what}, vs `hf download` into its cache holding the old revision", ours_text,
        f"{cached_bytes / MIB:.1f} MiB, {cached:.2f} s", f"{cached_bytes / max(ours_bytes, 1):.2f}x the bytes, "
        f"{cached / ours:.2f}x hf's speed")


if __name__ == "__main__":
    main()
