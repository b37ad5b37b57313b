"""A hostile S3 server: the real boto3 client of `weightkeeper.s3.make_client` against a raw socket server on loopback
that drips its headers or its body, or sends a body without end; and listings (through the test S3 server's proxy)
that leave out what every object has. Nothing waits without bound and nothing is read without bound."""

from __future__ import annotations

import hashlib
import random
import re
import socket
import threading
import time
import uuid

import pytest

from weightkeeper import s3
from weightkeeper.anchored import Dir
from weightkeeper.config import S3Settings
from weightkeeper.download import NAME_CHARS, RemoteFile, Snapshot
from weightkeeper.errors import SAID_CHARS, CleanupError, DownloadError
from weightkeeper.layout import parse_s3_uri

pytestmark = pytest.mark.without_prefect_server

HELD = 10.0  # the longest the hostile server keeps a connection: an answer unbounded here takes that long
SENT_AT_MOST = 32 << 20  # the most it sends on one connection: an unbounded read takes all of it
SHARD = "model-00001-of-00001.safetensors"


class Hostile:
    """A server on loopback that reads each request's head and answers with `answer(send, head)`, then closes. It
    records how long each connection lived from the first byte it sent, and how many bytes it sent."""

    def __init__(self, answer):
        self.answer, self.lives, self.sent, self.accepted = answer, [], [], 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        sent, start = [0], time.monotonic()

        def send(data: bytes) -> None:
            conn.sendall(data)
            sent[0] += len(data)

        with conn:
            try:
                conn.settimeout(HELD)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536) or b"\r\n\r\n"
                self.answer(send, request)
            except OSError:  # the client cut it
                pass
        self.lives.append(time.monotonic() - start)
        self.sent.append(sent[0])

    def close(self) -> None:
        """Stop accepting; wait (up to HELD) for the connections to end."""
        self.sock.close()
        end = time.monotonic() + HELD + 5
        while len(self.lives) < self.accepted and time.monotonic() < end:
            time.sleep(0.05)


def until(seconds: float):
    """Whether a drip goes on: for `seconds` from the first call of its connection's answer."""
    end = time.monotonic() + seconds
    return lambda: time.monotonic() < end


def drip(head: bytes, byte: bytes):
    """An answer that sends `head`, then `byte` every 0.1 s for HELD seconds."""
    def answer(send, _request: bytes) -> None:
        send(head)
        going = until(HELD)
        while going():
            send(byte)
            time.sleep(0.1)
    return answer


drip_headers = drip(b"HTTP/1.1 200 OK\r\n", b"X")
drip_body = drip(b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: 100000\r\n\r\n"
                 b"<ListBucketResult>", b" ")


def endless_body(status: str):
    def answer(send, _request: bytes) -> None:
        send(f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"<Contents>" + b"x" * 65000 + b"</Contents>"
        while True:  # until the client cuts it, or `capped` ends it
            send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    return answer


@pytest.fixture
def fast(monkeypatch):
    """Short bounds, and botocore's retries without their back-off (each is still made)."""
    monkeypatch.setattr(s3, "HEADERS_SECONDS", 0.5)
    monkeypatch.setattr(s3, "ANSWER_SECONDS", 1.0)
    monkeypatch.setattr(s3, "ANSWER_BYTES", 1 << 20)
    monkeypatch.setattr("botocore.retries.standard.ExponentialBackoff.delay_amount", lambda self, context: 0)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)


def hostile(answer):
    server = Hostile(answer)
    return server, s3.make_client(S3Settings(bucket="wk-src", endpoint_url=server.url, region="us-east-1"))


def capped(answer):
    """`answer`, ended by the server after SENT_AT_MOST bytes."""
    def run(send, request: bytes) -> None:
        total = [0]

        def counted(data: bytes) -> None:
            if total[0] > SENT_AT_MOST:
                raise OSError("enough")
            total[0] += len(data)
            send(data)
        answer(counted, request)
    return run


