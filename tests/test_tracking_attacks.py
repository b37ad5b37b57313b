"""Tracking and switching under attack or fault: a `model update` that lands while a check or a switch is out, a
switch killed between its rename and its record whose branch then goes back (or whose Hub then refuses, or whose
path lease has not lapsed), a Hub down through a check's retries, a switch on demand that fails after its rename, two
switches that each fit a workspace's capacity but not together, a path an earlier switch left on another commit, a
model moved after a killed switch, and a switch back left unfinished on a model nothing asks again.
"""

from __future__ import annotations

import os

import pytest

from test_reuse import SHARDS, commit_files
from test_tracking import B_CHANGES, _split
from weightkeeper.errors import WeightkeeperError
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile
from weightkeeper.layout import copy_name
from weightkeeper.registry import Registry
from weightkeeper.registry.leases import Kind


class Killed(WeightkeeperError):
    pass


def _killed(*args, **kwargs):
    raise Killed("killed between the rename and its record")


def _first(action, real):
    """`real`, with `action()` done just before each call to it (a user acting meanwhile)."""
    def call(*args, **kwargs):
        action()
        return real(*args, **kwargs)
    return call


@pytest.mark.parametrize("when", ["checking", "failing", "switching"])
def test_a_revision_asked_for_while_a_check_is_out_is_never_taken_for_the_commit_switched_to(wk, hub, monkeypatch,
                                                                                            when):
    """`model update --revision v2` lands while the hourly check of `main` is out (and gets no answer, or while its
    switch downloads): the model never records v2 as its revision at main's commit, and v2 stays due, so the next
    run switches to it."""
    import weightkeeper.tasks.switch as switch
    from weightkeeper.errors import DownloadError

    def failing(*args, **kwargs):
        raise DownloadError("the Hub is down; will retry")

    monkeypatch.setattr(switch.check_head, "retry_delay_seconds", [0, 0])

    name, repo = f"asked-{when}", f"acme/track-asked-{when}"
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}@main", workspaces=["team-a"], track=True)
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    b = hub.add_repo(repo, commit_files("B", B_CHANGES))
    c = hub.add_repo(repo, commit_files("C", (SHARDS[2],)), revision="v2")

    def asking(real):
        return _first(lambda: wk.registry.request_revision(name, "v2"), real)  # the user, meanwhile

    with monkeypatch.context() as patched:
        if when != "switching":
            patched.setattr(switch, "resolve", asking(switch.resolve if when == "checking" else failing))
        else:
            patched.setattr(Registry, "path_switched", asking(Registry.path_switched))
        assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == (b if when == "switching" else a)
    assert model.revision == "main" and model.source == f"hf://{repo}@main" and model.next_revision == "v2"
    assert model.head_checked_at is None  # still due: `update_due` asks for v2 on the next pass

    assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == c and model.revision == "v2" and model.next_revision is None
    assert os.readlink(path) == f"_artifacts/{repo.replace('/', '--')}/{c}"


@pytest.mark.parametrize("then", ["reverted", "refused"])
def test_a_killed_switch_is_rolled_back_before_a_check_drops_its_pending_commit(wk, hub, monkeypatch, then):
    """A switch renames the link to B's copy over A's and dies before the registry records it. Before any pass, the
    branch goes back to A (or the Hub refuses the check) and the model is ensured (`model ensure`): the check puts
    the recorded link back before it drops B, so the path is never failed as someone else's link, and it reads A."""
    name, repo = f"killed-{then}", f"acme/track-killed-{then}"
    a_files = commit_files("A")
    a = hub.add_repo(repo, a_files)
    wk.declare(name, f"hf://{repo}", workspaces=["team-a"], track=True)
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    copies = f"_artifacts/{repo.replace('/', '--')}"
    b = hub.add_repo(repo, commit_files("B", B_CHANGES))
    with monkeypatch.context() as patched:
        patched.setattr(Registry, "path_switched", _killed)
        ensure_model(name, return_state=True)
    assert os.readlink(path) == f"{copies}/{b}" and wk.registry.get_model(name).pending_commit == b

    if then == "reverted":
        hub.add_repo(repo, a_files)
    else:
        hub.fail_next(1, 403, repo_id=repo)
    assert ensure_model(name) == "Ready"
    assert os.readlink(path) == f"{copies}/{a}"
    assert {n: open(f"{path}/{n}", "rb").read() for n in a_files} == a_files
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit is None and model.local_paths[0].status == "Ready"
    assert "never recorded" in model.local_paths[0].message
    assert reconcile()[path] == "linked"
    assert wk.registry.get_model(name).phase == "Ready"


