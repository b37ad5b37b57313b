"""Model directories on a volume: what weightkeeper made there, its size, and its guarded removal.

Everything goes through `weightkeeper.anchored` (directory descriptors, no link followed). A path's
entry records what weightkeeper made at it (`made`): `LINK`, a directory's `uid@dev:inode`, `LEGACY` for
entries recorded before that was kept, or None when nothing was made yet. Removal takes only that.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from weightkeeper.anchored import Dir, open_parent, open_path, volume_of
from weightkeeper.download import CACHE_DIR, PARTIAL_DIR
from weightkeeper.errors import CleanupError, DownloadError, NotOursError, UnsafePathError
from weightkeeper.guard import VolumeRule, check_removable
from weightkeeper.layout import is_artifacts_dir

LINK, LEGACY = "link", "legacy"
SHOWN_ENTRIES = 5
MAKE_ATTEMPTS = 3  # for a shared copy whose repository's directory a collection removes as it is made


def made_here(d: Dir, made: str | None) -> bool:
    """`d` is the directory recorded as `made` (`uid@dev:inode`, `Dir.identity`), or `made` is LEGACY (recorded before
    identities were kept). The inode decides (a network filesystem's device number differs between hosts and mounts),
    with the owner: a freed inode is reused at once, so a user who removes the empty directory weightkeeper made and
    makes one gets that inode, but as theirs. The owner is the one it was made as, or on an owner's shelf
    (`_artifacts.<uid>`) that uid (their job made it). A `dev:inode` recorded before owners were compares the inode."""
    if made in (LEGACY, None):
        return made == LEGACY
    maker, owner = made.rpartition("@")[0], os.fstat(d.fd).st_uid
    return made.rpartition(":")[2] == d.identity().rpartition(":")[2] and (
        not maker or int(maker) == owner or owner == shelf_uid(d.where))


def shelf_uid(copy: str) -> int | None:
    """The uid whose shelf holds the shared copy at `copy` (`.../_artifacts.<uid>/<repo dir>/<copy name>`), or None."""
    parts = copy.split("/")
    shelf = parts[-3] if len(parts) > 3 else ""
    return int(shelf.rpartition(".")[2]) if is_artifacts_dir(shelf) and "." in shelf else None


def directory_size(d: Dir) -> int:
    """Bytes of regular files below `d`, without its `.cache` and without following symlinks."""
    return d.size(skip=(CACHE_DIR,))


def path_size(path: str, volumes: Sequence[VolumeRule], made: str | None) -> int:
    """The size of what weightkeeper made at a model path (`made`, as recorded): its directory, or the shared copy
    its link names. `NotOursError` when something else stands there (a directory swapped in would be measured)."""
    parent, name = open_parent(path, volumes)
    with parent:
        target = parent.readlink(name)
        if target is None:
            with parent.descend(name) as d:
                if made == LINK or not made_here(d, made):
                    raise NotOursError(f"{path} is not the directory weightkeeper made there (it was replaced)")
                return directory_size(d)
    if made not in (LINK, LEGACY):
        raise NotOursError(f"{path} is a link where weightkeeper made a directory (it was replaced)")
    artifact = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    with open_path(artifact, volumes, artifact=True) as d:
        return directory_size(d)


def check_writable(path: str, volumes: Iterable[VolumeRule], artifact: bool = False) -> None:
    """What may not be removed is never written: the guard, and no symlinked directory above `path`."""
    try:
        parent, _ = open_parent(path, list(volumes), artifact=artifact)
    except FileNotFoundError:
        return  # not made yet: the walk that makes it refuses a link all the same
    parent.close()


def own_directory(parent: Dir, name: str, path: str, made: str | None,
                  remedy: str = "empty it or choose another --subpath") -> tuple[Dir, str]:
    """The model directory `name` in `parent`, made by weightkeeper: (its Dir, what to record as made).

    The directory weightkeeper made before (`made` is its identity; one recorded without its owner gets it) is used
    as is. A missing one is made; an empty one someone else made is replaced by a new one (`Dir.make_dir`: never
    one renamed there meanwhile). A directory that holds anything
    weightkeeper did not write is refused, naming what it holds: weightkeeper never adopts files.
    """
    st = parent.lstat(name)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise DownloadError(f"{path} is a link (to {parent.readlink(name)}), not a directory of its own; move the "
                            "model to a new path with `weightkeeper model update --subpath`", permanent=True)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise DownloadError(f"{path} exists and is not a directory; remove it or choose another --subpath",
                            permanent=True)
    if st is not None:
        d = parent.descend(name)
        if made_here(d, made):
            upgrade = made != LEGACY and "@" not in made and d.mine(os.fstat(d.fd).st_uid)  # never a user's own
            return d, d.identity() if upgrade else made
        entries = sorted(d.entries())
        d.close()
        if entries:
            shown = ", ".join(entries[:SHOWN_ENTRIES]) + (f" and {len(entries) - SHOWN_ENTRIES} more"
                                                          if len(entries) > SHOWN_ENTRIES else "")
            raise DownloadError(f"{path} already holds files weightkeeper did not write ({shown}); weightkeeper "
                                f"never adopts them: {remedy}", permanent=True)
        try:
            parent.rmdir(name)  # only ever removes an empty directory
        except OSError as e:
            raise DownloadError(f"{path} could not be taken over: {e.strerror or e}", permanent=True) from None
    try:
        d = parent.make_dir(name)  # never one put there meanwhile
    except FileExistsError:
        raise DownloadError(f"{path} was made by someone else while weightkeeper made it; will retry") from None
    return d, d.identity()


COPY_REMEDY = "move it away (it is left alone); the next run makes the shared copy anew"


def own_copy(path: str, volumes: Iterable[VolumeRule], made: str | None) -> tuple[Dir, str]:
    """The shared copy at `path` to fill or repair, as `own_directory` gives a model's: the directory weightkeeper
    made (`made`, recorded), else one made now; never one someone else put there. (its Dir, what to record).

    The two directories above it (`_artifacts[.<uid>]/<repo dir>`) must be this process's, or the uid's its shelf
    names, and shut to others (`Dir.shut_to_others`): whoever else could write there could swap the copy for a
    link to files of theirs."""
    attempts = MAKE_ATTEMPTS
    while True:
        attempts -= 1
        try:
            with _shelf(path, volumes, create=True) as (parent, name):
                return own_directory(parent, name, path, made, COPY_REMEDY)
        except OSError as e:  # the repository's directory, empty, went with its last other copy: made again
            if e.errno not in (errno.ENOENT, errno.ESTALE) or not attempts:
                raise


def remove_repo_dir(path: str, volumes: Iterable[VolumeRule]) -> bool:
    """Remove the directory that held the collected shared copy at `path` (`_artifacts[.<uid>]/<repo dir>`) once it
    holds nothing else: only ever an empty directory, and only one this process or the shelf's uid made. True when it
    went; a copy made there meanwhile keeps it (and `own_copy` makes it again if that copy came a moment late)."""
    try:
        volume, (models, artifacts, repo, _) = _copy_parts(path, volumes)
        with Dir.root(volume.root) as root, root.descend(f"{models}/{artifacts}") as shelf:
            st = shelf.lstat(repo)
            if st is None or not stat.S_ISDIR(st.st_mode) or not (st.st_uid == shelf_uid(path) or
                                                                  shelf.mine(st.st_uid)):
                return False
            return shelf.rmdir_if(repo, st)
    except (OSError, UnsafePathError):
        return False


def shelf_problem(path: str, volumes: Iterable[VolumeRule]) -> str | None:
    """Why someone else could swap the shared copy at `path` for a link to files of theirs (a directory above it
    that `own_copy` would refuse: an earlier version let the first Kubernetes job make them), or None."""
    try:
        with _shelf(path, volumes):
            return None
    except DownloadError as e:
        return str(e)
    except OSError:  # no file can be made there to tell (a read-only mount): a repair, which writes, checks
        return None


def _copy_parts(path: str, volumes: Iterable[VolumeRule]) -> tuple[VolumeRule, list[str]]:
    """The volume of the shared copy at `path` (after the guard) and the four names below its root: the models
    directory, the shelf (`_artifacts[.<uid>]`), the repository's directory, the copy."""
    volume = check_removable(path, volumes, artifact=True)
    return volume, volume_of(path, [volume])[1].split("/")


@contextmanager
def _shelf(path: str, volumes: Iterable[VolumeRule], create: bool = False) -> Iterator[tuple[Dir, str]]:
    """(the directory holding the shared copy at `path`, its name), walked from the volume root after the guard; the
    shelf (`_artifacts[.<uid>]`) and that directory each checked to be shut to all but its maker (`Dir.shut_to_others`)."""
    volume, (models, artifacts, repo, name) = _copy_parts(path, volumes)
    maker = shelf_uid(path)
    with Dir.root(volume.root) as root, root.descend(models, create=create) as top, \
            top.descend(artifacts, create=create) as shelf, shelf.descend(repo, create=create) as parent:
        for d in (shelf, parent):
            if not d.shut_to_others(maker):
                st = os.fstat(d.fd)
                raise DownloadError(f"{d} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}) is not "
                                    "weightkeeper's own or others may write in it, so it cannot hold a shared copy: "
                                    "move it away and ensure the model again", permanent=True)
        yield parent, name


def open_copy(path: str, volumes: Iterable[VolumeRule], made: str | None) -> Dir:
    """The shared copy at `path` to check, measure or collect: the directory weightkeeper made there (`made`;
    `LEGACY`: recorded before identities were), else `NotOursError` (left in place)."""
    d = open_path(path, list(volumes), artifact=True)
    if not made_here(d, made):
        d.close()
        raise NotOursError(f"{path} is not the shared copy weightkeeper made there (it was replaced, or never made); "
                           "left in place")
    return d


def _prune(d: Dir, files: Iterable[str]) -> None:
    """Remove the directories below `d` that the listed `files` were in, and weightkeeper's cache, once they are left
    empty: the deepest first, without recursion, only ever an empty directory, and never one of a tree it did not
    list (a user's, however deep or wide: it is left as it is)."""
    folders = {CACHE_DIR}
    for name in files:
        parts = name.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for folder in sorted(folders, key=lambda f: f.count("/"), reverse=True):
        where, _, leaf = folder.rpartition("/")
        try:
            with d.descend(where) as parent:
                st = parent.lstat(leaf)
                if st is not None and stat.S_ISDIR(st.st_mode):
                    parent.rmdir(leaf)  # only ever an empty one
        except (FileNotFoundError, UnsafePathError):
            continue
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise


def remove_model_files(path: str, files: Iterable[str], volumes: Sequence[VolumeRule]) -> int:
    """For an entry recorded before weightkeeper refused occupied directories (it held others' files then):
    remove only the listed files and weightkeeper's cache, then the directories they were in left empty (`_prune`).
    Returns how many entries remain."""
    files = list(files)
    try:
        d = open_path(path, volumes)
    except FileNotFoundError:
        return 0
    try:
        with d:
            for name in files:
                folder, _, leaf = name.rpartition("/")
                try:
                    with d.descend(folder) as sub:
                        st = sub.lstat(leaf)
                        if st is not None and not stat.S_ISDIR(st.st_mode):
                            sub.unlink(leaf)
                except (FileNotFoundError, UnsafePathError):
                    continue
            try:
                with d.descend(CACHE_DIR) as cache:
                    cache.remove(PARTIAL_DIR.split("/", 1)[1])
            except (FileNotFoundError, UnsafePathError):
                pass
            _prune(d, files)
            remaining = len(d.entries())
        if not remaining:
            parent, name = open_parent(path, volumes)
            with parent:
                parent.rmdir(name)
        return remaining
    except OSError as e:
        raise CleanupError(f"cannot remove {e.filename or path}: {e.strerror or e}") from None


def _names_a_copy(path: str, target: str | None, volumes: Sequence[VolumeRule]) -> bool:
    """`target`, the link at `path` read without following it, names a shared copy (as `layout.link_target` makes):
    the link weightkeeper put there, or one it switched to. A link a user put in its place names anything else."""
    if target is None:
        return False
    try:
        check_removable(posixpath.normpath(posixpath.join(posixpath.dirname(path), target)), volumes, artifact=True)
    except UnsafePathError:
        return False
    return True


def remove_model_path(path: str, volumes: Sequence[VolumeRule], made: str | None = LEGACY,
                      artifact: bool = False) -> bool:
    """Remove what weightkeeper made at a model path (a shared copy with `artifact=True`). False when
    nothing is there. `NotOursError` when what stands there is not what it made (it is left alone).

    The guard first; then the walk from the volume root, which refuses a symlinked directory on the
    way; a mount point inside refuses the removal before anything is removed; nothing is followed.
    """
    try:
        parent, name = open_parent(path, volumes, artifact=artifact)
    except FileNotFoundError:
        return False
    with parent:
        st = parent.lstat(name)
        if st is None:
            return False
        try:
            if not stat.S_ISDIR(st.st_mode):
                if not (made in (LEGACY, LINK) and _names_a_copy(path, parent.readlink(name), volumes)):
                    raise NotOursError(f"{path} is not what weightkeeper made there (not a link of its own to a "
                                       "shared copy); left in place")
                return parent.unlink(name)
            with parent.descend(name) as d:
                if made is None:  # nothing was made there: only an empty directory goes, never what it holds
                    if parent.rmdir_if(name, os.fstat(d.fd)):  # only ever an empty one, whatever was written since
                        return True
                    raise NotOursError(f"{path} holds what weightkeeper never made there; left in place")
                if not made_here(d, made):
                    raise NotOursError(f"{path} is not the directory weightkeeper made there (it was replaced or "
                                       "never made); left in place")
                if mount := d.mount_inside():  # removing would empty the mounted filesystem, then fail with EBUSY
                    raise CleanupError(f"{mount} is a mount point inside {path}; nothing was removed: unmount it")
                d.clear()  # through the directory checked: never the one renamed to its name meanwhile
                if not parent.rmdir_if(name, os.fstat(d.fd), strict=True):
                    raise NotOursError(f"{path} was replaced while weightkeeper emptied the directory it made there; "
                                       "what stands there now is left in place")
            return True
        except OSError as e:
            raise CleanupError(f"cannot remove {e.filename or path}: {e.strerror or e}") from None
