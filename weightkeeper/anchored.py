"""The one file layer for everything weightkeeper writes or removes under a volume (or its own home).

A `Dir` is an open directory file descriptor. It is reached from a trusted root (a workspace volume
root, weightkeeper's home) one component at a time with `O_NOFOLLOW | O_DIRECTORY`, and every
operation below it names an entry relative to that descriptor (`dir_fd=`, `follow_symlinks=False`).
So a check and its use are the same directory: a user who swaps a directory on the way for a symlink
after the check makes the walk fail (`UnsafePathError`), never redirects a write or a removal.
The pure guard (`weightkeeper.guard`) decides which paths may be touched; this layer makes that true
at the moment of the system call.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator

from weightkeeper.errors import CleanupError, LinkInTheWayError, NotOursError, UnsafePathError
from weightkeeper.guard import VolumeRule, check_removable

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a planted FIFO never blocks an open
SMALL_FILE_BYTES = 1 << 20  # what `read_small` reads at most (markers, range progress)
WALK_OPEN = 64  # the deepest levels of a tree `walk` keeps open (and its top): however deep, descriptors are bounded
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # renameat2(2): fail if the new name exists; swap two entries atomically
_LIBC = ctypes.CDLL(None, use_errno=True)


def _rename2(fd: int, a: str, b: str, flags: int) -> bool:
    """renameat2 of `a` to `b` in directory `fd`; False where the file system cannot (NFS, old kernels)."""
    renameat2 = getattr(_LIBC, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(fd, os.fsencode(a), fd, os.fsencode(b), flags) != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False
        raise OSError(err, os.strerror(err), b)
    return True


def _owner_of_a_file_made_in(fd: int) -> int:
    """The owner a file this process makes in directory `fd` gets (made and removed at once)."""
    probe = f".probe.{uuid.uuid4().hex[:8]}"
    try:
        made = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=fd)
    except PermissionError:  # not writable by this process: not the directory it made
        return -1
    try:
        return os.fstat(made).st_uid
    finally:
        os.close(made)
        os.unlink(probe, dir_fd=fd)


def _segments(relative: str) -> list[str]:
    parts = [p for p in relative.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UnsafePathError(f"refusing {relative!r}: '.' and '..' are not followed")
    return parts


def _open_child(fd: int, name: str, create: bool, mode: int) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, mode, dir_fd=fd)
    except FileExistsError:
        pass  # made meanwhile: opened below, without following a link all the same
    return os.open(name, DIR_FLAGS, dir_fd=fd)


def _copy(src: int, dst: int, size: int) -> None:
    """Copy the first `size` bytes of `src` (fewer if it ends first) into `dst`: `copy_file_range` (extents shared
    where the filesystem can), or where the kernel will not between these two filesystems, `sendfile`."""
    left = size
    try:
        while left and (n := os.copy_file_range(src, dst, min(left, 1 << 30))):
            left -= n
        return
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    os.lseek(src, 0, os.SEEK_SET)
    os.lseek(dst, 0, os.SEEK_SET)
    os.ftruncate(dst, 0)
    left = size
    while left and (n := os.sendfile(dst, src, None, min(left, 1 << 30))):
        left -= n


class Dir:
    """An open directory: every name below it is resolved from this descriptor, never through a link."""

    def __init__(self, fd: int, where: str):
        self.fd, self.where = fd, where

    @classmethod
    def root(cls, path: str | os.PathLike, create: bool = False) -> Dir:
        """A trusted root (a configured volume, weightkeeper's home): the root itself may be a link."""
        path = os.fspath(path)
        if create:
            os.makedirs(path, exist_ok=True)
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __str__(self) -> str:
        return self.where

    def path(self, name: str = "") -> str:
        return f"{self.where}/{name}" if name else self.where

    # -- walking -----------------------------------------------------------------------------

    def descend(self, relative: str, create: bool = False, mode: int = 0o755) -> Dir:
        """The directory `relative` below this one (made when `create`); `FileNotFoundError` when it is
        missing, `UnsafePathError` when an entry on the way is a link or not a directory."""
        fd, where = os.dup(self.fd), self.where
        try:
            for name in _segments(relative):
                try:
                    child = _open_child(fd, name, create, mode)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise LinkInTheWayError(f"refusing {where}/{name}: it is a symlink or not a directory, "
                                                "and weightkeeper never follows one below a volume") from None
                    raise
                os.close(fd)
                fd, where = child, f"{where}/{name}"
            return Dir(fd, where)
        except BaseException:
            os.close(fd)
            raise

    def make_dir(self, name: str, mode: int = 0o755) -> Dir:
        """A directory `name` made here and now, and this process's own: `FileExistsError` when anything stands
        there, even if put there a moment ago. It is made under a temporary name, opened and checked (empty, and
        owned as a file this process makes in it is: file systems that map owners, NFS squashing or EFS access
        points, map both alike), then renamed into place without replacing anything (where the file system
        cannot, after checking the name is free): the Dir is the directory made, whatever is renamed around it."""
        tmp = f".{name}.{uuid.uuid4().hex[:8]}.new"
        os.mkdir(tmp, mode, dir_fd=self.fd)
        fd = os.open(tmp, DIR_FLAGS, dir_fd=self.fd)
        ours = False
        try:
            ours = not os.listdir(fd) and os.fstat(fd).st_uid == _owner_of_a_file_made_in(fd)
            if not ours:
                raise FileExistsError(errno.EEXIST, "replaced while it was made", self.path(name))
            if not _rename2(self.fd, tmp, name, RENAME_NOREPLACE):
                if self.lstat(name) is not None:
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), self.path(name))
                os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            st, mine = self.lstat(tmp), os.fstat(fd)
            os.close(fd)
            if ours and st is not None and (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                with contextlib.suppress(OSError):
                    os.rmdir(tmp, dir_fd=self.fd)  # the one made here, only ever empty
            raise
        return Dir(fd, self.path(name))

    def entries(self) -> list[str]:
        return os.listdir(self.fd)

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def shut_to_others(self, owner: int | None = None) -> bool:
        """This directory is this process's (owned as a file it makes here is: see `make_dir`) or `owner`'s, and
        neither its group nor others may write in it: no one else can rename, replace or add what it holds."""
        st = os.fstat(self.fd)
        return not st.st_mode & 0o022 and (st.st_uid == owner or st.st_uid == _owner_of_a_file_made_in(self.fd))

    def mine(self, uid: int) -> bool:
        """`uid` is this process's: its euid, or the owner a file it makes here gets (see `make_dir`)."""
        return uid == os.geteuid() or uid == _owner_of_a_file_made_in(self.fd)

    def identity(self) -> str:
        """`uid@dev:inode` of this directory: which directory it is, whatever its path, and whose (a freed inode is
        reused at once, by whoever makes a directory next)."""
        st = os.fstat(self.fd)
        return f"{st.st_uid}@{st.st_dev}:{st.st_ino}"

    # -- files -------------------------------------------------------------------------------

    def open(self, name: str, flags: int, mode: int = 0o644) -> int:
        """Open a regular file of this directory (with `O_CREAT`, made where nothing stands). What stands there is
        looked at (`O_PATH`) before it is opened, and only a regular file is: opening anything else can act (a
        device's driver, a FIFO's waiting writer). A link is ELOOP, a directory EISDIR, a FIFO, device or socket
        ENXIO, none of them opened; the file opened is the one looked at (reopened through its descriptor)."""
        if flags & os.O_CREAT and flags & os.O_EXCL:  # only ever a new regular file: whatever stands there is EEXIST
            return os.open(name, flags | FILE_FLAGS, mode, dir_fd=self.fd)
        for _ in range(3):
            try:
                probe = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
            except FileNotFoundError:
                if not flags & os.O_CREAT:
                    raise
                try:
                    return os.open(name, flags | os.O_EXCL | FILE_FLAGS, mode, dir_fd=self.fd)
                except FileExistsError:
                    continue  # made meanwhile: looked at first, as anything standing there
            try:
                kind = stat.S_IFMT(os.fstat(probe).st_mode)
                if kind != stat.S_IFREG:
                    err = {stat.S_IFLNK: errno.ELOOP, stat.S_IFDIR: errno.EISDIR}.get(kind, errno.ENXIO)
                    raise OSError(err, f"{os.strerror(err)} (not a regular file: never opened)", self.path(name))
                try:
                    return os.open(f"/proc/self/fd/{probe}", flags & ~os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK)
                except FileNotFoundError:  # never "missing": the file looked at is held open
                    raise OSError(errno.ENOSYS, "cannot reopen a file through /proc/self/fd: mount /proc",
                                  self.path(name)) from None
            finally:
                os.close(probe)
        raise UnsafePathError(f"refusing {self.path(name)}: it keeps being made and removed while it is opened")

    def open_regular(self, name: str, flags: int, mode: int = 0o644) -> int:
        """Open (or create) a regular file with one link: a planted FIFO, device, link or hard link is unlinked
        and a fresh file made in its place. A directory there is never removed (whoever can write here may have
        moved in one holding others' files): `LinkInTheWayError`, and it is left alone."""
        for _ in range(3):
            try:
                fd = self.open(name, flags, mode)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EWOULDBLOCK):
                    raise
                self._unlink_planted(name)
                continue
            st = os.fstat(fd)
            if st.st_nlink == 1:  # `open` opened a regular file: one with no other name is ours alone
                os.set_blocking(fd, True)
                return fd
            os.close(fd)
            self._unlink_planted(name)
        raise UnsafePathError(f"refusing {self.path(name)}: it keeps being replaced by something not a plain file")

    def make_new(self, name: str, flags: int, mode: int = 0o644) -> int:
        """A new, empty regular file `name` of this process's, open (blocking) with `flags`: whatever stands there (a
        link, a FIFO, another user's file moved here) is unlinked, never opened; a directory is left alone
        (`LinkInTheWayError`)."""
        for _ in range(3):
            self._unlink_planted(name)
            try:
                fd = self.open(name, flags | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:  # put there again meanwhile
                continue
            os.set_blocking(fd, True)
            return fd
        raise UnsafePathError(f"refusing {self.path(name)}: something keeps being put there while weightkeeper makes "
                              "a file of its own")

    def _unlink_planted(self, name: str) -> None:
        try:
            self.unlink(name)  # never a directory, even one renamed there since it was opened
        except IsADirectoryError:
            raise LinkInTheWayError(f"refusing {self.path(name)}: a directory stands where weightkeeper keeps a file "
                                    "of its own; it is left alone and nothing is written: move it away") from None

    def read_small(self, name: str, limit: int = SMALL_FILE_BYTES) -> bytes | None:
        """The content of a small regular file, or None when it is missing, not a regular file or too large."""
        try:
            fd = self.open(name, os.O_RDONLY)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_size > limit:  # `open` opens nothing but a regular file
                return None
            return os.read(fd, limit + 1)[:limit]
        finally:
            os.close(fd)

    def write_atomic(self, name: str, data: bytes) -> None:
        """Write a new file beside `name`, then rename it into place (what was there, link or not, is replaced)."""
        tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            os.set_blocking(fd, True)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        self.rename(tmp, self, name)

    def take(self, src: Dir, name: str, new: str, size: int, room: Callable[[int], None], *,
             others: bool, owner: int) -> tuple[str, int]:
        """Make `new` here (a name that must not exist) the regular file `name` of `src`, which is opened first
        without following a link, so the file checked is the file put here: a hard link to that very inode
        (`linkat` of the open descriptor) when both are on one filesystem and the inode is ours alone (this
        process's, writable by no one else), else a copy (`copy_file_range`, which shares extents where the
        filesystem can) of at most `size` bytes, once `room(size)` let it (it raises to refuse). A file not of
        `size` bytes is refused before either (a planted sparse or growing file never fills the volume); so is an
        inode neither this process's nor `owner`'s (the owner of the copy it is in: another user's file moved there),
        and one not ours alone unless `others`: its bytes may be someone's choice, which only a caller whose digest
        resists a planted collision may take. A copy is made mode 0600: the caller opens it to others only once its
        digest matched. Returns "hard link" or "copy", and a descriptor open on the result (the caller closes it)."""
        fd = src.open(name, os.O_RDONLY)
        try:
            st = os.fstat(fd)  # a regular file (`open`)
            if st.st_size != size:
                raise UnsafePathError(f"refusing {src.path(name)}: {st.st_size} bytes, not the {size} recorded")
            if st.st_uid not in (os.geteuid(), owner):
                raise UnsafePathError(f"refusing {src.path(name)} (owner uid {st.st_uid}): neither weightkeeper's nor "
                                      f"the owner's of the copy it is in (uid {owner}); another user's file was moved "
                                      "there")
            os.set_blocking(fd, True)
            try:  # only an inode this process owns and nobody else may write: no one can change it under the link
                if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    if not others:  # its bytes may be someone's choice
                        raise UnsafePathError(f"refusing {src.path(name)} (owner uid {st.st_uid}, mode "
                                              f"{stat.S_IMODE(st.st_mode):o}): not weightkeeper's alone, and its "
                                              "digest would not tell a planted collision")
                    raise OSError(errno.EPERM, "not ours alone")
                os.link(f"/proc/self/fd/{fd}", new, dst_dir_fd=self.fd, follow_symlinks=True)
                fd, linked = -1, fd
                return "hard link", linked
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOENT):
                    raise
            room(size)
            out = self.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)  # no one else reads it before its digest
            try:
                os.set_blocking(out, True)
                _copy(fd, out, size)
                os.lseek(out, 0, os.SEEK_SET)
            except BaseException:
                os.close(out)
                self.unlink(new)
                raise
            return "copy", out
        finally:
            if fd >= 0:
                os.close(fd)

    def rename(self, name: str, to: Dir, new: str) -> None:
        os.rename(name, new, src_dir_fd=self.fd, dst_dir_fd=to.fd)

    def symlink(self, target: str, name: str) -> None:
        """Point `name` at `target`: a link created where nothing is, or swapped atomically with the link there.
        Anything else standing there (a user's file, directory or FIFO, even one put there a moment ago) is left
        in place: `NotOursError`. Where the file system cannot swap, the link is renamed over the link checked."""
        try:
            os.symlink(target, name, dir_fd=self.fd)
            return
        except FileExistsError:
            pass
        refused = NotOursError(f"{self.path(name)} is not a link: it is left alone, and not linked")
        if not self.is_link(name):
            raise refused
        tmp = f".{name}.{uuid.uuid4().hex[:8]}.link"
        os.symlink(target, tmp, dir_fd=self.fd)
        try:
            if not _rename2(self.fd, tmp, name, RENAME_EXCHANGE):
                self.rename(tmp, self, name)
                return
            if not self.is_link(tmp):  # what was swapped out is not the link checked: put it back
                _rename2(self.fd, tmp, name, RENAME_EXCHANGE)
                raise refused
        finally:
            if self.is_link(tmp):  # the link swapped out, or ours: never what a failed swap back left there
                self.unlink(tmp)

    def is_link(self, name: str) -> bool:
        st = self.lstat(name)
        return st is not None and stat.S_ISLNK(st.st_mode)

    def readlink(self, name: str) -> str | None:
        try:
            return os.readlink(name, dir_fd=self.fd)
        except OSError:
            return None

    # -- removal -----------------------------------------------------------------------------

    def unlink(self, name: str) -> bool:
        try:
            os.unlink(name, dir_fd=self.fd)
            return True
        except FileNotFoundError:
            return False

    def rmdir(self, name: str) -> None:
        """Remove an empty directory (only ever an empty one)."""
        os.rmdir(name, dir_fd=self.fd)

    def remove(self, name: str) -> bool:
        """Remove an entry: a file or link is unlinked, a directory removed with all it holds. Nothing is
        followed, nothing on another filesystem is entered (a mount point inside refuses the removal), and no
        directory is entered whose owner is not this one's: whoever may write in a tree (a Kubernetes job's owner
        in theirs) can move in a directory of someone else's that they may not empty themselves, so it is left in
        place with all it holds (`LinkInTheWayError`, after what came before it was removed)."""
        st = self.lstat(name)
        if st is None:
            return False
        if not stat.S_ISDIR(st.st_mode):
            return self.unlink(name)
        if (child := self._enter(name)) is None:
            return True  # a link swapped in was unlinked, or it went meanwhile: nothing of it is left
        with child:
            child.clear()
            self.rmdir_if(name, os.fstat(child.fd))
        return True

    def rmdir_if(self, name: str, st: os.stat_result, strict: bool = False) -> bool:
        """Remove the empty directory `name` if it is still the one `st` describes: True when it went (or
        nothing stands there), False when another entry took its name, or (unless `strict`) when something is in it
        again; what stands there is left alone. `strict`: that directory holding something again raises
        `CleanupError`, naming it, so that it is kept for a retry."""
        def same(now: os.stat_result | None) -> bool:
            return now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)

        if (now := self.lstat(name)) is None:
            return True
        if not same(now):
            return False
        try:
            self.rmdir(name)  # only ever an empty one, whatever was renamed there since
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if strict and same(self.lstat(name)):
                try:
                    with self.descend(name) as again:
                        found = ", ".join(sorted(again.entries())[:3])
                except (OSError, UnsafePathError):
                    found = "entries"
                raise CleanupError(f"{self.path(name)} holds {found} again after it was emptied (written by a "
                                   "download that has not stopped yet, or a file still open on a network file "
                                   "system); it is kept and its removal retried") from None
            return False
        return True

    def clear(self) -> None:
        """Remove everything below this directory (see `remove`: only directories owned as the one they are in are
        entered, none on another filesystem). Depth first without recursion, holding directories open as `walk` does:
        however deep a tree a user made, neither the stack nor the descriptors grow with it. A directory is removed
        only while its name still names the one emptied."""
        levels = [_Level("", Dir(os.dup(self.fd), self.where))]
        try:
            while levels:
                if levels[-1].dir is None:
                    _reopen_last(levels)
                level, d = levels[-1], levels[-1].dir
                if level.todo is None:  # entered just now: its files go, its directories are entered one by one
                    level.todo = []
                    for name in d.entries():
                        st = d.lstat(name)
                        if st is not None and stat.S_ISDIR(st.st_mode):
                            level.todo.append(name)
                        elif st is not None:
                            d.unlink(name)
                if not level.todo:  # emptied: removed from its parent, if it is still the directory there
                    st = os.fstat(d.fd)
                    levels.pop().close()
                    if levels:
                        if levels[-1].dir is None:
                            _reopen_last(levels)
                        levels[-1].dir.rmdir_if(level.name, st)
                    continue
                name = level.todo.pop()
                if (child := d._enter(name)) is not None:
                    levels.append(_Level(name, child))
                    if len(levels) > WALK_OPEN + 1:
                        levels[-WALK_OPEN - 1].close()
        finally:
            for level in levels:
                level.close()

    def _enter(self, name: str) -> Dir | None:
        """The directory `name` here, to empty (see `remove`); None when it is gone, or was a link (unlinked)."""
        try:
            child = self.descend(name)
        except UnsafePathError:  # replaced by a link since it was listed: the link is what goes
            self.unlink(name)
            return None
        except FileNotFoundError:
            return None
        try:
            st, here = os.fstat(child.fd), os.fstat(self.fd)
            if st.st_dev != here.st_dev:
                raise CleanupError(f"{child.where} is a mount point; nothing below it was removed: unmount it")
            if st.st_uid != here.st_uid:
                raise LinkInTheWayError(f"{child.where} (owner uid {st.st_uid}) is not owned as {self.where} (uid "
                                        f"{here.st_uid}) is, so it is not weightkeeper's to empty: it is left in place "
                                        "with all it holds, and what holds it is kept; move it away, then it goes")
        except BaseException:
            child.close()
            raise
        return child

    def mount_inside(self) -> str | None:
        """The first directory below this one on another filesystem, or None."""
        device = os.fstat(self.fd).st_dev
        for child, _ in self.walk():
            if os.fstat(child.fd).st_dev != device:
                return child.where
        return None

    # -- reading a tree ----------------------------------------------------------------------

    def walk(self, skip: Iterable[str] = ()) -> Iterator[tuple[Dir, list[str]]]:
        """(directory, names of its non-directory entries) for this directory and every one below it, each
        opened from its parent without following links; `skip` names top-level entries to leave out.

        Depth first, one directory open per level, and only the deepest `WALK_OPEN` levels (and the top) at once:
        however wide or deep the tree, the descriptors are bounded. A level closed on the way down is opened again
        from the nearest open one on the way up, and must still be the directory it was (else `UnsafePathError`)."""
        skip = set(skip)
        levels = [_Level("", Dir(os.dup(self.fd), self.where))]
        try:
            while levels:
                level = levels[-1]
                if level.todo is None:  # entered just now: list it, hand it out
                    others, level.todo = [], []
                    for name in level.dir.entries():
                        if len(levels) == 1 and name in skip:
                            continue
                        st = level.dir.lstat(name)
                        if st is not None:
                            (level.todo if stat.S_ISDIR(st.st_mode) else others).append(name)
                    level.todo.reverse()
                    yield level.dir, others
                    continue
                if not level.todo:
                    levels.pop().close()
                    continue
                if level.dir is None:
                    _reopen_last(levels)
                name = level.todo.pop()
                try:
                    levels.append(_Level(name, level.dir.descend(name)))
                except (UnsafePathError, FileNotFoundError):
                    continue
                if len(levels) > WALK_OPEN + 1:
                    levels[-WALK_OPEN - 1].close()
        finally:
            for level in levels:
                level.close()

    def size(self, skip: Iterable[str] = ()) -> int:
        """Bytes of the regular files below this directory, links not followed."""
        total = 0
        for current, names in self.walk(skip):
            for name in names:
                st = current.lstat(name)
                if st is not None and stat.S_ISREG(st.st_mode):
                    total += st.st_size
        return total


