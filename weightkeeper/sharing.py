"""Filesystem side of shared copies: the ready marker, the per-snapshot file lock, links, the link scan."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from weightkeeper.download import PARTIAL_DIR
from weightkeeper.layout import ARTIFACTS_DIR

READY_MARKER = f"{PARTIAL_DIR}/ready"
LOCKS_DIR = ".locks"


def is_ready(artifact: str, commit: str) -> bool:
    """The marker is written only after a full verification of the copy."""
    try:
        return Path(artifact, READY_MARKER).read_text().strip() == commit
    except OSError:
        return False


def mark_ready(artifact: str, commit: str) -> None:
    marker = Path(artifact, READY_MARKER)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(commit + "\n")


def unmark_ready(artifact: str) -> None:
    Path(artifact, READY_MARKER).unlink(missing_ok=True)


def lock_path(artifact: str) -> Path:
    """`<models root>/_artifacts/.locks/<repo dir>--<commit>.lock`, next to the copies."""
    commit_dir = Path(artifact)
    return commit_dir.parent.parent / LOCKS_DIR / f"{commit_dir.parent.name}--{commit_dir.name}.lock"


@contextmanager
def file_lock(path: Path, on_wait: Callable[[], None], poll: float = 1.0) -> Iterator[None]:
    """An exclusive `flock` on `path`, for processes on hosts that share the volume. The kernel drops
    it when its holder dies; `on_wait` runs while another holder has it (and may raise to give up)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
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


def make_link(path: str, target: str) -> None:
    """Point `path` at `target` (relative) atomically: a temporary link renamed into place."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.link")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def links_to(path: str, artifact: str) -> bool:
    return os.path.islink(path) and os.path.realpath(path) == os.path.realpath(artifact)


def adoption_problem(path: str, artifact: str) -> str | None:
    """Why an existing `path` cannot become a link to the shared copy (None when it can)."""
    if not os.path.lexists(path) or links_to(path, artifact):
        return None
    if os.path.isdir(path) and not os.path.islink(path) and not any(os.scandir(path)):
        return None
    return f"{path} already holds files, so it keeps its own copy instead of linking to the shared one"


def links_into(models_root: str, artifact: str) -> list[str]:
    """Every symlink under the models root (outside `_artifacts`) that resolves into `artifact`."""
    target = os.path.realpath(artifact)
    found = []
    for current, dirs, files in os.walk(models_root, followlinks=False):
        if current == models_root and ARTIFACTS_DIR in dirs:
            dirs.remove(ARTIFACTS_DIR)
        for name in dirs + files:
            full = os.path.join(current, name)
            if os.path.islink(full):
                resolved = os.path.realpath(full)
                if resolved == target or resolved.startswith(target + os.sep):
                    found.append(full)
    return found


def discard(root: str, relative: str) -> None:
    """Remove one damaged entry of a copy (file, link or directory), never following a link: if a
    directory on the way is a symlink, that link itself is what gets removed."""
    current = root
    for part in relative.split("/"):
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            os.unlink(current)
            return
    shutil.rmtree(current)