@pytest.mark.parametrize("beside", [None, "other-patterns", "other-owner"])
def test_two_switches_that_each_fit_the_capacity_but_not_together_are_not_both_recorded(wk, hub, monkeypatch, beside):
    """Two tracked models in one workspace move at once: the first switch is recorded but its copy not made yet
    (its path runs queue in their pool); the second check counts what the first will add, and is held. A copy of
    the first one's new commit recorded there with other file patterns, or on another owner's shelf (another
    model's), is not its copy."""
    import weightkeeper.flows.ensure_model as ensure

    a_files, b_files = commit_files("A"), commit_files("B", B_CHANGES)
    size, changed = sum(map(len, a_files.values())), sum(len(b_files[n]) for n in B_CHANGES)
    capacity = 2 * size + 2 * changed - 1  # room for one switch's changed files, not for two
    wk.rewrite(hf_endpoint=hub.url, workspaces=[
        {"name": "team-a", "volume": str(wk.volumes["team-a"]), "capacity_bytes": capacity}])
    repos = {"cap-one": "acme/track-cap-one", "cap-two": "acme/track-cap-two"}
    for name, repo in repos.items():
        hub.add_repo(repo, a_files)
        wk.declare(name, f"hf://{repo}", workspaces=["team-a"], track=True)
        assert ensure_model(name) == "Ready"
    one, two = (hub.add_repo(repo, b_files) for repo in repos.values())
    with monkeypatch.context() as patched:
        patched.setattr(ensure, "_switch", lambda name: None)  # recorded, its path runs not started yet
        assert ensure_model("cap-one") == "Ready"
    assert wk.registry.get_model("cap-one").pending_commit == one
    if beside:  # another model's copy of that commit: its own patterns, or its owner's shelf
        volume, cluster = str(wk.volumes["team-a"]), wk.registry.get_model("cap-one").local_paths[0].cluster
        shelf, copy = ("_artifacts", copy_name(one, ["*.json"], None)) if beside == "other-patterns" else \
            ("_artifacts.4242", one)
        beside = wk.registry.artifact_for(repos["cap-one"], one, cluster, volume,
                                          f"{volume}/models/{shelf}/acme--track-cap-one/{copy}", [])

    assert ensure_model("cap-two") == "Ready"
    model = wk.registry.get_model("cap-two")
    assert model.pending_commit is None and model.commit != two
    assert model.message.startswith(f"update to {two} held: workspace 'team-a' stores {2 * size + changed} of its "
                                    f"capacity_bytes = {capacity} bytes, and this model needs {changed} bytes")
    assert f"(its stored bytes count the {changed} that other models' recorded switches add); it stays on" in \
        model.message
    if beside:  # its files are not the commit's: a switch to it would be held (`head_checked`)
        wk.registry.delete_artifact(beside.id)
    assert ensure_model("cap-one") == "Ready"
    model = wk.registry.get_model("cap-one")
    assert model.commit == one, model.message


def test_a_failed_switch_names_the_commit_the_path_is_on_not_the_models(wk, hub):
    """team-a's path switched to B, team-b's could not; main moves on to C and team-a's switch to C fails: its
    message says it stays on B, where it is, not on the model's A."""
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0)
    a, b, p1, p2, copies = _split(wk, hub, "split-said", "acme/track-split-said", track=True)
    assert ensure_model("split-said") == "Ready" and os.readlink(p1) == f"{copies}/{b}"
    c = hub.add_repo("acme/track-split-said", commit_files("C", (SHARDS[2],)))
    hub.fail_next(2, 403, repo_id="acme/track-split-said", path_contains=SHARDS[2])
    assert ensure_model("split-said") == "Ready"
    model = wk.registry.get_model("split-said")
    said = {p.path: p.message for p in model.local_paths}
    assert model.commit == a and os.readlink(p1) == f"{copies}/{b}"
    assert said[p1].startswith(f"update to {c} failed: ") and said[p1].endswith(f"; {p1} stays on {b}")


