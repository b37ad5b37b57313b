"""reconcile drives every model to its desired state, safely when two passes run at once."""

from __future__ import annotations

import os
import shutil
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import tiny_files
from test_attacks import SHARD, tree

from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile
from weightkeeper.config import DELETE_FLOW, ENSURE_FLOW
from weightkeeper.desired import needed_run, orphans
from weightkeeper.registry import Holder
from weightkeeper.verify import Due, hash_due, listed


def test_needed_run():
    assert needed_run("Pending", None) == ENSURE_FLOW
    assert needed_run("Staging", None) == ENSURE_FLOW  # no live run (a crashed one's lease was abandoned): redo
    assert needed_run("Downloading", ENSURE_FLOW) is None
    assert needed_run("Deleting", ENSURE_FLOW) == DELETE_FLOW  # deletion takes over
    assert needed_run("Deleting", DELETE_FLOW) is None
    assert needed_run("Deleting", None) == DELETE_FLOW
    assert needed_run("Ready", None) is None and needed_run("Failed", None) is None


def test_orphans():
    children = ["/v/models/a", "/v/models/b", "/v/models/sub", "/v/models/ab"]
    assert orphans(children, ["/v/models/a", "/v/models/sub/x--y", "/v/models/a/../b2"]) == ["/v/models/ab",
                                                                                              "/v/models/b"]


def test_orphans_are_reported_never_deleted(wk, hub):
    hub.add_repo("acme/kept", tiny_files("kept"))
    wk.declare("kept", "hf://acme/kept", workspaces=["team-a"])
    assert ensure_model("kept") == "Ready"
    stray = wk.volumes["team-a"] / "models" / "stray"
    stray.mkdir()
    (stray / "weights.bin").write_bytes(b"x")
    outcomes = reconcile()
    assert outcomes[str(stray)] == "orphan" and (stray / "weights.bin").exists()
    assert str(wk.volumes["team-a"] / "models" / "acme--kept") not in [p for p, o in outcomes.items() if o == "orphan"]


def test_two_concurrent_passes_on_postgresql(wk, hub, pg_url):
    """Pending models are ensured once and a Deleting one (whose run died) deleted once: no double
    download, no lost update."""
    wk.rewrite(registry_url=pg_url, hf_endpoint=hub.url)
    names = [f"conc-{i}" for i in range(3)]
    for name in names:
        hub.add_repo(f"acme/{name}", tiny_files(name))
        wk.declare(name, f"hf://acme/{name}")
    hub.add_repo("acme/doomed", tiny_files("doomed"))
    wk.declare("doomed", "hf://acme/doomed", workspaces=["team-a"])
    assert ensure_model("doomed") == "Ready"
    doomed = Path(wk.registry.get_model("doomed").local_paths[0].path)
    wk.registry.mark_deleting("doomed")  # as if its delete run had been killed at once
    wk.registry.claim_run("doomed", DELETE_FLOW, Holder("dead-run", "elsewhere", 1, 1.0), 0.0)  # lapsed at once
    hub.set_throttle(256 * 1024)
    hub.reset_stats()
    results: list[dict] = []
    errors: list[BaseException] = []

    def one_pass() -> None:
        try:
            results.append(reconcile())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    passes = [threading.Thread(target=one_pass) for _ in range(2)]
    for p in passes:
        p.start()
    for p in passes:
        p.join(240)
    hub.set_throttle(None)
    assert not errors and len(results) == 2, errors
    registry = wk.registry
    for name in names:
        model = registry.get_model(name)
        assert model.phase == "Ready" and [p.status for p in model.local_paths] == ["Ready", "Ready"]
        assert hub.get_count(f"acme/{name}") == 2 * 5  # each file once per path: no double download
        started = [r[f"model {name}"] for r in results if f"model {name}" in r]
        assert len([s for s in started if s not in ("busy", "gone")]) == 1, started
    assert registry.find_model("doomed") is None and not doomed.exists()
    assert len([r for r in results if r.get("model doomed", "busy") not in ("busy", "gone")]) == 1
    assert registry.run_leases() == {}  # every run released its lease


