"""Repairs and their outcomes: what a repair of a shared copy restores, why a repair waits, a path swapped while
it is measured, and the cleanup of a workspace renamed in the config. The tests act as the workspace user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import tiny_files
from test_attacks import tree
from test_sharing import SHARD, shared_dir
from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile


def test_a_repaired_shared_copy_never_makes_ready_a_path_whose_link_was_replaced(wk, hub):
    """A user replaces one model's link with a directory of their own while the shared copy is damaged: the pass
    fails that path (its link check), then repairs the copy. The repair restores the path it failed, never the one
    whose link is gone: that path stays Failed, saying what stands there and what to do."""
    files = tiny_files("relink-repair")
    commit = hub.add_repo("acme/relink-repair", files)
    wk.declare("rr-one", "hf://acme/relink-repair", workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("rr-two", "hf://acme/relink-repair", workspaces=["team-a"], subpath="models/rr-two",
               download_policy="reuse-if-exists")
    assert ensure_model("rr-one") == "Ready" and ensure_model("rr-two") == "Ready"
    copy = shared_dir(wk, "acme--relink-repair", commit)
    two = Path(wk.registry.get_model("rr-two").local_paths[0].path)
    two.unlink()
    two.mkdir()
    (two / "mine.txt").write_text("mine")
    os.truncate(copy / SHARD, 10)

    outcomes = reconcile()
    assert outcomes[str(two)] == "failed" and outcomes[str(copy)] == "repaired"
    assert (copy / SHARD).read_bytes() == files[SHARD]
    one, model = wk.registry.get_model("rr-one"), wk.registry.get_model("rr-two")
    assert one.phase == "Ready" and one.local_paths[0].status == "Ready"
    entry = model.local_paths[0]
    assert entry.status == "Failed" and model.phase == "Failed"
    assert f"{two} is a directory where weightkeeper's link" in entry.message and "move it away" in entry.message
    assert "model retry rr-two" in model.message
    assert tree(two) == {"mine.txt": b"mine"}


def test_a_failed_shared_repair_tells_why_only_to_the_owner_of_the_model_it_fetched_for(wk, hub):
    """Alice's and bob's models share a copy; it is damaged and its repair fetches for alice's model, the copy's
    first (with her token block, were there one), which the Hub refuses. Alice is told why; bob only that the
    files could not be fetched again from where another user's model gets them."""
    files = tiny_files("repair-theirs")
    commit = hub.add_repo("acme/repair-theirs", files)
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("rt-alice", "hf://acme/repair-theirs", **shared)
    wk.declare("rt-bob", "hf://acme/repair-theirs", subpath="models/bob", owner_name="bob", owner_uid=1001, **shared)
    assert ensure_model("rt-alice") == "Ready" and ensure_model("rt-bob") == "Ready"
    copy = shared_dir(wk, "acme--repair-theirs", commit)
    os.truncate(copy / SHARD, 10)
    hub.fail_next(20, 403, repo_id="acme/repair-theirs")
    try:
        assert reconcile()[str(copy)] == "failed"
    finally:
        hub.clear_faults()
    alice, bob = wk.registry.get_model("rt-alice"), wk.registry.get_model("rt-bob")
    assert alice.phase == bob.phase == "Failed"
    assert alice.message.startswith(f"repair of shared copy {copy} failed: ") and "403" in alice.message
    assert "from where another user's model gets them" in bob.message and "403" not in bob.message, bob.message


