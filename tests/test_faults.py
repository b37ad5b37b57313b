"""Fault injection: each fault ends with nothing lost and a message that says what happened.

Real components throughout: a killed worker process, the Hub server's injected statuses and
dropped connections, a small tmpfs that fills, a mount and a permission the cleanup cannot pass,
the session's Prefect server restarted mid-run, and PostgreSQL connections terminated mid-flow.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import expected_size, start_session_server, stop_session_server, tiny_files

from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.tasks.download import download_snapshot
from test_lifecycle import fetched_files, in_thread, wait_until
from weightkeeper.download import PARTIAL_DIR

MIB = 1 << 20


def assert_files_match(path: str, files: dict[str, bytes]) -> None:
    for name in fetched_files(path):
        assert (Path(path) / name).read_bytes() == files[name], name


def run_cli_flow(wk, flow: str, name: str, prefix: list[str] | None = None) -> subprocess.Popen:
    """A flow in a process of its own, as a background launch or a worker runs it."""
    log = open(wk.root / f"{flow}-{name}.log", "ab")
    return subprocess.Popen([*(prefix or []), sys.executable, "-m", "weightkeeper.cli", "run", flow, name],
                            env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config)), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: int):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def add_small_workspace(wk, hub, volume: Path, **settings) -> None:
    wk.rewrite(hf_endpoint=hub.url, workspaces=wk._workspaces + [{"name": "small", "volume": str(volume)}],
               **settings)


# -- the download side ---------------------------------------------------------------------------------------


def test_killed_worker_resumes_and_refetches_under_ten_percent(wk, hub):
    files = tiny_files("killed", shards=2, shard_size=24 * MIB)
    hub.add_repo("acme/killed", files)
    total = expected_size(files)
    wk.declare("killed", "hf://acme/killed", workspaces=["team-a"])
    hub.set_throttle(4 * MIB, repo_id="acme/killed")
    hub.reset_stats()
    worker = run_cli_flow(wk, "ensure-model", "killed")
    try:
        wait_until(lambda: wk.registry.get_model("killed").local_paths[0].bytes_done > total * 0.4,
                   timeout=90, what="the worker to fetch 40%")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        hub.set_throttle(None, repo_id="acme/killed")
    path = wk.registry.get_model("killed").local_paths[0].path
    kept = sum(p.stat().st_size for p in Path(path, PARTIAL_DIR).rglob("*.part"))
    assert kept > total * 0.3  # the killed run's bytes are on disk

    # the killed run's leases (run and path) lapse after lease_seconds; until then a new run stops at once
    wait_until(lambda: ensure_model("killed") == "Ready", timeout=60, what="a re-run to finish the download")
    entry = wk.registry.get_model("killed").local_paths[0]
    assert entry.status == "Ready" and entry.size_bytes == total
    assert_files_match(path, files)
    refetched = hub.bytes_served("acme/killed") - total
    assert 0 <= refetched < total * 0.10, f"re-fetched {refetched} of {total} bytes"


def test_hub_500_and_429_with_retry_after_are_retried_then_succeed(wk, hub, monkeypatch):
    monkeypatch.setattr(download_snapshot, "retry_delay_seconds", [1, 1])
    files = tiny_files("flaky")
    hub.add_repo("acme/flaky", files)
    wk.declare("flaky", "hf://acme/flaky", workspaces=["team-a"])
    hub.reset_stats()
    hub.fail_next(1, 429, retry_after=1, repo_id="acme/flaky", path_contains="00001-of-00002")
    hub.fail_next(1, 500, retry_after=1, repo_id="acme/flaky", path_contains="00002-of-00002")
    run = in_thread(ensure_model, "flaky")
    messages = set()
    while run.is_alive():
        messages.update(p.message for p in wk.registry.get_model("flaky").local_paths)
        time.sleep(0.05)
    assert run.result.get("value") == "Ready"
    assert_files_match(wk.registry.get_model("flaky").local_paths[0].path, files)
    statuses = [(r.filename, r.status) for r in hub.requests if r.repo_id == "acme/flaky" and r.filename]
    assert ("model-00001-of-00002.safetensors", 429) in statuses and ("model-00002-of-00002.safetensors", 500) in statuses
    # both files fail in the first attempt; the path's message names one of the two answers
    assert any(re.search(r"answered HTTP (429|500) for acme/flaky; will retry \(attempt 1, retrying\)", m)
               for m in messages), messages


def test_connection_closed_mid_body_resumes_from_where_it_stopped(wk, hub):
    files = tiny_files("dropped", shards=1, shard_size=4 * MIB)
    shard = "model-00001-of-00001.safetensors"
    hub.add_repo("acme/dropped", files)
    wk.declare("dropped", "hf://acme/dropped", workspaces=["team-a"])
    hub.reset_stats()
    hub.drop_after(3 * MIB // 2, repo_id="acme/dropped", filename=shard)
    assert ensure_model("dropped") == "Ready"
    assert_files_match(wk.registry.get_model("dropped").local_paths[0].path, files)
    bodies = [r for r in hub.requests if r.filename == shard and r.method == "GET"]
    assert bodies[0].bytes_sent == 3 * MIB // 2
    assert any(r.range and r.range != "bytes=0-" for r in bodies[1:]), [r.range for r in bodies]
    assert hub.bytes_served("acme/dropped") - expected_size(files) < MIB  # at most the last unwritten chunk


def test_a_model_bigger_than_the_free_space_fails_fast_with_both_numbers(wk, hub, tmp_path):
    files = tiny_files("toobig", shards=1, shard_size=12 * MIB)
    hub.add_repo("acme/toobig", files)
    with tmpfs(tmp_path / "small", 8 * MIB) as volume:
        (volume / "neighbour.txt").write_bytes(b"theirs")
        add_small_workspace(wk, hub, volume, free_space_margin_bytes=0)
        wk.declare("toobig", "hf://acme/toobig", workspaces=["small"])
        hub.reset_stats()
        assert ensure_model("toobig") == "Failed"
        model = wk.registry.get_model("toobig")
        free = os.statvfs(volume).f_bavail * os.statvfs(volume).f_frsize
        needs = f"needs {expected_size(files)} bytes, {free} free on {volume}"
        assert needs in model.local_paths[0].message and "nothing was written" in model.message
        assert hub.bytes_served("acme/toobig") == 0
        assert not os.path.exists(model.local_paths[0].path)
        assert sorted(os.listdir(volume)) == ["neighbour.txt"] and (volume / "neighbour.txt").read_bytes() == b"theirs"


def test_the_margin_keeps_a_volume_from_filling_up(wk, hub, tmp_path):
    files = tiny_files("margin", shards=1, shard_size=4 * MIB)
    hub.add_repo("acme/margin", files)
    with tmpfs(tmp_path / "small", 8 * MIB) as volume:
        add_small_workspace(wk, hub, volume, free_space_margin_bytes=6 * MIB)
        wk.declare("margin", "hf://acme/margin", workspaces=["small"])
        assert ensure_model("margin") == "Failed"
        assert f"free_space_margin_bytes = {6 * MIB}" in wk.registry.get_model("margin").message
        add_small_workspace(wk, hub, volume, free_space_margin_bytes=2 * MIB)
        assert ensure_model("margin") == "Ready"


def fill(path: Path) -> int:
    """Another writer on the volume: write until the disk is full; returns the bytes written."""
    written = 0
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 64 * 1024)
                f.flush()
                written += 64 * 1024
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return written


def test_disk_filled_by_another_writer_fails_with_no_space_and_resumes_later(wk, hub, tmp_path):
    files = tiny_files("diskfull", shards=1, shard_size=10 * MIB)
    hub.add_repo("acme/diskfull", files)
    with tmpfs(tmp_path / "small", 16 * MIB) as volume:
        add_small_workspace(wk, hub, volume, free_space_margin_bytes=0)
        wk.declare("diskfull", "hf://acme/diskfull", workspaces=["small"])
        hub.set_throttle(2 * MIB, repo_id="acme/diskfull")
        try:
            run = in_thread(ensure_model, "diskfull")
            wait_until(lambda: wk.registry.get_model("diskfull").local_paths[0].bytes_done > 0, what="the download")
            filler = volume / "other-writer.bin"
            size = fill(filler)
            run.join(60)
        finally:
            hub.set_throttle(None, repo_id="acme/diskfull")
        assert run.result.get("value") == "Failed"
        model = wk.registry.get_model("diskfull")
        assert "no space left on device" in model.local_paths[0].message.lower(), model.local_paths[0].message
        assert filler.stat().st_size >= size  # the other writer's file is untouched
        assert sorted(os.listdir(volume)) == ["models", "other-writer.bin"]
        path = Path(model.local_paths[0].path)
        kept = sum(p.stat().st_size for p in (path / PARTIAL_DIR).rglob("*.part"))
        assert kept > 0  # what arrived is kept for the next run

        filler.unlink()
        hub.reset_stats()
        assert ensure_model("diskfull") == "Ready"
        assert_files_match(str(path), files)
        assert hub.bytes_served("acme/diskfull") <= expected_size(files) - kept + MIB


# -- the cleanup side ----------------------------------------------------------------------------------------


def test_cleanup_hitting_eacces_keeps_the_model_and_retries(wk, hub):
    """Without CAP_DAC_OVERRIDE even root gets EACCES in a read-only directory: the deletion runs so."""
    wk.rewrite(hf_endpoint=hub.url, cleanup_retry_seconds=0.5, cleanup_retry_max_seconds=2)
    files = tiny_files("eacces")
    hub.add_repo("acme/eacces", files)
    wk.declare("eacces", "hf://acme/eacces", workspaces=["team-a"])
    assert ensure_model("eacces") == "Ready"
    path = Path(wk.registry.get_model("eacces").local_paths[0].path)
    path.chmod(0o555)
    try:
        deletion = run_cli_flow(wk, "delete-model", "eacces",
                                prefix=["setpriv", "--bounding-set=-dac_override,-dac_read_search"])
        model = wait_until(lambda: (m := wk.registry.get_model("eacces")).cleanup_attempts >= 2 and m,
                           timeout=90, what="two failed cleanup attempts")
        assert model.phase == "Deleting" and "Permission denied" in model.message and "kept" in model.message
        assert path.is_dir() and model.local_paths
    finally:
        path.chmod(0o755)
    assert deletion.wait(90) == 0
    assert wk.registry.find_model("eacces") is None and not path.exists()


def test_cleanup_meeting_a_mount_keeps_the_model_and_never_touches_the_mounted_files(wk, hub):
    """rmdir of a mount point is EBUSY; removing the files inside it would delete another filesystem's data."""
    hub.add_repo("acme/ebusy", tiny_files("ebusy"))
    wk.declare("ebusy", "hf://acme/ebusy", workspaces=["team-a"])
    assert ensure_model("ebusy") == "Ready"
    path = Path(wk.registry.get_model("ebusy").local_paths[0].path)
    with tmpfs(path / "scratch", MIB) as mounted:
        (mounted / "theirs.txt").write_bytes(b"not weightkeeper's")
        deletion = in_thread(delete_model, "ebusy")
        model = wait_until(lambda: (m := wk.registry.get_model("ebusy")).cleanup_attempts >= 2 and m,
                           what="two failed cleanup attempts")
        assert model.phase == "Deleting" and "kept" in model.message and "mount" in model.message, model.message
        assert (mounted / "theirs.txt").read_bytes() == b"not weightkeeper's"
    deletion.join(60)
    assert deletion.result.get("value") == "Released"
    assert not path.exists()


