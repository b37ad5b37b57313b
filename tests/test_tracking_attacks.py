"""Tracking and switching under attack or fault: a `model update` that lands while a check or a switch is out, a
switch killed between its rename and its record whose branch then goes back (or whose Hub then refuses), two
switches that each fit a workspace's capacity but not together, and a path an earlier switch left on another commit.
"""

from __future__ import annotations

import os

import pytest

from test_reuse import SHARDS, commit_files
from test_tracking import B_CHANGES, _split
from weightkeeper.errors import WeightkeeperError
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile
from weightkeeper.registry import Registry


class Killed(WeightkeeperError):
    pass


def _killed(*args, **kwargs):
    raise Killed("killed between the rename and its record")


@pytest.mark.parametrize("when", ["checking", "switching"])
def test_a_revision_asked_for_while_a_check_is_out_is_never_taken_for_the_commit_switched_to(wk, hub, monkeypatch,
                                                                                            when):
    """`model update --revision v2` lands while the hourly check of `main` is out (or its switch downloads): the model
    never records v2 as its revision at main's commit, and v2 stays due, so the next run switches to it."""
    import weightkeeper.tasks.switch as switch

    name, repo = f"asked-{when}", f"acme/track-asked-{when}"
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}@main", workspaces=["team-a"], track=True)
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    b = hub.add_repo(repo, commit_files("B", B_CHANGES))
    c = hub.add_repo(repo, commit_files("C", (SHARDS[2],)), revision="v2")

    def asking(real):
        def call(*args, **kwargs):
            wk.registry.request_revision(name, "v2")  # the user, meanwhile
            return real(*args, **kwargs)
        return call

    with monkeypatch.context() as patched:
        if when == "checking":
            patched.setattr(switch, "resolve", asking(switch.resolve))
        else:
            patched.setattr(Registry, "path_switched", asking(Registry.path_switched))
        assert ensure_model(name) == "Ready"
    model = wk.registry.get_model(name)
    assert model.commit == (a if when == "checking" else b)
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


def test_two_switches_that_each_fit_the_capacity_but_not_together_are_not_both_recorded(wk, hub, monkeypatch):
    """Two tracked models in one workspace move at once: the first switch is recorded but its copy not made yet
    (its path runs queue in their pool); the second check counts what the first will add, and is held."""
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

    assert ensure_model("cap-two") == "Ready"
    model = wk.registry.get_model("cap-two")
    assert model.pending_commit is None and model.commit != two
    assert model.message.startswith(f"update to {two} held: workspace 'team-a' stores {2 * size + changed} of its "
                                    f"capacity_bytes = {capacity} bytes, and this model needs {changed} bytes")
    assert f"(its stored bytes count the {changed} that other models' recorded switches add); it stays on" in \
        model.message
    assert ensure_model("cap-one") == "Ready" and wk.registry.get_model("cap-one").commit == one


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
