"""S3 with the real boto3 client: list a source prefix, stage a snapshot, fill a directory, delete a prefix.

A staged object carries the file's expected digest in its metadata (`x-amz-meta-wk-digest`), so
a later staging run skips every object already present with the right size and digest. Uploads
go through boto3's transfer manager (multipart, parallel parts); fills stream ranged GETs into
the same resumable, hashed `.part` files as downloads from the Hub.

The listing of an s3:// source is checked before use (`weightkeeper.download.check_snapshot`):
every object needs a plain (single-part) ETag, its MD5, to be verified by. Every answer is bounded
(`make_client`): its headers in time, and a body read whole (a listing page, an error) in size and time.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.awsrequest import AWSHTTPConnection, AWSHTTPConnectionPool, AWSHTTPSConnection, AWSHTTPSConnectionPool
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from urllib3.exceptions import HTTPError

from weightkeeper.config import S3Settings
from weightkeeper.anchored import Dir
from weightkeeper.download import (
    CONNECTIONS,
    Limits,
    RemoteFile,
    RoomCheck,
    Snapshot,
    Transfer,
    TransferInterrupted,
    check_count,
    check_snapshot,
    expected_digest,
    fetch_files,
    safe_repo_path,
    shown,
)
from weightkeeper.errors import CleanupError, DownloadError, said, scrubbed
from weightkeeper.hub import HeadersInTime
from weightkeeper.layout import S3Source, copy_name, parse_s3_uri
from weightkeeper.planning import select_files
from weightkeeper.watchdog import BodyRefused, Pace, Watchdog, current, read_body, read_whole

DIGEST_KEY = "wk-digest"
PART_BYTES = 16 << 20
UPLOAD_PAGES = 100  # pages of multipart uploads aborted under one prefix at most (a staging run leaves up to 8)
TRANSFER = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=8)
PLAIN_ETAG = re.compile(r'"?([0-9a-f]{32})"?')
PARTS_ETAG = re.compile(r'"?[0-9a-f]{32}-[0-9]{1,5}"?')  # an object uploaded in parts
LIST_PAGE = 1000  # objects a ListObjectsV2 page holds at most (S3's own cap)
EMPTY_PAGES = 100  # truncated pages in a row without an object: a server that leads the listing on
PERMANENT_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchKey",
                   "AllAccessDisabled", "InvalidBucketName", "InvalidObjectState"}
CREDENTIAL_KEYS = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
READ_SECONDS = 120  # botocore's bound of one read
HEADERS_SECONDS = READ_SECONDS  # an answer's headers (a 1,000-key delete or a part's upload may take long to answer)
ANSWER_BYTES = 16 << 20  # an answer read whole (a listing page, an error; never an object's bytes) holds at most this
ANSWER_SECONDS = 300.0  # and its body arrives within this (CompleteMultipartUpload keeps the line open with spaces)
LIST_SECONDS = 600.0  # a whole listing, page after page
MALFORMED = (KeyError, TypeError, ValueError)  # what botocore's parser and handlers raise on an answer out of shape
SENT_SECRETS = re.compile(r"(?:Credential=|Signature=)([^/,\s]+)")  # of a request's Authorization header
KEY_BYTES = 1024  # S3's own bound of a key
CREDENTIALS = "weightkeeper_credentials"  # a client's attribute: its session's credentials (`secrets_of`)
CUT_AGAIN_SECONDS = 5.0  # a stopped staging's requests still in flight this long after its cut are cut again
_sending = threading.local()  # `conns`: the connections of the request this thread sends (`_BoundedSession.send`)


class AnswerRefused(BotoCoreError):
    """An answer too large or too slow to be read whole."""
    fmt = "{why}"


class _HeadersInTime(HeadersInTime):
    def headers_seconds(self) -> float:
        return HEADERS_SECONDS

    def request(self, *args, **kwargs):
        conns = getattr(_sending, "conns", None)
        if conns is not None:  # sent by a `_BoundedSession`: `cut` shuts it down while it sends or reads the answer
            conns.append(self)
        return super().request(*args, **kwargs)


class _HTTPConnection(_HeadersInTime, AWSHTTPConnection):
    pass


class _HTTPSConnection(_HeadersInTime, AWSHTTPSConnection):
    pass


class _HTTPPool(AWSHTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(AWSHTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


def _read_answer(raw) -> bytes:
    """The whole body of `raw` (a urllib3 response), bounded by ANSWER_BYTES and ANSWER_SECONDS
    (`watchdog.read_whole`). Its connection is closed unless all was read: it may hold the rest of the answer."""
    conn = raw.connection
    try:
        return read_whole(raw, ANSWER_BYTES, ANSWER_SECONDS)
    except (BodyRefused, HTTPError, http.client.HTTPException, OSError) as e:
        raw.close()
        if conn is not None:
            conn.close()  # even once handed back to its pool
        if isinstance(e, BodyRefused):
            raise AnswerRefused(why=str(e)) from None
        raise HTTPClientError(error=e) from None  # a cut connection: botocore retries it


class _BoundedSession:
    """botocore's HTTP session, every answer bounded: its headers in HEADERS_SECONDS (`hub.HeadersInTime`), and
    a body read whole (all but an object's bytes: `s3_transfer` reads those, watched) by `_read_answer`. `cut()`
    shuts down the connection of every request it is sending, or whose answer it reads (a stopped staging's)."""

    def __init__(self, session):
        session._pool_classes_by_scheme.update(http=_HTTPPool, https=_HTTPSPool)  # shared by its proxies' managers
        self._session = session
        self._lock = threading.Lock()
        self._in_flight: dict[int, list] = {}  # thread -> the connections of the request it sends

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def send(self, request):
        thread, conns = threading.get_ident(), []
        with self._lock:
            self._in_flight[thread] = _sending.conns = conns
        streamed, request.stream_output = request.stream_output, True
        try:
            try:
                response = self._session.send(request)
            finally:
                request.stream_output = streamed
            if not streamed or response.status_code >= 300:
                response._content = _read_answer(response.raw)
                for secret in _sent_secrets(request.headers):  # an answer may repeat what it was sent (an error in a
                    response._content = response._content.replace(secret, b"...")  # 200 too): never the credentials
            return response
        finally:
            _sending.conns = None
            with self._lock:
                self._in_flight.pop(thread, None)

    def cut(self) -> None:
        """Shut down the socket of every request in flight: a blocked send or read returns at once."""
        with self._lock:
            conns = [conn for listed in self._in_flight.values() for conn in listed]
        for conn in conns:
            with contextlib.suppress(OSError, AttributeError):  # closed meanwhile; TLS to a proxy wraps a socket
                sock = conn.sock
                if sock is not None:
                    getattr(sock, "socket", sock).shutdown(socket.SHUT_RDWR)


def _sent_secrets(headers) -> list[bytes]:
    """What of a request's credentials an answer must not repeat: its session token, access key id, signature."""
    authorization = headers.get("Authorization") or b""  # botocore's are bytes: never their repr
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    found = [headers.get("X-Amz-Security-Token"), *SENT_SECRETS.findall(authorization)]
    return [v.encode() if isinstance(v, str) else v for v in found if v]


def make_client(s3: S3Settings, credentials: dict | None = None):
    """An S3 client for `s3`; `credentials` (from an `AwsCredentials` block) or boto3's own chain (environment,
    profile, instance role). Checksums only where S3 requires them, so S3-compatible servers work."""
    if credentials is not None and (set(credentials) - CREDENTIAL_KEYS or "aws_access_key_id" not in credentials):
        raise DownloadError(f"the S3 credentials block {s3.credentials_block!r} must set aws_access_key_id and "
                            f"aws_secret_access_key (and optionally aws_session_token)", permanent=True)
    config = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                    retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=64,
                    connect_timeout=10, read_timeout=READ_SECONDS)
    session = boto3.session.Session(**(credentials or {}))
    client = session.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region, config=config)
    client._endpoint.http_session = _BoundedSession(client._endpoint.http_session)  # botocore bounds only each read
    setattr(client, CREDENTIALS, session.get_credentials())  # what its errors must never show (`secrets_of`)
    return client


