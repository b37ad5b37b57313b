"""Lifecycle overhead for a tiny model: create -> Ready and delete -> released, median of 10.

    .venv/bin/python bench/lifecycle.py [--quick]

The references are what a user would run by hand for the same effect: `hf download` of the same
tiny repository into a fresh directory, and `rm -rf` of it. The Prefect server is warmed up first.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _setup import median_of, prepare_environment, row, sh, timed, tiny_pipeline


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = 3 if args.quick else 10
    with tempfile.TemporaryDirectory(prefix="wk-bench-lifecycle-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        prepare_environment(root)
        hub, declare = tiny_pipeline(root)

        from weightkeeper.flows.delete_model import delete_model
        from weightkeeper.flows.ensure_model import ensure_model
        from weightkeeper.runs import run_here

        counter = iter(range(10 ** 6))

        def create() -> str:
            name = f"tiny-{next(counter)}"
            declare(name)
            assert run_here(ensure_model, name) == "Ready"
            return name

        def create_and_delete() -> tuple[float, float]:
            holder: list[str] = []
            up = timed(lambda: holder.append(create()))
            down = timed(lambda: run_here(delete_model, holder[0]) == "Released" or sys.exit("delete failed"))
            return up, down

        hf = str(Path(sys.executable).parent / "hf")
        env = dict(os.environ, HF_ENDPOINT=hub.url)

        def hf_download() -> float:
            dest = root / "hf" / str(next(counter))
            return timed(lambda: sh(hf, "download", "bench/tiny", "--local-dir", str(dest), env=env))

        def rm_rf() -> float:
            dest = root / "rm" / str(next(counter))
            sh(hf, "download", "bench/tiny", "--local-dir", str(dest), env=env)
            return timed(lambda: sh("rm", "-rf", str(dest)))

        create_and_delete()  # warm-up: the Prefect server and the imports
        ours = [create_and_delete() for _ in range(runs)]
        up = sorted(u for u, _ in ours)[len(ours) // 2]
        down = sorted(d for _, d in ours)[len(ours) // 2]
        ref_up, ref_down = median_of(runs, hf_download), median_of(runs, rm_rf)
        hub.stop()
    row(f"lifecycle, tiny model: create -> Ready, median of {runs}", f"{up:.2f} s", f"{ref_up:.2f} s (`hf download`)",
        f"{up / ref_up:.1f}x the time")
    row(f"lifecycle, tiny model: delete -> released, median of {runs}", f"{down:.2f} s",
        f"{ref_down * 1000:.0f} ms (`rm -rf`)", f"{down / ref_down:.0f}x the time")


if __name__ == "__main__":
    main()