def test_hash_due_and_listed():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert hash_due(None, 60, now) and hash_due(now - timedelta(seconds=61), 60, now)
    assert not hash_due(now - timedelta(seconds=59), 60, now)
    assert listed([{"path": "a", "size": 3, "blobId": "x"}]) == (("a", 3),)
    for bad in ({"path": "a"}, {"path": 1, "size": 3}, {"path": "a", "size": True}, {"path": "a", "size": -1}, "a"):
        assert listed([bad]) is None


def test_due():
    now, hour, day = datetime(2026, 1, 1, tzinfo=timezone.utc), 3600, 86400
    due, ago = Due.at(now, day, hour), lambda seconds: now - timedelta(seconds=seconds)
    assert all(due.of(None, now, key) is True for key in range(8))  # never hashed
    assert all(due.of(ago(day + 1), now, key) is True for key in range(8))  # hashed too long ago
    assert all(due.of(now, None, key) is False for key in range(8))  # never checked: the cheap check
    assert all(Due.at(now, day, 0).of(now, now, key) is False for key in range(8))  # no interval: every pass
    assert not any(due.of(now, ago(0.74 * hour), key) is not None for key in range(8))
    assert all(due.of(now, ago(hour), key) is False for key in range(8))
    # copies checked together come due in different passes
    assert [due.of(now, ago(0.85 * hour), key) for key in range(8)] == [False] * 4 + [None] * 4


def test_a_pass_checks_only_the_copies_due_and_records_each_check(wk, hub):
    """With `check_interval_seconds`, a copy checked (or hashed) by a pass is not looked at again until it is due:
    damage done meanwhile is found by the first pass after that, and repaired."""
    from sqlalchemy import update

    from weightkeeper.registry.schema import LocalPathRow

    files = tiny_files("cadence")
    hub.add_repo("acme/cadence", files)
    wk.rewrite(hf_endpoint=hub.url, check_interval_seconds=3600, verify_interval_seconds=7 * 86400)
    wk.declare("cadence", "hf://acme/cadence", workspaces=["team-a"])
    assert ensure_model("cadence") == "Ready"
    path = wk.registry.get_model("cadence").local_paths[0].path
    assert reconcile()[path] == "verified"  # never hashed by a pass: hashed, and the check recorded
    assert reconcile()[path] == "not due"
    os.truncate(Path(path) / SHARD, 10)
    assert reconcile()[path] == "not due"  # the damage waits for the copy's next check
    with wk.registry.engine.begin() as conn:
        conn.execute(update(LocalPathRow).values(checked_at=datetime.now(timezone.utc) - timedelta(hours=1)))
    assert reconcile()[path] == "repaired"
    assert (Path(path) / SHARD).read_bytes() == files[SHARD] and wk.registry.get_model("cadence").phase == "Ready"


def _checked_model(wk, hub, name: str) -> tuple[dict[str, bytes], list[Path]]:
    """A Ready model with two own copies, both hashed just now (so a pass only size-checks them)."""
    files = tiny_files(name)
    hub.add_repo(f"acme/{name}", files)
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=3600)
    wk.declare(name, f"hf://acme/{name}")
    assert ensure_model(name) == "Ready"
    paths = wk.registry.get_model(name).local_paths
    for entry in paths:
        wk.registry.set_path_verified(name, entry.id, "Ready")
    return files, [Path(entry.path) for entry in paths]


def test_a_copy_not_due_is_only_size_checked_and_a_size_mismatch_is_repaired(wk, hub):
    files, (same_size, truncated) = _checked_model(wk, hub, "bulk")
    with open(same_size / SHARD, "r+b") as f:  # same size, other bytes: only a full hash would see it
        f.seek(100)
        f.write(bytes([files[SHARD][100] ^ 0xFF]))
    os.truncate(truncated / SHARD, 10)
    before = {p.path: p.verified_at for p in wk.registry.get_model("bulk").local_paths}
    hub.reset_stats()
    outcomes = reconcile()
    assert outcomes[str(same_size)] == "checked" and outcomes[str(truncated)] == "repaired"
    assert (same_size / SHARD).read_bytes() != files[SHARD]  # not hashed: not due
    assert (truncated / SHARD).read_bytes() == files[SHARD] and hub.get_count("acme/bulk") == 1
    after = {p.path: p.verified_at for p in wk.registry.get_model("bulk").local_paths}
    assert after[str(same_size)] == before[str(same_size)] and wk.registry.get_model("bulk").phase == "Ready"


