"""Filesystem side of shared copies: the ready marker, the per-snapshot file lock, links, the link scan.

Everything goes through `weightkeeper.anchored`: a copy is a `Dir` opened from its volume root.
"""

from __future__ import annotations

import fcntl
import os
import posixpath
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from weightkeeper.anchored import Dir, open_under, volume_of
from weightkeeper.download import PARTIAL_DIR, READY_MARKER
from weightkeeper.errors import CleanupError, LinkInTheWayError, UnsafePathError
from weightkeeper.fsops import shelf_uid
from weightkeeper.guard import VolumeRule
from weightkeeper.layout import is_artifacts_dir

LOCKS_DIR = ".locks"


def is_ready(copy: Dir, commit: str) -> bool:
    """The marker is written only after a full verification of the copy."""
    try:
        with copy.descend(PARTIAL_DIR) as d:
            raw = d.read_small(READY_MARKER, 64)
    except (FileNotFoundError, UnsafePathError):
        return False
    return raw is not None and raw.decode(errors="replace").strip() == commit


def mark_ready(copy: Dir, commit: str) -> None:
    with copy.descend(PARTIAL_DIR, create=True) as d:
        d.write_atomic(READY_MARKER, (commit + "\n").encode())


def unmark_ready(copy: Dir) -> None:
    try:
        with copy.descend(PARTIAL_DIR) as d:
            d.unlink(READY_MARKER)
    except (FileNotFoundError, UnsafePathError):
        pass


def _private(d: Dir, fd: int, where: str, owner: int | None) -> None:
    """No one else may open it: whoever can read a lock file can hold its `flock` forever (made so by an earlier
    version, its group and other bits are cleared). Only this process's own, or those of the `owner` whose shelf it is
    on (their job made them): any other is refused, never chmod-ed, as whoever can write on the shelf may have moved
    a file or directory of someone else's there (`d`: the directory it is in)."""
    st = os.fstat(fd)
    if st.st_uid != owner and not d.mine(st.st_uid):
        raise LinkInTheWayError(f"refusing {where} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): "
                                "neither weightkeeper's own nor its shelf owner's, so it is never used or chmod-ed; "
                                "it is left alone and the shared copy waits: move it away (weightkeeper makes its own)")
    if st.st_mode & 0o077:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)


@contextmanager
def file_lock(artifact: str, volumes: Iterable[VolumeRule], on_wait: Callable[[], None],
              poll: float = 1.0) -> Iterator[None]:
    """An exclusive `flock` on `<models root>/_artifacts[.<uid>]/.locks/<repo dir>--<commit>.lock`, for processes on
    hosts that share the volume. The kernel drops it when its holder dies; `on_wait` runs while another
    holder has it (and may raise to give up). Only its maker may open `.locks` and the lock (`_private`)."""
    volume, relative = volume_of(artifact, volumes)
    artifacts, repo_dir, commit = relative.rsplit("/", 2)
    owner, name = shelf_uid(artifact), f"{repo_dir}--{commit}.lock"
    with open_under(volume.root, artifacts, create=True) as shelf, shelf.descend(LOCKS_DIR, True, 0o700) as locks:
        _private(shelf, locks.fd, locks.where, owner)
        fd = locks.open_regular(name, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _private(locks, fd, locks.path(name), owner)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    on_wait()
                    time.sleep(poll)
            yield
        finally:
            os.close(fd)


def links_into(artifact: str, volumes: Iterable[VolumeRule]) -> list[str]:
    """Every symlink under the copy's models root (outside the `_artifacts` shelves) whose target, read from where it
    stands without following any other link, is inside `artifact`."""
    volume, relative = volume_of(artifact, volumes)
    found = []
    with open_under(volume.root, relative.rsplit("/", 3)[0]) as models_root:
        try:
            for current, names in models_root.walk(skip=filter(is_artifacts_dir, models_root.entries())):
                for name in names:
                    if name.startswith(".") and name.endswith(".link"):  # one `Dir.symlink` had not put in place yet
                        continue
                    target = current.readlink(name)
                    resolved = target and posixpath.normpath(posixpath.join(current.where, target))
                    if resolved and (resolved == artifact or resolved.startswith(artifact + "/")):
                        found.append(current.path(name))
        except OSError as e:  # a directory this process may not read (a user's, mode 0700) may hold a link
            raise CleanupError(f"cannot look for links into {artifact} in {e.filename or models_root}: "
                               f"{e.strerror or e}; the copy is kept") from None
    return found


def discard(copy: Dir, relative: str) -> None:
    """Remove one damaged entry of a copy (file, link or directory), never following a link: if a
    directory on the way is a symlink, that link itself is what gets removed. A directory on the way that is not
    owned as the copy is (moved in by whoever may write in it) is neither entered nor removed (`Dir.remove`)."""
    parts = relative.split("/")
    current = Dir(os.dup(copy.fd), copy.where)
    try:
        for part in parts[:-1]:
            st = current.lstat(part)
            if st is None:
                return
            if not stat.S_ISDIR(st.st_mode):
                current.unlink(part)
                return
            try:
                child = current.descend(part)
            except UnsafePathError:
                current.unlink(part)
                return
            current.close()
            current = child
            if (uid := os.fstat(current.fd).st_uid) != os.fstat(copy.fd).st_uid:
                raise LinkInTheWayError(f"{current} (owner uid {uid}) is not owned as {copy} is, so it is not "
                                        "weightkeeper's: it is left alone and the copy not repaired; move it away")
        current.remove(parts[-1])
    finally:
        current.close()