def _switch_killed(wk, hub, name: str, repo: str, **declared) -> tuple[str, str, dict, str, str]:
    """A model of `repo` Ready on A; B is added (at `main`, or at v2 asked for with `model update`) and its switch
    renames the path's link to B's copy, then dies before the registry records it: (a, b, a_files, path, copies)."""
    a_files = commit_files("A")
    a = hub.add_repo(repo, a_files)
    wk.declare(name, f"hf://{repo}", workspaces=["team-a"], **declared)
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    b = hub.add_repo(repo, commit_files("B", B_CHANGES), revision="main" if declared.get("track") else "v2")
    if not declared.get("track"):
        wk.registry.request_revision(name, "v2")
    return a, b, a_files, path, f"_artifacts/{repo.replace('/', '--')}"


@pytest.mark.parametrize("then", ["reverted", "offline", "refused"])
def test_a_killed_switch_whose_path_is_still_held_keeps_its_pending_commit_until_its_link_is_back(wk, hub,
                                                                                                 monkeypatch, then):
    """A switch on another host renames the link to B's copy and dies before the registry records it; its path lease
    has not lapsed when the next check comes, so the check cannot put the link back. Whatever the Hub answers then
    (main back at A, no answer, a refusal), B stays pending: once the lease lapses the link check still knows that
    link for the killed switch's, puts A's back, and the path is never failed as someone else's link."""
    import weightkeeper.tasks.switch as switch
    from weightkeeper.registry import Holder

    monkeypatch.setattr(switch.check_head, "retry_delay_seconds", [0, 0])
    name, repo = f"held-{then}", f"acme/track-held-{then}"
    a, b, a_files, path, copies = _switch_killed(wk, hub, name, repo, track=True)
    with monkeypatch.context() as patched:
        patched.setattr(Registry, "path_switched", _killed)
        ensure_model(name, return_state=True)
    entry = wk.registry.get_model(name).local_paths[0]
    elsewhere = Holder("run-9/1", "gpu-9", 4242, 99.0)  # the killed switch's, on another host: not lapsed yet
    assert wk.registry.claim_switch(name, entry.id, elsewhere, 600, wk.registry.get_model(name).pending_commit) == \
        "claimed"
    assert os.readlink(path) == f"{copies}/{b}"

    if then == "reverted":
        hub.add_repo(repo, a_files)
    elif then == "offline":
        hub.set_offline(True)
    else:
        hub.fail_next(1, 403, repo_id=repo)
    try:
        assert ensure_model(name) == "Ready"
    finally:
        hub.set_offline(False)
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit == b and model.head_checked_at is not None
    assert os.readlink(path) == f"{copies}/{b}" and model.local_paths[0].status == "Ready"
    assert path in model.message and "it stays on" in model.message

    wk.registry.end_switch(name, entry.id, elsewhere)  # its lease lapses
    assert reconcile()[path] == "relinked"
    assert os.readlink(path) == f"{copies}/{a}"
    assert {n: open(f"{path}/{n}", "rb").read() for n in a_files} == a_files
    model = wk.registry.get_model(name)
    assert model.phase == "Ready" and model.local_paths[0].status == "Ready"
    assert "never recorded" in model.local_paths[0].message