@pytest.mark.parametrize("answer, refused", [
    (drip_headers, "Connection was closed before we received a valid response"),
    (drip_body, "an answer's body took over 1 s"),
    (capped(endless_body("200 OK")), f"an answer held over {1 << 20} bytes"),
    (capped(endless_body("500 Internal Server Error")), f"an answer held over {1 << 20} bytes"),
], ids=["headers-drip", "body-drips", "page-without-end", "error-without-end"])
def test_a_listing_that_drips_or_never_ends_is_cut(fast, answer, refused):
    """The listing of an s3:// source from a server that drips its headers or its body a byte at a time, or sends
    a page (or an error) without end: each answer is cut at its bound, and the listing fails saying so."""
    server, client = hostile(answer)
    try:
        with pytest.raises(DownloadError, match=refused) as e:
            s3.list_source(client, parse_s3_uri("s3://wk-src/team/acme--m/"))
        assert "will retry" in str(e.value) and "\n" not in str(e.value)
    finally:
        server.close()
    assert server.lives and max(server.lives) < HELD / 2, server.lives
    assert max(server.sent) < SENT_AT_MOST // 2, server.sent  # what the sockets buffer aside


@pytest.mark.parametrize("answer, refused", [
    (drip_headers, "Connection was closed before we received a valid response"),
    (capped(endless_body("403 Forbidden")), f"an answer held over {1 << 20} bytes"),
], ids=["headers-drip", "error-without-end"])
def test_an_object_whose_answer_drips_or_never_ends_is_cut(fast, tmp_path, answer, refused):
    """Filling a model from S3: the ranged GET of an object answers with dripping headers, or an error without
    end (botocore reads an error's body whole, a streamed object's too): the fill fails in bounded time."""
    server, client = hostile(answer)
    snapshot = Snapshot("s3/acme--m", "0" * 40, (RemoteFile("model.safetensors", 10, "", md5="0" * 32),))
    try:
        with Dir.root(tmp_path) as target, pytest.raises(DownloadError, match=refused):
            s3.fill_from_s3(client, "s3://wk-src/team/acme--m/", snapshot, target, lambda n: None,
                            time.monotonic() + 60)
    finally:
        server.close()
    assert server.lives and max(server.lives) < HELD / 2, server.lives
    assert max(server.sent) < SENT_AT_MOST // 2, server.sent  # what the sockets buffer aside


# -- listings through the test S3 server's proxy ----------------------------------------------------------------


@pytest.fixture
def source(s3_server, monkeypatch):
    """A fresh bucket on the test S3 server: (its name, the server's own client, the proxy, weightkeeper's client
    through the proxy)."""
    direct, proxy = s3_server
    proxy.reset()
    bucket = f"wk-{uuid.uuid4().hex[:12]}"
    direct.create_bucket(Bucket=bucket)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    yield bucket, direct, proxy, s3.make_client(S3Settings(bucket=bucket, endpoint_url=proxy.url, region="us-east-1"))
    proxy.reset()


def rewritten(pattern: bytes, by: bytes):
    return lambda body, query: re.sub(pattern, by, body)


@pytest.mark.parametrize("rewrite, refused", [
    (rewritten(rb"<Size>\d+</Size>", b""), "config.json has a size of None, not 0 to"),
    (rewritten(rb"<Size>\d+</Size>", b"<Size>lots</Size>"), "S3 answered what cannot be read for s3://"),
    (rewritten(rb"<Key>[^<]*</Key>", b""), "S3 answered what cannot be read for s3://"),
], ids=["no-size", "size-not-a-number", "no-key"])
def test_a_listing_out_of_shape_is_refused_in_one_line(source, rewrite, refused):
    """A listing whose objects have no size, a size that is not a number, or no key: refused with one line that
    says why (not a KeyError or ValueError from botocore's parser), for a source and for a delete alike."""
    bucket, direct, proxy, client = source
    for name in ("config.json", "model.safetensors"):
        direct.put_object(Bucket=bucket, Key=f"team/acme--m/{name}", Body=b"{}")
    proxy.rewrite_listing = rewrite
    with pytest.raises(DownloadError, match=re.escape(refused)) as e:
        s3.list_source(client, parse_s3_uri(f"s3://{bucket}/team/acme--m/"))
    assert "\n" not in str(e.value)
    if "cannot be read" in refused:  # a delete lists no size
        with pytest.raises(CleanupError, match=re.escape(refused)):
            s3.delete_prefix(client, bucket, "team/acme--m/", s3.Limits())
        assert proxy.count("POST", f"/{bucket}") == 0  # nothing deleted
    assert len(direct.list_objects_v2(Bucket=bucket)["Contents"]) == 2


