"""Files fetched as parallel ranges into resumable, hashed partial files, with the real client against the Hub server."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from weightkeeper import download
from weightkeeper.anchored import Dir
from weightkeeper.download import (
    PARTIAL_DIR,
    Part,
    RemoteFile,
    fetch_files,
    frontier,
    listed_otherwise,
    load_parts,
    plan_parts,
    present_bytes,
    safe_repo_path,
)
from weightkeeper.errors import DownloadCancelled, DownloadError
from weightkeeper.hub import fetch_snapshot, hub_transfer, resolve_snapshot
from weightkeeper.layout import HfSource

MIB = 1 << 20
BIG = "model-00001-of-00001.safetensors"


# -- planning the ranges (pure) --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, download.PART_BYTES - 1, download.PART_BYTES, 2 * download.PART_BYTES + 7,
                                  5 * download.PART_BYTES + 3, 100 * download.PART_BYTES, 10**12 + 1])
@pytest.mark.parametrize("have", [0, 1, "half", "all"])
def test_ranges_cover_the_file_once_in_order_with_a_sequential_partial_counted(size, have):
    have = {"half": size // 2, "all": size}.get(have, have) if isinstance(have, str) else min(have, size)
    parts = plan_parts(size, have)
    assert 1 <= len(parts) <= download.CONNECTIONS
    assert parts[0].start == 0 and parts[-1].end == size
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
    assert len(parts) == 1 or all(p.end - p.start >= download.PART_BYTES for p in parts)
    assert sum(p.done for p in parts) == have and frontier(parts) == have


def test_saved_progress_is_used_only_when_it_fits_the_file():
    size = 4 * download.PART_BYTES
    parts = plan_parts(size)
    parts[2].done = 5
    saved = json.dumps({"size": size, "parts": [[p.start, p.end, p.done] for p in parts]})
    have = parts[2].start + 5  # the partial file ends where range 2 stopped
    assert load_parts(size, saved, have) == parts
    assert frontier(load_parts(size, saved, have)) == parts[0].start
    assert [p.done for p in load_parts(size, saved, have - 2)] == [0, 0, 3, 0]  # not beyond the file's end
    for bad in (None, "", "{", "[]", json.dumps({"size": size + 1, "parts": []}),
                json.dumps({"size": size, "parts": [[0, size, 0]]}),  # other boundaries
                json.dumps({"size": size, "parts": [[p.start, p.end, p.end - p.start + 1] for p in parts]})):
        assert load_parts(size, bad, 7) == plan_parts(size, 7), bad


def test_frontier_stops_at_the_first_unfinished_range():
    parts = [Part(0, 10, 10), Part(10, 20, 3), Part(20, 30, 10)]
    assert frontier(parts) == 13
    parts[1].done = 10
    assert frontier(parts) == 30


# -- fetching from the Hub server ---------------------------------------------------------------------------------


@pytest.fixture
def big_repo(hub, monkeypatch):
    """A repository with a 16 MiB shard that is fetched as 8 ranges of 2 MiB."""
    monkeypatch.setattr(download, "PART_BYTES", 2 * MIB)
    data = random.Random("big").randbytes(16 * MIB)
    repo = f"acme/ranged-{time.monotonic_ns()}"
    hub.add_repo(repo, {BIG: data, "config.json": b"{}\n"})
    snapshot = resolve_snapshot(HfSource(repo, "main"), hub.url, None)
    hub.reset_stats()
    return repo, data, snapshot


def fetch(hub, snapshot, target: Path, on_progress=lambda done: None, room=None) -> int:
    with Dir.root(target, create=True) as d:
        return fetch_snapshot(HfSource(snapshot.repo_id, snapshot.commit), snapshot, d, hub.url, None, on_progress,
                              time.monotonic() + 120, room=room)


def present(target: Path, remote: RemoteFile) -> int:
    with Dir.root(target) as d:
        return present_bytes(d, remote)


def body_gets(hub, repo: str) -> list:
    return [r for r in hub.requests if r.repo_id == repo and r.filename == BIG and r.method == "GET"]


def test_a_large_file_is_fetched_as_parallel_ranges_and_checked(hub, big_repo, tmp_path):
    repo, data, snapshot = big_repo
    assert fetch(hub, snapshot, tmp_path / "m") == len(data) + 3
    assert (tmp_path / "m" / BIG).read_bytes() == data
    ranges = sorted(r.range for r in body_gets(hub, repo))
    starts = [p.start for p in plan_parts(len(data))]
    assert len(ranges) == 8 and {int(r.split("=")[1].split("-")[0]) for r in ranges} == set(starts)
    assert hub.bytes_served(repo) == len(data) + 3  # every byte once
    assert not list((tmp_path / "m" / PARTIAL_DIR).iterdir())  # no partial file or progress left


def test_ranges_reuse_their_connections(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "PART_BYTES", MIB)
    repo = f"acme/pooled-{time.monotonic_ns()}"
    files = {f"model-{i:05d}-of-00003.safetensors": random.Random(i).randbytes(8 * MIB) for i in (1, 2, 3)}
    hub.add_repo(repo, files)
    snapshot = resolve_snapshot(HfSource(repo, "main"), hub.url, None)
    hub.reset_stats()
    fetch(hub, snapshot, tmp_path / "m")
    gets = [r for r in hub.requests if r.repo_id == repo and r.method == "GET"]
    assert len(gets) == 24  # 8 ranges per file
    assert len({r.client_port for r in gets}) <= download.CONNECTIONS  # each connection served several
    for name, data in files.items():
        assert (tmp_path / "m" / name).read_bytes() == data


def test_many_large_files_are_fetched_a_few_at_a_time(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "PART_BYTES", MIB)
    repo = f"acme/many-{time.monotonic_ns()}"
    files = {f"model-{i:05d}-of-00012.safetensors": random.Random(i).randbytes(2 * MIB) for i in range(1, 13)}
    hub.add_repo(repo, files)
    snapshot = resolve_snapshot(HfSource(repo, "main"), hub.url, None)
    opened, peak, lock = set(), [0], threading.Lock()
    real_open, real_finish = download.PartialFile.open, download.PartialFile.finish

    def tracked_open(self):
        with lock:
            opened.add(self.remote.path)
            peak[0] = max(peak[0], len(opened))
        return real_open(self)

    def tracked_finish(self):
        with lock:
            opened.discard(self.remote.path)
        return real_finish(self)

    monkeypatch.setattr(download.PartialFile, "open", tracked_open)
    monkeypatch.setattr(download.PartialFile, "finish", tracked_finish)
    fetch(hub, snapshot, tmp_path / "m")
    assert 2 <= peak[0] <= download.CONNECTIONS  # 12 files of 2 ranges: never all open at once
    for name, data in files.items():
        assert (tmp_path / "m" / name).read_bytes() == data


def test_an_interrupted_ranged_download_resumes_every_range_where_it_stopped(hub, big_repo, tmp_path):
    repo, data, snapshot = big_repo
    hub.set_throttle(8 * MIB, repo_id=repo)

    def stop_halfway(done: int) -> None:
        if done > len(data) // 2:
            raise DownloadCancelled("stop")

    with pytest.raises(DownloadCancelled):
        fetch(hub, snapshot, tmp_path / "m", stop_halfway)
    hub.set_throttle(None, repo_id=repo)
    ranges_file = tmp_path / "m" / PARTIAL_DIR / f"{BIG}.part.ranges"
    saved = [Part(*p) for p in json.loads(ranges_file.read_text())["parts"]]
    remote = next(f for f in snapshot.files if f.path == BIG)
    assert present(tmp_path / "m", remote) == sum(p.done for p in saved) >= len(data) // 2
    config_left = 0 if (tmp_path / "m" / "config.json").exists() else 3
    hub.reset_stats()

    fetch(hub, snapshot, tmp_path / "m")
    assert (tmp_path / "m" / BIG).read_bytes() == data
    asked = {r.range for r in body_gets(hub, repo)}
    assert asked == {f"bytes={p.offset}-" if p.end == len(data) else f"bytes={p.offset}-{p.end - 1}"
                     for p in saved if not p.complete}
    assert hub.bytes_served(repo) == len(data) - sum(p.done for p in saved) + config_left  # nothing twice


def test_damaged_progress_costs_a_refetch_never_a_wrong_file(hub, big_repo, tmp_path):
    """The file is fetched again whole at once where the caller checks its space again (`room`), else the
    fetch fails and the next one (its space checked) fetches it."""
    repo, data, snapshot = big_repo
    partial = tmp_path / "m" / PARTIAL_DIR / f"{BIG}.part"
    partial.parent.mkdir(parents=True)

    def damaged() -> None:
        partial.write_bytes(b"\0" * (8 * MIB))  # claims 8 MiB, holds zeros: the checksum catches it
        partial.with_name(partial.name + ".ranges").write_text("not json")

    damaged()
    with pytest.raises(DownloadError, match=f"{BIG} of .* arrived corrupted"):
        fetch(hub, snapshot, tmp_path / "m")
    assert not partial.exists() and not (tmp_path / "m" / BIG).exists()
    damaged()
    checked = []
    fetch(hub, snapshot, tmp_path / "m", room=lambda d, files: checked.append(sorted(f.path for f in files)))
    assert checked == [[BIG]]  # once, with every file the fetch began without (config.json was in place)
    assert (tmp_path / "m" / BIG).read_bytes() == data


def test_a_range_cut_mid_body_resumes_from_its_last_written_byte(hub, big_repo, tmp_path):
    repo, data, snapshot = big_repo
    hub.drop_after(MIB + MIB // 2, repo_id=repo, filename=BIG)
    fetch(hub, snapshot, tmp_path / "m")
    assert (tmp_path / "m" / BIG).read_bytes() == data
    gets = body_gets(hub, repo)
    assert len(gets) == 9  # 8 ranges, one of them resumed once
    cut = next(r for r in gets if r.bytes_sent == MIB + MIB // 2)
    start = int(cut.range.split("=")[1].split("-")[0])
    assert any(r.range.startswith(f"bytes={start + cut.bytes_sent}-") for r in gets)  # right after the last byte
    assert hub.bytes_served(repo) == len(data) + 3  # the bytes that arrived before the cut were all kept


def test_an_empty_file_and_a_file_in_place_cost_no_request(hub, tmp_path):
    repo = f"acme/empty-{time.monotonic_ns()}"
    hub.add_repo(repo, {"model.safetensors": b"", "tokenizer.json": b"{}"})
    snapshot = resolve_snapshot(HfSource(repo, "main"), hub.url, None)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tokenizer.json").write_bytes(b"{}")
    hub.reset_stats()
    assert fetch(hub, snapshot, tmp_path / "m") == 0
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == b""
    assert not [r for r in hub.requests if r.repo_id == repo and r.filename and r.method == "GET"]


def test_progress_counts_what_is_already_there(hub, big_repo, tmp_path):
    repo, data, snapshot = big_repo
    partial = tmp_path / "m" / PARTIAL_DIR / f"{BIG}.part"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:3 * MIB])  # a sequential partial file: ranges 0 and half of 1 are done
    remote: RemoteFile = next(f for f in snapshot.files if f.path == BIG)
    assert present(tmp_path / "m", remote) == 3 * MIB
    seen = []
    fetch(hub, snapshot, tmp_path / "m", seen.append)
    assert seen[0] == 3 * MIB and seen[-1] == len(data) + 3
    assert hub.bytes_served(repo) == len(data) - 3 * MIB + 3


def test_the_token_goes_to_the_hub_and_never_to_the_cdn_it_redirects_to(hub, tmp_path):
    repo = f"acme/private-{time.monotonic_ns()}"
    data = random.Random("cdn").randbytes(3 * MIB)
    hub.add_repo(repo, {BIG: data, "config.json": b"{}\n"}, private=True, token="hf_cdn_secret")
    snapshot = resolve_snapshot(HfSource(repo, "main"), hub.url, "hf_cdn_secret")
    hub.reset_stats()
    hub.cdn_redirects = True
    try:
        with Dir.root(tmp_path / "m", create=True) as d:
            fetch_snapshot(HfSource(repo, snapshot.commit), snapshot, d, hub.url, "hf_cdn_secret",
                           lambda done: None, time.monotonic() + 60,
                           redirect_hosts=[f"localhost:{hub.url.rsplit(':', 1)[1]}"])
    finally:
        hub.cdn_redirects = False
    assert (tmp_path / "m" / BIG).read_bytes() == data
    resolves = [r for r in hub.requests if r.repo_id == repo and "/resolve/" in r.path]
    cdn = [r for r in hub.requests if r.repo_id == repo and r.path.startswith("/cdn/")]
    assert resolves and all(r.authorization_present for r in resolves)  # the Hub needs it for a private repo
    assert [r.method for r in cdn] == ["GET"] and not cdn[0].authorization_present
    assert hub.bytes_served(repo) == len(data) + 3


def test_links_planted_among_the_partial_files_are_never_written_through(hub, big_repo, tmp_path):
    repo, data, snapshot = big_repo
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    partial_dir = tmp_path / "m" / PARTIAL_DIR
    partial_dir.mkdir(parents=True)
    (partial_dir / f"{BIG}.part.ranges.tmp").symlink_to(outside)
    fetch(hub, snapshot, tmp_path / "m")
    assert (tmp_path / "m" / BIG).read_bytes() == data
    assert outside.read_bytes() == b"keep"


def test_a_file_that_arrives_corrupted_fails_the_fetch_and_is_not_put_in_place(hub, big_repo, tmp_path):
    repo, data, snapshot = big_repo
    real = hub_transfer(HfSource(repo, snapshot.commit), snapshot.commit, hub.url, None)

    def corrupting(remote, start, end, write):
        def flip(chunk):
            if start == 0 and remote.path == BIG and chunk:
                chunk = memoryview(bytes([chunk[0] ^ 0xFF]) + bytes(chunk[1:]))
            write(chunk)
        real(remote, start, end, flip)

    with pytest.raises(DownloadError, match=f"{BIG} of .* arrived corrupted"):
        with Dir.root(tmp_path / "m", create=True) as d:
            fetch_files(snapshot, d, corrupting, lambda done: None, time.monotonic() + 60, "the test")
    assert not (tmp_path / "m" / BIG).exists()
    assert not (tmp_path / "m" / PARTIAL_DIR / f"{BIG}.part").exists()


@pytest.mark.parametrize("path", [".cache/weightkeeper/ready", ".CACHE/weightkeeper/ready",
                                  ".Cache/weightkeeper/model.safetensors.part", "../x", "a//b", "/etc/passwd", "a/./b"])
def test_a_listed_name_outside_the_copy_or_in_weightkeepers_folder_in_any_case_is_an_unsafe_file_name(path):
    """`.CACHE` is weightkeeper's own folder of partial files and ready marker on a volume that folds case."""
    with pytest.raises(DownloadError, match="lists an unsafe file name"):
        safe_repo_path(path, "acme/names")
    assert [safe_repo_path(p, "acme/names") for p in ("a/.cache/x", ".cachex/y")] == ["a/.cache/x", ".cachex/y"]


