"""Hub and S3 answers are untrusted input: a hostile server (the Hub test server's faults, a dripping S3
endpoint) against the real huggingface_hub and boto3 clients and the real flows. What it answers is
checked before use (commit, sizes, digests, counts), a body that stalls is cut by the fetch's watchdog,
and a download follows a redirect only where it is allowed."""

from __future__ import annotations

import contextlib
import datetime
import gzip
import ipaddress
import json
import logging
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import tiny_files
from test_lifecycle import in_thread, wait_until

from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.tasks.download import download_snapshot
from weightkeeper.tasks.snapshot import resolve_revision
from weightkeeper.anchored import Dir
from weightkeeper.config import S3Settings, load_settings
from weightkeeper.download import Limits, RemoteFile, Snapshot, collision, fetch_files, shown
from weightkeeper.errors import MESSAGE_LIMIT, SAID_CHARS, ConfigError, DownloadError, said
from weightkeeper.hub import check_access, hub_transfer, kind, model_info, resolve_snapshot, route
from weightkeeper.hubserver import LISTING, HubServer
from weightkeeper.layout import HfSource
from weightkeeper.prefectserver import free_port
from weightkeeper.s3 import make_client, s3_transfer
from weightkeeper.verify import verify_copy
from weightkeeper.watchdog import Pace

SHARD = "model-00001-of-00002.safetensors"


def add(hub, name: str, **kw) -> tuple[str, dict[str, bytes], str]:
    repo = f"acme/{name}-{time.monotonic_ns()}"
    files = tiny_files(name, **kw)
    return repo, files, hub.add_repo(repo, files)


def written(path: str) -> list[str]:
    """Files below `path` that hold any byte."""
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file() and p.stat().st_size)


def ensure_within(name: str, seconds: float) -> str:
    """ensure-model, which must end within `seconds` (a body that stalls for ever must not hold it)."""
    run = in_thread(ensure_model, name)
    run.join(seconds)
    assert not run.is_alive(), f"ensure-model {name} still running after {seconds} s"
    return run.result["value"]


def failed(wk, name: str) -> str:
    model = wk.registry.get_model(name)
    assert model.phase == "Failed", (model.phase, model.message)
    return model.message


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(download_snapshot, "retry_delay_seconds", [0, 0])


# -- what the Hub says a snapshot is -------------------------------------------------------------------------------


def test_a_commit_that_is_not_hex_fails_the_model_and_a_delete_still_releases_it(wk, hub, s3):
    repo, _, _ = add(hub, "nothex")
    hub.tamper(repo, sha="0123456789abcdef/../../" + "x" * 200)
    hub.reset_stats()
    wk.declare("nothex", f"hf://{repo}")
    assert ensure_model("nothex") == "Failed"
    message = failed(wk, "nothex")
    assert f"refusing {repo} from {hub.url}: its commit '0123456789abcdef/../../xxx" in message
    assert "is not 40 hex digits" in message and "x" * 100 not in message  # the value is cut short
    model = wk.registry.get_model("nothex")
    assert model.commit is None and model.staging_uri is None and s3.keys() == []
    assert hub.get_count(repo) == 0
    assert delete_model("nothex") == "Released"
    assert wk.registry.find_model("nothex") is None