@pytest.mark.parametrize("names, refused", [
    (["a" * (NAME_CHARS - 11) + ".safetensors"], f"has a name over {NAME_CHARS} characters"),
    (["Model.safetensors", "model.safetensors"], "'Model.safetensors' and 'model.safetensors' differ only in case"),
    (["Shard.safetensors", "shard.safetensors/config.json"],
     "where a volume folds case, 'shard.safetensors' is both a file and a folder"),
], ids=["name-too-long", "case-twins", "case-file-and-folder"])
def test_names_a_volume_cannot_all_hold_are_refused(source, tmp_path, names, refused):
    """Keys whose files cannot all be written: a name whose partial file's name would pass the filesystem's 255
    bytes (an OSError mid-fill, not a one-line refusal), or names that are one file (or a file and a folder) where a
    volume folds case, so that one would pass for the other unverified. A name of exactly NAME_CHARS is filled."""
    bucket, direct, _, client = source
    for name in names:
        direct.put_object(Bucket=bucket, Key=f"team/acme--m/{name}", Body=name.encode())
    with pytest.raises(DownloadError, match=re.escape(refused)) as e:
        s3.list_source(client, parse_s3_uri(f"s3://{bucket}/team/acme--m/"))
    assert e.value.permanent
    longest = "b" * (NAME_CHARS - 12) + ".safetensors"
    direct.put_object(Bucket=bucket, Key=f"team/ok/{longest}", Body=b"weights")
    snapshot = s3.list_source(client, parse_s3_uri(f"s3://{bucket}/team/ok/"))
    with Dir.root(tmp_path) as target:
        s3.fill_from_s3(client, f"s3://{bucket}/team/ok/", snapshot, target, lambda n: None, time.monotonic() + 60)
    assert (tmp_path / longest).read_bytes() == b"weights"


def test_a_listing_that_goes_on_slowly_is_cut_at_its_deadline(source, monkeypatch):
    """Each page says more follow and comes a little late (every answer within its own bounds): the listing as a
    whole ends at LIST_SECONDS, long before EMPTY_PAGES pages."""
    bucket, direct, proxy, client = source
    monkeypatch.setattr(s3, "LIST_SECONDS", 1.0)
    direct.put_object(Bucket=bucket, Key="team/acme--m/model.safetensors", Body=b"weights")

    def slowly(body: bytes, query: dict) -> bytes:
        time.sleep(0.25)
        token = b"B" if query.get("continuation-token") == ["A"] else b"A"
        return re.sub(rb"<Contents>.*</Contents>", b"", body, flags=re.S).replace(
            b"<IsTruncated>false</IsTruncated>",
            b"<IsTruncated>true</IsTruncated><NextContinuationToken>" + token + b"</NextContinuationToken>")

    proxy.rewrite_listing = slowly
    with pytest.raises(DownloadError, match="it took over 1 s; will retry"):
        s3.list_source(client, parse_s3_uri(f"s3://{bucket}/team/acme--m/"))
    assert proxy.count("GET", f"/{bucket}") < 10


def echo(send, request: bytes) -> None:
    """An error that repeats the request's credentials (its session token, then its Authorization), then its whole
    head, in its message, on many lines."""
    lines = request.decode(errors="replace").split("\r\n")
    said = "\n".join(sorted(lines, key=lambda line: not line.lower().startswith(("x-amz-security-token", "authoriz"))))
    said = said.replace("&", "&amp;").replace("<", "&lt;")
    body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>you sent\n{said}"
            "</Message></Error>").encode()
    send(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s"
         % (len(body), body))


def test_an_error_that_repeats_the_credentials_never_shows_them(fast, monkeypatch):
    """A server answers every request with an error whose message repeats the request's head: its session token,
    access key id and signature. The refusal names none of them, and is one line of bounded length."""
    token, key_id = "wkSessionToken0123456789abcdefSECRET", "WKKEYID0123456789"
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    server, client = hostile(echo)
    try:
        with pytest.raises(DownloadError, match="S3 answered AccessDenied for s3://wk-src/team/acme--m/: you sent") \
                as e:
            s3.list_source(client, parse_s3_uri("s3://wk-src/team/acme--m/"))
    finally:
        server.close()
    message = str(e.value)
    for secret in (token, key_id, "Signature="):
        assert secret not in message, message
    assert "\n" not in message and len(message) < 2 * SAID_CHARS + 100, message


def answered(status: str, body: str) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {len(body.encode())}\r\n\r\n"
            f"{body}").encode()


def sent(request: bytes, header: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in request.decode(errors="replace").split("\r\n")
                 if line.lower().startswith(header.lower() + ":")), "")


def escaped_echo(request: bytes) -> str:
    """The request's session token and Authorization as XML character references: what is sent is not what the
    parser gives."""
    return "".join(f"&#{ord(c)};" for c in f"{sent(request, 'X-Amz-Security-Token')} {sent(request, 'Authorization')}")


