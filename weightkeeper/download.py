"""Fetching a snapshot's files into a model directory through resumable, hashed partial files.

Each file arrives in `<model dir>/.cache/weightkeeper/<file>.part` and moves into place only when
complete and its digest matches (sha256 for LFS files, the git blob sha1 for other Hub files, md5
for S3 objects with a plain ETag). A file of at least two `PART_BYTES` is fetched as several byte
ranges at once, each written at its offset; their progress is kept next to the partial file in
`<file>.part.ranges`, so a later run, in any process, resumes every range where it stopped. A
file in one range resumes from its partial file's size. Only a partial file of this process's own is
resumed or written: whoever may write the model directory can move another user's file to its name.
Bytes that extend a file's hashed prefix are hashed by the thread that wrote them; a hasher thread
per file reads back from the page cache what becomes contiguous later, so hashing overlaps the
transfer. The model directory is a `weightkeeper.anchored.Dir`: every name below it is opened from its
descriptor, never through a link.

Where the bytes come from is a `Transfer`: `weightkeeper.hub` (ranged GETs from the Hub) or
`weightkeeper.s3` (ranged GETs from S3).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import zip_longest

from weightkeeper.anchored import Dir
from weightkeeper.errors import DownloadError, DropDebug, RedactUrls, UnsafePathError
from weightkeeper.layout import COMMIT, SEGMENT
from weightkeeper.watchdog import Pace, Watchdog

CACHE_DIR = ".cache"
PARTIAL_DIR = f"{CACHE_DIR}/weightkeeper"
READY_MARKER = "ready"  # a shared copy's mark, in its PARTIAL_DIR beside the partial files' folders
CONNECTIONS = 8  # ranges in flight at once, per fetch
FILES_AT_ONCE = CONNECTIONS // 2  # files whose ranges are interleaved
PART_BYTES = 32 << 20  # a file is split into ranges of at least this size, at most CONNECTIONS of them
RANGE_RETRIES = 5  # a range whose connection is cut resumes this many times inside one run
SAVE_SECONDS = 0.2  # how often the ranges' progress is written down
HASH_CHUNK = 8 << 20
MAX_DEPTH = 16  # names in a file's path at most: each folder above it is one more for a listing to have made

for _name in ("urllib3.connectionpool", "urllib3.util.retry", "urllib3.poolmanager"):  # they name the URLs they
    logging.getLogger(_name).addFilter(RedactUrls())  # retry or redirect: signed ones too (Hub, S3)
for _name in ("botocore.endpoint", "botocore.auth", "botocore.parsers", "botocore.handlers"):  # DEBUG: signed headers,
    logging.getLogger(_name).addFilter(DropDebug())  # the string signed and its signature, credentials' bodies


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    blob_id: str  # the git blob sha1 on the Hub; "" for an S3 source
    sha256: str | None = None  # set for LFS files
    md5: str | None = None  # an S3 source object's single-part ETag

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "blobId": self.blob_id, "sha256": self.sha256, "md5": self.md5}

    @classmethod
    def from_json(cls, raw: dict) -> RemoteFile:
        """A recorded file; a permanent DownloadError for an entry that is not one."""
        try:
            remote = cls(raw["path"], raw["size"], raw["blobId"], raw.get("sha256"), raw.get("md5"))
        except (KeyError, TypeError, AttributeError):
            remote = None
        if remote is None or not isinstance(remote.path, str) or not _is_size(remote.size) or not all(
                isinstance(v, str) for v in (remote.blob_id, remote.sha256 or "", remote.md5 or "")):
            raise DownloadError(f"the recorded file entry {shown(raw)} is malformed; delete the model and declare it "
                                "again", permanent=True)
        return remote


def listed_otherwise(recorded: Sequence[dict] | None, listed: Sequence[dict] | None) -> str | None:
    """A file two listings of one commit (`RemoteFile.to_json` entries) give otherwise: its size or a digest, or only
    one lists it (its name, the first in order; None when they agree). A commit's files never change, so a Hub
    that lists them otherwise than when a copy was made is not to be trusted."""
    a, b = ({f.get("path"): (f.get("size"), f.get("blobId"), f.get("sha256"), f.get("md5")) for f in files or ()}
            for files in (recorded, listed))
    return min((str(n) for n in a.keys() | b.keys() if a.get(n) != b.get(n)), default=None)


@dataclass(frozen=True)
class Snapshot:
    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]  # only the files loading needs
    copy: str = ""  # the name of its copies (`layout.copy_name`); the commit when the model has no patterns

    def __post_init__(self) -> None:
        if not self.copy:
            object.__setattr__(self, "copy", self.commit)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Limits:
    """What a source's answer may hold: settings `max_file_bytes`, `max_manifest_files`."""
    max_file_bytes: int = 2 << 40
    max_manifest_files: int = 100_000


