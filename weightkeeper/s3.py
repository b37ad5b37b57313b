"""S3 with the real boto3 client: list a source prefix, stage a snapshot, fill a directory, delete a prefix.

A staged object carries the file's expected digest in its metadata (`x-amz-meta-wk-digest`), so
a later staging run skips every object already present with the right size and digest. Uploads
go through boto3's transfer manager (multipart, parallel parts); fills stream ranged GETs into
the same resumable, hashed `.part` files as downloads from the Hub.

The listing of an s3:// source is checked before use (`weightkeeper.download.check_snapshot`):
every object needs a plain (single-part) ETag, its MD5, to be verified by.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from urllib3.exceptions import HTTPError

from weightkeeper.config import S3Settings
from weightkeeper.anchored import Dir
from weightkeeper.download import (
    CONNECTIONS,
    Limits,
    RemoteFile,
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
from weightkeeper.errors import CleanupError, DownloadError
from weightkeeper.layout import S3Source, copy_name, parse_s3_uri
from weightkeeper.planning import select_files
from weightkeeper.watchdog import Pace, current, read_body

DIGEST_KEY = "wk-digest"
PART_BYTES = 16 << 20
TRANSFER = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=8)
PLAIN_ETAG = re.compile(r'"?([0-9a-f]{32})"?')
LIST_PAGE = 1000  # objects a ListObjectsV2 page holds at most (S3's own cap)
EMPTY_PAGES = 100  # truncated pages in a row without an object: a server that leads the listing on
PERMANENT_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchKey",
                   "AllAccessDisabled", "InvalidBucketName", "InvalidObjectState"}
CREDENTIAL_KEYS = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}


def make_client(s3: S3Settings, credentials: dict | None = None):
    """An S3 client for `s3`; `credentials` (from an `AwsCredentials` block) or boto3's own chain (environment,
    profile, instance role). Checksums only where S3 requires them, so S3-compatible servers work."""
    if credentials is not None and (set(credentials) - CREDENTIAL_KEYS or "aws_access_key_id" not in credentials):
        raise DownloadError(f"the S3 credentials block {s3.credentials_block!r} must set aws_access_key_id and "
                            f"aws_secret_access_key (and optionally aws_session_token)", permanent=True)
    config = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                    retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=64,
                    connect_timeout=10, read_timeout=120)
    session = boto3.session.Session(**(credentials or {}))
    return session.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region, config=config)


def s3_error(error: Exception, what: str) -> DownloadError:
    """Translate a boto3 error into one line that says what to do."""
    if isinstance(error, NoCredentialsError):
        return DownloadError(f"no S3 credentials for {what}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or name a "
                             "prefect-aws AwsCredentials block in [s3] credentials_block", permanent=True)
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        permanent = code in PERMANENT_CODES or status in (400, 401, 403, 404)
        return DownloadError(f"S3 answered {code or status} for {what}: "
                             f"{error.response.get('Error', {}).get('Message', '')}; "
                             f"{'fix the bucket, prefix or credentials' if permanent else 'will retry'}",
                             permanent=permanent)
    return DownloadError(f"cannot reach S3 for {what}: {error}; will retry")


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
    token, empty = None, 0
    try:
        while True:
            page = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=LIST_PAGE,
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
    except (BotoCoreError, ClientError) as e:
        raise s3_error(e, what) from None


def list_source(client, source: S3Source, limits: Limits = Limits(), include: list[str] | None = None,
                exclude: list[str] | None = None) -> Snapshot:
    """The files of an S3 source prefix to fetch (`select_files`, as for the Hub), checked.

    Its "commit" is a digest of the listing (keys, sizes, ETags): it changes when the objects do.
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
        files.append(RemoteFile(name, o["Size"], "", md5=plain.group(1)))
    listing = "\n".join(f"{f.path}\0{f.size}\0{objects[f.path]['ETag']}" for f in files)
    commit = hashlib.sha1(listing.encode()).hexdigest()
    return check_snapshot(Snapshot(source.repo_id, commit, tuple(files), copy_name(commit, include, exclude)),
                          source.uri, limits)


