"""Shared snapshots, verification and repair, on the real client and the loopback Hub server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import expected_size, tiny_files
from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile
from test_lifecycle import fetched_files, in_thread, wait_until

SHARD = "model-00001-of-00002.safetensors"
FILES_FETCHED = 5


def shared_dir(wk, repo_dir: str, commit: str, workspace: str = "team-a") -> Path:
    return wk.volumes[workspace] / "models" / "_artifacts" / repo_dir / commit


def test_two_models_share_one_copy_and_it_goes_with_the_last(wk, hub):
    files = tiny_files("share")
    commit = hub.add_repo("acme/share", files)
    hub.reset_stats()
    wk.declare("one", "hf://acme/share", workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("two", "hf://acme/share", workspaces=["team-a"], subpath="models/team-two",
               download_policy="reuse-if-exists")
    assert ensure_model("one") == "Ready" and ensure_model("two") == "Ready"
    copy = shared_dir(wk, "acme--share", commit)
    one, two = (wk.registry.get_model(n).local_paths[0] for n in ("one", "two"))
    assert os.readlink(one.path) == f"_artifacts/acme--share/{commit}"
    assert os.readlink(two.path) == f"../_artifacts/acme--share/{commit}"
    assert fetched_files(str(copy)) == fetched_files(one.path) == fetched_files(two.path)
    assert one.size_bytes == two.size_bytes == expected_size(files)
    assert hub.get_count("acme/share") == FILES_FETCHED  # one copy, downloaded once
    (artifact,) = wk.registry.list_artifacts()
    assert artifact.state == "Ready" and sorted(u.model for u in artifact.users) == ["one", "two"]
    assert wk.registry.get_model("one").to_json()["localPaths"][0]["shared"] is True

    assert delete_model("one") == "Released"
    assert not os.path.lexists(one.path) and copy.is_dir() and fetched_files(two.path)
    assert delete_model("two") == "Released"
    assert not os.path.lexists(two.path) and not copy.parent.exists() and copy.parent.parent.is_dir()
    assert wk.registry.list_artifacts() == []

    hub.reset_stats()
    wk.declare("three", "hf://acme/share", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("three") == "Ready"
    assert hub.get_count("acme/share") == FILES_FETCHED  # a fresh download: the copy was gone


def test_a_repositorys_directory_goes_with_its_last_copy(wk, hub):
    """Two commits of one repository, each the copy of a model: collecting one removes its copy and keeps the
    repository's directory (the other is in it); collecting the last removes that directory too. Their lock files
    stay (`file_lock`)."""
    old = hub.add_repo("acme/two-commits", tiny_files("two-commits"), revision="v1")
    new = hub.add_repo("acme/two-commits", tiny_files("two-commits-b"), revision="v2")
    for name, revision in (("first", "v1"), ("second", "v2")):
        wk.declare(name, f"hf://acme/two-commits@{revision}", workspaces=["team-a"], subpath=f"models/{name}",
                   download_policy="reuse-if-exists")
        assert ensure_model(name) == "Ready"
    repo = shared_dir(wk, "acme--two-commits", old).parent
    assert sorted(p.name for p in repo.iterdir()) == sorted([old, new])
    assert delete_model("first") == "Released"
    assert [p.name for p in repo.iterdir()] == [new]
    assert delete_model("second") == "Released"
    assert not repo.exists() and repo.parent.is_dir() and wk.registry.list_artifacts() == []
    assert sorted(p.name for p in (repo.parent / ".locks").iterdir()) == sorted(
        f"acme--two-commits--{c}.lock" for c in (old, new))


@pytest.mark.parametrize("planted", ["another user's empty directory", "a link", "a file"])
def test_only_an_empty_repository_directory_of_its_own_is_removed_after_a_collection(tmp_path, planted):
    """What stands at a collected copy's repository directory on an owner's shelf (`_artifacts.1000`) is not
    weightkeeper's or its owner's: an empty directory of uid 2000, a link, a file. It is left as it is."""
    from weightkeeper.fsops import remove_repo_dir
    from weightkeeper.guard import VolumeRule

    repo = tmp_path / "models" / "_artifacts.1000" / "acme--r"
    repo.parent.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    if planted == "a link":
        repo.symlink_to(tmp_path / "elsewhere")
    elif planted == "a file":
        repo.write_bytes(b"theirs")
    else:
        repo.mkdir()
        os.chown(repo, 2000, 2000)
    assert remove_repo_dir(str(repo / ("a" * 40)), [VolumeRule(str(tmp_path))]) is False
    assert os.path.lexists(repo) and (tmp_path / "elsewhere").is_dir()
    if planted == "another user's empty directory":
        os.chown(repo, 1000, 1000)  # the shelf's owner's own: theirs to have made, empty, removed
        assert remove_repo_dir(str(repo / ("a" * 40)), [VolumeRule(str(tmp_path))]) is True and not repo.exists()


def test_a_copy_is_made_again_when_a_collection_removed_its_repositorys_directory_meanwhile(wk, hub, monkeypatch):
    """Garbage collection removes a repository's directory once its last copy is gone, as a download of another commit
    of that repository is about to make its copy there: the download makes the directory again and ends Ready."""
    import weightkeeper.fsops as fsops

    commit = hub.add_repo("acme/remade", tiny_files("remade"))
    made, raced = fsops.own_directory, []

    def collected_meanwhile(parent, name, *args, **kwargs):
        if not raced:
            raced.append(parent.where)
            os.rmdir(parent.where)  # the empty repository directory, as `remove_repo_dir` removes it
        return made(parent, name, *args, **kwargs)

    monkeypatch.setattr(fsops, "own_directory", collected_meanwhile)
    wk.declare("remade", "hf://acme/remade", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("remade") == "Ready"
    assert raced == [str(shared_dir(wk, "acme--remade", commit).parent)]
    assert fetched_files(str(shared_dir(wk, "acme--remade", commit)))


def test_concurrent_creators_download_exactly_once(wk, hub):
    commit = hub.add_repo("acme/rush", tiny_files("rush", shard_size=512 * 1024))
    hub.set_throttle(2 * 1024 * 1024, repo_id="acme/rush")
    hub.reset_stats()
    names = [f"rush-{i}" for i in range(4)]
    for i, name in enumerate(names):
        wk.declare(name, "hf://acme/rush", workspaces=["team-a"], subpath=f"models/r{i}",
                   download_policy="reuse-if-exists")
    runs = [in_thread(ensure_model, n) for n in names]
    for r in runs:
        r.join(120)
    hub.set_throttle(None, repo_id="acme/rush")
    assert [r.result.get("value") for r in runs] == ["Ready"] * 4
    for name in fetched_files(str(shared_dir(wk, "acme--rush", commit))):
        assert hub.get_count("acme/rush", name) == 1, name


def test_models_on_the_same_path_share_the_link(wk, hub):
    commit = hub.add_repo("acme/samepath", tiny_files("samepath"))
    for name in ("left", "right"):
        wk.declare(name, "hf://acme/samepath", workspaces=["team-b"], download_policy="reuse-if-exists")
        assert ensure_model(name) == "Ready"
    link = wk.registry.get_model("left").local_paths[0].path
    assert delete_model("left") == "Released"
    assert os.path.islink(link) and fetched_files(link)  # "right" still has this path
    assert delete_model("right") == "Released"
    assert not os.path.lexists(link) and not shared_dir(wk, "acme--samepath", commit, "team-b").exists()


def test_keep_files_leaves_the_link_and_the_copy(wk, hub):
    commit = hub.add_repo("acme/reserve", tiny_files("reserve"))
    wk.declare("reserve", "hf://acme/reserve", workspaces=["team-a"], download_policy="reuse-if-exists",
               keep_files=True)
    assert ensure_model("reserve") == "Ready"
    link = wk.registry.get_model("reserve").local_paths[0].path
    assert delete_model("reserve") == "Released"
    assert os.path.islink(link) and fetched_files(link)
    assert reconcile()[str(shared_dir(wk, "acme--reserve", commit))] == "linked"
    hub.reset_stats()
    wk.declare("later", "hf://acme/reserve", workspaces=["team-a"], subpath="models/later",
               download_policy="reuse-if-exists")
    assert ensure_model("later") == "Ready" and hub.get_count("acme/reserve") == 0  # the kept copy is reused


def test_a_link_planted_by_hand_keeps_the_copy_until_it_is_gone(wk, hub):
    commit = hub.add_repo("acme/planted", tiny_files("planted"))
    wk.declare("planted", "hf://acme/planted", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("planted") == "Ready"
    copy = shared_dir(wk, "acme--planted", commit)
    planted = wk.volumes["team-a"] / "models" / "by-hand"
    planted.symlink_to(copy)
    assert delete_model("planted") == "Released"
    assert copy.is_dir() and "by-hand" in wk.registry.list_artifacts()[0].message
    planted.unlink()
    assert reconcile()[str(copy)] == "collected"
    assert not copy.exists() and wk.registry.list_artifacts() == []


@pytest.mark.parametrize("policy", ["reuse-if-exists", "always-download"])
def test_a_path_that_holds_files_weightkeeper_did_not_write_is_refused_and_kept(wk, hub, policy):
    """The attacker (or a careless user) fills the model's directory first: weightkeeper never adopts it,
    marks nothing Ready with the user's bytes, and its delete removes none of them."""
    files = tiny_files("occupied")
    hub.add_repo("acme/occupied", files)
    model = wk.declare("occupied", "hf://acme/occupied", workspaces=["team-a"], download_policy=policy)
    path = Path(model.local_paths[0].path)
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    (path / SHARD).write_bytes(b"x" * len(files[SHARD]))  # same name and size as the model's shard
    assert ensure_model("occupied") == "Failed"
    message = wk.registry.get_model("occupied").local_paths[0].message
    assert "already holds files weightkeeper did not write" in message and "notes.txt" in message
    assert wk.registry.list_artifacts() == [] and sorted(os.listdir(path)) == sorted(["notes.txt", SHARD])
    assert delete_model("occupied") == "Released"
    assert (path / "notes.txt").read_text() == "mine" and (path / SHARD).read_bytes() == b"x" * len(files[SHARD])