def test_the_bulk_check_never_follows_a_link_planted_in_a_copy(wk, hub, tmp_path):
    """The attacker swaps a file, and a whole copy, for links to look-alikes elsewhere (right sizes): the
    check sees the links, never what they point at, and nothing outside is read into or written."""
    files, (with_file_link, as_dir_link) = _checked_model(wk, hub, "planted")
    outside = tmp_path / "outside"
    shutil.copytree(as_dir_link, outside / "copy")
    before = tree(outside)
    (with_file_link / SHARD).unlink()
    (with_file_link / SHARD).symlink_to(outside / "copy" / SHARD)
    os.rename(as_dir_link, tmp_path / "away")
    as_dir_link.symlink_to(outside / "copy")
    hub.reset_stats()
    outcomes = reconcile()
    assert outcomes[str(with_file_link)] == "repaired" and outcomes[str(as_dir_link)] == "postponed"
    assert not (with_file_link / SHARD).is_symlink() and (with_file_link / SHARD).read_bytes() == files[SHARD]
    entry = next(p for p in wk.registry.get_model("planted").local_paths if p.path == str(as_dir_link))
    assert entry.status == "Failed" and "link" in entry.message
    assert tree(outside) == before


def test_a_ready_model_costs_no_hub_request_in_a_pass(wk, hub):
    """Hashed in full or size-checked, a healthy copy (own or shared) never asks the Hub anything; only a
    repair does."""
    files, own = _checked_model(wk, hub, "quiet")
    hub.add_repo("acme/quiet-shared", tiny_files("quiet-shared"))
    wk.declare("quiet-shared", "hf://acme/quiet-shared", download_policy="reuse-if-exists")
    assert ensure_model("quiet-shared") == "Ready"
    copies = [a.path for a in wk.registry.list_artifacts() if a.repo_id == "acme/quiet-shared"]  # one a volume
    for interval, outcome in ((0, "verified"), (3600, "checked")):
        wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=interval)
        hub.reset_stats()
        outcomes = reconcile()
        assert [outcomes[str(p)] for p in own] + [outcomes[c] for c in copies] == [outcome] * 4, outcomes
        assert hub.requests == [], [r.path for r in hub.requests]
    os.truncate(own[0] / SHARD, 10)
    outcomes = reconcile()
    assert outcomes[str(own[0])] == "repaired"
    assert [outcomes[str(own[1])]] + [outcomes[c] for c in copies] == ["checked"] * 3
    assert hub.requests and {r.repo_id for r in hub.requests} == {"acme/quiet"}
    hub.reset_stats()  # a healthy copy whose repair failed is hashed by its own task, found whole, and Ready again
    entry = next(p for p in wk.registry.get_model("quiet").local_paths if p.path == str(own[1]))
    _repair_failed(wk, "quiet", entry.id)
    assert reconcile()[str(own[1])] == "verified" and hub.requests == []
    assert next(p for p in wk.registry.get_model("quiet").local_paths if p.path == str(own[1])).status == "Ready"


def _insert_ready(wk, count: int, start: int, files: list[dict], template: Path) -> None:
    """`count` Ready models written to the registry directly, an own copy each in team-a, its files hard links."""
    from sqlalchemy.orm import Session

    from weightkeeper.registry.common import utcnow
    from weightkeeper.registry.schema import LocalPathRow, ModelRow

    now = utcnow()
    with Session(wk.registry.engine) as s, s.begin():
        for i in range(start, start + count):
            path = wk.volumes["team-a"] / "models" / f"acme--many-{i}"
            path.mkdir(parents=True)
            for f in files:
                os.link(template / f["path"], path / f["path"])
            row = ModelRow(name=f"many-{i}", owner_name="alice", owner_uid=1000, source=f"hf://acme/many-{i}",
                           repo_id=f"acme/many-{i}", revision="main", commit="0" * 40, files=files, phase="Ready",
                           message="", created_at=now, updated_at=now, cleanup_attempts=0)
            st = path.stat()
            row.paths = [LocalPathRow(workspace="team-a", cluster="local", path=str(path), status="Ready", message="",
                                      owned=True, made=f"{st.st_dev}:{st.st_ino}", verified_at=now, updated_at=now)]
            s.add(row)


