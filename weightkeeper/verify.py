"""Verify a copy of a snapshot against its manifest: present, regular, right size, right content."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from weightkeeper.anchored import Dir
from weightkeeper.download import RemoteFile, digest_problem, expected_digest, file_hasher
from weightkeeper.errors import UnsafePathError

READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class Problem:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _digest(d: Dir, name: str, remote: RemoteFile) -> str:
    """The file's digest, of the kind its manifest states."""
    h = file_hasher(remote)
    fd = d.open(name, os.O_RDONLY)
    with os.fdopen(fd, "rb", buffering=0) as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check(root: Dir, remote: RemoteFile, deep: bool) -> Problem | None:
    folder, _, name = remote.path.rpartition("/")
    try:
        d = root.descend(folder)
    except UnsafePathError:
        return Problem(remote.path, "a directory on its way is a symlink")
    except (FileNotFoundError, NotADirectoryError):
        return Problem(remote.path, "missing")
    with d:
        st = d.lstat(name)
        if st is None:
            return Problem(remote.path, "missing")
        if stat.S_ISLNK(st.st_mode):
            return Problem(remote.path, "is a symlink, not a file")
        if not stat.S_ISREG(st.st_mode):
            return Problem(remote.path, "not a regular file")
        if st.st_size != remote.size:
            return Problem(remote.path, f"size {st.st_size}, expected {remote.size}")
        if deep and (problem := digest_problem(remote)):
            return Problem(remote.path, f"cannot be checked: {problem}")
        if deep and _digest(d, name, remote) != expected_digest(remote):
            return Problem(remote.path, "content does not match its checksum")
    return None


def verify_copy(root: Dir, files: Sequence[RemoteFile], deep: bool, workers: int = 4) -> list[Problem]:
    """Problems of the copy in `root` (empty when it is complete and correct). `deep` hashes every
    file, `workers` at a time; otherwise only presence, type and size are checked. No symlink is followed."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return [p for p in pool.map(lambda f: _check(root, f, deep), files) if p]