def entity_encoded(send, request: bytes) -> None:
    """A 403 whose message repeats the credentials, escaped in XML."""
    send(answered("403 Forbidden", f"<Error><Code>AccessDenied</Code><Message>{escaped_echo(request)}</Message>"
                                   "</Error>"))


SIGNATURES: list[str] = []


def error_in_a_200(send, request: bytes) -> None:
    """A 200 whose body is an error repeating the credentials (botocore takes it as a 500, retries, then fails)."""
    signature = sent(request, "Authorization").rpartition("Signature=")[2]
    SIGNATURES.append(signature)
    said = f"Signature={signature} {sent(request, 'X-Amz-Security-Token')} {sent(request, 'Authorization')}"
    send(answered("200 OK", f"<Error><Code>AccessDenied</Code><Message>{said}</Message></Error>"))


PREFIX = "staging/acme--m/" + "0" * 40 + "/"


def refused_per_key(send, request: bytes) -> None:
    """A listing of one object, then a DeleteObjects answered 200 whose error for that key repeats the credentials,
    escaped in XML."""
    if request.startswith(b"GET") and b"list-type=2" in request:
        send(answered("200 OK", f"<ListBucketResult><Name>wk-stage</Name><KeyCount>1</KeyCount><IsTruncated>false"
                                f"</IsTruncated><Contents><Key>{PREFIX}config.json</Key><Size>2</Size></Contents>"
                                "</ListBucketResult>"))
        return
    send(answered("200 OK", f"<DeleteResult><Error><Key>{PREFIX}config.json</Key><Code>AccessDenied</Code>"
                            f"<Message>{escaped_echo(request)}</Message></Error></DeleteResult>"))


@pytest.mark.parametrize("answer", [entity_encoded, error_in_a_200, refused_per_key])
def test_credentials_a_server_repeats_however_it_encodes_them_are_never_shown(fast, monkeypatch, answer):
    """A server repeats the request's session token and access key id in an error escaped in XML, in an error sent as
    a 200, or in the per-key errors of a DeleteObjects answer: the message (a model's, a log line) shows neither."""
    token, key_id = "wkSessionToken0123456789abcdefSECRET", "WKKEYID0123456789"
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    server, client = hostile(answer)
    try:
        with pytest.raises((DownloadError, CleanupError)) as e:
            if answer is refused_per_key:
                s3.delete_prefix(client, "wk-stage", PREFIX, s3.Limits())
            else:
                s3.list_source(client, parse_s3_uri("s3://wk-src/team/acme--m/"))
    finally:
        server.close()
    message = str(e.value)
    assert "AccessDenied" in message or "S3 answered" in message, message
    for secret in (token, key_id, *(SIGNATURES if answer is error_in_a_200 else ())):  # as sent: hidden as read
        assert secret not in message, message


def test_keys_longer_than_s3_allows_are_refused_as_they_are_listed(fast):
    """A server lists keys of 12,000 characters, 6,000 folders deep (S3 allows 1,024 bytes): each folder one more a
    fill would make, each path's every folder held in memory to check it. Refused at the first such key."""
    key = "team/acme--m/" + "a/" * 6000 + "model.safetensors"

    def listing(send, _request: bytes) -> None:
        send(answered("200 OK", f"<ListBucketResult><Name>wk-src</Name><KeyCount>1</KeyCount><IsTruncated>false"
                                f"</IsTruncated><Contents><Key>{key}</Key><Size>2</Size><ETag>&quot;"
                                f"{'0' * 32}&quot;</ETag></Contents></ListBucketResult>"))

    server, client = hostile(listing)
    try:
        with pytest.raises(DownloadError, match="a key of over 1024 bytes \\(more than S3 allows\\)") as e:
            s3.list_source(client, parse_s3_uri("s3://wk-src/team/acme--m/"))
    finally:
        server.close()
    assert e.value.permanent and len(str(e.value)) < 2 * SAID_CHARS + 200


