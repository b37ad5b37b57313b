"""Verify a copy of a snapshot against its manifest: present, regular, right size, right content."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

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


def _digest(fd: int, size: int, remote: RemoteFile) -> str | None:
    """The digest, of the kind its manifest states, of the open file; None when it does not hold exactly `size`
    bytes as it is read (at most `size` + 1 are read, however fast its owner grows it)."""
    h, read = file_hasher(remote), 0
    while read <= size and (chunk := os.read(fd, min(READ_CHUNK, size + 1 - read))):
        read += len(chunk)
        if read <= size:
            h.update(chunk)
    return h.hexdigest() if read == size else None


Listed = tuple[str, int]  # a recorded file as the cheap check needs it: its path and size


def listed(files: list) -> tuple[Listed, ...] | None:
    """A manifest as the cheap check needs it (no digest parsed); None when an entry is not a path and a size
    (`RemoteFile.from_json`, in the copy's own check, says which and why)."""
    out = []
    for f in files:
        if type(f) is not dict or type(path := f.get("path")) is not str or type(size := f.get("size")) is not int \
                or size < 0:
            return None
        out.append((path, size))
    return tuple(out)


def hash_due(verified_at: datetime | None, interval_seconds: float, now: datetime) -> bool:
    """A copy is hashed in full when it never was, or not within the verify interval (`Due.hashes`)."""
    return Due.at(now, interval_seconds, 0).hashes(verified_at)


CHECK_SPREAD = 8  # copies fall due for their cheap check at this many points between 3/4 of the interval and all of it


@dataclass(frozen=True)
class Due:
    """What a pass at `now` finds due: a full hash of a copy not hashed within `verify_interval`, else its cheap
    check when it had none within its own share of `check_interval` (by its key, so that copies checked in one
    pass come due in different ones)."""

    hash_before: datetime
    check_before: tuple[datetime, ...]

    @classmethod
    def at(cls, now: datetime, verify_interval: float, check_interval: float) -> Due:
        return cls(now - timedelta(seconds=verify_interval),
                   tuple(now - timedelta(seconds=check_interval * (0.75 + k / (4 * CHECK_SPREAD)))
                         for k in range(CHECK_SPREAD)))

    def hashes(self, verified_at: datetime | None) -> bool:
        """A copy is hashed in full when it never was, or not within the verify interval."""
        return verified_at is None or verified_at < self.hash_before

    def of(self, verified_at: datetime | None, checked_at: datetime | None, key: int) -> bool | None:
        """A hash (True), the cheap check (False), or nothing yet (None)."""
        if self.hashes(verified_at):
            return True
        return False if checked_at is None or checked_at <= self.check_before[key % CHECK_SPREAD] else None


def _problem(st: os.stat_result | None, path: str, size: int) -> Problem | None:
    if st is None:
        return Problem(path, "missing")
    if stat.S_ISLNK(st.st_mode):
        return Problem(path, "is a symlink, not a file")
    if not stat.S_ISREG(st.st_mode):
        return Problem(path, "not a regular file")
    if st.st_size != size:
        return Problem(path, f"size {st.st_size}, expected {size}")
    return None


def _unreadable(path: str, e: OSError) -> Problem:
    """A file of the copy that cannot be opened or read (its mode changed by whoever may, a mount of theirs, the
    volume's I/O error): a problem of the copy, repaired as any other, never an error of the whole check. This
    process's own want of descriptors or memory, and a network filesystem failing over, are no fault of the copy:
    they are raised."""
    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN, errno.ESTALE, errno.ETIMEDOUT):
        raise e
    return Problem(path, f"cannot be read: {e.strerror or e}")


def _check_entry(d: Dir, name: str, path: str, size: int, remote: RemoteFile | None) -> Problem | None:
    """The entry's problem by its stat (nothing else is opened); with `remote`, the file is then opened once
    without following a link, and what was opened is checked again and hashed (an entry swapped or grown since
    the stat is never read past its recorded size)."""
    try:
        st = d.lstat(name)
    except OSError as e:  # a directory on the way this process may list but not search
        return _unreadable(path, e)
    if (problem := _problem(st, path, size)) or remote is None:
        return problem
    if problem := digest_problem(remote):
        return Problem(path, f"cannot be checked: {problem}")
    try:
        fd = d.open(name, os.O_RDONLY)
    except FileNotFoundError:
        return Problem(path, "missing")
    except OSError as e:  # swapped since the stat: `open` opens nothing but a regular file
        if e.errno == errno.ELOOP:
            return Problem(path, "is a symlink, not a file")
        if e.errno in (errno.EISDIR, errno.ENXIO):
            return Problem(path, "not a regular file")
        return _unreadable(path, e)
    try:
        if problem := _problem(os.fstat(fd), path, size):
            return problem
        digest = _digest(fd, size, remote)
    except OSError as e:
        return _unreadable(path, e)
    finally:
        os.close(fd)
    if digest is None:
        return Problem(path, f"changed size while it was hashed (recorded {size} bytes)")
    if digest != expected_digest(remote):
        return Problem(path, "content does not match its checksum")
    return None


def _check(root: Dir, path: str, size: int, remote: RemoteFile | None = None) -> Problem | None:
    """The file's problem, if any; with `remote`, its content is hashed too."""
    folder, _, name = path.rpartition("/")
    if not folder:
        return _check_entry(root, name, path, size, remote)
    try:
        d = root.descend(folder)
    except UnsafePathError:
        return Problem(path, "a directory on its way is a symlink")
    except (FileNotFoundError, NotADirectoryError):
        return Problem(path, "missing")
    except OSError as e:  # a directory on the way this process may not open
        return _unreadable(path, e)
    with d:
        return _check_entry(d, name, path, size, remote)


def check_sizes(root: Dir, files: Sequence[Listed]) -> list[Problem]:
    """The cheap check of the copy in `root`: each file present, regular and of its size, a stat each in this
    thread; no symlink is followed. A file directly in `root` that passes costs the stat alone."""
    problems = []
    for path, size in files:
        if "/" not in path:
            try:
                st = os.stat(path, dir_fd=root.fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_size == size:
                    continue
            except OSError:
                pass  # said below
        if problem := _check(root, path, size):
            problems.append(problem)
    return problems


def verify_copy(root: Dir, files: Sequence[RemoteFile], deep: bool, workers: int = 4,
                pool: ThreadPoolExecutor | None = None) -> list[Problem]:
    """Problems of the copy in `root` (empty when it is complete and correct). `deep` hashes every
    file, `workers` at a time (in `pool` when given: one for many copies); otherwise only presence, type and
    size are checked (`check_sizes`). No symlink is followed."""
    if not deep:
        return check_sizes(root, [(f.path, f.size) for f in files])
    if pool is not None:
        return [p for p in pool.map(lambda f: _check(root, f.path, f.size, f), files) if p]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as own:
        return verify_copy(root, files, deep, pool=own)