class _Level:
    """One level of `Dir.walk`: its name in its parent, its directory (None while closed), which directory it is, and
    the names of its subdirectories left to walk (None until it is listed)."""

    def __init__(self, name: str, d: Dir):
        st = os.fstat(d.fd)
        self.name, self.dir, self.where, self.id = name, d, d.where, (st.st_dev, st.st_ino)
        self.todo: list[str] | None = None

    def close(self) -> None:
        if self.dir is not None:
            self.dir.close()
            self.dir = None


def _reopen_last(levels: list[_Level]) -> None:
    """Open the last of `levels` again by name from the nearest open one: the very directory it was."""
    top = max(i for i, level in enumerate(levels) if level.dir is not None)
    last = levels[-1]
    try:
        again = levels[top].dir.descend("/".join(level.name for level in levels[top + 1:]))
    except OSError:  # moved away meanwhile
        raise UnsafePathError(f"{last.where} was moved while weightkeeper read the tree it is in; read it again") \
            from None
    st = os.fstat(again.fd)
    if (st.st_dev, st.st_ino) != last.id:
        again.close()
        raise UnsafePathError(f"{last.where} was replaced while weightkeeper read the tree it is in; read it again")
    last.dir = again


def volume_of(path: str, volumes: Iterable[VolumeRule]) -> tuple[VolumeRule, str]:
    """The declared volume holding `path` and the path relative to its root (no guard: see `open_path`)."""
    for volume in sorted(volumes, key=lambda v: len(v.root), reverse=True):
        root = volume.root.rstrip("/")
        if root and path.startswith(root + "/"):
            return volume, path[len(root) + 1:]
    raise UnsafePathError(f"refusing {path!r}: not inside any declared workspace volume")