def test_a_pass_reads_the_registry_in_the_same_statements_whatever_the_count(wk, hub, tmp_path):
    """The registry reads of a pass are batched: 20 models cost the statements 4 cost (none per model)."""
    from sqlalchemy import event

    template = tmp_path / "template"
    template.mkdir()
    files = []
    for name, data in (("config.json", b"{}"), (SHARD, b"x" * 4096)):
        (template / name).write_bytes(data)
        files.append({"path": name, "size": len(data), "blobId": "0" * 40, "sha256": None, "md5": None})
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=3600)
    statements: list[str] = []
    engine = wk.registry.engine
    listen = lambda conn, cursor, sql, *rest: statements.append(sql)  # noqa: E731
    counts = []
    for count, start in ((4, 0), (16, 4)):
        _insert_ready(wk, count, start, files, template)
        statements.clear()
        event.listen(engine, "before_cursor_execute", listen)
        try:
            outcomes = reconcile()
        finally:
            event.remove(engine, "before_cursor_execute", listen)
        mine = [outcome for path, outcome in outcomes.items() if "acme--many-" in path]
        assert mine == ["checked"] * (count + start), outcomes
        counts.append(len(statements))
    assert counts[0] == counts[1], statements


def test_a_run_queued_behind_busy_workers_keeps_its_reservation_and_gets_no_twin(wk, hub):
    """A burst queues runs behind the workers' run limit for longer than a reservation lasts: a pass that finds a
    lapsed reservation whose run still waits for a worker renews it instead of starting a second run; once that
    run is gone (cancelled), the next pass starts the model's run again."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.states import Cancelled
    from sqlalchemy import update

    from weightkeeper.deployments import declared, ensure_work_pools
    from weightkeeper.desired import IN_PROGRESS
    from weightkeeper.registry.leases import Kind
    from weightkeeper.registry.schema import LeaseRow
    from weightkeeper.runs import run_here, start_deployment

    wk.rewrite(hf_endpoint=hub.url, work_pool="wk-no-worker")  # no worker serves it: the run stays Scheduled
    ensure_work_pools(wk.settings)
    for deployment, _ in declared(wk.settings):
        if deployment.flow_name == ENSURE_FLOW:
            deployment.apply(work_pool_name="wk-no-worker")
    hub.add_repo("acme/queued", tiny_files("queued"))
    model = wk.declare("queued", "hf://acme/queued", workspaces=["team-a"])
    run_id = start_deployment(wk.registry, wk.settings, ENSURE_FLOW, "queued", "test/queued", IN_PROGRESS)

    def lapse() -> None:
        with wk.registry.engine.begin() as conn:
            conn.execute(update(LeaseRow).where(LeaseRow.kind == Kind.RUN, LeaseRow.key == model.id)
                         .values(expires_at=datetime.now(timezone.utc) - timedelta(seconds=1)))

    def runs() -> list:
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["ensure-queued"])))

    assert wk.registry.lease_of(Kind.RUN, model.id).holder.run == f"reserved:{run_id}"  # the reservation names it
    lapse()
    assert run_here(reconcile)["model queued"] == "queued"
    lease = wk.registry.lease_of(Kind.RUN, model.id)
    assert lease.holder.run == f"reserved:{run_id}" and lease.expires_at > datetime.now(timezone.utc) + timedelta(
        seconds=60)  # renewed for a reservation's time
    assert [str(r.id) for r in runs()] == [run_id] and wk.registry.get_model("queued").phase == "Pending"

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Cancelled(), force=True)
    lapse()
    assert run_here(reconcile)["model queued"].startswith(f"{ENSURE_FLOW}: ")  # not deployed here: run in the pass
    assert wk.registry.get_model("queued").phase == "Ready"


def test_repairing_a_size_mismatch_hashes_the_whole_own_copy_before_it_counts_as_verified(wk, hub):
    """A pass whose size check is due but not the hash finds a truncated shard in a model's own copy. Another
    file of the copy has one byte flipped (same size): the repair hashes the whole copy before it records a full
    verification, so that file is fetched again too, not passed as verified."""
    files = tiny_files("rehash")
    hub.add_repo("acme/rehash", files)
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=3600)
    wk.declare("rehash", "hf://acme/rehash", workspaces=["team-a"])
    assert ensure_model("rehash") == "Ready"
    entry = wk.registry.get_model("rehash").local_paths[0]
    wk.registry.set_path_verified("rehash", entry.id, "Ready")  # hashed just now: a pass only size-checks it
    path, flipped = Path(entry.path), "model-00002-of-00002.safetensors"
    os.truncate(path / SHARD, 10)
    with open(path / flipped, "r+b") as f:
        f.seek(100)
        f.write(bytes([files[flipped][100] ^ 0xFF]))
    assert reconcile()[str(path)] == "repaired"
    assert (path / SHARD).read_bytes() == files[SHARD] and (path / flipped).read_bytes() == files[flipped]
    model = wk.registry.get_model("rehash")
    assert model.phase == "Ready" and model.local_paths[0].status == "Ready"


def _repair_failed(wk, name: str, path_id: int) -> None:
    """Fail the path as a repair that fails does (the next pass repairs it again)."""
    holder = Holder.here(f"repair/test/{path_id}")
    assert wk.registry.claim_download(name, path_id, holder, 60).ok
    wk.registry.repair_failed(name, path_id, holder, "an earlier repair failed")


def test_a_full_hash_never_marks_ready_a_path_another_run_works_on(wk, hub, monkeypatch):
    """A path whose repair failed, though its bytes are all there; before its full hash ends, another run claims it
    (a new download, a cleanup). The hash finds the copy complete, and leaves the path to that run: not Ready."""
    from prefect import flow

    from weightkeeper.tasks import verify

    hub.add_repo("acme/hash-busy", tiny_files("hash-busy"))
    wk.declare("hash-busy", "hf://acme/hash-busy", workspaces=["team-a"])
    assert ensure_model("hash-busy") == "Ready"
    path_id = wk.registry.get_model("hash-busy").local_paths[0].id
    _repair_failed(wk, "hash-busy", path_id)
    other = Holder("another-run/1", "elsewhere", 7, 1.0)
    check = verify._check

    def claimed_meanwhile(*args):
        problems = check(*args)
        assert wk.registry.claim_download("hash-busy", path_id, other, 60).ok
        return problems

    monkeypatch.setattr(verify, "_check", claimed_meanwhile)
    assert flow(name="hash-busy-pass")(lambda: verify.verify_model_path("hash-busy", path_id))() == "busy"
    entry = wk.registry.get_model("hash-busy").local_paths[0]
    assert entry.status == "Downloading" and entry.lease.holder == other


def _no_file_fetched(hub) -> bool:
    return not [r.filename for r in hub.requests if r.method == "GET" and r.filename]


def test_a_path_whose_download_failed_is_left_to_its_owner_never_fetched_by_a_pass(wk, hub):
    """The download is refused for space ("nothing was written"): the pass neither repairs nor creates the path,
    asks the Hub for no file, and leaves the path Failed with the download's message for `model retry`."""
    hub.add_repo("acme/no-room", tiny_files("no-room"))
    wk.rewrite(hf_endpoint=hub.url, free_space_margin_bytes=2**62)
    wk.declare("no-room", "hf://acme/no-room", workspaces=["team-a"])
    assert ensure_model("no-room") == "Failed"
    entry = wk.registry.get_model("no-room").local_paths[0]
    assert entry.status == "Failed" and "no space" in entry.message and "nothing was written" in entry.message
    hub.reset_stats()
    assert entry.path not in reconcile()
    after = wk.registry.get_model("no-room")
    assert after.phase == "Failed" and after.local_paths[0].status == "Failed"
    assert after.local_paths[0].message == entry.message and _no_file_fetched(hub)
    assert not os.path.lexists(entry.path)


