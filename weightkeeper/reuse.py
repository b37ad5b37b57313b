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
inode weightkeeper would link (its own, writable by no one else), and only where no one else could have put that
inode at its name (`_sealed`: every directory from the volume root down to the file's is weightkeeper's and shut to
others): weightkeeper's own inodes hold bytes of any repository a user pointed a model at, and a user who may rename
in a directory on the way (their subpath, their shelf, a copy of theirs) could swap in one holding their bytes.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from weightkeeper.anchored import Dir, volume_of
from weightkeeper.download import HASH_CHUNK, PARTIAL_DIR, RemoteFile, expected_digest, file_hasher
from weightkeeper.errors import UnsafePathError
from weightkeeper.guard import VolumeRule, check_removable
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


def _sealed(d: Dir) -> bool:
    """No one but this process (or root) can rename, add or replace what `d` holds: it is root's or this process's
    euid's, and neither its group nor others may write in it, unless it is sticky (then only an entry's owner may
    rename it, and each entry on the way is checked to be ours in turn). Nothing is written to tell (`Dir.mine`
    would, in a user's directory): on a volume that maps owners (NFS squashing) no directory is sealed, and a
    file a git blob sha1 checks is fetched (it is small)."""
    st = os.fstat(d.fd)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return False
    return st.st_uid in (0, os.geteuid())


def _descend(d: Dir, relative: str, sealed: bool) -> tuple[Dir, bool]:
    """`d.descend(relative)` one directory at a time, and whether every one on the way is `_sealed` (with `sealed`)."""
    d = d.descend("")
    try:
        for name in (p for p in relative.split("/") if p):
            child = d.descend(name)
            d.close()
            d = child
            sealed = sealed and _sealed(d)
        return d, sealed
    except BaseException:
        d.close()
        raise


def _open_source(where: str, volumes: list[VolumeRule]) -> tuple[Dir, bool]:
    """The copy at `where`, walked from its volume root without following a link (a shared copy guarded as one,
    never a model's), and whether every directory from that root down to it is `_sealed`."""
    volume = check_removable(where, volumes, artifact=any(map(is_artifacts_dir, where.split("/"))))
    with Dir.root(volume.root) as root:
        return _descend(root, volume_of(where, [volume])[1], _sealed(root))


def _put(target: Dir, source: Dir, source_path: str, remote: RemoteFile, room: Room, sealed: bool) -> \
        str | None:
    """Put `source_path` of `source` at `remote.path` in `target` if it is `remote`'s content: how, or None.
    `sealed`: no one else could have put what stands in `source` there (`_open_source`)."""
    src_folder, _, src_name = source_path.rpartition("/")
    folder, _, name = remote.path.rpartition("/")
    tmp = f"{name}.{uuid.uuid4().hex[:8]}.reuse"
    src, sealed = _descend(source, src_folder, sealed)
    with src, target.descend(f"{PARTIAL_DIR}/{folder}".rstrip("/"), create=True) as \
            scratch, target.descend(folder, create=True) as dest:
        # another's inode only for a sha256 (`file_hasher`): a git blob sha1 would pass a planted collision
        how, fd = scratch.take(src, src_name, tmp, remote.size, room, others=bool(remote.sha256),
                               owner=os.fstat(source.fd).st_uid)
        try:
            if not (remote.sha256 or sealed):  # weightkeeper's inode, but which? Neither linked nor copied
                raise UnsafePathError(f"refusing {src.path(src_name)}: someone else may rename in a directory on its "
                                      "way, so it may be another inode of weightkeeper's put there (holding bytes of a "
                                      "repository they chose), and its git blob sha1 would not tell a planted "
                                      "collision")
            good = os.fstat(fd).st_size == remote.size and _digest(fd, remote) == expected_digest(remote)
            if good and how == "copy":
                os.fchmod(fd, FILE_MODE)  # readable once it is the manifest's bytes, not another user's
        except BaseException:
            scratch.unlink(tmp)
            raise
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
    volumes = list(volumes)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for where in sorted({w for w, _ in plan.values()}):
            try:
                source, sealed = _open_source(where, volumes)
            except (OSError, UnsafePathError) as e:
                logger.warning("cannot reuse files of %s: %s", where, e)
                continue
            with source:
                wanted = sorted(path for path, (w, _) in plan.items() if w == where)
                for path, how in zip(wanted, pool.map(
                        lambda p: _try(target, source, plan[p][1], missing[p], room, sealed), wanted)):
                    if how:
                        reused.add(how, missing[path].size)
    return reused


def _try(target: Dir, source: Dir, source_path: str, remote: RemoteFile, room: Room, sealed: bool) -> str | None:
    try:
        return _put(target, source, source_path, remote, room, sealed)
    except (OSError, UnsafePathError) as e:
        logger.warning("cannot reuse %s of %s for %s: %s; it is fetched", source_path, source, remote.path, e)
        return None