@pytest.mark.parametrize("tracked", [False, True])
def test_a_hub_outage_during_the_check_forgets_neither_the_asked_revision_nor_the_pending_switch(wk, hub,
                                                                                               monkeypatch, tracked):
    """`model update --revision v2` (or main's move, for a tracked model) is recorded, and the Hub is down when it is
    checked, through the check's retries: nothing is switched and nothing forgotten (v2 stays asked for, a pending
    commit stays pending), the model says why, and this pass does not ask again; once the Hub is back, the next
    check (`model ensure`) switches."""
    import weightkeeper.tasks.switch as switch
    from weightkeeper.desired import update_due

    monkeypatch.setattr(switch.check_head, "retry_delay_seconds", [0, 0])
    name, repo = f"outage-{tracked}".lower(), f"acme/track-outage-{tracked}".lower()
    a, b, a_files, path, copies = _switch_killed(wk, hub, name, repo, **({"track": True} if tracked else {
        "download_policy": "reuse-if-exists"}))
    if tracked:
        with monkeypatch.context() as patched:
            patched.setattr(Registry, "path_switched", _killed)
            ensure_model(name, return_state=True)
        assert wk.registry.get_model(name).pending_commit == b
    before = wk.registry.get_model(name)
    hub.set_offline(True)
    try:
        assert ensure_model(name) == "Ready"
    finally:
        hub.set_offline(False)
    model = wk.registry.get_model(name)
    assert model.commit == a and model.next_revision == before.next_revision == (None if tracked else "v2")
    assert model.pending_commit == before.pending_commit == (b if tracked else None)
    assert model.message.startswith(f"cannot check {'main' if tracked else 'v2'}: ") and f"it stays on {a}" in \
        model.message and "503" in model.message
    assert not update_due(model.phase, model.track, model.next_revision, model.head_checked_at,
                          model.head_checked_at, 3600, model.id, pending=False)  # not asked again in this pass

    assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == b and model.pending_commit is None and model.next_revision is None
    assert model.revision == ("main" if tracked else "v2") and os.readlink(path) == f"{copies}/{b}"


@pytest.mark.parametrize("then", ["released", "unreleased"])
def test_a_switch_on_demand_that_fails_after_its_rename_is_put_back_before_the_revision_is_held(wk, hub,
                                                                                                monkeypatch, then):
    """`model update --revision v2` on a model no check comes to by itself: its switch renames the link to B's copy
    and fails before the registry records it. The run holds v2 (asked again by the next `model update` or
    `model ensure`) only after it put A's link back: the path is never failed as someone else's link. When the
    failed switch's path lease is not let go either (its end never recorded), the link cannot be put back yet: B
    stays pending, so the next pass still knows that link for the switch's."""
    name, repo = f"demand-{then}", f"acme/track-demand-{then}"
    a, b, a_files, path, copies = _switch_killed(wk, hub, name, repo, download_policy="reuse-if-exists")
    with monkeypatch.context() as patched:
        patched.setattr(Registry, "path_switched", _killed)
        if then == "unreleased":
            patched.setattr(Registry, "end_switch", lambda *args, **kwargs: None)
        assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == a and model.next_revision == "v2"
    if then == "unreleased":
        assert model.pending_commit == b and os.readlink(path) == f"{copies}/{b}"
        assert f"{path} links to the copy of {b}, a switch never recorded, and cannot be linked back now" in \
            model.message
        entry = model.local_paths[0]
        wk.registry.release_lease("path", entry.id, wk.registry.lease_of("path", entry.id).holder)  # it lapses
        assert reconcile()[path] == "relinked"
        model = wk.registry.get_model(name)
    assert os.readlink(path) == f"{copies}/{a}" and "never recorded" in model.local_paths[0].message
    assert {n: open(f"{path}/{n}", "rb").read() for n in a_files} == a_files
    assert reconcile()[path] == "linked" and wk.registry.get_model(name).phase == "Ready"

    assert ensure_model(name) == "Ready"  # `model ensure`: asked again
    model = wk.registry.get_model(name)
    assert model.commit == b and model.revision == "v2" and os.readlink(path) == f"{copies}/{b}"


