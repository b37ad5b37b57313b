"""Fetching a snapshot into a model directory: from the Hub with the real `huggingface_hub` client, or
(see `weightkeeper.s3`) from S3, through one resumable file fetch.

`huggingface_hub` resumes a partial file only inside one call, so partial files are ours: each
file streams into `<model dir>/.cache/weightkeeper/<file>.part`, is hashed while it arrives
(sha256 for LFS files, the git blob sha1 for other Hub files, md5 for S3 objects with a plain
ETag) and is moved into place only when complete and correct. A later run, in any process,
resumes from the partial file's size.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers

from weightkeeper.errors import DownloadError, WeightkeeperError
from weightkeeper.layout import SEGMENT, HfSource
from weightkeeper.planning import select_files

# `http_get` writes in chunks of this size: 1 MiB (instead of 10) bounds what a killed run loses per
# file and how late a heartbeat, a cancellation or the timeout is noticed.
constants.DOWNLOAD_CHUNK_SIZE = 1 << 20

CACHE_DIR = ".cache"
PARTIAL_DIR = f"{CACHE_DIR}/weightkeeper"
API_TIMEOUT_SECONDS = 30.0
FILE_WORKERS = 8


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
        return cls(raw["path"], raw["size"], raw["blobId"], raw.get("sha256"), raw.get("md5"))


@dataclass(frozen=True)
class Snapshot:
    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]  # only the files loading needs

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def safe_repo_path(path: str, repo_id: str) -> str:
    segments = path.split("/")
    if path.startswith("/") or posixpath.normpath(path) != path or any(
        s in ("", ".", "..") or not SEGMENT.fullmatch(s) for s in segments
    ) or segments[0] == CACHE_DIR:
        raise DownloadError(f"repository {repo_id} lists an unsafe file name {path!r}; refusing to download it",
                            permanent=True)
    return path


def hub_error(error: Exception, source: HfSource, endpoint: str | None) -> DownloadError:
    """Translate a client error into one line that says what to do."""
    where = endpoint or "the Hugging Face Hub"
    if isinstance(error, GatedRepoError):
        return DownloadError(f"{source.repo_id} is gated on {where}: accept its terms on the Hub and give the model "
                             "a token block (--token-block) of an account that has access", permanent=True)
    if isinstance(error, RepositoryNotFoundError):
        return DownloadError(f"repository {source.repo_id} was not found on {where} (if it is private, give the "
                             "model a token block with access)", permanent=True)
    if isinstance(error, RevisionNotFoundError):
        return DownloadError(f"revision {source.revision!r} does not exist in {source.repo_id} on {where}",
                             permanent=True)
    if isinstance(error, RemoteEntryNotFoundError):
        return DownloadError(f"a file of {source.repo_id} disappeared from {where}: {error}", permanent=True)
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else None
        permanent = status in (400, 401, 403)
        return DownloadError(f"{where} answered HTTP {status} for {source.repo_id}; "
                             f"{'fix access and retry' if permanent else 'will retry'}", permanent=permanent)
    if isinstance(error, httpx2.HTTPError):
        return DownloadError(f"cannot reach {where} for {source.repo_id}: {error}; will retry")
    if isinstance(error, OSError):
        return DownloadError(f"download of {source.repo_id} from {where} was cut short: {error}; will retry")
    return DownloadError(f"downloading {source.repo_id} failed: {error}")


def resolve_snapshot(source: HfSource, endpoint: str | None, token: str | None) -> Snapshot:
    """One request: the commit of the revision (a 40-hex revision as is) and the files to fetch."""
    api = HfApi(endpoint=endpoint, token=token or False)
    try:
        info = api.model_info(source.repo_id, revision=source.revision, files_metadata=True,
                              timeout=API_TIMEOUT_SECONDS)
    except Exception as e:  # noqa: BLE001 - every client error becomes a DownloadError
        raise hub_error(e, source, endpoint) from None
    if not info.sha or (source.pinned_commit and info.sha != source.pinned_commit):
        raise DownloadError(f"{endpoint or 'the Hub'} returned commit {info.sha!r} for {source.uri}", permanent=True)
    siblings = {s.rfilename: s for s in info.siblings or []}
    files = []
    for name in select_files(siblings):
        s = siblings[safe_repo_path(name, source.repo_id)]
        if s.size is None or s.blob_id is None:
            raise DownloadError(f"{endpoint or 'the Hub'} gave no size or blob id for {name} in {source.repo_id}")
        files.append(RemoteFile(name, s.size, s.blob_id, s.lfs.sha256 if s.lfs else None))
    return Snapshot(source.repo_id, info.sha, tuple(files))


def file_hasher(remote: RemoteFile):
    """sha256 for LFS files, md5 for S3 objects with a plain ETag, the git blob sha1 (`blob <size>\\0` +
    content) for the other Hub files; None when only the size can be checked (multipart S3 objects)."""
    if remote.sha256:
        return hashlib.sha256()
    if remote.md5:
        return hashlib.md5()  # noqa: S324 - an integrity check against the server's ETag, not security
    if not remote.blob_id:
        return None
    h = hashlib.sha1()
    h.update(b"blob %d\0" % remote.size)
    return h


def expected_digest(remote: RemoteFile) -> str:
    return remote.sha256 or remote.md5 or remote.blob_id


class HashingWriter:
    """The file object a transfer writes to: hashes and counts what it writes."""

    def __init__(self, f: BinaryIO, expected: RemoteFile, resume: int, on_bytes: Callable[[int], None], where: Path):
        self._f, self._expected, self._on_bytes, self._where = f, expected, on_bytes, where
        self._hash = file_hasher(expected)
        if resume and self._hash:
            f.seek(0)
            while chunk := f.read(8 << 20):
                self._hash.update(chunk)
        f.seek(resume)

    def write(self, chunk: bytes) -> int:
        if self._hash:
            self._hash.update(chunk)
        try:
            n = self._f.write(chunk)
        except OSError as e:  # a disk problem, not a network one: retrying the download does not help
            raise DownloadError(f"cannot write {self._where}: {e.strerror or e}", permanent=True) from None
        self._on_bytes(len(chunk))
        return n

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        """The server ignored our Range: the transfer rewinds to 0 and starts over."""
        n = self._f.truncate(size)
        if self._f.tell() != 0:
            raise DownloadError(f"cannot restart {self._expected.path} from offset {self._f.tell()}")
        self._hash = file_hasher(self._expected)
        return n

    def matches(self) -> bool:
        return self._hash is None or self._hash.hexdigest() == expected_digest(self._expected)


# Writes the bytes of `remote` from offset `resume` on into the writer; raises DownloadError.
Transfer = Callable[[RemoteFile, HashingWriter, int], None]


def in_place(target: Path, remote: RemoteFile) -> bool:
    """The file is in the model directory already: a regular file (not a link) of the right size."""
    dest = target / remote.path
    return dest.is_file() and not dest.is_symlink() and dest.stat().st_size == remote.size


def present_bytes(target: Path, remote: RemoteFile) -> int:
    """Bytes of `remote` already in `target`: all of it in place, else what its partial file holds."""
    if in_place(target, remote):
        return remote.size
    part = target / PARTIAL_DIR / f"{remote.path}.part"
    return min(part.stat().st_size, remote.size) if part.is_file() else 0


def fetch_file(target: Path, remote: RemoteFile, transfer: Transfer, on_bytes: Callable[[int], None],
               what: str) -> int:
    """Fetch one file into place through `<target>/.cache/weightkeeper/<file>.part` (resumed from its
    size, hashed as it arrives); returns the bytes transferred (0 when already there)."""
    dest = target / remote.path
    if in_place(target, remote):
        return 0
    part = target / PARTIAL_DIR / f"{remote.path}.part"
    root = os.path.realpath(target)
    for d in (dest.parent, part.parent):
        d.mkdir(parents=True, exist_ok=True)
        real = os.path.realpath(d)
        if real != root and not real.startswith(root + os.sep):
            raise DownloadError(f"{d} leaves the model directory {target} through a symlink; refusing to write",
                                permanent=True)
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "r+b") as f:
        resume = os.fstat(fd).st_size
        if resume > remote.size:
            f.truncate(0)
            resume = 0
        writer = HashingWriter(f, remote, resume, on_bytes, part)
        if resume < remote.size:
            transfer(remote, writer, resume)
        ok = writer.matches() and f.tell() == remote.size
    if not ok:
        part.unlink(missing_ok=True)
        if resume:  # the partial file was bad: start this file over once, right away
            return fetch_file(target, remote, transfer, on_bytes, what)
        raise DownloadError(f"{remote.path} of {what} arrived corrupted (checksum or size mismatch); "
                            "the partial file was dropped and the file will be fetched again")
    os.replace(part, dest)
    return remote.size - resume


def hub_transfer(source: HfSource, commit: str, endpoint: str | None, token: str | None) -> Transfer:
    """Files of a Hub commit through `huggingface_hub`'s `http_get` (Range requests from the resume offset)."""
    headers = build_hf_headers(token=token or False, library_name="weightkeeper")

    def transfer(remote: RemoteFile, writer: HashingWriter, resume: int) -> None:
        url = hf_hub_url(source.repo_id, remote.path, revision=commit, endpoint=endpoint)
        try:
            http_get(url, writer, resume_size=resume, headers=headers, expected_size=remote.size,  # type: ignore[arg-type]
                     displayed_filename=remote.path)
        except WeightkeeperError:
            raise
        except Exception as e:  # noqa: BLE001
            raise hub_error(e, source, endpoint) from None

    return transfer