DIGESTS = (("sha256", 64), ("md5", 32), ("blob_id", 40))  # a file is checked by the first it has


def shown(value: object, limit: int = 80) -> str:
    """`value` as it may appear in a one-line message: its repr, cut to about `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def digest_problem(remote: RemoteFile) -> str | None:
    """Why `remote` cannot be checked (None: it can): the digest it is checked by is missing, or is not
    lowercase hex of its length."""
    for name, length in DIGESTS:
        if value := getattr(remote, name):
            if isinstance(value, str) and re.fullmatch(f"[0-9a-f]{{{length}}}", value):
                return None
            return f"its {name} {shown(value)} is not {length} hex digits"
    return "it has no digest"


NAME_CHARS = 255 - len(".part.ranges")  # a file's name, so that its partial files' names fit a filesystem's 255


def check_count(where: str, count: int, limits: Limits) -> None:
    """A source's listing (every file of the repository or prefix, before selection) is bounded."""
    if count > limits.max_manifest_files:
        raise DownloadError(f"refusing {where}: it lists {count} files, more than max_manifest_files "
                            f"({limits.max_manifest_files}); raise that setting if the model really has that many",
                            permanent=True)


def collision(paths: Sequence[str]) -> str | None:
    """Why the files at `paths` cannot all be written on every volume (None: they can): a name over NAME_CHARS,
    names one file where a volume folds case, a file where a folder of another's goes, in the copy or among the
    partial files (`a` and `a/b`; `a`, whose partial file is `a.part`, and `a.part/b`), or a folder where
    weightkeeper keeps its READY_MARKER; or a file over MAX_DEPTH names deep (each folder one more to make)."""
    if long := next((p for p in paths if any(len(s) > NAME_CHARS for s in p.split("/"))), None):
        return f"{shown(long)} has a name over {NAME_CHARS} characters (its partial file's would not fit in 255)"
    if deep := next((p for p in paths if p.count("/") >= MAX_DEPTH), None):
        return f"{shown(deep)} is {deep.count('/') + 1} names deep, more than {MAX_DEPTH}; leave it out with --exclude"
    folded: dict[str, str] = {}
    for path in paths:
        if (other := folded.setdefault(path.casefold(), path)) != path:
            return f"{shown(other)} and {shown(path)} differ only in case (one file where a volume folds case)"
    if problem := _collision(paths):
        return problem
    if problem := _collision(list(folded)):
        return f"where a volume folds case, {problem}"
    return None


def _collision(paths: Sequence[str]) -> str | None:
    """`collision`'s files and folders, of names as they are: each folder once, as (its parent's number, its name),
    so that what this holds grows with the names, not with each path's every prefix."""
    folders: dict[tuple[int, str], int] = {}  # (parent folder's number, name) -> number; the top is 0
    files = []
    for path in paths:
        parent, (*above, leaf) = 0, path.split("/")
        for name in above:
            parent = folders.setdefault((parent, name), len(folders) + 1)
        files.append((parent, leaf, path))
    if (0, READY_MARKER) in folders:
        return f"its folder {READY_MARKER!r} is where weightkeeper keeps its own marker"
    if file := next((path for parent, leaf, path in files if (parent, leaf) in folders), None):
        return f"{shown(file)} is both a file and a folder"
    for parent, leaf, path in files:
        if suffix := next((s for s in (".part", ".part.ranges") if (parent, leaf + s) in folders), None):
            return f"the partial file of {shown(path)} would stand where the folder {shown(path + suffix)} goes"
    return None