@pytest.mark.parametrize("tracked", [True, False])
def test_a_move_after_a_killed_switch_keeps_its_pending_commit_so_the_pass_still_knows_its_link(wk, hub,
                                                                                                monkeypatch, tracked):
    """A switch (main's move, or `model update --revision v2`) renames the link to B's copy and its run is killed
    before the registry records it; the owner then moves the model (`model update --download-policy
    reuse-if-exists`: the same paths), and a reconcile pass comes before the move's run. The move keeps B pending
    (and v2 asked for), so the pass still knows that link for the killed switch's: it puts A's back rather than
    failing the path as someone else's link, the move's run finishes on A, and the next run switches to B."""
    import weightkeeper.flows.ensure_model as ensure
    from weightkeeper.service import move_model

    name, repo = f"moved-{tracked}".lower(), f"acme/track-moved-{tracked}".lower()
    a, b, a_files, path, copies = _switch_killed(wk, hub, name, repo, **({"track": True} if tracked else {
        "download_policy": "reuse-if-exists"}))
    with monkeypatch.context() as patched:
        patched.setattr(Registry, "path_switched", _killed)
        patched.setattr(ensure, "hold_switch", _killed)  # the run dies before it holds v2
        ensure_model(name, return_state=True)
    assert os.readlink(path) == f"{copies}/{b}" and wk.registry.get_model(name).pending_commit == b

    assert move_model(wk.settings, wk.registry, name, subpath=None, download_policy="reuse-if-exists").phase == \
        "Pending"
    model = wk.registry.get_model(name)
    assert model.pending_commit == b and model.next_revision == (None if tracked else "v2")
    assert reconcile()[path] == "relinked"  # the pass also runs the move's ensure-model here
    assert os.readlink(path) == f"{copies}/{a}"
    assert {n: open(f"{path}/{n}", "rb").read() for n in a_files} == a_files
    model = wk.registry.get_model(name)
    assert model.phase == "Ready" and model.commit == a and model.local_paths[0].status == "Ready"
    assert model.pending_commit == b

    assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == b and model.pending_commit is None and os.readlink(path) == f"{copies}/{b}"
    assert model.revision == ("main" if tracked else "v2") and model.next_revision is None


def test_a_switch_back_left_unfinished_is_finished_by_a_plain_ensure(wk, hub, monkeypatch):
    """`model update --revision v2` on a model no check comes to by itself: its path switches to B and the run is
    killed before it records the model's switch; v2 then returns to A, and the next run finds nothing to switch to,
    so the path must go back to A: killed again before it does. v2 then moves on to C. A plain `model ensure`
    (nothing asked any more) switches the path back to A, never to C, and records that nothing is pending."""
    import weightkeeper.flows.ensure_model as ensure

    name, repo = "back-unfinished", "acme/track-back-unfinished"
    a, b, a_files, path, copies = _switch_killed(wk, hub, name, repo, download_policy="reuse-if-exists")
    with monkeypatch.context() as patched:
        patched.setattr(Registry, "model_switched", _killed)
        ensure_model(name, return_state=True)
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit == b and os.readlink(path) == f"{copies}/{b}"

    hub.add_repo(repo, a_files, revision="v2")
    with monkeypatch.context() as patched:
        patched.setattr(ensure, "_switch", _killed)
        ensure_model(name, return_state=True)
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit == a and model.next_revision is None and not model.track
    assert wk.registry.get_artifact(model.local_paths[0].artifact_id).commit == b  # on another commit

    hub.add_repo(repo, commit_files("C", (SHARDS[2],)), revision="v2")
    assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert os.readlink(path) == f"{copies}/{a}" and model.pending_commit is None and model.commit == a
    assert wk.registry.get_artifact(model.local_paths[0].artifact_id).commit == a
    assert {n: open(f"{path}/{n}", "rb").read() for n in a_files} == a_files
    assert model.phase == "Ready" and model.local_paths[0].status == "Ready" and model.revision == "v2"


def test_another_users_model_never_joins_a_path_while_its_model_switches(wk, hub, monkeypatch):
    """`model update --revision v2` on alice's model (no other model on its path when asked, or when its switch is
    claimed); while the switch fills v2's copy, bob declares the same repository with no subpath, which one link
    would serve both. Alice's path may link to v2 already (a model of several paths switches each in turn) while her
    record says A: bob is refused, and alice ends on v2; once it is recorded he may share it."""
    import weightkeeper.tasks.download as download
    from weightkeeper.errors import ConflictError

    repo = "acme/track-joined"
    hub.add_repo(repo, commit_files("A"))
    b = hub.add_repo(repo, commit_files("B", B_CHANGES), revision="v2")
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("alices-joined", f"hf://{repo}", **shared)
    assert ensure_model("alices-joined") == "Ready"
    path = wk.registry.get_model("alices-joined").local_paths[0].path
    wk.registry.request_revision("alices-joined", "v2")
    fill, refused = download._fill_shared_copy, []

    def joined(*args, **kwargs):  # bob, while the new copy is filled
        with pytest.raises(ConflictError, match=f"already owns {path}") as e:
            wk.declare("bobs-joined", f"hf://{repo}", owner_name="bob", owner_uid=1001, **shared)
        refused.append(str(e.value))
        return fill(*args, **kwargs)

    monkeypatch.setattr(download, "_fill_shared_copy", joined)
    assert ensure_model("alices-joined") == "Ready"
    alice = wk.registry.get_model("alices-joined")
    assert refused and wk.registry.find_model("bobs-joined") is None
    assert alice.commit == b and alice.pending_commit is None
    assert os.readlink(path) == f"_artifacts/{repo.replace('/', '--')}/{b}"
    wk.declare("bobs-joined", f"hf://{repo}@v2", owner_name="bob", owner_uid=1001, **shared)
    assert ensure_model("bobs-joined") == "Ready" and wk.registry.get_model("bobs-joined").local_paths[0].path == path