@pytest.mark.parametrize("why", ["space", "deadline"])
def test_a_repair_short_of_space_or_time_waits_and_says_why_to_every_user(wk, hub, why):
    """A shared copy's repair that finds no room on the volume, or runs out of its download time, is no failure of
    the copy or its source: the copy stays under repair (retried on every pass) and each user's model says why and
    what to do, naming no other user's model; once there is room (or time) the next pass repairs it."""
    repo = f"acme/waits-{why}"
    files = tiny_files(f"waits-{why}")
    commit = hub.add_repo(repo, files)
    wk.declare(f"w{why}-a", f"hf://{repo}", workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare(f"w{why}-b", f"hf://{repo}", workspaces=["team-a"], subpath=f"models/w{why}-b",
               download_policy="reuse-if-exists", owner_name="bob", owner_uid=1001)
    assert ensure_model(f"w{why}-a") == "Ready" and ensure_model(f"w{why}-b") == "Ready"
    copy = shared_dir(wk, f"acme--waits-{why}", commit)
    (copy / SHARD).unlink()
    if why == "space":
        wk.rewrite(hf_endpoint=hub.url, free_space_margin_bytes=1 << 60)
    else:
        wk.rewrite(hf_endpoint=hub.url, download_timeout_seconds=1)
        hub.set_throttle(8 * 1024, repo_id=repo)
    try:
        assert reconcile()[str(copy)] == "postponed"
    finally:
        hub.set_throttle(None, repo_id=repo)
    (artifact,) = wk.registry.list_artifacts()
    assert artifact.state == "Repairing"
    said = "free_space_margin_bytes" if why == "space" else "download_timeout_seconds"
    for name, other in ((f"w{why}-a", f"w{why}-b"), (f"w{why}-b", f"w{why}-a")):
        model = wk.registry.get_model(name)
        assert model.phase == "Failed" and said in model.message and "the next pass" in model.message, model.message
        assert "could not be fetched again" not in model.message and repr(other) not in model.message
    wk.rewrite(hf_endpoint=hub.url)
    assert reconcile()[str(copy)] == "repaired"
    assert (copy / SHARD).read_bytes() == files[SHARD]
    assert [wk.registry.get_model(n).phase for n in (f"w{why}-a", f"w{why}-b")] == ["Ready", "Ready"]


def test_a_link_swapped_in_after_a_repair_fails_the_path_not_the_task(wk, hub, monkeypatch):
    """The user swaps the own copy's parent for a link to it between the repair and its measure: nothing is
    followed, the path fails with one line saying why and what to do, its lease is let go and the pass goes on."""
    from weightkeeper.tasks import verify

    files = tiny_files("swap-measure")
    hub.add_repo("acme/swap-measure", files)
    wk.declare("swap-measure", "hf://acme/swap-measure", workspaces=["team-a"], subpath="models/swapped")
    assert ensure_model("swap-measure") == "Ready"
    path = Path(wk.registry.get_model("swap-measure").local_paths[0].path)
    parent, moved = path.parent, path.parent.with_name("swapped.moved")
    os.truncate(path / SHARD, 10)
    refetch = verify._refetch_hashed

    def then_swapped(*args, **kwargs):
        remaining = refetch(*args, **kwargs)
        parent.rename(moved)
        parent.symlink_to(moved.name)
        return remaining

    monkeypatch.setattr(verify, "_refetch_hashed", then_swapped)
    assert reconcile()[str(path)] == "failed"
    model = wk.registry.get_model("swap-measure")
    entry = model.local_paths[0]
    assert model.phase == "Failed" and entry.status == "Failed" and entry.lease is None
    assert "symlink" in entry.message and "the next pass" in entry.message and "\n" not in entry.message
    assert (moved / path.name / SHARD).read_bytes() == files[SHARD] and parent.is_symlink()


@pytest.mark.parametrize("pool", [None, "elsewhere"])
def test_a_workspace_renamed_in_the_config_keeps_the_files_and_says_what_to_do(wk, hub, pool):
    """A workspace renamed in the config, on the same volume (and pool, or another): whether the new name's volume
    is the same filesystem (not another host's disk or a Kubernetes volume at the same path) only the admin knows,
    so the path is not removed; the message names the workspace that holds its volume and what to declare, and
    the deletion finishes once it is declared again."""
    name = f"renamed-ws-{pool or 'same'}"
    hub.add_repo(f"acme/{name}", tiny_files(name))
    wk.declare(name, f"hf://acme/{name}", workspaces=["team-a"])
    assert ensure_model(name) == "Ready"
    path = Path(wk.registry.get_model(name).local_paths[0].path)
    renamed = [{**w, "name": "team-a-new", **({"work_pool": pool} if pool else {})} if w["name"] == "team-a" else w
               for w in wk._workspaces]
    wk.rewrite(hf_endpoint=hub.url, workspaces=renamed)
    with pytest.raises(Exception, match=f"cleanup of '{name}' incomplete"):
        delete_model(name)
    model = wk.registry.get_model(name)
    assert model.phase == "Deleting" and path.is_dir() and model.local_paths
    assert "workspace 'team-a' is no longer declared" in model.message and "'team-a-new'" in model.message
    assert "declare 'team-a' again" in model.message
    wk.rewrite(hf_endpoint=hub.url)
    assert delete_model(name) == "Released" and not path.exists()


def test_a_repair_the_volume_refuses_fails_the_copy_lets_it_go_and_the_next_pass_repairs_it(wk, hub, monkeypatch):
    """The volume answers the repair with an I/O error: the copy is Failed with that error, its lease let go (not held
    by a task that died until it lapses), its users say why; once the volume answers again, the next pass repairs it."""
    import errno

    from weightkeeper.tasks import verify

    files = tiny_files("eio-repair")
    commit = hub.add_repo("acme/eio-repair", files)
    wk.declare("eio-repair", "hf://acme/eio-repair", workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("eio-bob", "hf://acme/eio-repair", workspaces=["team-a"], subpath="models/eio-bob",
               download_policy="reuse-if-exists", owner_name="bob", owner_uid=1001)
    assert ensure_model("eio-repair") == "Ready" and ensure_model("eio-bob") == "Ready"
    copy = shared_dir(wk, "acme--eio-repair", commit)
    os.truncate(copy / SHARD, 10)

    def refused(path, *args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    with monkeypatch.context() as patched:
        patched.setattr(verify, "own_copy", refused)
        assert reconcile()[str(copy)] == "failed"
    (artifact,) = wk.registry.list_artifacts()
    assert artifact.state == "Failed" and artifact.lease is None and "Input/output error" in artifact.message
    for name in ("eio-repair", "eio-bob"):  # the volume's error is each user's concern, said as it is
        model = wk.registry.get_model(name)
        assert model.phase == "Failed" and "Input/output error" in model.message, model.message
    assert reconcile()[str(copy)] == "repaired" and (copy / SHARD).read_bytes() == files[SHARD]
    assert [wk.registry.get_model(n).phase for n in ("eio-repair", "eio-bob")] == ["Ready", "Ready"]
