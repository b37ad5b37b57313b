"""Cleanup: delete -> released for a model holding 50,000 small files vs `rm -rf` of an identical tree.

    .venv/bin/python bench/cleanup.py [--quick]

The model is made Ready through the pipeline (a tiny repository), then its directory is filled
with 50,000 small files in 500 subdirectories (`--quick`: 5,000), as a model with that many files
would be. The same tree is made next to it for `rm -rf`. weightkeeper's time covers the whole
delete-model flow: stop downloads, guarded clean-path (checks, mount scan, fd-based rmtree),
registry updates and release.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _setup import prepare_environment, row, sh, timed, tiny_pipeline


def fill(directory: Path, count: int) -> None:
    for i in range(count):
        sub = directory / f"part-{i % 500:03d}"
        if i < 500:
            sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:06d}.json").write_bytes(b"{}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count = 5_000 if args.quick else 50_000
    with tempfile.TemporaryDirectory(prefix="wk-bench-cleanup-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        prepare_environment(root)
        hub, declare = tiny_pipeline(root)

        from weightkeeper.flows.delete_model import delete_model
        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.runs import run_here

        declare("many")
        assert run_here(ensure_model, "many") == "Ready"
        path = root / "volume" / "models" / "many" / "bench--tiny"
        assert path.is_dir()
        fill(path, count)
        sh("cp", "-a", str(path), str(root / "copy"))
        sh("sync")
        ours = timed(lambda: run_here(delete_model, "many") == "Released" or exit("delete failed"))
        assert not path.exists()
        sh("sync")
        reference = timed(lambda: sh("rm", "-rf", str(root / "copy")))
        hub.stop()
    row(f"cleanup, {count:,} small files: delete -> released", f"{ours:.2f} s", f"{reference:.2f} s (`rm -rf`)",
        f"{ours / reference:.2f}x the time")


if __name__ == "__main__":
    main()