def _relist(hub, repo: str, commit: str, files: dict[str, bytes]) -> None:
    """The hostile Hub: `commit` of `repo` lists `files` from now on (a commit's files never change on a real Hub)."""
    import dataclasses

    other = hub.add_repo(repo, files, revision="relisted")
    commits = hub._repos[repo].commits
    commits[commit] = dataclasses.replace(commits[other], sha=commit)


def _listing(files: dict[str, bytes]) -> list[dict]:
    """`files` as a Hub lists them: shards by sha256 (LFS), the rest by git blob sha1."""
    import hashlib

    return [{"path": n, "size": len(v), "blobId": hashlib.sha1(b"blob %d\0" % len(v) + v).hexdigest(),
             "sha256": hashlib.sha256(v).hexdigest() if n.endswith(".safetensors") else None, "md5": None}
            for n, v in files.items()]


@pytest.mark.parametrize("when", ["checked", "switched"])
def test_a_commit_the_hub_lists_otherwise_than_its_copy_on_the_volume_is_never_recorded(wk, hub, when):
    """Bob's model of v2 (commit B) is Ready on its shared copy; the Hub then lists B with another third shard. Alice's
    tracked model sees main move to B: her check holds the switch, naming the file (or, when her switch was recorded
    before bob's copy was made, her switch fails): she is never recorded on B with a manifest the copy she would
    link to does not hold, and her path stays on A. Carol's new model of v2 fails the same way, linked to nothing."""
    name, repo = f"relisted-{when}", f"acme/track-relisted-{when}"
    a = hub.add_repo(repo, commit_files("A"))
    b_files = commit_files("B", B_CHANGES)
    b = hub.add_repo(repo, b_files, revision="v2")
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare(name, f"hf://{repo}", track=when == "checked", **shared)
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    other = commit_files("B", (*B_CHANGES, SHARDS[2]))
    if when == "switched":  # recorded while no copy of B was on the volume
        assert wk.registry.head_checked(name, b, _listing(other), asked="main")
    wk.declare(f"bobs-{when}", f"hf://{repo}@v2", subpath=f"models/bob-{when}", owner_name="bob", owner_uid=1001,
               **shared)
    assert ensure_model(f"bobs-{when}") == "Ready"
    _relist(hub, repo, b, other)
    assert hub.add_repo(repo, b_files) == b  # main moves to B, which the Hub now lists otherwise

    assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit is None
    said = "of it otherwise than" if when == "checked" else f"of {repo}@{b} otherwise than when its shared copy"
    assert f"the Hub lists {SHARDS[2]} {said}" in model.message and f"stays on {a}" in model.message
    assert os.readlink(path) == f"_artifacts/{repo.replace('/', '--')}/{a}"
    assert {n: open(f"{path}/{n}", "rb").read() for n in b_files} == commit_files("A")

    # a first download of B, listed otherwise than its copy: never linked to it, never recorded with that listing
    wk.declare(f"carols-{when}", f"hf://{repo}@v2", subpath=f"models/carol-{when}", owner_name="carol",
               owner_uid=1002, **shared)
    assert ensure_model(f"carols-{when}") == "Failed"
    carol = wk.registry.get_model(f"carols-{when}")
    assert f"the Hub lists {SHARDS[2]} of {repo}@{b} otherwise than when its shared copy" in \
        carol.local_paths[0].message
    assert carol.local_paths[0].artifact_id is None and not os.path.lexists(carol.local_paths[0].path)