@pytest.mark.parametrize("path, fields, reason", [
    ("config.json", {"blobId": ""}, "config.json has no usable digest (it has no digest)"),
    ("config.json", {"blobId": "../etc"}, "config.json has no usable digest (its blob_id '../etc' is not 40 hex"),
    (SHARD, {"lfs": {"sha256": "ab" * 16, "size": 1, "pointerSize": 134}},
     f"{SHARD} has no usable digest (its sha256 '{'ab' * 16}' is not 64 hex digits)"),
    ("config.json", {"size": -1}, "config.json has a size of -1, not 0 to 2199023255552 bytes (max_file_bytes)"),
    ("tokenizer.json", {"size": "12"}, "tokenizer.json has a size of '12', not 0 to"),
])
def test_a_file_without_a_usable_digest_or_size_fails_the_model_before_any_byte(wk, hub, path, fields, reason):
    repo, _, _ = add(hub, "nodigest")
    hub.tamper(repo, path, **fields)
    hub.reset_stats()
    wk.declare("nodigest", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("nodigest") == "Failed"
    assert f"refusing {repo} from {hub.url}: {reason}" in failed(wk, "nodigest")
    assert wk.registry.get_model("nodigest").files is None  # nothing was recorded
    assert hub.get_count(repo) == 0  # and no body asked for


def test_files_bigger_than_max_file_bytes_and_listings_longer_than_max_manifest_files_are_refused(wk, hub):
    repo, _, _ = add(hub, "bounds")
    wk.rewrite(hf_endpoint=hub.url, max_file_bytes=1024)
    wk.declare("big", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("big") == "Failed"
    assert "safetensors has a size of 65536, not 0 to 1024 bytes (max_file_bytes)" in failed(wk, "big")
    wk.rewrite(hf_endpoint=hub.url, max_manifest_files=3)
    wk.declare("many", f"hf://{repo}", workspaces=["team-b"])
    assert ensure_model("many") == "Failed"
    assert "it lists 9 files, more than max_manifest_files (3); raise that setting" in failed(wk, "many")


def test_a_multipart_s3_source_object_without_digest_fails_the_model_naming_it(wk, hub, s3):
    bucket = f"{s3.bucket}-src"
    s3.client.create_bucket(Bucket=bucket)
    files = tiny_files("multipart")
    for name, body in files.items():
        if name != SHARD:
            s3.put(f"team/acme--mp/{name}", body, bucket=bucket)
    upload = s3.client.create_multipart_upload(Bucket=bucket, Key=f"team/acme--mp/{SHARD}")
    part = s3.client.upload_part(Bucket=bucket, Key=f"team/acme--mp/{SHARD}", UploadId=upload["UploadId"],
                                 PartNumber=1, Body=files[SHARD])
    s3.client.complete_multipart_upload(Bucket=bucket, Key=f"team/acme--mp/{SHARD}", UploadId=upload["UploadId"],
                                        MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    wk.declare("mp", f"s3://{bucket}/team/acme--mp/", workspaces=["team-a"])
    assert ensure_model("mp") == "Failed"
    message = failed(wk, "mp")
    assert f"refusing s3://{bucket}/team/acme--mp/: {SHARD} has no MD5 to be verified by" in message
    assert "-1" in message and "upload it again in one part" in message
    assert written(wk.registry.get_model("mp").local_paths[0].path) == []


def test_recorded_junk_is_an_error_not_a_crash(tmp_path):
    for junk in ({}, [], "x", {"path": "a", "size": "1", "blobId": ""}, {"path": 1, "size": 1, "blobId": ""},
                 {"path": "a", "size": -1, "blobId": ""}, {"path": "a", "size": 1, "blobId": None}):
        with pytest.raises(DownloadError, match="is malformed; delete the model and declare it again"):
            RemoteFile.from_json(junk)
    (tmp_path / "a").write_bytes(b"abc")
    with Dir.root(tmp_path) as root:
        problems = verify_copy(root, [RemoteFile("a", 3, "")], deep=True)
        assert [str(p) for p in problems] == ["a: cannot be checked: it has no digest"]
        with pytest.raises(DownloadError, match="b of the test cannot be verified \\(it has no digest\\)"):
            fetch_files(Snapshot("r", "0" * 40, (RemoteFile("b", 3, ""),)), root, None, lambda done: None,
                        time.monotonic() + 10, "the test")


# -- a body that stalls ---------------------------------------------------------------------------------------------


def test_a_dripping_body_fails_at_the_minimum_pace_and_is_retried(wk, hub, quick_retries):
    wk.rewrite(hf_endpoint=hub.url, min_download_bytes_per_second=1024, stall_seconds=2)
    repo, _, _ = add(hub, "drip")
    hub.drip(1, 0.2, count=100, repo_id=repo, filename=SHARD)
    wk.declare("drip", f"hf://{repo}", workspaces=["team-a"])
    started = time.monotonic()
    assert ensure_within("drip", 40) == "Failed"
    took = time.monotonic() - started
    assert f"download of {repo}@" in failed(wk, "drip")
    assert "stalled:" in failed(wk, "drip") and "in the last 2 s, below the minimum of 1024 B/s" in failed(wk, "drip")
    assert "the next attempt resumes them" in failed(wk, "drip")
    gets = [r for r in hub.requests if r.repo_id == repo and r.filename == SHARD and r.method == "GET"]
    assert len(gets) == 3 and took < 30, (len(gets), took)  # three attempts, each cut after about 2 s


def test_a_dripping_body_fails_at_the_deadline(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, download_timeout_seconds=2, min_download_bytes_per_second=1)
    repo, _, _ = add(hub, "late")
    hub.drip(1, 0.2, count=100, repo_id=repo, filename=SHARD)
    wk.declare("late", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_within("late", 20) == "Failed"
    assert "exceeded its timeout" in failed(wk, "late")


def test_a_delete_during_a_drip_stops_the_download_promptly(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, min_download_bytes_per_second=0)
    repo, _, _ = add(hub, "dripdel")
    hub.drip(1, 0.5, count=100, repo_id=repo, filename=SHARD)
    wk.declare("dripdel", f"hf://{repo}", workspaces=["team-a"])
    ensure = in_thread(ensure_model, "dripdel")
    wait_until(lambda: any(r.filename == SHARD and r.bytes_sent for r in hub.requests if r.repo_id == repo),
               what="the dripping body to start")
    path = wk.registry.get_model("dripdel").local_paths[0].path
    started = time.monotonic()
    assert delete_model("dripdel") == "Released"
    assert time.monotonic() - started < 15
    ensure.join(15)
    assert not ensure.is_alive() and not Path(path).exists()


class _DrippingS3(BaseHTTPRequestHandler):
    """An S3 endpoint whose every GetObject answers a 206 and then sends a byte a second."""
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_GET(self):
        self.send_response(206)
        self.send_header("Content-Length", "1000")
        self.send_header("Content-Range", "bytes 0-999/1000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(1)
        except OSError:
            pass


def test_an_s3_body_that_drips_is_cut_by_the_watchdog(tmp_path, monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DrippingS3)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = make_client(S3Settings("bucket", endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
                                        region="us-east-1"))
        snapshot = Snapshot("r", "0" * 40, (RemoteFile("model.safetensors", 1000, "", md5="0" * 32),))
        started = time.monotonic()
        with pytest.raises(DownloadError, match=r"stalled: \d bytes arrived in the last 1 s"), \
                Dir.root(tmp_path / "m", create=True) as target:
            fetch_files(snapshot, target, s3_transfer(client, "s3://bucket/p/"), lambda done: None,
                        time.monotonic() + 60, "s3://bucket/p/", Pace(1024, 1))
        assert time.monotonic() - started < 5
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("paths, problem", [
    (["ready/config.json"], "its folder 'ready' is where weightkeeper keeps its own marker"),
    (["a", "a/b"], "'a' is both a file and a folder"),
    (["a", "a.part/x"], "the partial file of 'a' would stand where the folder 'a.part' goes"),
    (["x/a", "x/a.part.ranges/b"], "the partial file of 'x/a' would stand where the folder 'x/a.part.ranges' goes"),
    (["ready", "ready.json", "x/ready/y", "a.part", "a/b", "a/c"], None),
    (["x/" + "a" * 244],
     f"{shown('x/' + 'a' * 244)} has a name over 243 characters (its partial file's would not fit in 255)"),
    (["x/" + "a" * 243, "b" * 243 + "/c"], None),
    (["Model.bin", "model.bin"], "'Model.bin' and 'model.bin' differ only in case (one file where a volume folds case)"),
    (["Shard", "shard/config.json"], "where a volume folds case, 'shard' is both a file and a folder"),
    (["READY/config.json"], "where a volume folds case, its folder 'ready' is where weightkeeper keeps its own marker"),
    (["a/" * 15 + "model.safetensors"], None),  # 16 names deep: the most
    (["a/" * 16 + "model.safetensors"], f"{shown('a/' * 16 + 'model.safetensors')} is 17 names deep, more than 16; leave it out with --exclude"),
    ([f"{i}/x/y" for i in range(3)] + ["2/x/y/z"], "'2/x/y' is both a file and a folder"),
])
def test_names_that_cannot_all_be_written_are_refused(paths, problem):
    assert collision(paths) == problem


def test_a_repository_whose_folder_takes_the_ready_markers_place_is_refused_before_any_byte(wk, hub):
    """A repository (or an S3 prefix) with a folder `ready/`: its partial files would take the shared copy's
    marker's name, so the copy could never be marked ready (and a repair would fail the other way round)."""
    repo, files, _ = add(hub, "marker")
    hub.add_repo(repo, {**files, "ready/config.json": b"{}"})
    hub.reset_stats()
    wk.declare("marker", f"hf://{repo}", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("marker") == "Failed"
    assert "its folder 'ready' is where weightkeeper keeps its own marker" in failed(wk, "marker")
    assert hub.get_count(repo) == 0


# -- redirects ------------------------------------------------------------------------------------------------------


@pytest.fixture
def other_hub(tmp_path):
    """Another Hub server on another loopback port, serving the same repositories: it must never be asked."""
    with HubServer(tmp_path / "other-hub") as server:
        yield server


@pytest.mark.parametrize("target, method, reason", [
    ("other", None, "it is not https and not the endpoint's origin"),
    ("other", "GET", "it is not https and not the endpoint's origin"),  # the HEAD is fine, the GET is redirected
    ("https://169.254.169.254/latest/meta-data/iam?X-Amz-Signature=secret", None, "a link-local address"),
    ("http://10.0.0.1/weights?sig=secret#frag", None, "it is not https"),
])
def test_a_redirect_anywhere_else_is_refused_and_nothing_is_written(wk, hub, other_hub, target, method, reason):
    repo, files, commit = add(hub, "redir")
    other_hub.add_repo(repo, files)
    if target == "other":
        target = f"{other_hub.url}/{repo}/resolve/{commit}/{SHARD}"
    hub.redirect(target, count=100, repo_id=repo, filename=SHARD, method=method)
    wk.declare("redir", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("redir") == "Failed"
    message = failed(wk, "redir")
    shown = target.split("?")[0].split("#")[0]
    assert f"{hub.url} redirected {SHARD} of {repo} to {shown}; refused: " in message and reason in message
    assert "secret" not in message and "frag" not in message
    assert other_hub.requests == []
    assert [p for p in written(wk.registry.get_model("redir").local_paths[0].path) if SHARD in p] == []


def test_a_cdn_on_another_origin_needs_the_allow_list(wk, hub):
    repo, files, _ = add(hub, "cdn")
    cdn = f"localhost:{hub.url.rsplit(':', 1)[1]}"
    hub.cdn_redirects = True
    try:
        wk.declare("cdn", f"hf://{repo}", workspaces=["team-a"])
        assert ensure_model("cdn") == "Failed"
        assert f"to http://{cdn}/cdn/{repo}/" in failed(wk, "cdn")
        wk.rewrite(hf_endpoint=hub.url, hub_redirect_hosts=[cdn])
        hub.reset_stats()
        assert ensure_model("cdn") == "Ready"
    finally:
        hub.cdn_redirects = False
    path = wk.registry.get_model("cdn").local_paths[0].path
    assert Path(path, SHARD).read_bytes() == files[SHARD]
    assert any(r.path.startswith("/cdn/") for r in hub.requests if r.repo_id == repo)


def test_a_listing_redirected_to_another_origin_is_refused(wk, hub, other_hub):
    """`huggingface_hub`'s session follows up to 20 redirects anywhere: the listing of a revision is asked here, and
    a redirect is followed as a file's is (`route`), with the token only within the endpoint's origin."""
    from prefect.blocks.system import Secret

    repo, files, commit = add(hub, "listing-redir")
    other_hub.add_repo(repo, files)
    hub.redirect(f"{other_hub.url}/api/models/{repo}/revision/{commit}?blobs=true&sig=secret",
                 repo_id=repo, filename=LISTING)  # refused at once: not asked again
    wk.declare("listing-redir", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("listing-redir") == "Failed"
    message = failed(wk, "listing-redir")
    assert f"redirected the listing of the files of {repo} on {hub.url} to {other_hub.url}/api/models/" in message
    assert "refused: it is not https and not the endpoint's origin" in message and "secret" not in message
    assert other_hub.requests == []
    hub.redirect(f"{hub.url}/api/models/{repo}/revision/{commit}?blobs=true", repo_id=repo, filename=LISTING)
    assert ensure_model("listing-redir") == "Ready"  # within the origin: followed
    wk.declare("listing-allowed", f"hf://{repo}", workspaces=["team-a"], subpath="models/allowed",
               token_block="hf-token-listing")
    Secret(value="hf_LISTINGtoken1234567").save("hf-token-listing", overwrite=True)
    wk.rewrite(hf_endpoint=hub.url, hub_redirect_hosts=[other_hub.url.split("://")[1]])
    hub.redirect(f"{other_hub.url}/api/models/{repo}/revision/{commit}?blobs=true", repo_id=repo, filename=LISTING)
    assert ensure_model("listing-allowed") == "Ready"  # an allowed host: followed, without the token
    assert other_hub.requests and not any(r.authorization_present for r in other_hub.requests)


def test_a_listing_that_drips_or_floods_is_cut(wk, hub, monkeypatch):
    import weightkeeper.hub

    monkeypatch.setattr(weightkeeper.hub, "API_TIMEOUT_SECONDS", 2.0)
    monkeypatch.setattr(resolve_revision, "retry_delay_seconds", [0, 0])
    repo, _, _ = add(hub, "listing-drip")
    hub.drip(64, 0.5, count=10, repo_id=repo, filename=LISTING)  # each read is quick, the whole is not
    wk.declare("listing-drip", f"hf://{repo}", workspaces=["team-a"])
    started = time.monotonic()
    assert ensure_model("listing-drip") == "Failed"
    assert time.monotonic() - started < 20  # three attempts of about 2 s
    assert "took over 2 s to list the files of" in failed(wk, "listing-drip")

    repo, _, _ = add(hub, "listing-flood")
    hub.tamper(repo, cardData={"padding": "x" * (2 << 20)})
    wk.rewrite(hf_endpoint=hub.url, max_manifest_files=10)
    wk.declare("listing-flood", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("listing-flood") == "Failed"
    assert f"the listing is over {(1 << 20) + 1024 * 10} bytes (max_manifest_files 10)" in failed(wk, "listing-flood")

    repo, _, _ = add(hub, "listing-bloat")  # within the bytes, but parsed, each `[]` would be an object
    hub.tamper(repo, cardData={"padding": [[]] * 150_000})
    wk.declare("listing-bloat", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("listing-bloat") == "Failed"
    assert "the listing holds over 100160 values (max_manifest_files 10)" in failed(wk, "listing-bloat")


def test_a_listing_nested_deeper_than_the_parser_goes_or_an_error_page_of_many_values_is_refused_in_one_line():
    """Parsed, an error's body (its message) costs as much as a listing's: both are bounded before parsing."""
    for status, body, refused in ((b"200 OK", b"[" * 60_000 + b"]" * 60_000, "the listing is not a model's"),
                                  (b"500 Oops", b"[" + b"{}," * 200_000 + b"{}]", "the listing holds over 100160 values")):
        head = (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        with raw_listing(head, body) as url:
            with pytest.raises(DownloadError, match=refused) as e:
                model_info(HfSource("acme/deep"), url, None, Limits(max_manifest_files=10))
        assert e.value.permanent and "\n" not in str(e.value)


@contextlib.contextmanager
def raw_listing(head: bytes, body: bytes, drip: bytes = b"", every: float = 0.2) -> Iterator[str]:
    """A server on loopback that answers every request with `head` and `body` as given (no framing added), then
    `drip` every `every` s for 30 s (trailer lines after a chunked body's end): the endpoint's URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(head + body)
                    for _ in range(int(30 / every) if drip else 0):
                        if stop.wait(every):
                            break
                        conn.sendall(drip)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_a_listing_whose_chunked_trailers_never_end_is_cut_at_the_deadline(monkeypatch):
    """Every read returns quickly, but the chunked body's trailer lines never end, all within one read of the body:
    the listing's deadline holds anyway."""
    import weightkeeper.hub

    monkeypatch.setattr(weightkeeper.hub, "API_TIMEOUT_SECONDS", 2.0)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    with raw_listing(head, b"2\r\n{}\r\n0\r\n", drip=b"X-Trailer: 1\r\n") as url:
        started = time.monotonic()
        with pytest.raises(DownloadError, match="took over 2 s to list the files of acme/trailers"):
            model_info(HfSource("acme/trailers"), url, None, Limits())
        assert time.monotonic() - started < 10  # not the 30 s the trailers last


@contextlib.contextmanager
def headers_dripped(method: str) -> Iterator[str]:
    """A server on loopback that answers a `method` request with a status line, then a header line every 0.2 s for
    30 s (each read is quick; the headers never end), and any other request with `200 OK` and nothing more."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while request := conn.recv(65536):
                if not request.startswith(method.encode() + b" "):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                for _ in range(150):
                    if stop.wait(0.2):
                        return
                    conn.sendall(b"X-Drip: 1\r\n")
                conn.sendall(b"Content-Length: 0\r\n\r\n")

    def serve() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                threading.Thread(target=answer, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("asked", ["the listing", "a file's HEAD", "a range's GET"])
def test_an_answer_whose_headers_drip_is_cut_at_the_deadline(monkeypatch, asked):
    """The server sends a status line, then a header line every 0.2 s, never ending them: each read returns well
    within the read timeout. The revision's listing, a file's HEAD and the GET of its bytes are each cut when the
    headers are not all in by HEADERS_SECONDS, with a message that says so."""
    import weightkeeper.hub

    monkeypatch.setattr(weightkeeper.hub, "HEADERS_SECONDS", 1.0)
    source, remote = HfSource("acme/drip-headers"), RemoteFile("config.json", 4, "0" * 40)
    with headers_dripped("HEAD" if asked == "a file's HEAD" else "GET") as url:
        started = time.monotonic()
        with pytest.raises(DownloadError, match="headers took over 1 s") as e:
            if asked == "the listing":
                resolve_snapshot(source, url, None, Limits())
            elif asked == "a file's HEAD":
                check_access(source, remote.path, url, None)
            else:
                hub_transfer(source, "a" * 40, url, None)(remote, 0, remote.size, lambda data: None)
        assert time.monotonic() - started < 10 and not e.value.permanent  # not the 30 s the drip lasts


def test_a_file_the_hub_redirects_within_its_own_origin_is_found_on_the_same_connection(wk, hub):
    """The Hub answers a file's HEAD with a redirect to another path of its own origin (a renamed repository, a
    resolve cache): the next HEAD goes out on the connection the first one used, and finds the file."""
    repo, files, commit = add(hub, "renamed")
    hub.redirect(f"{hub.url}/{repo}/resolve/{commit}/{SHARD}", repo_id=repo, filename=SHARD, method="HEAD")
    wk.declare("renamed", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("renamed") == "Ready", wk.registry.get_model("renamed").message
    assert Path(wk.registry.get_model("renamed").local_paths[0].path, SHARD).read_bytes() == files[SHARD]
    asked = [r.status for r in hub.requests if r.method == "HEAD" and r.repo_id == repo and r.filename == SHARD]
    assert asked == [302, 200]  # no attempt failed and was retried


@contextlib.contextmanager
def echoing_hub() -> Iterator[str]:
    """A Hub (or a proxy before it) whose error pages repeat the request's headers, over many lines: the listing's
    404 in its body, a file's HEAD in `X-Error-Message`, as the Hub sends them."""
    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            said = f"no such entry; you sent {self.headers.get('Authorization')}" + "\nINFO forged log line" * 1000
            body = json.dumps({"error": said}).encode() if self.command == "GET" else b""
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            if self.command == "HEAD":
                self.send_header("X-Error-Message", said.replace("\n", " ")[:4000])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_error_page_that_repeats_the_token_never_carries_it_into_a_message():
    """Whatever quotes the answer (the listing's error body, a file's error header), the DownloadError, and so
    the registry, the logs and the run's state, holds one short line and never the token."""
    token = "hf_ECHOEDsecret1234567890abcdef"
    with echoing_hub() as url:
        staged = hub_transfer(HfSource("acme/echo"), "a" * 40, url, token)  # as staging to S3 fetches
        for call in (lambda: resolve_snapshot(HfSource("acme/echo"), url, token),
                     lambda: check_access(HfSource("acme/echo", "a" * 40), "config.json", url, token),
                     lambda: staged(RemoteFile("config.json", 10, "b" * 40), 0, 10, lambda chunk: None)):
            with pytest.raises(DownloadError, match="a file of acme/echo disappeared from") as e:
                call()
            assert token not in str(e.value) and "Bearer …" in str(e.value), str(e.value)
            assert "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)
    weights = {"rfilename": "model.safetensors", "blobId": "a" * 40, "size": 1,
               "lfs": {"sha256": "b" * 64, "size": 1, "pointerSize": 134}}
    body = json.dumps({"id": "acme/echo", "sha": token, "siblings": [weights]}).encode()  # as an answer's value
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    with raw_listing(head, body) as url:
        with pytest.raises(DownloadError, match="its commit '…' is not 40 hex digits") as e:
            resolve_snapshot(HfSource("acme/echo"), url, token)
    assert token not in str(e.value), str(e.value)
    cut = said("x" * (SAID_CHARS - 10) + token, [token])  # a token the cut would halve is gone before it
    assert token[:8] not in cut and cut.endswith("x…"), cut
    flood = str(DownloadError("INFO forged log line\n" * 1000))  # whatever a message quotes: one line, bounded
    assert "\n" not in flood and len(flood) == MESSAGE_LIMIT and flood.startswith("INFO forged log line INFO")


def test_a_listing_sent_compressed_is_refused_before_it_is_inflated():
    """Asked for as is (`Accept-Encoding: identity`), the listing comes as gzip inside gzip: a few hundred bytes
    that would inflate to 64 MiB (or terabytes, in three layers). It is refused, never inflated."""
    body = gzip.compress(gzip.compress(bytes(64 << 20)))
    for status in (b"200 OK", b"404 Not Found"):  # an error's body is read too (its message)
        head = (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Encoding: gzip, gzip\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        with raw_listing(head, body) as url:
            with pytest.raises(DownloadError, match="the listing came encoded .'gzip, gzip'., not as asked") as e:
                model_info(HfSource("acme/bomb"), url, None, Limits())
        assert e.value.permanent


def test_the_token_never_follows_a_redirect_to_huggingface_co_from_another_endpoint(wk, hub, other_hub, monkeypatch):
    """A mirror (the endpoint) redirects a file to huggingface.co, which `huggingface_hub` trusts with the token
    whatever the endpoint (no network here: the other server stands for it, made one of its Hub origins)."""
    import huggingface_hub.utils._http as hf_http
    from prefect.blocks.system import Secret

    monkeypatch.setattr(hf_http, "_HUB_ORIGINS", hf_http._HUB_ORIGINS | {hf_http._url_origin(other_hub.url)})
    repo, files, commit = add(hub, "mirror")
    other_hub.add_repo(repo, files)
    Secret(value="hf_MIRRORtoken123456").save("hf-token-mirror", overwrite=True)
    hub.redirect(f"{other_hub.url}/{repo}/resolve/{commit}/{SHARD}", count=100, repo_id=repo, filename=SHARD)
    wk.rewrite(hf_endpoint=hub.url, hub_redirect_hosts=[other_hub.url.split("://")[1]])
    wk.declare("mirror", f"hf://{repo}", workspaces=["team-a"], token_block="hf-token-mirror")
    assert ensure_model("mirror") == "Ready"
    assert other_hub.requests and not any(r.authorization_present for r in other_hub.requests)
    assert any(r.authorization_present for r in hub.requests if r.repo_id == repo)


def test_a_signed_url_that_cannot_be_reached_never_reaches_a_message_or_a_log(wk, hub, quick_retries, caplog):
    """The Hub redirects to an allowed CDN with a signed URL, and the CDN does not answer: the error names the
    host, never the signature (urllib3's debug records of its retries included)."""
    caplog.set_level(logging.DEBUG, logger="urllib3")
    repo, _, _ = add(hub, "signed")
    port = free_port()  # nothing listens there
    hub.redirect(f"http://localhost:{port}/cdn/x?X-Amz-Credential=AKIASIGNED&X-Amz-Signature=SIGNEDsecret",
                 count=100, repo_id=repo, filename=SHARD, method="GET")
    wk.rewrite(hf_endpoint=hub.url, hub_redirect_hosts=[f"localhost:{port}"])
    wk.declare("signed", f"hf://{repo}", workspaces=["team-a"])
    assert ensure_model("signed") == "Failed"
    model = wk.registry.get_model("signed")
    assert f"cannot reach http://localhost:{port}/cdn/x, where" in model.message, model.message
    seen = str(model.to_json()) + caplog.text
    assert "SIGNEDsecret" not in seen and "AKIASIGNED" not in seen


def tls_for(tmp_path: Path, *names: str) -> tuple[ssl.SSLContext, Path]:
    """A server context for `names`, and the file of the authority that signed it (a client trusts only that)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def certificate(subject: str, key, issuer: str, signer, ca: bool, alt: tuple[str, ...] = ()):
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(a) for a in alt]),
                                            critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("weightkeeper test authority", ca_key, "weightkeeper test authority", ca_key, True)
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "server.pem").write_bytes(
        certificate(names[0], key, "weightkeeper test authority", ca_key, False, names).public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "server.pem")
    return context, tmp_path / "ca.pem"


def test_a_cdn_whose_dns_answer_changes_after_the_check_is_reached_where_it_was_checked(wk, hub, tmp_path,
                                                                                       monkeypatch, quick_retries):
    """DNS rebinding: the Hub redirects a revision's listing and a file to an https CDN whose name resolves to an
    address the rule allows when checked, and to another when connecting (here both loopback, as the endpoint is;
    in production a public address, then a private one). Each GET goes to the address that was checked, with the
    name for TLS and `Host`; the server at the other address (an internal service) is never asked. A certificate
    for another name is still refused; when the first address checked refuses, the next one is tried."""
    context, authority = tls_for(tmp_path, "cdn.test", "two.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(authority))
    with HubServer(tmp_path / "cdn", "127.0.0.2", tls=context) as cdn:
        port = int(cdn.url.rsplit(":", 1)[1])
        with HubServer(tmp_path / "internal", "127.0.0.3", port, tls=context) as internal:
            answers: list[str] = []
            resolve = socket.getaddrinfo

            def rebinding(host, *args, **kw):
                if host == "wrong.test":  # the CDN's address under another name: its certificate does not match
                    return resolve("127.0.0.2", *args, **kw)
                if host == "two.test":  # two addresses, nothing listening at the first
                    return resolve("127.0.0.4", *args, **kw) + resolve("127.0.0.2", *args, **kw)
                if host != "cdn.test":
                    return resolve(host, *args, **kw)
                checking = (args[0] if args else kw.get("port")) is None  # the check asks with no port
                answers.append("127.0.0.2" if checking else "127.0.0.3")
                return resolve(answers[-1], *args, **kw)

            monkeypatch.setattr(socket, "getaddrinfo", rebinding)
            repo, cdn_files, commit = add(hub, "rebind")
            cdn.add_repo(repo, cdn_files)
            internal.add_repo(repo, cdn_files)
            hub.redirect(f"https://cdn.test:{port}/{repo}/resolve/{commit}/{SHARD}?X-Amz-Signature=s", count=100,
                         repo_id=repo, filename=SHARD)
            hub.redirect(f"https://cdn.test:{port}/api/models/{repo}/revision/{commit}?blobs=true", repo_id=repo,
                         filename=LISTING)
            wk.declare("rebind", f"hf://{repo}", workspaces=["team-a"])
            assert ensure_model("rebind") == "Ready", wk.registry.get_model("rebind").message
            other, files, commit = add(hub, "rebind-name")
            cdn.add_repo(other, files)
            hub.redirect(f"https://wrong.test:{port}/{other}/resolve/{commit}/{SHARD}", count=100, repo_id=other,
                         filename=SHARD)
            wk.declare("rebind-name", f"hf://{other}", workspaces=["team-a"])
            assert ensure_model("rebind-name") == "Failed"
            assert "cannot reach" in failed(wk, "rebind-name") and "wrong.test" in failed(wk, "rebind-name")
            assert not any(r.repo_id == other for r in cdn.requests)  # the handshake failed: no request was made
            second, files, commit = add(hub, "rebind-second")
            cdn.add_repo(second, files)
            hub.redirect(f"https://two.test:{port}/{second}/resolve/{commit}/{SHARD}", count=100, repo_id=second,
                         filename=SHARD)
            wk.declare("rebind-second", f"hf://{second}", workspaces=["team-a"])
            assert ensure_model("rebind-second") == "Ready"  # the next address checked, when the first refuses
    assert "127.0.0.2" in answers and internal.requests == []
    assert {r.path.split("/")[1] for r in cdn.requests if r.repo_id == repo} == {"api", "acme"}  # listing and file
    assert Path(wk.registry.get_model("rebind").local_paths[0].path, SHARD).read_bytes() == cdn_files[SHARD]


@pytest.mark.parametrize("location, allowed, refused", [
    ("http://127.0.0.1:9000/x", (), None),  # the endpoint's own origin
    ("http://127.0.0.1:9001/x", (), "not https"),
    ("https://127.0.0.1:9001/x", (), None),  # loopback, as the endpoint is
    ("http://127.0.0.1:9001/x", ("127.0.0.1:9001",), None),
    ("http://127.0.0.1:9001/x", ("127.0.0.1",), None),
    ("http://127.0.0.1:9001/x", ("127.0.0.1:9002",), "not https"),
    ("https://169.254.169.254/x", (), "link-local"),
    ("https://[::ffff:169.254.169.254]/x", (), "link-local"),
    ("https://10.1.2.3/x", (), "private"),
    ("https://[fd00::1]/x", (), "private"),
    ("https://8.8.8.8/x", (), None),
    ("ftp://8.8.8.8/x", (), "not an http(s) URL"),
    ("https://8.8.8.8:99999/x", (), "port is not a number"),
    ("file:///etc/passwd", (), "not an http(s) URL"),
    ("http://[::1/x", (), "it is not a URL"),
    ("http://localhost:9001\\@127.0.0.1:9000/x", (), "read one way by the check and another"),  # urllib3: localhost
    ("https://169.254.169.254\\@cdn.example/x", ("cdn.example",), "read one way by the check and another"),
    ("https://%31%36%39.254.169.254/x", (), "read one way by the check and another"),  # urllib3 decodes a host
    ("https://" + "a" * 64 + ".example/x", (), "is not a valid name"),  # a label over 63: no lookup
])
def test_where_a_redirect_may_go(location, allowed, refused):
    problem = route(location, "http://127.0.0.1:9000", allowed).problem
    assert problem is None if refused is None else refused in problem


def test_a_redirect_host_of_many_addresses_is_tried_at_its_first_four_only(monkeypatch):
    """Each address is tried with a connect timeout of its own, which the fetch's watchdog cannot cut short: a host
    that resolves to a hundred unreachable addresses would hold the fetch a hundred times as long."""
    import weightkeeper.hub

    many = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"8.8.{i}.{i}", 0)) for i in range(100)]
    monkeypatch.setattr(weightkeeper.hub.socket, "getaddrinfo",
                        lambda host, *a, **k: many if host == "cdn.example" else [(0, 0, 0, "", ("8.8.8.8", 0))])
    to = route("https://cdn.example/x", "https://8.8.8.8", ())
    assert to.problem is None and to.addresses == ("8.8.0.0", "8.8.1.1", "8.8.2.2", "8.8.3.3")


def test_a_redirect_host_of_both_families_has_one_of_the_other_tried(monkeypatch):
    """A CDN answers 8 IPv6 addresses, then 4 IPv4 ones: the first four would all be IPv6, and a host whose IPv6 route
    is blackholed would never reach it. One IPv4 address takes the fourth place."""
    import weightkeeper.hub

    six = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (f"2600:9000:{i}::1", 0, 0, 0)) for i in range(8)]
    four = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"18.160.0.{i}", 0)) for i in range(1, 5)]
    monkeypatch.setattr(weightkeeper.hub.socket, "getaddrinfo",
                        lambda host, *a, **k: six + four if host == "cdn.example" else [(0, 0, 0, "", ("8.8.8.8", 0))])
    monkeypatch.setattr(weightkeeper.hub, "allowed_gai_family", lambda: socket.AF_UNSPEC)
    to = route("https://cdn.example/x", "https://8.8.8.8", ())
    assert to.problem is None
    assert to.addresses == ("2600:9000:0::1", "2600:9000:1::1", "2600:9000:2::1", "18.160.0.1"), to.addresses


def test_from_a_public_endpoint_no_redirect_goes_to_a_loopback_link_local_or_private_address():
    assert "private" in route("https://10.1.2.3/x", "https://8.8.8.8", ()).problem
    assert "link-local" in route("https://[fe80::1]/x", "https://8.8.8.8", ()).problem
    assert "loopback" in route("https://2130706433/x", "https://8.8.8.8", ()).problem  # 127.0.0.1, spelt as a number
    assert "loopback" in route("https://0.0.0.0/x", "https://8.8.8.8", ()).problem


@pytest.mark.parametrize("address, expected", [
    ("64:ff9b::a00:5", "private"),  # NAT64 of 10.0.0.5
    ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 of 169.254.169.254
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "private"),  # Teredo, client 10.0.0.1
    ("::7f00:1", "loopback"),  # IPv4-compatible 127.0.0.1
    ("::ffff:0:7f00:1", "loopback"),  # IPv4-translated 127.0.0.1
    ("fec0::1", "private"),  # site-local
    ("64:ff9b:1::a00:1", "private"),  # a local NAT64 (RFC 8215)
    ("64:ff9b::808:808", "public"),
    ("2606:4700::1111", "public"),
])
def test_an_ipv6_address_that_carries_an_ipv4_address_is_of_that_ones_kind(address, expected):
    assert kind(ipaddress.ip_address(address)) == expected
    problem = route(f"https://[{address}]/x", "https://8.8.8.8", ()).problem
    assert problem is None if expected == "public" else expected in problem


@pytest.mark.parametrize("line, error", [
    ("max_file_bytes = -1", "max_file_bytes must be 0 or more"),
    ("max_manifest_files = 0", "max_manifest_files must be positive"),
    ("stall_seconds = 0", "stall_seconds must be positive"),
    ("min_download_bytes_per_second = -5", "min_download_bytes_per_second must be 0"),
    ("min_download_bytes_per_second = 1.5", "must be an integer"),
    ('hub_redirect_hosts = "cdn.example.com"', "hub_redirect_hosts must be a list"),
    ('hub_redirect_hosts = ["https://cdn.example.com"]', "hub_redirect_hosts must be a list"),
    ('hub_redirect_hosts = ["CDN.example.com"]', "hub_redirect_hosts must be a list"),
])
def test_the_new_settings_are_validated(tmp_path, line, error):
    config = tmp_path / "config.toml"
    config.write_text(f'home = "{tmp_path}"\n{line}\n')
    with pytest.raises(ConfigError, match=error):
        load_settings(config)
    config.write_text(f'home = "{tmp_path}"\nhub_redirect_hosts = ["cdn.example.com", "[::1]:8443", "10.0.0.1:80"]\n')
    settings = load_settings(config)
    assert settings.hub_redirect_hosts == ("cdn.example.com", "[::1]:8443", "10.0.0.1:80")
    assert (settings.max_file_bytes, settings.max_manifest_files) == (2 << 40, 100_000)
    assert (settings.min_download_bytes_per_second, settings.stall_seconds) == (1024, 60)


def _fetched(hub, repo: str, target: Path, token: str | None = None) -> None:
    snapshot = resolve_snapshot(HfSource(repo), hub.url, token)
    with Dir.root(target, create=True) as root:
        fetch_files(snapshot, root, hub_transfer(HfSource(repo), snapshot.commit, hub.url, token), lambda done: None,
                    time.monotonic() + 30, repo)


@pytest.mark.parametrize("asked", ["HEAD", "GET", LISTING])
def test_a_redirect_whose_host_urllib3_reads_otherwise_is_refused_and_the_token_stays_home(hub, other_hub, tmp_path,
                                                                                           asked):
    """`http://localhost:Q\\@127.0.0.1:P/...` is the endpoint's own origin to `urlsplit`, by which a redirect is
    checked, and localhost:Q to urllib3, which would send it, with the token (`Authorization`) and past every check
    of where a request may go. A redirect of the listing, a file's HEAD or its GET there is refused, and the other
    server is never asked."""
    repo, files, commit = add(hub, "two-ways")
    other_hub.add_repo(repo, files)
    port, elsewhere = hub.url.rsplit(":", 1)[1], other_hub.url.rsplit(":", 1)[1]
    path = f"/api/models/{repo}/revision/{commit}?blobs=true" if asked == LISTING else f"/{repo}/resolve/{commit}/{SHARD}"
    hub.redirect(f"http://localhost:{elsewhere}\\@127.0.0.1:{port}{path}", count=100, repo_id=repo,
                 filename=LISTING if asked == LISTING else SHARD, method=None if asked == LISTING else asked)
    with pytest.raises(DownloadError, match="refused: its host is read one way by the check and another") as e:
        _fetched(hub, repo, tmp_path / "m", "hf_TWOWAYStoken12345")
    assert e.value.permanent and "hf_TWOWAYS" not in str(e.value)
    assert other_hub.requests == []


@pytest.mark.parametrize("location", ["http://[::1/x", "http://[not-an-address]/x", "https://a..b/x",
                                      "https://" + "a" * 64 + ".example.com/x"])
@pytest.mark.parametrize("asked", ["HEAD", "GET", LISTING])
def test_a_redirect_to_what_is_not_a_url_or_no_host_name_is_refused_in_one_line(hub, tmp_path, location, asked):
    """urljoin and urlsplit raise ValueError for `http://[::1`, and resolving a host with an empty label or one over
    63 characters UnicodeError: never a traceback (a GET's went out of the fetch as it was), nor an error retried as
    if the network had failed: the redirect is refused."""
    repo, _, _ = add(hub, "bad-location")
    hub.redirect(location, count=100, repo_id=repo, filename=LISTING if asked == LISTING else SHARD,
                 method=None if asked == LISTING else asked)
    with pytest.raises(DownloadError, match="redirected .*; refused: (it is not a URL|its host .* is not a valid "
                                            "name)") as e:
        _fetched(hub, repo, tmp_path / "m")
    assert e.value.permanent and "\n" not in str(e.value)


@pytest.mark.parametrize("path, fields, said", [
    (None, {"lastModified": 1}, "the listing is not a model's (\"'int' object has no attribute 'endswith'\")"),
    (None, {"evalResults": "x"}, "the listing is not a model's"),
    ("config.json", {"rfilename": None}, "it lists a file name None that is not a string"),
    ("config.json", {"rfilename": 0}, "it lists a file name 0 that is not a string"),
    ("config.json", {"rfilename": []}, "it lists a file name [] that is not a string"),
])
def test_a_listing_of_values_of_the_wrong_type_is_refused_not_a_traceback(hub, path, fields, said):
    """`huggingface_hub`'s ModelInfo raises AttributeError for a date that is not a string (it was retried as a
    network error), and a file name that is null, 0 or [] slipped past the check for names that are not strings (it
    tested the name's truth) into a TypeError."""
    repo, _, _ = add(hub, "wrong-types")
    hub.tamper(repo, path, **fields)
    with pytest.raises(DownloadError) as e:
        resolve_snapshot(HfSource(repo), hub.url, None)
    assert said in str(e.value) and e.value.permanent, str(e.value)