def secrets_of(client) -> list[str]:
    """What of `client`'s credentials no message may show, whatever a server repeats of them, and however it
    encodes it (escaped in XML, in a 200's body, per key of a DeleteObjects answer): its access key id, secret key
    and session token, hidden in the message made of what it said."""
    credentials = getattr(client, CREDENTIALS, None)
    try:
        frozen = credentials.get_frozen_credentials() if credentials is not None else None
    except Exception:  # noqa: BLE001 - a refresh that fails here (an instance role's): the sent ones are still hidden
        return []
    return [s for s in (frozen.access_key, frozen.secret_key, frozen.token) if s] if frozen else []


def s3_error(error: Exception, what: str, secrets: Sequence[str] = ()) -> DownloadError:
    """Translate a boto3 error into one line that says what to do, none of `secrets` (`secrets_of`) in it: hidden
    in what the server said before it is cut to length."""
    if isinstance(error, NoCredentialsError):
        return DownloadError(f"no S3 credentials for {what}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or name a "
                             "prefect-aws AwsCredentials block in [s3] credentials_block", permanent=True)
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        permanent = code in PERMANENT_CODES or status in (400, 401, 403, 404)
        return DownloadError(f"S3 answered {said(code or status, secrets)} for {what}: "
                             f"{said(error.response.get('Error', {}).get('Message'), secrets)}; "
                             f"{'fix the bucket, prefix or credentials' if permanent else 'will retry'}",
                             permanent=permanent)
    if isinstance(error, MALFORMED):
        return DownloadError(f"S3 answered what cannot be read for {what} ({type(error).__name__}: "
                             f"{shown(scrubbed(error, secrets))}); will retry")
    return DownloadError(f"cannot reach S3 for {what}: {scrubbed(error, secrets)}; will retry")