def test_a_switch_run_started_for_a_commit_no_longer_pending_switches_nothing(wk, hub):
    """A deployed path run queued past its parent's deadline still carries the commit pending when it started; the
    head moved on since (or the switch was held): its claim is settled, nothing is switched or leased, and a run for
    the commit pending now claims the path."""
    from weightkeeper.registry import Holder

    name, repo = "stale-switch", "acme/track-stale-switch"
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}", track=True, workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model(name) == "Ready"
    b_files, c_files = commit_files("B", B_CHANGES), commit_files("C", (*B_CHANGES, SHARDS[2]))
    b, c = (hub.add_repo(repo, files, revision=rev) for files, rev in ((b_files, "v2"), (c_files, "v3")))
    assert wk.registry.head_checked(name, b, _listing(b_files), asked="main")  # the stale run's commit
    assert wk.registry.head_checked(name, c, _listing(c_files), asked="main")  # pending now
    entry, run = wk.registry.get_model(name).local_paths[0], Holder.here("switch-stale")
    assert wk.registry.claim_switch(name, entry.id, run, 600, b) == "settled"
    assert wk.registry.lease_of(Kind.PATH, entry.id) is None and wk.registry.get_model(name).commit == a
    assert wk.registry.claim_switch(name, entry.id, run, 600, c) == "claimed"


@pytest.mark.parametrize("at", ["claim", "fill"])
def test_a_switch_run_that_carries_another_listing_of_the_pending_commit_is_never_recorded(wk, hub, monkeypatch, at):
    """A path run (deployed, queued past its parent's deadline) carries pending commit B as the Hub listed it then;
    the next check, before any copy of B was made (before the run claimed the path, or after, before it recorded
    B's copy), gets B listed otherwise (a hostile Hub) and records that listing. The stale run fills B's copy from
    its own listing: the model is never recorded on B with a manifest that copy does not hold."""
    import weightkeeper.tasks.download as download
    from weightkeeper.download import listed_otherwise
    from weightkeeper.tasks.switch import finish_switch, pending, switch_path

    name, repo = f"stale-listing-{at}", f"acme/track-stale-listing-{at}"
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}", track=True, workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model(name) == "Ready"
    entry = wk.registry.get_model(name).local_paths[0]
    b_files, other = commit_files("B", B_CHANGES), commit_files("B", (*B_CHANGES, SHARDS[2]))
    b = hub.add_repo(repo, b_files)
    assert wk.registry.head_checked(name, b, _listing(b_files), asked="main")
    stale = pending(wk.registry.get_model(name))  # what the path run carries

    def check():  # the next check: B listed otherwise
        assert wk.registry.head_checked(name, b, _listing(other), asked="main")

    if at == "claim":
        check()
    else:
        writable = download.check_writable
        monkeypatch.setattr(download, "check_writable", lambda *args, **kwargs: (check(), writable(*args, **kwargs)))
    switch_path(name, entry.id, stale, return_state=True)
    finish_switch(name)
    model = wk.registry.get_model(name)
    assert model.commit == a and not listed_otherwise(model.files, _listing(commit_files("A"))), model.message
    assert f"update to {b} held: the Hub lists {SHARDS[2]} of it otherwise than when the shared copy" in model.message
    assert model.pending_commit in (None, a)  # the path goes back to A if the stale run switched it

    assert ensure_model(name) == "Ready"  # the Hub lists B as its copy holds it: recorded with that listing
    model = wk.registry.get_model(name)
    on = wk.registry.get_artifact(model.local_paths[0].artifact_id)
    assert model.commit == on.commit == b and not listed_otherwise(on.files, model.files)
    assert not listed_otherwise(model.files, _listing(b_files)) and model.pending_commit is None
    path = model.local_paths[0].path
    assert {n: open(f"{path}/{n}", "rb").read() for n in b_files} == b_files