def test_a_repair_fetches_only_what_fits_from_the_hub_budget_and_a_failed_repair_is_repaired_next_pass(wk, hub):
    """A Ready copy is damaged while the volume has no room: its repair fetches nothing and fails saying so; the
    next pass, with room again, repairs it, its requests counted in the Hub budget like a download's."""
    files = tiny_files("repair-room")
    hub.add_repo("acme/repair-room", files)
    wk.declare("repair-room", "hf://acme/repair-room", workspaces=["team-a"])
    assert ensure_model("repair-room") == "Ready"
    path = Path(wk.registry.get_model("repair-room").local_paths[0].path)
    os.truncate(path / SHARD, 10)
    wk.rewrite(hf_endpoint=hub.url, free_space_margin_bytes=2**62)
    hub.reset_stats()
    assert reconcile()[str(path)] == "postponed"
    entry = wk.registry.get_model("repair-room").local_paths[0]
    assert entry.status == "Failed" and "no space" in entry.message and _no_file_fetched(hub)
    wk.rewrite(hf_endpoint=hub.url, free_space_margin_bytes=0)
    before = wk.registry.hub_request_counts()["resolve"].requests
    assert reconcile()[str(path)] == "repaired"
    assert (path / SHARD).read_bytes() == files[SHARD] and wk.registry.get_model("repair-room").phase == "Ready"
    resolves = len([r for r in hub.requests if r.filename])
    assert resolves and wk.registry.hub_request_counts()["resolve"].requests - before == resolves