def open_parent(path: str, volumes: Iterable[VolumeRule], create: bool = False,
                artifact: bool = False) -> tuple[Dir, str]:
    """The parent directory of a guarded model path (or shared copy), walked from its volume root, and the
    path's last name. The guard is checked first; the walk makes it hold."""
    volume = check_removable(path, volumes, artifact)
    _, relative = volume_of(path, [volume])
    parent, _, name = relative.rpartition("/")
    with Dir.root(volume.root) as root:
        return root.descend(parent, create=create), name


def open_path(path: str, volumes: Iterable[VolumeRule], create: bool = False, artifact: bool = False) -> Dir:
    """The directory at a guarded model path (or shared copy), walked from its volume root."""
    parent, name = open_parent(path, volumes, create, artifact)
    with parent:
        return parent.descend(name, create=create)


class PathOpener:
    """`open_path` for many paths in a row (sorted, so that siblings follow each other): each path is guarded
    and opened from its parent without following a link, and a parent is walked from its volume root once,
    then kept open while the next paths are its children too."""

    def __init__(self, volumes: Iterable[VolumeRule]):
        self.volumes = list(volumes)
        self._parent: tuple[str, Dir] | None = None

    def __enter__(self) -> PathOpener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._parent is not None:
            self._parent[1].close()
            self._parent = None

    def open(self, path: str, artifact: bool = False) -> Dir:
        check_removable(path, self.volumes, artifact)
        where, _, name = path.rpartition("/")
        if self._parent is None or self._parent[0] != where:
            self.close()
            self._parent = (where, open_parent(path, self.volumes, artifact=artifact)[0])
        return self._parent[1].descend(name)


def open_under(root: str | os.PathLike, relative: str, create: bool = False) -> Dir:
    """A directory below a trusted root that is not a model path (locks, weightkeeper's scratch space)."""
    with Dir.root(root, create=create) as top:
        return top.descend(relative, create=create)


def remove_under(root: str | os.PathLike, relative: str) -> bool:
    """Remove `relative` (and all it holds) below a trusted root; False when it is not there."""
    parent, _, name = relative.rpartition("/")
    try:
        with open_under(root, parent) as d:
            return d.remove(name)
    except FileNotFoundError:
        return False
