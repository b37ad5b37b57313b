"""Files a download takes from verified copies already on the volume instead of fetching them again.

A new commit of a repository usually changes a few files: every file whose digest and size match a file of a
verified copy of the same repository on the same volume (`registry.verified_copies`, `planning.reuse_plan`) is
put in place from it. A hard link shares the inode: no bytes are copied, and removing either tree leaves the
other whole. Where the two trees cannot share inodes (another filesystem below the volume, a link count at its
limit, hard links refused) the file is copied with `copy_file_range`, which shares extents on filesystems that
can (reflink) and copies otherwise, only while the copies leave the margin a download leaves free on the volume.
Either way the file is hashed against the new manifest before it takes its name, so a copy changed since it was
verified is never passed on: that file is fetched instead. Only a sha256 (LFS files) resists a planted collision:
a file checked by its git blob sha1 (config, tokenizer, code run with trust_remote_code) is taken only from an
inode weightkeeper would link (its own, writable by no one else); from a user's or a writable one it is fetched.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from weightkeeper.anchored import Dir, PathOpener
from weightkeeper.download import HASH_CHUNK, PARTIAL_DIR, RemoteFile, expected_digest, file_hasher
from weightkeeper.errors import UnsafePathError
from weightkeeper.guard import VolumeRule
from weightkeeper.layout import is_artifacts_dir
from weightkeeper.planning import reuse_plan

logger = logging.getLogger("weightkeeper.reuse")
FILE_MODE = 0o644  # a copy's mode, as a fetched file's


@dataclass
class Reused:
    """What a download took from copies on the volume: files, and bytes by how ("hard link", "copy")."""

    files: int = 0
    by_how: dict[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.by_how.values())

    def add(self, how: str, size: int) -> None:
        self.files += 1
        self.by_how[how] = self.by_how.get(how, 0) + size

    def __str__(self) -> str:
        return f"{self.files} files ({self.bytes} bytes) reused by {' and '.join(sorted(self.by_how)) or 'nothing'}"


class Room:
    """What the copies of one reuse may write: the bytes free on the target's filesystem as it starts, less `margin`
    (`free_space_margin_bytes`, which a download leaves free too). A copy that does not fit is refused before a byte is
    written (ENOSPC): its file is fetched, if the download's own space check lets it."""

    def __init__(self, target: Dir, margin: int):
        st = os.fstatvfs(target.fd)
        self.left, self.lock = st.f_bavail * st.f_frsize - margin, threading.Lock()

    def __call__(self, size: int) -> None:
        with self.lock:
            if size > self.left:
                raise OSError(errno.ENOSPC, f"a copy of {size} bytes would leave less than free_space_margin_bytes "
                                            "free on the volume")
            self.left -= size


def _digest(fd: int, remote: RemoteFile) -> str:
    h = file_hasher(remote)
    while chunk := os.read(fd, HASH_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _put(target: Dir, source: Dir, source_path: str, remote: RemoteFile, room: Room) -> str | None:
    """Put `source_path` of `source` at `remote.path` in `target` if it is `remote`'s content: how, or None."""
    src_folder, _, src_name = source_path.rpartition("/")
    folder, _, name = remote.path.rpartition("/")
    tmp = f"{name}.{uuid.uuid4().hex[:8]}.reuse"
    with source.descend(src_folder) as src, target.descend(f"{PARTIAL_DIR}/{folder}".rstrip("/"), create=True) as \
            scratch, target.descend(folder, create=True) as dest:
        # another's inode only for a sha256 (`file_hasher`): a git blob sha1 would pass a planted collision
        how, fd = scratch.take(src, src_name, tmp, remote.size, room, others=bool(remote.sha256),
                               owner=os.fstat(source.fd).st_uid)
        try:
            good = os.fstat(fd).st_size == remote.size and _digest(fd, remote) == expected_digest(remote)
            if good and how == "copy":
                os.fchmod(fd, FILE_MODE)  # readable once it is the manifest's bytes, not another user's
        finally:
            os.close(fd)
        if not good:
            scratch.unlink(tmp)
            logger.warning("%s/%s no longer matches its recorded digest: %s is fetched instead", source, source_path,
                           remote.path)
            return None
        try:
            scratch.rename(tmp, dest, name)
        except OSError:
            scratch.unlink(tmp)
            raise
        return how


def reuse_files(target: Dir, missing: Iterable[RemoteFile], copies: Iterable[tuple[str, list]],
                volumes: Iterable[VolumeRule], workers: int = 4, *, margin: int) -> Reused:
    """Put in `target` each missing file that a verified copy (`copies`: directory, recorded files) holds, `workers`
    files at a time (each is hashed); copies leave `margin` bytes free (`Room`)."""
    missing = {f.path: f for f in missing}
    plan = reuse_plan([f.to_json() for f in missing.values()], copies, skip=target.where)
    reused, room = Reused(), Room(target, margin)
    with PathOpener(volumes) as opener, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for where in sorted({w for w, _ in plan.values()}):
            try:
                source = opener.open(where, artifact=any(map(is_artifacts_dir, where.split("/"))))  # never a model's
            except (OSError, UnsafePathError) as e:
                logger.warning("cannot reuse files of %s: %s", where, e)
                continue
            with source:
                wanted = sorted(path for path, (w, _) in plan.items() if w == where)
                for path, how in zip(wanted, pool.map(lambda p: _try(target, source, plan[p][1], missing[p], room),
                                                      wanted)):
                    if how:
                        reused.add(how, missing[path].size)
    return reused


def _try(target: Dir, source: Dir, source_path: str, remote: RemoteFile, room: Room) -> str | None:
    try:
        return _put(target, source, source_path, remote, room)
    except (OSError, UnsafePathError) as e:
        logger.warning("cannot reuse %s of %s for %s: %s; it is fetched", source_path, source, remote.path, e)
        return None
