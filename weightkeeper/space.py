"""Free-space check before a download or a repair: the bytes still missing must fit on the volume with a margin."""

from __future__ import annotations

import os
from collections.abc import Iterable

from weightkeeper.anchored import Dir
from weightkeeper.download import RemoteFile, present_bytes
from weightkeeper.errors import DownloadError
from weightkeeper.planning import bytes_to_fetch, space_problem


def free_space(target: Dir | str) -> tuple[str, int]:
    """The mount point holding `target` (for messages) and its free bytes: asked of the open directory, or for
    a path not made yet, of its nearest existing parent (a read: nothing is written through it). A user may swap
    links on that path meanwhile: a name that cannot be asked is passed over for its parent (`_mount_of`)."""
    if isinstance(target, Dir):
        existing, st = target.where, os.fstatvfs(target.fd)
    else:
        existing = target
        while (st := _statvfs(existing)) is None:
            existing = os.path.dirname(existing)
    return _mount_of(existing), st.f_bavail * st.f_frsize


def _statvfs(path: str) -> os.statvfs_result | None:
    try:
        return os.statvfs(path)
    except OSError:  # gone, or a link swapped in (dangling, looping): its parent is asked
        if os.path.dirname(path) == path:
            raise
        return None


def _mount_of(path: str) -> str:
    """The mount point above `path`, for a message: where a link on it changes meanwhile (realpath's readlink then
    meets a directory), the path itself."""
    try:
        mount = os.path.realpath(path)
    except OSError:
        return path
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    return mount


def room_problem(target: Dir | str, files: Iterable[RemoteFile], margin: int) -> str | None:
    """Why the files still missing in `target` (the directory, or its path before it is made, when nothing is
    present yet) do not fit on the volume with `margin` to spare; None when they do."""
    needed = bytes_to_fetch((f.size, present_bytes(target, f) if isinstance(target, Dir) else 0) for f in files)
    mount, free = free_space(target)
    return space_problem(needed, free, margin, mount)


def check_free_space(name: str, target: Dir | str, files: Iterable[RemoteFile], margin: int,
                     done: str = "nothing was written") -> None:
    """Fail fast, before any byte of model `name` is written (or before a file whose resumed bytes failed their
    digest is fetched again whole: `done` says so), when the missing files do not fit (`room_problem`)."""
    if problem := room_problem(target, files, margin):
        raise DownloadError(f"no space for model {name!r} in {target}: it {problem}; {done}. "
                            "Free space on the volume (or lower free_space_margin_bytes), then run "
                            f"`weightkeeper model ensure {name}`", permanent=True)