# -- the control plane ---------------------------------------------------------------------------------------


def test_prefect_server_restarted_mid_run_the_run_completes(wk, hub):
    files = tiny_files("restart", shards=2, shard_size=8 * MIB)
    hub.add_repo("acme/restart", files)
    wk.declare("restart", "hf://acme/restart", workspaces=["team-a"])
    hub.set_throttle(2 * MIB, repo_id="acme/restart")
    try:
        run = in_thread(ensure_model, "restart")
        wait_until(lambda: wk.registry.get_model("restart").local_paths[0].bytes_done > 2 * MIB,
                   what="the download to be under way")
        stop_session_server()
        time.sleep(3)
        start_session_server()
        run.join(120)
    finally:
        hub.set_throttle(None, repo_id="acme/restart")
    assert not run.is_alive()
    assert run.result.get("value") == "Ready", run.result
    model = wk.registry.get_model("restart")
    assert model.phase == "Ready" and model.local_paths[0].size_bytes == expected_size(files)
    assert_files_match(model.local_paths[0].path, files)


def consistency_problems(registry) -> list[str]:
    """What a half-written registry would show: a Ready model with unfinished paths, a lease half set."""
    problems = []
    for m in registry.list_models(include_deleting=True):
        if m.phase == "Ready" and any(p.status != "Ready" or p.size_bytes is None for p in m.local_paths):
            problems.append(f"{m.name} is Ready with unfinished paths")
        for p in m.local_paths:
            if p.lease is not None and p.status not in ("Downloading", "Cleaning", "Waiting", "Failed", "Ready"):
                problems.append(f"{m.name}:{p.path} is {p.status} under a lease")
            if p.bytes_total and p.bytes_done > p.bytes_total:
                problems.append(f"{m.name}:{p.path} has more bytes done than total")
    return problems


