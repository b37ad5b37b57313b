"""Verify a copy of a snapshot against its manifest: present, regular, right size, right content."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from weightkeeper.download import RemoteFile, expected_digest, file_hasher

READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class Problem:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _digest(path: str, remote: RemoteFile) -> str:
    h = file_hasher(remote)
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check(root: str, remote: RemoteFile, deep: bool) -> Problem | None:
    full = os.path.join(root, remote.path)
    parent = os.path.dirname(full)
    if os.path.realpath(parent) != os.path.join(os.path.realpath(root), os.path.dirname(remote.path)).rstrip("/"):
        return Problem(remote.path, "a directory on its way is a symlink")
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return Problem(remote.path, "missing")
    if stat.S_ISLNK(st.st_mode):
        return Problem(remote.path, "is a symlink, not a file")
    if not stat.S_ISREG(st.st_mode):
        return Problem(remote.path, "not a regular file")
    if st.st_size != remote.size:
        return Problem(remote.path, f"size {st.st_size}, expected {remote.size}")
    if deep and _digest(full, remote) != expected_digest(remote):
        return Problem(remote.path, "content does not match its checksum")
    return None


def verify_copy(root: str | Path, files: Sequence[RemoteFile], deep: bool, workers: int = 4) -> list[Problem]:
    """Problems of the copy at `root` (empty when it is complete and correct). `deep` hashes every
    file, `workers` at a time; otherwise only presence, type and size are checked. No symlink is followed."""
    root = str(root)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return [p for p in pool.map(lambda f: _check(root, f, deep), files) if p]