@pytest.mark.parametrize("listed, refused", [
    ([PREFIX + "../../../data/alice/model.safetensors"], "with an empty, '.' or '..' segment"),
    ([PREFIX + "x.part", PREFIX + "x.part"], "listed twice or without an id"),
    ([PREFIX + f"x{i}" for i in range(1001)], "1001 multipart uploads under s3://wk-stage/staging/acme--m/"),
])
def test_a_listing_of_uploads_out_of_bounds_aborts_none_of_them(fast, listed, refused):
    """The objects are deleted; the listing of multipart uploads left under the prefix then names a key that climbs
    out of it (which a gateway that resolves `..` would act on), an upload twice, or more in a page than S3 sends:
    the delete is refused, naming it, and no abort is sent for what was refused (an upload listed twice is aborted
    once)."""
    aborts = []

    def uploads(send, request: bytes) -> None:
        line = request.split(b"\r\n", 1)[0].decode()
        if line.startswith("DELETE"):
            aborts.append(line)
            send(answered("204 No Content", ""))
        elif "uploads" in line:
            body = "".join(f"<Upload><Key>{key}</Key><UploadId>same</UploadId></Upload>" for key in listed)
            send(answered("200 OK", f"<ListMultipartUploadsResult><Bucket>wk-stage</Bucket><IsTruncated>false"
                                    f"</IsTruncated>{body}</ListMultipartUploadsResult>"))
        else:  # the objects: none left
            send(answered("200 OK", "<ListBucketResult><Name>wk-stage</Name><KeyCount>0</KeyCount><IsTruncated>false"
                                    "</IsTruncated></ListBucketResult>"))

    server, client = hostile(uploads)
    try:
        with pytest.raises(CleanupError, match=re.escape(refused)):
            s3.delete_prefix(client, "wk-stage", PREFIX, s3.Limits())
    finally:
        server.close()
    assert len(aborts) == (1 if len(listed) == 2 else 0)  # a repeat: refused when it comes again


def test_a_staged_object_answered_without_a_size_is_staged_again(fast):
    """HEAD of a staged object answers with the right digest and no Content-Length: not taken as staged (nor a
    KeyError that fails the staging run)."""
    remote = RemoteFile("model.safetensors", 7, "", md5="0" * 32)

    def head(send, _request: bytes) -> None:
        send(f"HTTP/1.1 200 OK\r\nx-amz-meta-{s3.DIGEST_KEY}: {'0' * 32}\r\nConnection: close\r\n\r\n".encode())

    server, client = hostile(head)
    try:
        assert not s3.staged(client, "wk-src", "staging/acme--m/model.safetensors", remote)
    finally:
        server.close()


@pytest.mark.parametrize("multipart", [False, True], ids=["same-size", "multipart"])
def test_a_source_object_replaced_after_listing_fails_at_once_saying_so(source, tmp_path, multipart):
    """The model's objects are listed, then one is uploaded again with other bytes (of the same size, or in parts):
    its fill stops at the first answer, for good and saying why, rather than fetching the whole object to find it
    corrupted, again at every retry."""
    bucket, direct, proxy, client = source
    key = f"team/acme--m/{SHARD}"
    direct.put_object(Bucket=bucket, Key=key, Body=b"a" * 1000)
    snapshot = s3.list_source(client, parse_s3_uri(f"s3://{bucket}/team/acme--m/"))
    if multipart:
        upload = direct.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        part = direct.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"b" * 1000)
        direct.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={
            "Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    else:
        direct.put_object(Bucket=bucket, Key=key, Body=b"b" * 1000)
    proxy.reset()
    with Dir.root(tmp_path) as target, pytest.raises(DownloadError, match="changed since it was listed") as e:
        s3.fill_from_s3(client, f"s3://{bucket}/team/acme--m/", snapshot, target, lambda n: None,
                        time.monotonic() + 60)
    assert e.value.permanent and "delete the model and declare it again" in str(e.value)
    assert proxy.count("GET", f"/{bucket}/{key}") == 1
    assert not (tmp_path / SHARD).exists()


# -- a staging bucket that takes an upload's bytes slowly -------------------------------------------------------------


def _left_running() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("stage", "watchdog"))]


