"""Verification throughput against `sha256sum` on the same files, in the same run.

    .venv/bin/python bench/verify.py [--files 4] [--mib 256] [--quick]

Both read warm files (each file is read once first), so the figures compare hashing, not the disk.
Prints MiB/s for `sha256sum`, for `verify_copy` with 1 worker and with 4, and the ratios, as rows of
bench/run_all.py's table. `--quick` uses 4 files of 32 MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

from weightkeeper.anchored import Dir
from weightkeeper.download import RemoteFile
from weightkeeper.verify import verify_copy


def make_files(root: Path, count: int, mib: int) -> list[RemoteFile]:
    files = []
    block = os.urandom(1 << 20)
    for i in range(count):
        name = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        h = hashlib.sha256()
        with open(root / name, "wb") as f:
            for j in range(mib):
                chunk = block[j % 997:] + block[: j % 997]  # distinct chunks, cheap to make
                f.write(chunk)
                h.update(chunk)
        files.append(RemoteFile(name, mib << 20, "0" * 40, h.hexdigest()))
    return files


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.mib = 32
    with tempfile.TemporaryDirectory(prefix="wk-bench-verify-") as tmp:
        root = Path(tmp)
        files = make_files(root, args.files, args.mib)
        total_mib = args.files * args.mib
        paths = [str(root / f.path) for f in files]
        subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        reference = timed(lambda: subprocess.run(["sha256sum", *paths], stdout=subprocess.DEVNULL, check=True))
        results = {}
        with Dir.root(root) as copy:  # verify_copy takes the copy's open directory (the anchored layer)
            for workers in (1, 4):
                elapsed = timed(lambda: verify_copy(copy, files, deep=True, workers=workers))
                assert not verify_copy(copy, files, deep=False)
                results[workers] = elapsed
    for workers, elapsed in results.items():
        print(f"| verify {args.files} x {args.mib} MiB (warm cache), workers={workers} | {total_mib / elapsed:.0f} MiB/s "
              f"| {total_mib / reference:.0f} MiB/s (`sha256sum`) | {reference / elapsed:.2f}x sha256sum's speed |")


if __name__ == "__main__":
    main()
