"""Filesystem side of model directories: size, and guarded removal that never follows a symlink."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable

from weightkeeper.download import CACHE_DIR, PARTIAL_DIR
from weightkeeper.errors import CleanupError, UnsafePathError
from weightkeeper.guard import VolumeRule, check_removable


def directory_size(path: str) -> int:
    """Bytes of regular files below `path`, without its `.cache` and without following symlinks."""
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        with os.scandir(current) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if not (current == path and entry.name == CACHE_DIR):
                        stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _check_parents(path: str, volume: VolumeRule) -> None:
    """No directory between the volume root and `path` may be a symlink (the root itself may)."""
    parent = os.path.dirname(path)
    expected = os.path.join(os.path.realpath(volume.root), os.path.relpath(parent, volume.root))
    if os.path.realpath(parent) != expected:
        raise UnsafePathError(f"refusing to remove {path!r}: a directory above it inside volume {volume.root} "
                              "is a symlink")


def check_writable(path: str, volumes: Iterable[VolumeRule], artifact: bool = False) -> None:
    """What may not be removed is never written: the guard, and no symlinked directory above `path`."""
    _check_parents(path, check_removable(path, volumes, artifact))


def remove_model_files(path: str, files: Iterable[str], volumes: Iterable[VolumeRule]) -> int:
    """For a directory that held others' files before weightkeeper came: remove only the listed files
    and weightkeeper's cache, then the directories left empty. Returns how many entries remain."""
    check_writable(path, volumes)
    if os.path.islink(path) or not os.path.isdir(path):
        return 0
    root = os.path.realpath(path)
    try:
        for name in files:
            full = os.path.join(path, name)
            parent = os.path.realpath(os.path.dirname(full))
            inside = parent == root or \
                parent.startswith(root + os.sep)
            if inside and (os.path.islink(full) or os.path.isfile(full)):
                os.unlink(full)
        if os.path.isdir(os.path.join(path, PARTIAL_DIR)):
            shutil.rmtree(os.path.join(path, PARTIAL_DIR))
        for current, _dirs, _files in os.walk(path, topdown=False, followlinks=False):
            if current != path and not os.listdir(current):
                os.rmdir(current)
        remaining = len(os.listdir(path))
        if not remaining:
            os.rmdir(path)
        return remaining
    except OSError as e:
        raise CleanupError(f"cannot remove {e.filename or path}: {e.strerror or e}") from None


def mount_inside(path: str) -> str | None:
    """The first directory below `path` that is on another filesystem (a mount point); links are not followed."""
    device = os.lstat(path).st_dev
    stack = [path]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.stat(follow_symlinks=False).st_dev != device:
                        return entry.path
                    stack.append(entry.path)
    return None


def remove_model_path(path: str, volumes: Iterable[VolumeRule], artifact: bool = False) -> bool:
    """Remove a model directory (or the link at its path). Returns False when nothing was there.

    `artifact=True` is for garbage collection of a shared copy and allows nothing else.
    Checks the guard, then that no parent is a symlink and no mount point is inside, then removes
    without following links
    (`shutil.rmtree` uses the fd-based walk on Linux; a link at `path` is unlinked, not followed).
    """
    volume = check_removable(path, volumes, artifact)
    _check_parents(path, volume)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    check_removable(path, [volume], artifact)  # once more, just before removal
    try:
        if stat.S_ISDIR(mode):
            if not shutil.rmtree.avoids_symlink_attacks:
                raise CleanupError(f"this platform cannot remove {path} without following symlinks")
            if mount := mount_inside(path):  # rmtree would empty the mounted filesystem, then fail with EBUSY
                raise CleanupError(f"{mount} is a mount point inside {path}; nothing was removed: unmount it")
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError as e:
        raise CleanupError(f"cannot remove {e.filename or path}: {e.strerror or e}") from None
    return True