def test_a_partial_file_that_becomes_another_users_after_it_was_measured_is_never_written(tmp_path):
    """Whoever may write the directory renames another user's file to a partial file's name between its measure and
    its opening (here: the file measured becomes theirs): it is neither truncated nor written, and the fetch fails."""
    data = random.Random("became").randbytes(1000)
    remote = RemoteFile("w.bin", len(data), "", sha256=hashlib.sha256(data).hexdigest())
    part = tmp_path / PARTIAL_DIR / "w.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:400])
    with Dir.root(tmp_path) as d:
        file = download.PartialFile(d, remote, "the test")
        assert file.resumed == 400
        os.chown(part, 4343, 4343)
        try:
            with pytest.raises(DownloadError, match="replaced by another user's file"):
                file.open()
        finally:
            file.stop()
    assert part.read_bytes() == data[:400] and part.stat().st_uid == 4343


def test_a_signal_while_the_ranges_download_stops_them_and_is_raised(hub, big_repo, tmp_path):
    """SIGTERM (a worker stopping, `serve` ending) arrives while the download waits for its ranges: Prefect's
    handler raises in the waiting thread. The ranges stop at their next chunk and the signal's exception comes out
    at once, instead of being swallowed while the download goes on to its end; the partial files stay to resume."""
    repo, data, snapshot = big_repo
    hub.set_throttle(MIB, repo_id=repo)  # 16 s for the whole file

    class Terminated(BaseException):
        pass

    def terminated(*_):
        raise Terminated()

    previous = signal.signal(signal.SIGALRM, terminated)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(Terminated):
            fetch(hub, snapshot, tmp_path / "m")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        hub.set_throttle(None, repo_id=repo)
    assert hub.bytes_served(repo) < len(data) and not (tmp_path / "m" / BIG).exists()  # stopped, not finished
    assert not [t for t in threading.enumerate() if t.name.startswith("fetch")]
    assert (tmp_path / "m" / PARTIAL_DIR / f"{BIG}.part").exists()