def check_snapshot(snapshot: Snapshot, where: str, limits: Limits) -> Snapshot:
    """`snapshot` as a source described it (`where`: which model from which server), once it is safe to use:
    a 40-hex commit, files of 0 to `max_file_bytes` bytes that each have a digest to check them by, and names
    that can all be written (`collision`)."""
    if not isinstance(snapshot.commit, str) or not COMMIT.fullmatch(snapshot.commit):
        raise DownloadError(f"refusing {where}: its commit {shown(snapshot.commit)} is not 40 hex digits",
                            permanent=True)
    if problem := collision([f.path for f in snapshot.files]):
        raise DownloadError(f"refusing {where}: {problem}", permanent=True)
    for f in snapshot.files:
        if not _is_size(f.size) or f.size > limits.max_file_bytes:
            raise DownloadError(f"refusing {where}: {f.path} has a size of {shown(f.size)}, not 0 to "
                                f"{limits.max_file_bytes} bytes (max_file_bytes)", permanent=True)
        if problem := digest_problem(f):
            raise DownloadError(f"refusing {where}: {f.path} has no usable digest ({problem}), so it could not be "
                                "verified", permanent=True)
    return snapshot


class TransferInterrupted(Exception):
    """The connection of a range was cut: the range resumes from the bytes written so far."""


class _Stopped(Exception):
    """Another range of the same fetch failed: this one stops too (its error is the one reported)."""


# A space check of a fetch's files before one of them is fetched again whole (its resumed bytes failed their digest,
# and the caller's first check counted them present): it raises to refuse.
RoomCheck = Callable[[Dir, Sequence[RemoteFile]], None]


# `transfer(remote, start, end, write)` calls `write(chunk)` with bytes [start, end) of `remote`, in
# order; it raises DownloadError for an answer it cannot use, TransferInterrupted when cut short.
Transfer = Callable[[RemoteFile, int, int, Callable[[memoryview], None]], None]


def safe_repo_path(path: str, repo_id: str) -> str:
    segments = path.split("/")
    if path.startswith("/") or posixpath.normpath(path) != path or any(
        s in ("", ".", "..") or not SEGMENT.fullmatch(s) for s in segments
    ) or segments[0].casefold() == CACHE_DIR:  # `.CACHE` is weightkeeper's folder where a volume folds case
        raise DownloadError(f"repository {repo_id} lists an unsafe file name {shown(path)}; refusing to download it",
                            permanent=True)
    return path


def file_hasher(remote: RemoteFile):
    """sha256 for LFS files, md5 for S3 objects with a plain ETag, the git blob sha1 (`blob <size>\\0` +
    content) for the other Hub files. A file without a usable digest (`digest_problem`; never one that
    `check_snapshot` passed) is a permanent DownloadError."""
    if problem := digest_problem(remote):
        raise DownloadError(f"{remote.path} cannot be verified: {problem}; delete the model and declare it again",
                            permanent=True)
    if remote.sha256:
        return hashlib.sha256()
    if remote.md5:
        return hashlib.md5()  # noqa: S324 - an integrity check against the server's ETag, not security
    h = hashlib.sha1()
    h.update(b"blob %d\0" % remote.size)
    return h


def expected_digest(remote: RemoteFile) -> str:
    return remote.sha256 or remote.md5 or remote.blob_id


@dataclass
class Part:
    """Bytes [start, end) of a file; `done` of them, from `start` on, are written."""
    start: int
    end: int
    done: int = 0

    @property
    def offset(self) -> int:
        return self.start + self.done

    @property
    def complete(self) -> bool:
        return self.offset >= self.end


