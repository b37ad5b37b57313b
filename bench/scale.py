"""Scale: 100 models over 4 workspaces with the download limit at 4, against the ideal time.

    .venv/bin/python bench/scale.py [--quick]

Each model is its own repository (one 8 MiB shard plus small files; `--quick`: 20 models of 2 MiB).
All ensure-model runs start at once, in threads of this process; the Hub server runs in this
process too, so it can count downloads in flight (the peak is the most repositories being served
at one moment). The ideal is total bytes / throughput, the throughput being that of `curl
--parallel` fetching the same files from the same server in the same run.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from pathlib import Path

from _setup import MIB, prepare_environment, row, sh, timed, write_config, write_repo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    models, shard_mib, limit = (20, 2, 4) if args.quick else (100, 8, 4)
    workspaces = [f"ws-{i}" for i in range(4)]
    with tempfile.TemporaryDirectory(prefix="wk-bench-scale-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        prepare_environment(root)
        from weightkeeper.hubserver import HubServer

        hub = HubServer(root / "hub").start()
        names = [f"m{i:03d}" for i in range(models)]
        urls, total = [], 0
        for name in names:
            src = root / "src" / name
            write_repo(src, shards=1, shard_mib=shard_mib, seed=name)
            files = {p.name: p for p in src.iterdir()}
            hub.add_repo(f"bench/{name}", files)
            urls += [(f"{name}/{f}", f"{hub.url}/bench/{name}/resolve/main/{f}") for f in files]
            total += sum(p.stat().st_size for p in files.values())
        write_config(root, hub.url, {w: root / w for w in workspaces}, max_concurrent_downloads=limit)
        sh("cat", *(str(p) for p in (root / "hub" / "blobs").iterdir()))

        curl = ["curl", "-sSf", "--parallel", "--parallel-max", "8", "--create-dirs"]
        for rel, url in urls:
            curl += ["-o", str(root / "curl" / rel), url]
        reference = timed(lambda: sh(*curl))
        sh("rm", "-rf", str(root / "curl"))

        from flows.ensure_model import ensure_model
        from weightkeeper.config import load_settings
        from weightkeeper.service import declare_model, registry_for

        settings = load_settings()
        registry = registry_for(settings)
        declare_model(settings, registry, name="warm-up", source="hf://bench/m000", owner_name="bench",
                      owner_uid=0, workspaces=[workspaces[0]], subpath="models/warm-up")
        assert ensure_model("warm-up") == "Ready"
        for i, name in enumerate(names):
            declare_model(settings, registry, name=name, source=f"hf://bench/{name}", owner_name="bench",
                          owner_uid=0, workspaces=[workspaces[i % len(workspaces)]])
        hub.reset_stats()
        outcomes: dict[str, str] = {}

        def run_all() -> None:
            threads = [threading.Thread(target=lambda n=n: outcomes.__setitem__(n, ensure_model(n))) for n in names]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        ours = timed(run_all)
        peak = hub.peak_concurrent_repos
        hub.stop()
    failed = sorted(n for n in names if outcomes.get(n) != "Ready")
    throughput = total / reference
    print(f"{models} models, {total / MIB:.0f} MiB, {len(failed)} not Ready {failed[:5]}; "
          f"curl --parallel {throughput / MIB:.0f} MiB/s", flush=True)
    row(f"scale: {models} models ({total / MIB:.0f} MiB) over 4 workspaces, limit {limit}: wall time",
        f"{ours:.1f} s, peak {peak} concurrent downloads",
        f"{reference:.1f} s ideal ({throughput / MIB:.0f} MiB/s, `curl --parallel`)",
        f"{ours / reference:.1f}x the ideal" + (f"; {len(failed)} not Ready" if failed else ""))


if __name__ == "__main__":
    main()