def _call(method, what: str, **params) -> dict:
    """`method(**params)` (a client's), any error it raises one DownloadError line (`s3_error`)."""
    try:
        return method(**params)
    except (BotoCoreError, ClientError, *MALFORMED) as e:
        raise s3_error(e, what, secrets_of(method.__self__)) from None


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key/prefix/` -> (bucket, `key/prefix/`)."""
    source = parse_s3_uri(uri)
    return source.bucket, source.prefix


def _key_problem(key: object, prefix: str, previous: str | None, segments: bool) -> str | None:
    """Why a listed key is not one of `prefix`'s (None: it is): outside it, with `segments` an empty, `.` or `..`
    segment below it (a folder marker's trailing `/` aside), a control character, or not after `previous` in S3's
    order."""
    if not isinstance(key, str) or not key.startswith(prefix):
        return f"it lists {shown(key)}, which is not under {prefix}"
    if len(key.encode("utf-8", "surrogatepass")) > KEY_BYTES:
        return f"it lists {shown(key)}, a key of over {KEY_BYTES} bytes (more than S3 allows)"
    rest = key[len(prefix):]
    if segments and rest and {"", ".", ".."} & set((rest[:-1] if rest.endswith("/") else rest).split("/")):
        return f"it lists {shown(key)}, with an empty, '.' or '..' segment"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return f"it lists {shown(key)}, with a control character"
    if previous is not None and key <= previous:
        return f"it lists {shown(key)} after {shown(previous)}, not in S3's ascending order"
    return None


def _objects(client, bucket: str, prefix: str, what: str, limits: Limits, segments: bool) -> list[dict]:
    """Every object under `prefix`, each key checked as it is listed (`_key_problem`; `segments`: its segments
    too, for a delete: a source's keys are checked when selected): the keys ascend, so a listing ends; at most
    LIST_PAGE a page, EMPTY_PAGES truncated pages in a row without a key, and `limits.max_manifest_files` objects
    in all."""
    found: list[dict] = []
    token, empty, deadline = None, 0, time.monotonic() + LIST_SECONDS
    while True:
        if time.monotonic() > deadline:
            raise DownloadError(f"refusing the listing of {what}: it took over {LIST_SECONDS:.0f} s; will retry")
        page = _call(client.list_objects_v2, what, Bucket=bucket, Prefix=prefix, MaxKeys=LIST_PAGE,
                     **({"ContinuationToken": token} if token else {}))
        contents = page.get("Contents") or []
        if len(contents) > LIST_PAGE:
            raise DownloadError(f"refusing the listing of {what}: a page of {len(contents)} objects (S3 lists "
                                f"at most {LIST_PAGE})", permanent=True)
        for o in contents:
            if problem := _key_problem(o.get("Key"), prefix, found[-1]["Key"] if found else None, segments):
                raise DownloadError(f"refusing the listing of {what}: {problem}", permanent=True)
            found.append(o)
        check_count(what, len(found), limits)
        if not page.get("IsTruncated"):
            return found
        empty = 0 if contents else empty + 1
        if not (token := page.get("NextContinuationToken")):
            raise DownloadError(f"refusing the listing of {what}: a page says more follow but gives no "
                                "continuation token; will retry")
        if empty >= EMPTY_PAGES:
            raise DownloadError(f"refusing the listing of {what}: {empty} pages in a row say more follow and "
                                "hold no object; will retry")


def list_source(client, source: S3Source, limits: Limits = Limits(), include: list[str] | None = None,
                exclude: list[str] | None = None) -> Snapshot:
    """The files of an S3 source prefix to fetch (`select_files`, as for the Hub), checked.

    Its "commit" is a digest of the source's URI and its listing (keys, sizes, ETags): it changes when the objects
    do, and is never another prefix's, so that a shared copy holds one source's files (MD5s can be made to collide:
    files a user listed under their prefix never stand in for another's).
    """
    objects = {o["Key"][len(source.prefix):]: o
               for o in _objects(client, source.bucket, source.prefix, source.uri, limits, segments=False)
               if not o["Key"].endswith("/")}
    if not objects:
        raise DownloadError(f"no objects under {source.uri}; stage the model there first or fix the source",
                            permanent=True)
    files = []
    try:
        selected = select_files(objects, include, exclude)
    except DownloadError as e:
        raise DownloadError(f"{source.uri}: {e}", permanent=True) from None
    for name in selected:
        o = objects[safe_repo_path(name, source.uri)]
        if not (plain := PLAIN_ETAG.fullmatch(o.get("ETag", ""))):
            raise DownloadError(f"refusing {source.uri}: {name} has no MD5 to be verified by (its ETag "
                                f"{shown(o.get('ETag'))} is not one: it was uploaded in parts); upload it again in "
                                "one part (e.g. `aws s3 cp` with a multipart_threshold above its size, up to 5 GiB)",
                                permanent=True)
        files.append(RemoteFile(name, o.get("Size"), "", md5=plain.group(1)))  # a size checked below
    listing = "\n".join([source.uri, *(f"{f.path}\0{f.size}\0{objects[f.path]['ETag']}" for f in files)])
    commit = hashlib.sha1(listing.encode()).hexdigest()
    return check_snapshot(Snapshot(source.repo_id, commit, tuple(files), copy_name(commit, include, exclude)),
                          source.uri, limits)


def _changed(response: dict, remote: RemoteFile) -> bool:
    """An s3:// source's object is no longer the one listed: the ETag of its GET is another MD5 than its listing's,
    or one of an upload in parts. Any other ETag (a weak one from a proxy) is not judged: the hash still is."""
    etag = response.get("ETag") if remote.md5 else None
    if not isinstance(etag, str):
        return False
    if plain := PLAIN_ETAG.fullmatch(etag):
        return plain.group(1) != remote.md5
    return bool(PARTS_ETAG.fullmatch(etag))


def s3_transfer(client, uri: str) -> Transfer:
    """Ranges of the objects under `uri`, each one ranged GET."""
    bucket, prefix = split_uri(uri)

    def transfer(remote: RemoteFile, start: int, end: int, write: Callable[[memoryview], None]) -> None:
        what = f"s3://{bucket}/{prefix}{remote.path}"
        response = _call(client.get_object, what, Bucket=bucket, Key=prefix + remote.path,
                         Range=f"bytes={start}-{end - 1}")
        raw = response["Body"]._raw_stream  # the urllib3 response under botocore's StreamingBody
        left = end - start
        try:
            if not response.get("ContentRange", "").startswith(f"bytes {start}-"):
                raise DownloadError(f"S3 did not honour a Range request for {what}; will retry")
            if _changed(response, remote):
                raise DownloadError(f"{what} changed since it was listed (its ETag is {said(response.get('ETag'))}, "
                                    f"not the MD5 {remote.md5}); delete the model and declare it again to fetch "
                                    "the new objects", permanent=True)
            with current().abortable(raw.shutdown):
                left -= read_body(raw, left, write)
        except (HTTPError, http.client.HTTPException, OSError) as e:  # cut mid-body, or no data within the timeout
            raise TransferInterrupted(f"{type(e).__name__}: {e}") from None
        finally:
            if left == 0 and raw._fp.isclosed():  # the whole body was read: the connection can be reused
                raw.release_conn()
            else:
                raw.close()

    return transfer


def fill_from_s3(client, uri: str, snapshot: Snapshot, target: Dir, on_progress: Callable[[int], None],
                 deadline: float, pace: Pace = Pace(), room: RoomCheck | None = None) -> int:
    """`fetch_files` from the staged (or source) prefix `uri`."""
    return fetch_files(snapshot, target, s3_transfer(client, uri), on_progress, deadline, uri, pace, room)


def staged(client, bucket: str, key: str, remote: RemoteFile) -> bool:
    """The object is there with the file's size and digest (so it need not be uploaded again)."""
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
            return False
        raise s3_error(e, f"s3://{bucket}/{key}", secrets_of(client)) from None
    except (BotoCoreError, *MALFORMED) as e:
        raise s3_error(e, f"s3://{bucket}/{key}", secrets_of(client)) from None
    return head.get("ContentLength") == remote.size and \
        head.get("Metadata", {}).get(DIGEST_KEY) == expected_digest(remote)


class _Stopped(Exception):
    """The staging stopped (its first error is raised): a thread's request or fetch ends here."""


class _Uploads(Watchdog):
    """The watchdog of a staging run's uploads (`weightkeeper.watchdog.Watchdog`, its thread and its rules): past
    the deadline, once `poll` raises (a deleted model), or when S3 took fewer than `pace.min_bytes_per_second *
    stall_seconds` bytes over the last `stall_seconds` while a file was being uploaded, it fails the staging and
    cuts every request of the client in flight (`_BoundedSession.cut`), again CUT_AGAIN_SECONDS later (what was
    still connecting then; the abort of a multipart upload s3transfer sends on failure, once)."""

    def __init__(self, client, deadline: float, pace: Pace, poll: Callable[[], None],
                 fail: Callable[[BaseException], None], what: str, stop: threading.Event):
        super().__init__(deadline, pace, poll, fail, what, stop)
        self.cut = getattr(client._endpoint.http_session, "cut", lambda: None)
        self.uploading: set[str] = set()  # the keys of the files being uploaded, their bytes or their answers awaited
        self.taken = 0  # bytes S3 took (read to be sent; again when a request is sent again)
        self.again: threading.Timer | None = None

    @contextlib.contextmanager
    def upload(self, key: str) -> Iterator[Callable[[int], None]]:
        """While inside, the file is being uploaded to `key`: the function yielded counts the bytes S3 takes."""
        with self.lock:
            self.uploading.add(key)
        try:
            yield self._took
        finally:
            self.completing(key)

    def _took(self, n: int) -> None:
        if n > 0:  # negative: s3transfer rewinding a body to send it again
            with self.lock:
                self.taken += n

    def completing(self, key: str) -> None:
        """The file at `key` is no longer being uploaded, or every part of it was and they are being put together (S3
        may take minutes to answer a CompleteMultipartUpload, sending spaces meanwhile): no pace is asked of it (the
        deadline still holds)."""
        with self.lock:
            self.uploading.discard(key)

    def _moved(self) -> tuple[bool, int]:
        """Whether a file is being uploaded, and how many bytes S3 took so far (the watchdog's pace rule)."""
        with self.lock:
            return bool(self.uploading), self.taken

    def _stalled(self, moved: int, window: float) -> str:
        return (f"{self.what} stalled: S3 took {moved} bytes in the last {window:g} s, below the minimum of "
                f"{self.pace.min_bytes_per_second} B/s (min_download_bytes_per_second); the objects already staged "
                "are kept and the next attempt uploads the rest")

    def abort(self) -> None:
        super().abort()
        self.cut()
        with self.lock:
            if self.again is None:
                self.again = threading.Timer(CUT_AGAIN_SECONDS, self.cut)
                self.again.name, self.again.daemon = "watchdog-cut", True
                self.again.start()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if self.again is not None:
            self.again.cancel()
            self.again.join()


def stage_snapshot(client, uri: str, snapshot: Snapshot,
                   fetch_one: Callable[[RemoteFile, Callable[[], None]], tuple[BinaryIO, Callable[[], None]]],
                   on_progress: Callable[[int], None], counts: dict[str, int] | None = None,
                   deadline: float = float("inf"), pace: Pace = Pace(), what: str | None = None) -> tuple[int, int]:
    """Upload every file of `snapshot` under `uri` that is not staged yet; returns (uploaded, skipped) files.

    `fetch_one(file, poll)` puts a verified local copy of the file on disk and returns it open, with the
    function that removes it once uploaded; `poll()` raises once the staging stopped (call it as the fetch goes).
    `on_progress(bytes_staged)` may raise to stop (a deleted model); it is also called every
    `weightkeeper.watchdog.TICK` seconds. Past `deadline` (a `time.monotonic()` value), or when S3 takes the bytes
    slower than `pace`, the staging fails (`_Uploads`, `what` names it in the message). The first error stops every
    file: their requests are not sent again (botocore would retry a request its body's reading stopped), and it is
    the one raised. `counts` (bytes, uploaded, skipped), if given, is counted in as it goes: what an interrupted call
    did. `client` is this call's own: its events stop its requests while the staging stops.
    """
    bucket, prefix = split_uri(uri)
    lock, stop, first = threading.Lock(), threading.Event(), [None]
    counts = {"bytes": 0, "uploaded": 0, "skipped": 0} if counts is None else counts

    def fail(error: BaseException) -> None:
        with lock:
            if first[0] is None and not isinstance(error, _Stopped):
                first[0] = error
            stop.set()

    def poll() -> None:
        if stop.is_set():
            raise _Stopped()

    def add(n: int, count: str | None = None) -> None:
        poll()
        with lock:
            counts["bytes"] += n
            if count:
                counts[count] += 1
            value = counts["bytes"]
        try:
            on_progress(value)
        except BaseException as e:
            fail(e)
            raise

    def progressed() -> None:  # the watchdog's poll
        with lock:
            value = counts["bytes"]
        on_progress(value)

    def hold(event_name: str = "", **kwargs) -> None:  # before a request is sent: none once stopped, but an abort
        if stop.is_set() and not event_name.endswith(".AbortMultipartUpload"):
            raise _Stopped()

    def no_retry(**kwargs) -> None:  # before botocore retries a request: none once stopped
        poll()

    def completing(params: dict, **kwargs) -> None:
        watchdog.completing(params.get("Key"))

    def stage(remote: RemoteFile) -> None:
        poll()
        key = prefix + remote.path
        if staged(client, bucket, key, remote):
            add(remote.size, "skipped")
            return
        local, remove = fetch_one(remote, poll)
        try:
            with local, watchdog.upload(key) as took:
                def sent(n: int) -> None:
                    took(n)
                    add(n)

                client.upload_fileobj(local, bucket, key, Config=TRANSFER, Callback=sent,
                                      ExtraArgs={"Metadata": {DIGEST_KEY: expected_digest(remote)}})
        except Exception as e:  # noqa: BLE001 - boto3 wraps client errors in S3UploadFailedError
            if stop.is_set():  # this upload was stopped (its error, if any, is whatever its cut request raised)
                raise _Stopped() from None
            if isinstance(e, (BotoCoreError, ClientError)):
                raise s3_error(e, f"s3://{bucket}/{key}", secrets_of(client)) from None
            if isinstance(e.__cause__ or e.__context__, (BotoCoreError, ClientError)):
                raise s3_error(e.__cause__ or e.__context__, f"s3://{bucket}/{key}", secrets_of(client)) from None
            raise
        remove()
        add(0, "uploaded")

    def run(remote: RemoteFile) -> None:
        try:
            stage(remote)
        except BaseException as e:
            fail(e)
            if not isinstance(e, _Stopped):
                watchdog.abort()  # the other files' requests in flight end now, not at their next chunk or timeout
            raise

    watchdog = _Uploads(client, deadline, pace, progressed, fail, what or f"staging to {uri}", stop)
    events, unique = client.meta.events, f"weightkeeper-stage-{id(stop)}"
    hooks = [("before-send.s3", hold), ("needs-retry.s3", no_retry),
             ("before-parameter-build.s3.CompleteMultipartUpload", completing)]
    interrupted: BaseException | None = None  # raised in this thread while it waited: a signal (SIGTERM, Ctrl-C)
    try:
        for event, handler in hooks:
            events.register_first(event, handler, unique_id=f"{unique}-{event}")
        with watchdog, ThreadPoolExecutor(max_workers=CONNECTIONS, thread_name_prefix="stage") as pool:
            futures = [pool.submit(run, f) for f in snapshot.files]
            try:
                for future in futures:
                    try:
                        future.result()
                    except BaseException as e:  # noqa: BLE001 - a file's own error: the first one is raised below
                        if not (future.done() and (future.cancelled() or future.exception() is e)):
                            raise
                        for other in futures:  # the others stop at their next chunk
                            other.cancel()
            except BaseException as e:  # a signal while this thread waited: every upload stops now
                interrupted = e
                fail(e)
                watchdog.abort()
                for other in futures:
                    other.cancel()
    finally:
        for event, handler in hooks:
            events.unregister(event, handler, unique_id=f"{unique}-{event}")
    if interrupted is not None or first[0] is not None:
        raise interrupted or first[0]
    return counts["uploaded"], counts["skipped"]


def _abort_uploads(client, bucket: str, prefix: str, uri: str) -> None:
    """Abort the multipart uploads under `prefix` that a killed staging run left (S3 bills their parts until then),
    in at most UPLOAD_PAGES pages of at most LIST_PAGE uploads, within LIST_SECONDS, of a listing checked as it
    comes (each key under `prefix`, its segments too, as for a delete; each upload listed once)."""
    markers: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + LIST_SECONDS
    for _ in range(UPLOAD_PAGES):
        if time.monotonic() > deadline:
            raise CleanupError(f"the listing of multipart uploads under {uri} took over {LIST_SECONDS:.0f} s")
        page = _call(client.list_multipart_uploads, uri, Bucket=bucket, Prefix=prefix, MaxUploads=LIST_PAGE,
                     **markers)
        uploads = page.get("Uploads") or ()
        if len(uploads) > LIST_PAGE:
            raise CleanupError(f"S3 listed {len(uploads)} multipart uploads under {uri} in one page, more than "
                               f"{LIST_PAGE}")
        for upload in uploads:
            key, upload_id = upload.get("Key"), upload.get("UploadId")
            problem = _key_problem(key, prefix, None, segments=True)
            if problem or not isinstance(upload_id, str) or not upload_id or (key, upload_id) in seen:
                raise CleanupError(f"S3 listed a multipart upload not of {uri}: "
                                   f"{problem or f'{said(str(key))} listed twice or without an id'}")
            seen.add((key, upload_id))
            _call(client.abort_multipart_upload, uri, Bucket=bucket, Key=key, UploadId=upload_id)
        following = {"KeyMarker": page.get("NextKeyMarker"), "UploadIdMarker": page.get("NextUploadIdMarker")}
        if not page.get("IsTruncated") or following == markers or not all(following.values()):
            return
        markers = following


def delete_prefix(client, bucket: str, prefix: str, limits: Limits) -> int:
    """Delete every object whose key starts with `prefix` (which ends in '/'), at most `limits.max_manifest_files`
    of them (a staged copy holds no more), and abort the multipart uploads left under it; returns how many objects.

    Raises `CleanupError` when S3 refuses any delete or anything is left afterwards.
    """
    if not prefix.endswith("/"):
        raise CleanupError(f"refusing to delete s3://{bucket}/{prefix}: a prefix must end with '/'")
    uri = f"s3://{bucket}/{prefix}"
    try:
        keys = [o["Key"] for o in _objects(client, bucket, prefix, uri, limits, segments=True)]  # under `prefix`
        for start in range(0, len(keys), 1000):
            response = _call(client.delete_objects, uri, Bucket=bucket, Delete={
                "Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})
            if errors := response.get("Errors"):
                first, secrets = errors[0], secrets_of(client)
                raise CleanupError(f"S3 refused to delete {len(errors)} object(s) under {uri}: "
                                   f"{said(first.get('Key'), secrets)}: {said(first.get('Code'), secrets)} "
                                   f"{said(first.get('Message'), secrets)}".rstrip())
        left = _call(client.list_objects_v2, uri, Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0)
        _abort_uploads(client, bucket, prefix, uri)
        uploads = _call(client.list_multipart_uploads, uri, Bucket=bucket, Prefix=prefix, MaxUploads=1).get("Uploads")
    except (BotoCoreError, ClientError, DownloadError) as e:
        reason = e if isinstance(e, DownloadError) else s3_error(e, uri, secrets_of(client))
        raise CleanupError(str(reason)) from None
    if left:
        raise CleanupError(f"objects are still left under {uri} after deleting {len(keys)}")
    if uploads:
        raise CleanupError(f"multipart uploads are still left under {uri} after aborting them")
    return len(keys)