def terminate_backends(database: str) -> int:
    import psycopg

    from conftest import PG_ADMIN_URL

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        return len(conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = %s AND pid <> pg_backend_pid()", (database,)).fetchall())


def test_registry_connections_dropped_mid_flow_leave_no_half_written_state(wk, hub, pg_url):
    wk.rewrite(registry_url=pg_url, hf_endpoint=hub.url)
    files = tiny_files("pgdrop", shards=2, shard_size=4 * MIB)
    hub.add_repo("acme/pgdrop", files)
    wk.declare("pgdrop", "hf://acme/pgdrop", workspaces=["team-a", "team-b"])
    hub.set_throttle(2 * MIB, repo_id="acme/pgdrop")
    database = pg_url.rsplit("/", 1)[1]
    killed, problems = 0, []
    try:
        run = in_thread(ensure_model, "pgdrop")
        while run.is_alive():
            killed += terminate_backends(database)
            with contextlib.suppress(Exception):  # our own read may meet a terminated connection too
                problems += consistency_problems(wk.registry)
            time.sleep(0.3)
    finally:
        hub.set_throttle(None, repo_id="acme/pgdrop")
    assert killed > 0 and not problems, problems
    outcome, error = run.result.get("value"), str(run.result.get("error"))
    if outcome != "Ready":  # a run cut short by the database (retries used up) leaves work undone, never half
        assert outcome in ("Failed", "Downloading") or "terminating connection" in error, run.result
        wait_until(lambda: ensure_model("pgdrop") == "Ready", timeout=60, what="a re-run to complete the model")
    model = wk.registry.get_model("pgdrop")
    assert not consistency_problems(wk.registry)
    for p in model.local_paths:
        assert p.status == "Ready" and p.size_bytes == expected_size(files)
        assert_files_match(p.path, files)