@pytest.mark.parametrize("drip, deadline, pace, stopped", [
    ((4096, 0.1), 60, s3.Pace(256 * 1024, 2), "stalled: S3 took"),
    ((4096, 0.1), 3, s3.Pace(0, 60), "exceeded its timeout"),
    ((0, 0.1), 3, s3.Pace(0, 60), "exceeded its timeout"),
    ((4096, 0.1), 60, s3.Pace(0, 60), "is being deleted"),
    ((0, 0.1), 60, s3.Pace(0, 60), "is being deleted"),
], ids=["below-the-pace", "past-the-deadline", "silent-past-the-deadline", "deleted", "silent-deleted"])
def test_an_upload_in_parts_to_a_bucket_that_takes_bytes_slowly_stops_at_once(source, tmp_path, drip, deadline, pace,
                                                                              stopped):
    """A file of two parts is staged to a bucket that takes its bytes at 40 KB/s, or takes no more of them: the
    staging stops at the minimum pace, at its deadline or at a deletion (its beat raising, whether or not a byte is
    taken meanwhile) within a few seconds, with that error, rather than botocore's error after sending each part
    again (5 attempts); the multipart upload is aborted, nothing is left running, the client keeps no hook."""
    from weightkeeper.errors import DeadlineExceeded, DownloadCancelled

    bucket, direct, proxy, client = source
    data = random.Random("slow-bucket").randbytes(s3.PART_BYTES + (4 << 20))
    (tmp_path / SHARD).write_bytes(data)
    remote = RemoteFile(SHARD, len(data), "", sha256=hashlib.sha256(data).hexdigest())
    uri = f"s3://{bucket}/staging/acme--m/{'0' * 40}/"
    started = time.monotonic()

    def beat(done: int) -> None:
        if stopped == "is being deleted" and time.monotonic() - started > 2:
            raise DownloadCancelled("model 'm' is being deleted; staging stopped")

    outcome: dict[str, BaseException] = {}

    def stage() -> None:
        try:
            s3.stage_snapshot(client, uri, Snapshot("acme/m", "0" * 40, (remote,)),
                              lambda f, poll: (open(tmp_path / f.path, "rb"), lambda: None), beat,
                              deadline=started + deadline, pace=pace, what=f"staging 'm' to {uri}")
        except BaseException as e:  # noqa: BLE001 - judged below
            outcome["error"] = e

    proxy.drip_uploads(*drip)
    staging = threading.Thread(target=stage, daemon=True)
    staging.start()
    staging.join(30)
    took = time.monotonic() - started
    if staging.is_alive():
        proxy.reset()  # its requests dropped: it ends
        pytest.fail("the staging still goes on after 30 s")
    error = outcome.get("error")
    assert isinstance(error, (DownloadError, DownloadCancelled)) and stopped in str(error), repr(error)
    assert took < (deadline if deadline < 60 else 2) + 4.5, took  # the pace: 2 s of too little, and a few ticks
    assert f"staging 'm' to {uri}" in str(error) or stopped == "is being deleted", str(error)
    assert isinstance(error, DeadlineExceeded) == (stopped == "exceeded its timeout")
    assert 1 <= proxy.drips <= 2  # each part's body once: never sent again
    proxy.reset()  # a dripping read still under way ends
    assert not direct.list_multipart_uploads(Bucket=bucket).get("Uploads")  # aborted
    assert not direct.list_objects_v2(Bucket=bucket).get("Contents")
    assert _left_running() == []
    assert not [k for k in client.meta.events._emitter._unique_id_handlers if str(k).startswith("weightkeeper-stage")]


def test_a_files_own_error_stops_the_other_uploads_at_once(source, tmp_path):
    """One file fails on its own (its fetch from the Hub) while another's upload waits on a bucket that takes none of
    its bytes: that upload is cut at once, not left to its send timeout or the pace rule (60 s here)."""
    bucket, _, proxy, client = source
    data = random.Random("own-error").randbytes(4 << 20)
    (tmp_path / "a.bin").write_bytes(data)
    files = (RemoteFile("a.bin", len(data), "", sha256=hashlib.sha256(data).hexdigest()),
             RemoteFile("b.bin", 10, "", sha256="0" * 64))
    uri = f"s3://{bucket}/staging/acme--m/{'0' * 40}/"

    def fetch_one(f, poll):
        if f.path == "b.bin":
            time.sleep(1.5)  # a.bin's upload is under way, the bucket taking none of it
            raise DownloadError("b.bin could not be fetched", permanent=True)
        return open(tmp_path / f.path, "rb"), lambda: None

    outcome: dict[str, BaseException] = {}

    def stage() -> None:
        try:
            s3.stage_snapshot(client, uri, Snapshot("acme/m", "0" * 40, files), fetch_one, lambda n: None,
                              pace=s3.Pace(0, 60))
        except BaseException as e:  # noqa: BLE001 - judged below
            outcome["error"] = e

    proxy.drip_uploads(0)
    started = time.monotonic()
    staging = threading.Thread(target=stage, daemon=True)
    staging.start()
    try:
        staging.join(30)
        took, alive = time.monotonic() - started, staging.is_alive()
    finally:
        proxy.reset()
        staging.join(30)
    assert not alive and took < 6, took
    assert str(outcome["error"]) == "b.bin could not be fetched"
