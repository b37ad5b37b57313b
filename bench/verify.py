"""Verification throughput against `sha256sum` on the same files, in the same run.

    .venv/bin/python bench/verify.py [--files 4] [--mib 256]

Both read warm files (each file is read once first), so the figures compare hashing, not the disk.
Prints MiB/s for `sha256sum`, for `verify_copy` with 1 worker and with 4, and the ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wk-bench-verify-") as tmp:
        root = Path(tmp)
        files = make_files(root, args.files, args.mib)
        total_mib = args.files * args.mib
        paths = [str(root / f.path) for f in files]
        subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        reference = timed(lambda: subprocess.run(["sha256sum", *paths], stdout=subprocess.DEVNULL, check=True))
        results = {}
        for workers in (1, 4):
            elapsed = timed(lambda: verify_copy(root, files, deep=True, workers=workers))
            assert not verify_copy(root, files, deep=False)
            results[workers] = elapsed
    print(f"data: {args.files} files x {args.mib} MiB = {total_mib} MiB, warm page cache, {os.cpu_count()} CPUs")
    print(f"sha256sum            {total_mib / reference:8.1f} MiB/s")
    for workers, elapsed in results.items():
        print(f"verify_copy workers={workers} {total_mib / elapsed:8.1f} MiB/s   ratio vs sha256sum {reference / elapsed:.2f}")


if __name__ == "__main__":
    main()