def test_a_download_in_any_thread_stops_once_its_process_is_orphaned(hub, big_repo, tmp_path):
    """A run downloads several paths, each in a thread of its own, where no signal is raised. Its worker is gone
    (`exit_with_parent` sets ORPHANED before it sends SIGTERM): the fetch in the thread stops at the watchdog's
    next tick, its connections cut, and keeps its partial files."""
    from weightkeeper import watchdog

    repo, data, snapshot = big_repo
    hub.set_throttle(MIB, repo_id=repo)  # 16 s for the whole file
    outcome: list[BaseException | int] = []

    def download() -> None:
        try:
            outcome.append(fetch(hub, snapshot, tmp_path / "m"))
        except BaseException as e:  # noqa: BLE001 - the test reads it
            outcome.append(e)

    thread = threading.Thread(target=download)
    try:
        thread.start()
        time.sleep(1)
        watchdog.ORPHANED.set()
        thread.join(10)
    finally:
        watchdog.ORPHANED.clear()
        hub.set_throttle(None, repo_id=repo)
        thread.join()
    assert isinstance(outcome[0], DownloadCancelled) and "is gone" in str(outcome[0])
    assert hub.bytes_served(repo) < len(data) and (tmp_path / "m" / PARTIAL_DIR / f"{BIG}.part").exists()


def test_two_listings_of_a_commit_agree_only_file_for_file():
    """`listed_otherwise`: the first file (by name) whose size or digests differ, or that only one listing has."""
    a = [RemoteFile("b.json", 2, "b" * 40).to_json(), RemoteFile("a.bin", 5, "a" * 40, "f" * 64).to_json()]
    assert listed_otherwise(a, list(reversed(a))) is None and listed_otherwise(None, []) is None
    for changed in ({"size": 6}, {"blobId": "c" * 40}, {"sha256": "e" * 64}, {"sha256": None}, {"md5": "d" * 32}):
        assert listed_otherwise(a, [{**a[1], **changed}, a[0]]) == "a.bin", changed
    assert listed_otherwise(a, a[1:]) == listed_otherwise(a[1:], a) == "b.json" and listed_otherwise(a, None) == "a.bin"