def test_a_shared_model_outside_the_models_root_fails(wk, hub):
    hub.add_repo("acme/outside", tiny_files("outside"))
    wk.declare("outside", "hf://acme/outside", workspaces=["team-a"], subpath="team",
               download_policy="reuse-if-exists")
    assert ensure_model("outside") == "Failed"
    assert "outside the models root" in wk.registry.get_model("outside").message


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_reconcile_repairs_only_the_damaged_file(wk, hub, damage):
    files = tiny_files(f"repair-{damage}")
    repo = f"acme/repair-{damage}"
    commit = hub.add_repo(repo, files)
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=0 if damage == "corrupt" else 3600)
    wk.declare("repair", f"hf://{repo}", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("repair") == "Ready"
    shard = shared_dir(wk, f"acme--repair-{damage}", commit) / SHARD
    if damage == "corrupt":
        with open(shard, "r+b") as f:
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "truncate":
        os.truncate(shard, 100)
    else:
        shard.unlink()
    hub.reset_stats()
    hub.set_throttle(64 * 1024, repo_id=repo)
    run = in_thread(reconcile)
    failed = wait_until(lambda: (m := wk.registry.get_model("repair")).phase == "Failed" and m,
                        what="the model to fail during repair")
    assert "under repair" in failed.message
    hub.set_throttle(None, repo_id=repo)
    run.join(60)
    assert run.result["value"][str(shard.parent)] == "repaired"
    assert shard.read_bytes() == files[SHARD]
    assert hub.get_count(repo) == 1 and hub.get_count(repo, SHARD) == 1
    model = wk.registry.get_model("repair")
    assert model.phase == "Ready" and "restored" in model.message


def test_hub_unreachable_during_repair_fails_the_models_until_it_is_back(wk, hub):
    files = tiny_files("offline-repair")
    commit = hub.add_repo("acme/offline-repair", files)
    wk.rewrite(hf_endpoint=hub.url, hub_unreachable_seconds=0)
    wk.declare("offline", "hf://acme/offline-repair", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("offline") == "Ready"
    shard = shared_dir(wk, "acme--offline-repair", commit) / SHARD
    shard.unlink()
    hub.set_offline(True)
    try:
        assert reconcile()[str(shard.parent)] == "failed"
    finally:
        hub.set_offline(False)
    model = wk.registry.get_model("offline")
    assert model.phase == "Failed" and "repair of shared copy" in model.message
    assert wk.registry.list_artifacts()[0].state == "Failed"
    assert reconcile()[str(shard.parent)] == "repaired"
    assert wk.registry.get_model("offline").phase == "Ready" and shard.read_bytes() == files[SHARD]


def test_an_own_copy_is_verified_and_repaired_too(wk, hub):
    files = tiny_files("own-repair")
    hub.add_repo("acme/own-repair", files)
    wk.declare("own", "hf://acme/own-repair", workspaces=["team-a"])
    assert ensure_model("own") == "Ready"
    path = Path(wk.registry.get_model("own").local_paths[0].path)
    os.truncate(path / SHARD, 10)
    hub.reset_stats()
    assert reconcile()[str(path)] == "repaired"
    assert (path / SHARD).read_bytes() == files[SHARD] and hub.get_count("acme/own-repair") == 1
    assert wk.registry.get_model("own").phase == "Ready"


def test_a_killed_lock_holder_is_taken_over_after_its_lease(wk, hub):
    files = tiny_files("killed", shards=1, shard_size=4 * 1024 * 1024)
    commit = hub.add_repo("acme/killed", files)
    wk.declare("victim", "hf://acme/killed", workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("heir", "hf://acme/killed", workspaces=["team-a"], subpath="models/heir",
               download_policy="reuse-if-exists")
    hub.set_throttle(512 * 1024, repo_id="acme/killed")
    hub.reset_stats()
    victim = subprocess.Popen([sys.executable, "-c", "from weightkeeper.flows.ensure_model import ensure_model; "
                               "ensure_model('victim')"], env=dict(os.environ), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (a := wk.registry.list_artifacts()) and a[0].lease and hub.bytes_served("acme/killed")
                   > 1024 * 1024, timeout=90, what="the victim to hold the shared copy and download")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    hub.set_throttle(None, repo_id="acme/killed")
    assert wk.registry.list_artifacts()[0].lease  # a SIGKILLed holder leaves its lease behind
    assert ensure_model("heir") == "Ready"
    copy = shared_dir(wk, "acme--killed", commit)
    assert (copy / "model-00001-of-00001.safetensors").read_bytes() == files["model-00001-of-00001.safetensors"]
    assert hub.bytes_served("acme/killed") < 2 * expected_size(files)  # resumed, not fetched twice


def test_moving_a_model_onto_the_shared_copy(wk, hub):
    from weightkeeper.service import move_model

    files = tiny_files("move")
    commit = hub.add_repo("acme/move", files)
    wk.declare("base", "hf://acme/move", workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("mover", "hf://acme/move", workspaces=["team-a"], subpath="models/own")
    assert ensure_model("base") == "Ready" and ensure_model("mover") == "Ready"
    old = Path(wk.registry.get_model("mover").local_paths[0].path)
    assert not old.is_symlink() and fetched_files(str(old))
    hub.reset_stats()
    moved = move_model(wk.settings, wk.registry, "mover", subpath="models/shared", download_policy="reuse-if-exists")
    assert [p.retired for p in moved.local_paths] == [True, False]
    assert ensure_model("mover") == "Ready"
    (entry,) = wk.registry.get_model("mover").local_paths
    assert os.readlink(entry.path) == f"../_artifacts/acme--move/{commit}"
    assert not old.exists() and hub.get_count("acme/move") == 0
    assert entry.size_bytes == expected_size(files)


def test_workspace_listing_shows_what_sharing_saves(wk, hub):
    import json

    from test_cli import cli

    files = tiny_files("usage")
    hub.add_repo("acme/usage", files)
    for i in range(3):
        wk.declare(f"use-{i}", "hf://acme/usage", workspaces=["team-b"], subpath=f"models/u{i}",
                   download_policy="reuse-if-exists")
        assert ensure_model(f"use-{i}") == "Ready"
    rows = {r["name"]: r for r in json.loads(cli(wk, "workspace", "list", "--json").stdout)}
    assert rows["team-b"]["storedBytes"] == expected_size(files)
    assert rows["team-b"]["withoutSharingBytes"] == 3 * expected_size(files)
    shown = json.loads(cli(wk, "model", "get", "use-0", "--json").stdout)["localPaths"][0]["sharedCopy"]
    assert shown["models"] == ["use-0", "use-1", "use-2"] and shown["state"] == "Ready"


def test_shared_copy_is_verified_before_it_is_used(wk, hub):
    """What a run that died while filling the copy it made left there (right size, wrong content, no ready
    marker) is hashed before the copy is used. (A directory weightkeeper did not make is never used:
    test_attacks.py.)"""
    files = tiny_files("preverify")
    commit = hub.add_repo("acme/preverify", files)
    wk.declare("first", "hf://acme/preverify", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("first") == "Ready"
    copy = shared_dir(wk, "acme--preverify", commit)
    (copy / ".cache" / "weightkeeper" / "ready").unlink()
    (copy / SHARD).write_bytes(b"\0" * len(files[SHARD]))
    wk.declare("preverify", "hf://acme/preverify", workspaces=["team-a"], subpath="models/second",
               download_policy="reuse-if-exists")
    assert ensure_model("preverify") == "Ready"
    assert (copy / SHARD).read_bytes() == files[SHARD]


def test_reconcile_runs_on_a_schedule(wk, hub):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterState
    from prefect.client.schemas.filters import FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    def completed() -> int:
        with get_client(sync_client=True) as client:
            return len(client.read_flow_runs(flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(any_=["reconcile"]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED])))))

    before = completed()
    # every 5 s, not 2: Prefect's runner starts a run's process up to 10 s before its time (its prefetch), so a
    # shorter interval piles up run processes that starve one another (and every other test) on a small machine
    served = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "reconcile", "--every", "5"],
                              env=dict(os.environ, PREFECT_RUNNER_POLL_FREQUENCY="1"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: completed() >= before + 2, timeout=120, what="two scheduled reconcile runs")
    finally:
        os.killpg(served.pid, signal.SIGTERM)
        try:
            served.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(served.pid, signal.SIGKILL)  # no run process outlives the test
            raise


def test_a_copy_begun_for_a_model_the_hub_refuses_is_collected_and_the_model_kept(wk, hub):
    """Refused (gated, no token), the model is no user of the copy begun for it: a pass collects it, and the
    model stays Failed for its owner to retry or delete."""
    commit = hub.add_repo("acme/partial", tiny_files("partial"), gated=True, token="hf_needed")
    wk.declare("partial", "hf://acme/partial", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("partial") == "Failed"
    copy = shared_dir(wk, "acme--partial", commit)
    assert reconcile()[str(copy)] == "collected"
    assert not copy.exists() and wk.registry.list_artifacts() == []
    assert wk.registry.get_model("partial").phase == "Failed"
    assert delete_model("partial") == "Released"


def test_an_own_copy_is_never_written_through_a_left_link(wk, hub):
    commit = hub.add_repo("acme/leftlink", tiny_files("leftlink"))
    wk.declare("keeper", "hf://acme/leftlink", workspaces=["team-a"], download_policy="reuse-if-exists",
               keep_files=True)
    assert ensure_model("keeper") == "Ready" and delete_model("keeper") == "Released"
    wk.declare("writer", "hf://acme/leftlink", workspaces=["team-a"])
    assert ensure_model("writer") == "Failed"
    assert "is a link" in wk.registry.get_model("writer").message
    copy = shared_dir(wk, "acme--leftlink", commit)
    assert sorted(os.listdir(copy)) == sorted(["config.json", "tokenizer.json", "tokenizer_config.json", SHARD,
                                               "model-00002-of-00002.safetensors", ".cache"])


def test_a_shared_copy_removed_by_hand_is_forgotten_when_its_last_model_goes(wk, hub):
    commit = hub.add_repo("acme/by-hand", tiny_files("by-hand"))
    wk.declare("by-hand", "hf://acme/by-hand", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("by-hand") == "Ready"
    shutil.rmtree(shared_dir(wk, "acme--by-hand", commit))
    assert delete_model("by-hand") == "Released"
    assert wk.registry.list_artifacts() == []


def test_a_copy_recorded_before_identities_gets_its_own_after_a_full_hash(wk, hub):
    from sqlalchemy import update

    from weightkeeper.download import RemoteFile
    from weightkeeper.registry.schema import ArtifactRow
    from weightkeeper.tasks.verify import Copy, check_copies
    from weightkeeper.verify import listed

    commit = hub.add_repo("acme/legacy-copy", tiny_files("legacy-copy"))
    wk.declare("legacy-copy", "hf://acme/legacy-copy", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("legacy-copy") == "Ready"
    artifact = wk.registry.list_artifacts()[0]
    made = artifact.made
    with wk.registry._tx() as s:  # as migration 0014 leaves a copy recorded before it
        s.execute(update(ArtifactRow).values(made="legacy"))
    files = tuple(RemoteFile.from_json(f) for f in artifact.files)
    assert check_copies.fn([Copy(artifact.path, listed(artifact.files), artifact.id, True, False, "legacy")]) == {}
    assert wk.registry.get_artifact(artifact.id).made == "legacy"  # a size check proves nothing
    assert check_copies.fn([Copy(artifact.path, files, artifact.id, True, True, "legacy")]) == {}
    assert wk.registry.get_artifact(artifact.id).made == made
    assert artifact.path == str(shared_dir(wk, "acme--legacy-copy", commit))


def test_no_one_else_can_hold_a_shared_copys_lock(wk, hub):
    """Reading a lock file is enough to hold its `flock` for ever, stalling every model of that commit. An earlier
    version left `.locks` and its files readable by all: the next lock makes them the service's alone, and a user
    (nobody, in a process of its own) can no longer open them."""
    commit = hub.add_repo("acme/private-lock", tiny_files("private-lock"))
    locks = wk.volumes["team-a"] / "models" / "_artifacts" / ".locks"
    lock = locks / f"acme--private-lock--{commit}.lock"
    locks.mkdir(parents=True)
    lock.touch()
    locks.chmod(0o755)
    lock.chmod(0o644)
    wk.declare("private-lock", "hf://acme/private-lock", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("private-lock") == "Ready"
    assert (stat.S_IMODE(locks.stat().st_mode), stat.S_IMODE(lock.stat().st_mode)) == (0o700, 0o600)
    holder = subprocess.run([sys.executable, "-c", "import fcntl, os, sys; os.setgid(65534); os.setuid(65534); "
                             "fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX)", str(lock)],
                            capture_output=True, text=True)
    assert holder.returncode != 0 and "PermissionError" in holder.stderr


def test_a_directory_the_service_may_not_read_keeps_the_copy_and_the_pass_goes_on(wk, hub, monkeypatch):
    """A user makes a directory under the models root that a service not running as root may not enter (mode 0700;
    this root process is refused it as such a service would be). It could hold a link into an unused copy, so the
    copy is kept, saying why; the release and the reconcile pass go on. Once it can be read, the copy goes."""
    from weightkeeper import anchored

    commit = hub.add_repo("acme/unreadable", tiny_files("unreadable"))
    wk.declare("unreadable", "hf://acme/unreadable", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("unreadable") == "Ready"
    locked = wk.volumes["team-a"] / "models" / "bob"
    locked.mkdir(mode=0o700)
    descend = anchored.Dir.descend

    def as_a_service(self, relative, *args, **kw):
        if self.path(relative) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return descend(self, relative, *args, **kw)

    with monkeypatch.context() as refused:
        refused.setattr(anchored.Dir, "descend", as_a_service)
        assert delete_model("unreadable") == "Released"
        (artifact,) = wk.registry.list_artifacts()
        assert f"cannot look for links into {artifact.path} in {locked}: Permission denied" in artifact.message
        outcomes = reconcile()
        assert outcomes[artifact.path] == "busy" and shared_dir(wk, "acme--unreadable", commit).is_dir()
    assert reconcile()[artifact.path] == "collected" and not shared_dir(wk, "acme--unreadable", commit).exists()


def test_a_copy_whose_directories_others_may_write_is_failed_and_hashed_before_it_is_used_again(wk, hub):
    """An earlier version let the first Kubernetes job make a copy's directories, so its owner could write them.
    Here the repository's directory above a Ready copy is opened to all: the next full hash fails the copy and its
    models, naming the directory, though every byte is still right. The attacker then rewrites a shard (same size:
    the quick check passes). Once the directory is closed again, ensuring the model hashes the copy before it
    trusts its marker: the shard is fetched."""
    files = tiny_files("open-shelf")
    commit = hub.add_repo("acme/open-shelf", files)
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=0)
    wk.declare("open-shelf", "hf://acme/open-shelf", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("open-shelf") == "Ready"
    copy = shared_dir(wk, "acme--open-shelf", commit)
    copy.parent.chmod(0o777)
    assert reconcile()[str(copy)] == "failed"
    model = wk.registry.get_model("open-shelf")
    assert model.phase == "Failed" and f"{copy.parent} (owner uid 0, mode 777)" in model.message
    assert "others may write in it" in model.message
    (copy / SHARD).write_bytes(b"\0" * len(files[SHARD]))
    copy.parent.chmod(0o755)
    hub.reset_stats()
    assert ensure_model("open-shelf") == "Ready"
    assert (copy / SHARD).read_bytes() == files[SHARD] and hub.get_count("acme/open-shelf", SHARD) == 1


def test_a_directory_put_in_place_of_the_link_fails_the_path_and_is_left_alone(wk, hub):
    """Whoever may write the path's parent replaces weightkeeper's link with a directory of zeros of the model's
    files and sizes: the next pass fails the path and its model, naming what stands there, and touches none of it."""
    from test_attacks import tree

    hub.add_repo("acme/unlinked", tiny_files("unlinked"))
    wk.declare("unlinked", "hf://acme/unlinked", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("unlinked") == "Ready"
    model = wk.registry.get_model("unlinked")
    path = Path(model.local_paths[0].path)
    assert path.is_symlink()
    path.unlink()
    path.mkdir()
    for f in model.files:
        (path / f["path"]).write_bytes(b"\0" * f["size"])
    before = tree(path)
    assert reconcile()[str(path)] == "failed"
    model = wk.registry.get_model("unlinked")
    entry = model.local_paths[0]
    assert model.phase == "Failed" and entry.status == "Failed"
    assert f"{path} is a directory where weightkeeper's link" in entry.message and "model retry unlinked" in \
        entry.message and model.message == entry.message
    assert tree(path) == before and not path.is_symlink()


def _an_owners_copy(wk, hub, tmp_path, monkeypatch, name: str) -> tuple[Path, str]:
    """(Kubernetes) A Ready shared copy that a job of owner 1000 made for model `name` on `_artifacts.1000`, and its
    commit; the Kubernetes table is then dropped, so that the service's deletion waits for no pod (no cluster here)."""
    from test_kube import _kube_workspace, as_the_job_of

    volume = _kube_workspace(wk, hub, tmp_path)
    commit = hub.add_repo(f"acme/{name}", tiny_files(name))
    wk.declare(name, f"hf://acme/{name}", workspaces=["gpu"], download_policy="reuse-if-exists", owner_uid=1000)
    with as_the_job_of(monkeypatch, 1000):
        assert ensure_model(name) == "Ready"
    shelf = volume / "models" / "_artifacts.1000"
    for made in (shelf, *shelf.rglob("*")):  # as the job, running as 1000, made them
        os.chown(made, 1000, 1000, follow_symlinks=False)
    wk.rewrite(hf_endpoint=hub.url)
    return shelf / f"acme--{name}" / commit, commit


def test_collecting_a_copy_on_an_owners_shelf_never_empties_another_users_directory(wk, hub, tmp_path, monkeypatch):
    """The copy on `_artifacts.1000` is its owner's to write. Before deleting their model they move into it a directory
    open to all that holds another user's (uid 2000) read-only subtree, which they cannot remove themselves. The
    service's garbage collection (root) leaves that subtree whole and keeps the copy, naming it; once its owner
    takes it back, the copy goes."""
    from test_attacks import tree

    copy, _ = _an_owners_copy(wk, hub, tmp_path, monkeypatch, "owned-gc")
    theirs = copy / "planted" / "theirs"
    (theirs / "deeper").mkdir(parents=True)
    (theirs / "deeper" / "data.bin").write_bytes(b"another user's")
    (theirs / "notes.txt").write_bytes(b"another user's too")
    os.chown(copy / "planted", 1000, 1000)
    (copy / "planted").chmod(0o777)
    for p in (theirs, *theirs.rglob("*")):
        os.chown(p, 2000, 2000)
    before = tree(theirs)
    assert delete_model("owned-gc") == "Released"
    (artifact,) = wk.registry.list_artifacts()
    assert artifact.path == str(copy) and f"cannot collect: {theirs} (owner uid 2000) is not owned as" in \
        artifact.message, artifact.message
    assert tree(theirs) == before
    assert reconcile()[str(copy)] == "busy" and tree(theirs) == before
    os.rename(theirs, tmp_path / "theirs")
    assert reconcile()[str(copy)] == "collected" and not copy.exists() and wk.registry.list_artifacts() == []
    assert tree(tmp_path / "theirs") == before


@pytest.mark.parametrize("planted", ["directory at the lock", "lock of another uid", "locks of another uid"])
def test_a_lock_someone_else_put_on_an_owners_shelf_is_refused_and_left_alone(wk, hub, tmp_path, monkeypatch,
                                                                              planted):
    """The owner of `_artifacts.1000` puts at their copy's lock (or at `.locks`) something of another user's: a
    directory holding their files, their lock file or their directory, open to others. The service's garbage collection
    (root) neither removes nor chmods it: the copy is kept, naming it, until it is gone; the owner's own locks serve."""
    from test_attacks import tree

    copy, commit = _an_owners_copy(wk, hub, tmp_path, monkeypatch, "owned-lock")
    locks = copy.parent.parent / ".locks"
    lock = locks / f"acme--owned-lock--{commit}.lock"
    if planted == "directory at the lock":
        lock.unlink()
        lock.mkdir()
        (lock / "theirs").write_bytes(b"another user's")
        os.chown(lock, 1000, 1000)
        os.chown(lock / "theirs", 2000, 2000)
    what = locks if planted == "locks of another uid" else lock
    if planted != "directory at the lock":
        os.chown(what, 2000, 2000)
        what.chmod(0o755 if what == locks else 0o644)
    state = lambda: [(p, p.stat().st_uid, p.stat().st_mode) for p in (what, *what.rglob("*"))]  # noqa: E731
    before, content = state(), tree(what) if what.is_dir() else what.read_bytes()
    assert delete_model("owned-lock") == "Released"
    (artifact,) = wk.registry.list_artifacts()
    assert f"cannot collect: refusing {what}" in artifact.message, artifact.message
    assert copy.is_dir() and state() == before and (tree(what) if what.is_dir() else what.read_bytes()) == content
    if what == locks:
        os.chown(locks, 1000, 1000)
        locks.chmod(0o700)
    else:
        os.rename(lock, tmp_path / "moved-away")
    assert reconcile()[str(copy)] == "collected" and not copy.exists()


def test_a_models_root_wider_than_the_open_file_limit_keeps_garbage_collection_going(wk, hub):
    """A user makes 1,500 directories in their part of the models root; the service runs with the usual limit of 1,024
    open files (a process of its own here). The scan for links into an unused copy still sees all of them (one
    directory open per level): a link in the last keeps the copy, and once it is gone the copy is collected."""
    commit = hub.add_repo("acme/wide-root", tiny_files("wide-root"))
    wk.declare("wide-root", "hf://acme/wide-root", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("wide-root") == "Ready"
    copy = shared_dir(wk, "acme--wide-root", commit)
    user = wk.volumes["team-a"] / "models" / "bob"
    for i in range(1500):
        (user / f"run-{i:04}").mkdir(parents=True)
    (user / "run-1499" / "weights").symlink_to(copy)
    assert delete_model("wide-root") == "Released" and copy.is_dir()
    limited = ("import json, resource; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit("
               "resource.RLIMIT_NOFILE)[1])); from weightkeeper.flows.reconcile import reconcile; "
               "print(json.dumps({k: str(v) for k, v in reconcile().items()}))")

    def reconcile_limited() -> dict[str, str]:
        run = subprocess.run([sys.executable, "-c", limited], env=dict(os.environ), capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    assert reconcile_limited()[str(copy)] == "linked" and copy.is_dir()
    assert f"{user}/run-1499/weights" in wk.registry.list_artifacts()[0].message
    (user / "run-1499" / "weights").unlink()
    assert reconcile_limited()[str(copy)] == "collected" and not copy.exists()