@pytest.mark.parametrize("when", ["after its check", "while it is read"])
def test_a_full_hash_never_reads_past_the_recorded_size_of_a_file_its_owner_grows(tmp_path, monkeypatch, when):
    """The copy's owner appends 2 MiB to a file recorded at 4 KiB once its size was checked, or while it is hashed:
    at most one byte past the recorded size is read, and the copy is damaged."""
    import hashlib

    from weightkeeper import verify
    from weightkeeper.anchored import Dir
    from weightkeeper.download import RemoteFile

    data = os.urandom(4096)
    (tmp_path / SHARD).write_bytes(data)
    remote = RemoteFile(SHARD, len(data), "0" * 40, hashlib.sha256(data).hexdigest())
    inode, counted = (tmp_path / SHARD).stat().st_ino, {"read": 0, "hashed": 0}

    def grow() -> None:
        with open(tmp_path / SHARD, "ab") as f:
            f.write(b"\0" * (2 << 20))

    def read(fd: int, n: int, real=os.read) -> bytes:
        chunk = real(fd, n)
        counted["read"] += len(chunk) if os.fstat(fd).st_ino == inode else 0
        return chunk

    class Hasher:
        def __init__(self, real):
            self.real = real

        def update(self, chunk: bytes) -> None:
            if not counted["hashed"] and when == "while it is read":
                grow()
            counted["hashed"] += len(chunk)
            self.real.update(chunk)

        def hexdigest(self) -> str:
            return self.real.hexdigest()

    def lstat(self, name: str, real=Dir.lstat):
        st = real(self, name)
        if name == SHARD and when == "after its check":
            grow()
        return st

    monkeypatch.setattr(verify, "file_hasher", lambda r, real=verify.file_hasher: Hasher(real(r)))
    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(Dir, "lstat", lstat)
    with Dir.root(tmp_path) as root:
        problems = verify.verify_copy(root, [remote], deep=True, workers=1)
    assert [p.path for p in problems] == [SHARD] and "size" in problems[0].reason, problems
    assert counted["read"] <= len(data) + 1 and counted["hashed"] <= len(data), counted
    assert counted["read"] == 0 or when == "while it is read"  # grown before the open: not a byte read


def test_a_dead_runs_lease_on_a_ready_model_is_marked_crashed_once_then_let_go(wk, hub):
    """A Ready model whose last run died holding its run lease: a pass marks that run Crashed and lets the lease
    go, so the next pass has nothing of it to mark (before, every pass did, for ever)."""
    import uuid

    hub.add_repo("acme/dead-run", tiny_files("dead-run"))
    wk.declare("dead-run", "hf://acme/dead-run", workspaces=["team-a"])
    assert ensure_model("dead-run") == "Ready"
    registry = wk.registry
    gone = Holder(run=str(uuid.uuid4()), host=Holder.here("x").host, pid=2 ** 22 + 7, started=1.0)  # no such process
    assert registry.claim_run("dead-run", ENSURE_FLOW, gone, 60) is None
    assert "dead-run" in registry.run_leases() and not registry.run_leases()["dead-run"].fresh
    reconcile()
    assert "dead-run" not in registry.run_leases()
    assert registry.get_model("dead-run").phase == "Ready"
