"""The Hugging Face Hub side of a download: `huggingface_hub` resolves, pooled ranged GETs fetch.

`huggingface_hub` resolves the revision and its files (`model_info`) and each file's location
(`get_hf_file_metadata`: a HEAD whose errors become its typed errors). The bytes then come as
ranged GETs over urllib3's pooled connections, several per large file: `hf download` streams a
file through one connection in Python-sized chunks, which is what limits it. The token goes to
the endpoint's own origin only, never to a CDN the Hub redirects a file to. Proxies come from
the environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`), as for `huggingface_hub`; the read
timeout is `HF_HUB_DOWNLOAD_TIMEOUT` (10 s by default).
"""

from __future__ import annotations

import http.client
import threading
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx2
import urllib3
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers

from weightkeeper.anchored import Dir
from weightkeeper.download import (
    CONNECTIONS,
    RemoteFile,
    Snapshot,
    Transfer,
    TransferInterrupted,
    fetch_files,
    safe_repo_path,
)
from weightkeeper.errors import DownloadError
from weightkeeper.layout import HfSource
from weightkeeper.planning import select_files

API_TIMEOUT_SECONDS = 30.0
READ_CHUNK = 1 << 20
# urllib3 retries connecting and follows redirects (dropping Authorization when the host changes);
# a body cut short is resumed by weightkeeper.download from the bytes written.
RETRIES = urllib3.Retry(total=None, connect=2, read=0, status=0, other=0, redirect=5)

_pools: dict[str | None, urllib3.PoolManager] = {}
_pools_lock = threading.Lock()


def _pool(url: str) -> urllib3.PoolManager:
    """The connection pool for `url`: through the environment's proxy for its scheme unless NO_PROXY says not."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and urllib.request.proxy_bypass(parts.hostname or ""):
        proxy = None
    with _pools_lock:
        if proxy not in _pools:
            # a staging run fetches up to CONNECTIONS files at once, each as up to CONNECTIONS ranges
            options = {"num_pools": 32, "maxsize": CONNECTIONS * CONNECTIONS}
            _pools[proxy] = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
        return _pools[proxy]


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def status_error(status: int | None, source: HfSource, endpoint: str | None) -> DownloadError:
    permanent = status in (400, 401, 403)
    return DownloadError(f"{endpoint or 'the Hugging Face Hub'} answered HTTP {status} for {source.repo_id}; "
                         f"{'fix access and retry' if permanent else 'will retry'}", permanent=permanent)


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
        return status_error(error.response.status_code if error.response is not None else None, source, endpoint)
    if isinstance(error, (httpx2.HTTPError, urllib3.exceptions.HTTPError)):
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


def _read_body(response: urllib3.HTTPResponse, left: int, write: Callable[[memoryview], None]) -> int:
    """Read up to `left` bytes of the body into one reused buffer, passing each full buffer to `write`; the
    bytes read. It reads through the `http.client` response under urllib3's: urllib3 2's `readinto` reads
    into new bytes and copies them (1 GiB: 1.85 s that way, 1.49 s this way, best of 7 on 2 CPUs)."""
    body: http.client.HTTPResponse = response._fp
    buf = memoryview(bytearray(min(READ_CHUNK, left)))
    total = 0
    while total < left:
        want = min(len(buf), left - total)
        n = 0
        while n < want and (got := body.readinto(buf[n:want])):
            n += got
        if n:
            write(buf[:n])
            total += n
        if n < want:
            break  # the body ended early
    return total


def hub_transfer(source: HfSource, commit: str, endpoint: str | None, token: str | None) -> Transfer:
    """Ranges of a commit's files: one HEAD per file (through `huggingface_hub`) finds where it is served."""
    headers = build_hf_headers(token=token or False, library_name="weightkeeper")
    anonymous = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    timeout = urllib3.Timeout(connect=API_TIMEOUT_SECONDS, read=float(constants.HF_HUB_DOWNLOAD_TIMEOUT))
    located: dict[str, tuple[str, dict[str, str]]] = {}
    locks: dict[str, threading.Lock] = {}
    guard = threading.Lock()

    def locate(remote: RemoteFile) -> tuple[str, dict[str, str]]:
        """Where the file's bytes are served and the headers to send there (the token only to the endpoint)."""
        with guard:
            lock = locks.setdefault(remote.path, threading.Lock())
        with lock:
            if remote.path not in located:
                url = hf_hub_url(source.repo_id, remote.path, revision=commit, endpoint=endpoint)
                try:
                    meta = get_hf_file_metadata(url, token=token or False, timeout=API_TIMEOUT_SECONDS,
                                                endpoint=endpoint, library_name="weightkeeper")
                except Exception as e:  # noqa: BLE001
                    raise hub_error(e, source, endpoint) from None
                location = meta.location or url
                located[remote.path] = (location, headers if _origin(location) == _origin(url) else anonymous)
            return located[remote.path]

    def transfer(remote: RemoteFile, start: int, end: int, write: Callable[[memoryview], None]) -> None:
        location, sent = locate(remote)
        wanted = {"Range": f"bytes={start}-" if end >= remote.size else f"bytes={start}-{end - 1}",
                  "Accept-Encoding": "identity"}
        try:
            response = _pool(location).request("GET", location, headers={**sent, **wanted}, preload_content=False,
                                               decode_content=False, retries=RETRIES, timeout=timeout)
        except urllib3.exceptions.HTTPError as e:
            raise hub_error(e, source, endpoint) from None
        left = end - start
        try:
            if response.status == 200 and start == 0 or response.status == 206 and (
                    response.headers.get("Content-Range", "").startswith(f"bytes {start}-")):
                left -= _read_body(response, left, write)
            elif response.status in (200, 206):
                raise DownloadError(f"{endpoint or 'the Hub'} did not honour a Range request for {remote.path} of "
                                    f"{source.repo_id}; will retry")
            else:
                raise status_error(response.status, source, endpoint)
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as e:  # cut mid-body, or no data
            raise TransferInterrupted(f"{type(e).__name__}: {e}") from None                # within the read timeout
        finally:
            if left == 0 and response._fp.isclosed():  # the whole body was read: the connection can be reused
                response.release_conn()
            else:
                response.close()

    return transfer


def fetch_snapshot(source: HfSource, snapshot: Snapshot, target: Dir, endpoint: str | None, token: str | None,
                   on_progress: Callable[[int], None], deadline: float) -> int:
    """`fetch_files` from the Hub."""
    return fetch_files(snapshot, target, hub_transfer(source, snapshot.commit, endpoint, token), on_progress,
                       deadline, f"{source.repo_id}@{snapshot.commit[:12]}")