@pytest.mark.parametrize("when", ["filling", "renamed"])
def test_a_model_deleted_while_its_path_switches_is_released_with_its_path_gone(wk, hub, monkeypatch, when):
    """The user deletes a tracked model while its path switches to B: while B's copy is filled (the switch stops),
    or once the link was renamed to B's copy and before the registry records it. The switch never records the
    model on B, the delete is never stuck in Deleting, and nothing is left at the path."""
    import weightkeeper.tasks.download as download
    from weightkeeper.flows.delete_model import delete_model

    name, repo = f"deleted-{when}", f"acme/track-deleted-{when}"
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}", track=True, workspaces=["team-a"])
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    hub.add_repo(repo, commit_files("B", B_CHANGES))

    def deleting(real):
        return _first(lambda: wk.registry.mark_deleting(name), real)  # the user, meanwhile

    with monkeypatch.context() as patched:
        if when == "filling":
            patched.setattr(download, "_fill_shared_copy", deleting(download._fill_shared_copy))
        else:
            patched.setattr(Registry, "path_switched", deleting(Registry.path_switched))
        ensure_model(name, return_state=True)
    model = wk.registry.get_model(name)
    assert model.phase == "Deleting" and model.commit == a
    assert delete_model(name) == "Released"
    left = wk.registry.find_model(name)
    assert left is None and not os.path.lexists(path), (left.phase, left.message, left.local_paths)
    assert all(wk.registry.lease_of(Kind.PATH, p.id) is None for p in model.local_paths)


@pytest.mark.parametrize("when", ["claimed", "filled"])
@pytest.mark.parametrize("what", ["directory", "link"])
def test_a_path_replaced_by_a_workspace_user_during_a_switch_is_left_as_they_put_it(wk, hub, monkeypatch, when, what):
    """A workspace user replaces the path's link, after the check found B (when the switch claims the path, or
    while it fills B's copy), with a directory of their own holding a file, or with a link of their own. A directory
    is never written into, removed or linked over: the switch fails, the model stays on A with a message that says
    why; their link is replaced by the switch's (the path is the model's), and nothing outside is touched."""
    import weightkeeper.tasks.download as download

    name, repo = f"replaced-{what}-{when}", f"acme/track-replaced-{what}-{when}"
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}", track=True, workspaces=["team-a"])
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    b = hub.add_repo(repo, commit_files("B", B_CHANGES))
    theirs = os.path.join(os.path.dirname(path), "theirs")
    os.mkdir(theirs)
    with open(os.path.join(theirs, "mine"), "wb") as f:
        f.write(b"precious")

    def replace() -> None:
        if os.path.islink(path):
            os.unlink(path)
            if what == "directory":
                os.mkdir(path)
                with open(os.path.join(path, "mine"), "wb") as f:
                    f.write(b"precious")
            else:
                os.symlink("theirs", path)

    def replaced(real):
        return _first(replace, real)

    with monkeypatch.context() as patched:
        if when == "claimed":
            patched.setattr(Registry, "claim_switch", replaced(Registry.claim_switch))
        else:
            patched.setattr(download, "_fill_shared_copy", replaced(download._fill_shared_copy))
        assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert open(os.path.join(theirs, "mine"), "rb").read() == b"precious" and os.listdir(theirs) == ["mine"]
    if what == "directory":
        assert model.commit == a and not os.path.islink(path), model.message
        assert os.listdir(path) == ["mine"] and open(os.path.join(path, "mine"), "rb").read() == b"precious"
        said = "is not a link" if when == "claimed" else "is no longer empty"
        assert f"update to {b} failed: {path} {said}: it is left alone, and not " in model.message
        assert "model's own copy" not in model.message and f"{path} stays on {a}" in model.message
    else:
        assert model.commit == b and os.readlink(path) == f"_artifacts/{repo.replace('/', '--')}/{b}"
    assert model.local_paths[0].lease is None


def test_a_head_answered_in_upper_case_is_refused_and_switches_nothing(wk, hub):
    """The Hub answers main's head as the model's own commit spelled in upper case: the check refuses it (not 40
    lowercase hex digits), says so, and the model stays on its commit with nothing pending and nothing downloaded."""
    import dataclasses

    name, repo = "upper-head", "acme/track-upper-head"
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}", track=True, workspaces=["team-a"])
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    stored = hub._repos[repo]
    stored.commits[a.upper()] = dataclasses.replace(stored.commits[a], sha=a.upper())
    stored.refs["main"] = a.upper()
    assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit is None and model.local_paths[0].status == "Ready"
    assert "cannot check main: " in model.message and "not 40 hex digits" in model.message
    assert os.readlink(path) == f"_artifacts/{repo.replace('/', '--')}/{a}"
    assert os.listdir(os.path.dirname(os.path.join(os.path.dirname(path), os.readlink(path)))) == [a]