def plan_parts(size: int, have: int = 0) -> list[Part]:
    """The ranges of a file of `size` bytes, `have` of them present from 0 on (a sequential partial file)."""
    count = max(1, min(CONNECTIONS, size // PART_BYTES))
    bounds = [size * i // count for i in range(count + 1)]
    return [Part(a, b, min(max(have - a, 0), b - a)) for a, b in zip(bounds, bounds[1:])]


def load_parts(size: int, saved: str | None, have: int) -> list[Part]:
    """The ranges' progress from the `.ranges` file when it fits this file, else `plan_parts(size, have)`. No range
    counts bytes beyond the `have` the partial file holds: they could not be hashed back, every run over."""
    try:
        raw = json.loads(saved) if saved else None
        parts = [Part(*map(int, p)) for p in raw["parts"]] if raw and raw.get("size") == size else None
    except (ValueError, KeyError, TypeError):
        parts = None
    if parts and [(p.start, p.end) for p in parts] == [(p.start, p.end) for p in plan_parts(size)] and all(
            0 <= p.done <= p.end - p.start for p in parts):
        return [Part(p.start, p.end, min(p.done, max(have - p.start, 0))) for p in parts]
    return plan_parts(size, have)


def frontier(parts: Sequence[Part]) -> int:
    """The end of the bytes written contiguously from 0."""
    for p in parts:
        if not p.complete:
            return p.offset
    return parts[-1].end if parts else 0


def _entry(target: Dir, relative: str) -> os.stat_result | None:
    """lstat of `relative` below `target`, reached without following links (None: missing or unreachable)."""
    parent, _, name = relative.rpartition("/")
    try:
        if not parent:
            return target.lstat(name)
        with target.descend(parent) as d:
            return d.lstat(name)
    except (FileNotFoundError, NotADirectoryError, UnsafePathError):
        return None


def in_place(target: Dir, remote: RemoteFile) -> bool:
    """The file is in the model directory already: a regular file (not a link) of the right size."""
    st = _entry(target, remote.path)
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == remote.size


def present_bytes(target: Dir, remote: RemoteFile) -> int:
    """Bytes of `remote` already in `target`: all of it in place, else what its partial file holds on disk."""
    return remote.size if in_place(target, remote) else PartialFile(target, remote, "").allocated


@dataclass
class PartialFile:
    """One file on its way into place: its partial file, its ranges' progress and its hasher. Every name is
    opened below the model directory's descriptor (`weightkeeper.anchored`), never through a link."""
    target: Dir
    remote: RemoteFile
    what: str

    def __post_init__(self) -> None:
        folder, _, self.name = self.remote.path.rpartition("/")
        self.dest_rel, self.part_rel = folder, f"{PARTIAL_DIR}/{folder}".rstrip("/")
        self.part_name, self.ranges_name = f"{self.name}.part", f"{self.name}.part.ranges"
        self.dest_dir: Dir | None = None
        self.part_dir: Dir | None = None
        self.cond, self.save_lock = threading.Condition(), threading.Lock()
        self.saved_at, self.fd, self.failed = 0.0, -1, False
        self.hash_error: BaseException | None = None
        self.hashed, self.hashing = 0, False  # the digest covers bytes [0, hashed); a thread is adding to it
        self.hasher: threading.Thread | None = None
        have, held, saved = 0, 0, None
        try:
            with self.target.descend(self.part_rel) as d:
                st = d.lstat(self.part_name)
                # only this process's own file is resumed: a link, FIFO or hard link planted there, or another
                # user's file moved there by whoever may write here, is replaced by a new file (`open`)
                if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and d.mine(st.st_uid):
                    have, held = st.st_size, st.st_blocks * 512
                raw = d.read_small(self.ranges_name)  # bounded; never a FIFO, a link or a device
                saved = raw.decode(errors="replace") if raw is not None else None
        except (OSError, UnsafePathError):  # gone, or unreadable (a probe of `mine` over quota): nothing to resume
            pass
        if have > self.remote.size:  # a partial file longer than the file: start over
            have, saved = 0, None
        self.parts = load_parts(self.remote.size, saved, have)
        self.resumed = sum(p.done for p in self.parts)
        self.allocated = min(self.resumed, held)  # what it holds on disk: a sparse file's holes are no bytes present
        self.left = sum(not p.complete for p in self.parts)  # ranges not finished yet

    @property
    def part(self) -> str:
        return f"{self.target}/{self.part_rel}/{self.part_name}"

    def open(self) -> None:
        """Create the directories (never through a symlink), open the partial file, start the hasher."""
        try:
            self.dest_dir = self.target.descend(self.dest_rel, create=True)
            self.part_dir = self.target.descend(self.part_rel, create=True)
        except UnsafePathError as e:
            raise DownloadError(f"{e}; refusing to write {self.remote.path} into {self.target}", permanent=True) \
                from None
        self.save(force=True)  # before any range writes past another's start
        if not self.resumed:  # a new file of its own, whatever stands there: another user's file is never written
            self.fd = self.part_dir.make_new(self.part_name, os.O_RDWR)
        else:
            fd = self.part_dir.open_regular(self.part_name, os.O_RDWR | os.O_CREAT)
            if not self.part_dir.mine(os.fstat(fd).st_uid):
                os.close(fd)
                raise DownloadError(f"{self.part} was replaced by another user's file as its download began; it is "
                                    "left unwritten, and the next attempt puts a new file in its place")
            self.fd = fd
        self.digest = file_hasher(self.remote)
        self.hasher = threading.Thread(target=self._hash, name=f"hash-{self.remote.path}"[:60], daemon=True)
        self.hasher.start()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for d in (self.dest_dir, self.part_dir):
            if d is not None:
                d.close()

    def save(self, force: bool = False) -> None:
        """Write the ranges' progress (atomically) so another run resumes each range where it stopped."""
        if len(self.parts) < 2:
            return  # one range: the partial file's size is its progress
        with self.save_lock:
            now = time.monotonic()
            if not force and now - self.saved_at < SAVE_SECONDS:
                return
            self.saved_at = now
            with self.cond:
                state = json.dumps({"size": self.remote.size, "parts": [[p.start, p.end, p.done] for p in self.parts]})
            try:
                self.part_dir.write_atomic(self.ranges_name, state.encode())
            except OSError as e:
                raise DownloadError(f"cannot write {self.part}.ranges: {e.strerror or e}", permanent=True) from None

    def write(self, part: Part, chunk: memoryview) -> None:
        """Write the next bytes of `part` at its offset (and hash them here when they extend the hashed prefix)."""
        offset, view = part.offset, chunk
        while view:
            try:
                n = os.pwrite(self.fd, view, part.offset)
            except OSError as e:  # a disk problem, not a network one: retrying the download does not help
                raise DownloadError(f"cannot write {self.part}: {e.strerror or e}", permanent=True) from None
            view = view[n:]
            with self.cond:
                part.done += n
        self._hash_written(offset, chunk)
        self.save()

    def _hash_written(self, offset: int, chunk: memoryview) -> None:
        """Hash `chunk`, just written at `offset`, if it continues the hashed prefix; wake the hasher thread
        when bytes behind the prefix became contiguous (a range reached the next one's written bytes)."""
        if self.digest is None:
            return
        with self.cond:
            inline = not self.hashing and self.hashed == offset
            self.hashing |= inline
            if not inline:
                if not self.hashing and frontier(self.parts) > self.hashed:
                    self.cond.notify_all()
                return
        try:
            self.digest.update(chunk)
        finally:
            with self.cond:
                self.hashed += len(chunk)
                self.hashing = False
                if self.hashed >= self.remote.size or frontier(self.parts) > self.hashed:
                    self.cond.notify_all()

    def _hash(self) -> None:
        """Hash what the writers could not (bytes already on disk when resuming, or written beyond the prefix
        and then reached by it), reading them back from the page cache. Ends when all is hashed or on stop()."""
        if self.digest is None:
            return
        buf = None  # allocated when there is something to read back
        try:
            while True:
                with self.cond:
                    while not self.failed and self.hashed < self.remote.size and (
                            self.hashing or frontier(self.parts) <= self.hashed):
                        self.cond.wait()
                    if self.failed or self.hashed >= self.remote.size:
                        return
                    self.hashing, pos, front = True, self.hashed, frontier(self.parts)
                buf = buf or memoryview(bytearray(min(HASH_CHUNK, self.remote.size)))
                try:
                    while pos < front:
                        n = os.preadv(self.fd, [buf[:min(HASH_CHUNK, front - pos)]], pos)
                        if not n:
                            raise DownloadError(f"{self.part} is shorter than its recorded progress")
                        self.digest.update(buf[:n])
                        pos += n
                finally:
                    with self.cond:
                        self.hashed, self.hashing = pos, False
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.hash_error = e

    def stop(self) -> None:
        """A range failed: stop the hasher, keep the progress for the next run, close the file."""
        with self.cond:
            self.failed = True
            self.cond.notify_all()
        if self.hasher:
            self.hasher.join()
        try:
            self.save(force=True)
        finally:
            self._close()

    def finish(self) -> bool:
        """All ranges are written: check the digest and move the file into place. False (partial file
        dropped) when it does not match."""
        if self.hasher:
            self.hasher.join()
        try:
            size = os.fstat(self.fd).st_size
            if self.hash_error is not None:
                raise self.hash_error
            ok = size == self.remote.size and (self.digest is None or self.digest.hexdigest() ==
                                                 expected_digest(self.remote))
            if ok:
                self.part_dir.rename(self.part_name, self.dest_dir, self.name)
            else:
                self.part_dir.unlink(self.part_name)
            self.part_dir.unlink(self.ranges_name)
            return ok
        finally:
            self._close()


def _fetch_part(file: PartialFile, part: Part, transfer: Transfer, on_bytes: Callable[[int], None],
                stop: threading.Event, watchdog: Watchdog) -> None:
    """Fetch the rest of one range; a cut connection resumes from the bytes written, up to RANGE_RETRIES times,
    unless the fetch was stopped meanwhile (by another range or the watchdog)."""
    def write(chunk: memoryview) -> None:
        if stop.is_set():
            raise _Stopped()
        n = min(len(chunk), part.end - part.offset)
        file.write(part, chunk[:n])
        on_bytes(n)

    for attempt in range(RANGE_RETRIES + 1):
        if stop.is_set():
            raise _Stopped()
        try:
            with watchdog.connection():
                transfer(file.remote, part.offset, part.end, write)
            if part.complete:
                return
            problem: Exception = TransferInterrupted(f"the body ended at byte {part.offset} of {part.end}")
        except TransferInterrupted as e:
            problem = e
        if stop.wait(min(2 ** attempt * 0.25, 4) if attempt < RANGE_RETRIES else 0):
            raise _Stopped()
    raise DownloadError(f"the connection for {file.remote.path} of {file.what} was cut {RANGE_RETRIES + 1} times "
                        f"({problem}); the partial file is kept and the next attempt resumes it")


def _fetch(target: Dir, remotes: Sequence[RemoteFile], transfer: Transfer, on_bytes: Callable[[int], None],
           what: str, on_start: Callable[[int], None] = lambda present: None, deadline: float = float("inf"),
           pace: Pace = Pace(), room: RoomCheck | None = None) -> int:
    """Fetch the files not in place, CONNECTIONS ranges at a time; returns bytes transferred.
    `on_start(bytes_present)` is called first with what is already there. A watchdog fails the fetch past
    `deadline`, when `on_bytes(0)` raises (it is called every `weightkeeper.watchdog.TICK` seconds), or when
    the bytes arrive slower than `pace`. A file whose resumed bytes fail its digest is fetched again at once if
    `room` lets it; without `room` it fails the fetch, and the next attempt (its space checked) fetches it."""
    files, present = [], 0
    for remote in remotes:
        if in_place(target, remote):
            present += remote.size
        elif problem := digest_problem(remote):
            raise DownloadError(f"{remote.path} of {what} cannot be verified ({problem}); delete the model and "
                                "declare it again", permanent=True)
        else:
            files.append(PartialFile(target, remote, what))
            present += files[-1].resumed
    on_start(present)
    lock, stop = threading.Lock(), threading.Event()
    counted, first = [0], [None]

    def count(n: int) -> None:
        with lock:
            counted[0] += n
        on_bytes(n)

    def fail(error: BaseException) -> None:
        with lock:
            if first[0] is None and not isinstance(error, _Stopped):
                first[0] = error
            stop.set()

    def run(file: PartialFile, part: Part | None) -> None:
        """Fetch one range of `file` (None: nothing is left to fetch); the last range to end finishes the file."""
        counted_off = False
        try:
            with lock:
                if file.fd < 0 and not file.failed:
                    file.open()
            if part is not None:
                _fetch_part(file, part, transfer, count, stop, watchdog)
            with lock:
                file.left -= 1
                last, counted_off = file.left <= 0, True
            if last and stop.is_set():
                file.stop()
            elif last and not file.finish():
                if not file.resumed or room is None:
                    raise DownloadError(f"{file.remote.path} of {what} arrived corrupted (checksum or size mismatch); "
                                        "the partial file was dropped and the file will be fetched again")
                room(target, [f.remote for f in files])  # the bytes dropped were counted present by the first check
                _fetch(target, [file.remote], transfer, count, what, deadline=watchdog.deadline, pace=pace,
                       room=room)
        except BaseException as e:
            fail(e)
            with lock:
                if not counted_off:
                    file.left -= 1
                last = not counted_off and file.left <= 0
            if last and file.fd >= 0:
                file.stop()
            raise

    # the ranges of FILES_AT_ONCE files at a time, in turn: few writers per file, few files open
    per_file = [[(f, p) for p in ([p for p in f.parts if not p.complete] or [None])] for f in files]
    jobs = [job for i in range(0, len(per_file), FILES_AT_ONCE)
            for turn in zip_longest(*per_file[i:i + FILES_AT_ONCE]) for job in turn if job]
    watchdog = Watchdog(deadline, pace, lambda: on_bytes(0), fail, f"download of {what} into {target}", stop)
    interrupted: BaseException | None = None  # raised in this thread while it waited: a signal (SIGTERM, Ctrl-C)
    with ThreadPoolExecutor(max_workers=CONNECTIONS, thread_name_prefix="fetch") as pool, watchdog:
        futures = [pool.submit(run, file, part) for file, part in jobs]
        try:
            for future in futures:
                try:
                    future.result()
                except BaseException as e:  # noqa: BLE001 - a range's own error is raised below
                    if not (future.done() and (future.cancelled() or future.exception() is e)):
                        raise
                    for other in futures:  # the others stop at their next chunk
                        other.cancel()
        except BaseException as e:  # a signal while this thread waited: every range stops now, its files kept
            interrupted = e
            fail(e)
            watchdog.abort()
            for other in futures:
                other.cancel()
    for file in files:  # ranges cancelled before they ran: keep what their file has, close it
        if file.fd >= 0:
            file.stop()
    if interrupted is not None or first[0] is not None:
        raise interrupted or first[0]
    return counted[0]


def fetch_file(target: Dir, remote: RemoteFile, transfer: Transfer, on_bytes: Callable[[int], None],
               what: str, deadline: float = float("inf"), pace: Pace = Pace()) -> int:
    """Fetch one file into place (its ranges in parallel); returns the bytes transferred (0 when already there).
    `on_bytes(0)` is called now and then and may raise to stop (a deleted model). A resumed file that fails its
    digest fails the fetch (no space check to fetch it again here): the next one fetches it whole."""
    return _fetch(target, [remote], transfer, on_bytes, what, deadline=deadline, pace=pace)


def fetch_files(snapshot: Snapshot, target: Dir, transfer: Transfer, on_progress: Callable[[int], None],
                deadline: float, what: str, pace: Pace = Pace(), room: RoomCheck | None = None) -> int:
    """Fetch every missing file of `snapshot` into `target`, CONNECTIONS ranges at a time; returns bytes
    transferred.

    `on_progress(bytes_present)` is called as data arrives, and now and then while none does; it may
    raise to stop the download (a cancelled model). Past `deadline` (a `time.monotonic()` value), or
    slower than `pace`, the download fails. Nothing is deleted on failure: the next run resumes from
    the partial files. A file whose resumed bytes fail its digest is fetched again at once only if `room` lets it.
    """
    lock = threading.Lock()
    present = [0]

    def on_start(n: int) -> None:
        present[0] = n
        on_progress(n)

    def on_bytes(n: int) -> None:
        with lock:
            present[0] += n
            done = present[0]
        on_progress(done)

    return _fetch(target, snapshot.files, transfer, on_bytes, what, on_start, deadline, pace, room)
