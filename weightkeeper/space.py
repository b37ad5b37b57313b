"""Free-space check before a download: the bytes still missing must fit on the volume with a margin."""

from __future__ import annotations

import os
from collections.abc import Iterable

from weightkeeper.anchored import Dir
from weightkeeper.download import RemoteFile, present_bytes
from weightkeeper.errors import DownloadError
from weightkeeper.planning import bytes_to_fetch, space_problem


def free_space(target: Dir) -> tuple[str, int]:
    """The mount point holding `target` (for messages) and its free bytes (asked of the open directory)."""
    mount = os.path.realpath(target.where)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    st = os.fstatvfs(target.fd)
    return mount, st.f_bavail * st.f_frsize


def check_free_space(name: str, target: Dir, files: Iterable[RemoteFile], margin: int) -> None:
    """Fail fast, before any byte is written, when the missing files do not fit on the volume."""
    needed = bytes_to_fetch((f.size, present_bytes(target, f)) for f in files)
    mount, free = free_space(target)
    problem = space_problem(needed, free, margin, mount)
    if problem:
        raise DownloadError(f"no space for model {name!r} in {target}: it {problem}; nothing was written. "
                            "Free space on the volume (or lower free_space_margin_bytes), then run "
                            f"`weightkeeper model ensure {name}`", permanent=True)