def fetch_files(snapshot: Snapshot, target: Path, transfer: Transfer, on_progress: Callable[[int], None],
                deadline: float, what: str) -> int:
    """Fetch every missing file of `snapshot` into `target`, in parallel; returns bytes transferred.

    `on_progress(bytes_present)` is called as data arrives; it may raise to stop the download
    (a cancelled model). Past `deadline` (a `time.monotonic()` value) the download fails.
    Nothing is deleted on failure: the next run resumes from the partial files.
    """
    target.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    present = [sum(present_bytes(target, f) for f in snapshot.files)]

    def on_bytes(n: int) -> None:
        with lock:
            present[0] += n
            done = present[0]
        if time.monotonic() > deadline:
            raise DownloadError(f"download of {what} into {target} exceeded its timeout; "
                                "`weightkeeper model ensure` resumes it from the partial files", permanent=True)
        on_progress(done)

    on_progress(present[0])
    with ThreadPoolExecutor(max_workers=FILE_WORKERS, thread_name_prefix="fetch") as pool:
        futures = [pool.submit(fetch_file, target, f, transfer, on_bytes, what) for f in snapshot.files]
        errors, transferred = [], 0
        for future in futures:
            try:
                transferred += future.result()
            except BaseException as e:  # noqa: BLE001 - first error wins, others are dropped
                errors.append(e)
                for other in futures:
                    other.cancel()
    if errors:
        raise errors[0]
    return transferred


def fetch_snapshot(source: HfSource, snapshot: Snapshot, target: Path, endpoint: str | None, token: str | None,
                   on_progress: Callable[[int], None], deadline: float) -> int:
    """`fetch_files` from the Hub."""
    return fetch_files(snapshot, target, hub_transfer(source, snapshot.commit, endpoint, token), on_progress,
                       deadline, f"{source.repo_id}@{snapshot.commit[:12]}")