def s3_transfer(client, uri: str) -> Transfer:
    """Ranges of the objects under `uri`, each one ranged GET."""
    bucket, prefix = split_uri(uri)

    def transfer(remote: RemoteFile, start: int, end: int, write: Callable[[memoryview], None]) -> None:
        what = f"s3://{bucket}/{prefix}{remote.path}"
        try:
            response = client.get_object(Bucket=bucket, Key=prefix + remote.path, Range=f"bytes={start}-{end - 1}")
        except (BotoCoreError, ClientError) as e:
            raise s3_error(e, what) from None
        raw = response["Body"]._raw_stream  # the urllib3 response under botocore's StreamingBody
        left = end - start
        try:
            if not response.get("ContentRange", "").startswith(f"bytes {start}-"):
                raise DownloadError(f"S3 did not honour a Range request for {what}; will retry")
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
                 deadline: float, pace: Pace = Pace()) -> int:
    """`fetch_files` from the staged (or source) prefix `uri`."""
    return fetch_files(snapshot, target, s3_transfer(client, uri), on_progress, deadline, uri, pace)


def staged(client, bucket: str, key: str, remote: RemoteFile) -> bool:
    """The object is there with the file's size and digest (so it need not be uploaded again)."""
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
            return False
        raise s3_error(e, f"s3://{bucket}/{key}") from None
    except BotoCoreError as e:
        raise s3_error(e, f"s3://{bucket}/{key}") from None
    return head["ContentLength"] == remote.size and head.get("Metadata", {}).get(DIGEST_KEY) == expected_digest(remote)


def stage_snapshot(client, uri: str, snapshot: Snapshot,
                   fetch_one: Callable[[RemoteFile], tuple[BinaryIO, Callable[[], None]]],
                   on_progress: Callable[[int], None]) -> tuple[int, int]:
    """Upload every file of `snapshot` under `uri` that is not staged yet; returns (uploaded, skipped) files.

    `fetch_one(file)` puts a verified local copy of the file on disk and returns it open, with the
    function that removes it once uploaded. `on_progress(bytes_staged)` may raise to stop (a deleted model).
    """
    bucket, prefix = split_uri(uri)
    lock = threading.Lock()
    counts = {"bytes": 0, "uploaded": 0, "skipped": 0}

    def add(n: int, count: str | None = None) -> None:
        with lock:
            counts["bytes"] += n
            if count:
                counts[count] += 1
            value = counts["bytes"]
        on_progress(value)

    def stage(remote: RemoteFile) -> None:
        key = prefix + remote.path
        if staged(client, bucket, key, remote):
            add(remote.size, "skipped")
            return
        local, remove = fetch_one(remote)
        try:
            with local:
                client.upload_fileobj(local, bucket, key, Config=TRANSFER, Callback=add,
                                      ExtraArgs={"Metadata": {DIGEST_KEY: expected_digest(remote)}})
        except (BotoCoreError, ClientError) as e:
            raise s3_error(e, f"s3://{bucket}/{key}") from None
        except Exception as e:  # noqa: BLE001 - boto3 wraps client errors in S3UploadFailedError
            if isinstance(e.__cause__ or e.__context__, (BotoCoreError, ClientError)):
                raise s3_error(e.__cause__ or e.__context__, f"s3://{bucket}/{key}") from None
            raise
        remove()
        add(0, "uploaded")

    with ThreadPoolExecutor(max_workers=CONNECTIONS, thread_name_prefix="stage") as pool:
        futures = [pool.submit(stage, f) for f in snapshot.files]
        errors = []
        for future in futures:
            try:
                future.result()
            except BaseException as e:  # noqa: BLE001 - first error wins, the others are dropped
                errors.append(e)
                for other in futures:
                    other.cancel()
    if errors:
        raise errors[0]
    return counts["uploaded"], counts["skipped"]


def delete_prefix(client, bucket: str, prefix: str, limits: Limits) -> int:
    """Delete every object whose key starts with `prefix` (which ends in '/'), at most `limits.max_manifest_files`
    of them (a staged copy holds no more); returns how many.

    Raises `CleanupError` when S3 refuses any delete or anything is left afterwards.
    """
    if not prefix.endswith("/"):
        raise CleanupError(f"refusing to delete s3://{bucket}/{prefix}: a prefix must end with '/'")
    uri = f"s3://{bucket}/{prefix}"
    try:
        keys = [o["Key"] for o in _objects(client, bucket, prefix, uri, limits, segments=True)]  # under `prefix`
        for start in range(0, len(keys), 1000):
            response = client.delete_objects(Bucket=bucket, Delete={
                "Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})
            if errors := response.get("Errors"):
                first = errors[0]
                raise CleanupError(f"S3 refused to delete {len(errors)} object(s) under {uri}: "
                                   f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}".rstrip())
        left = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0)
    except (BotoCoreError, ClientError, DownloadError) as e:
        reason = e if isinstance(e, DownloadError) else s3_error(e, uri)
        raise CleanupError(str(reason)) from None
    if left:
        raise CleanupError(f"objects are still left under {uri} after deleting {len(keys)}")
    return len(keys)
