"""Models that follow a branch: `main` moves from commit A to B (one of four shards and config.json changed).

The tracked model's path is a link to its commit's shared copy; a switch downloads B beside A (taking the three
unchanged shards from A), verifies it, renames a new link over the old one, and A's copy goes after the grace
period. Readers act as the users of the model: one holds a shard of A open, one lists and reads the directory in a
loop through the switch.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from test_api import events
from test_lifecycle import wait_until
from test_reuse import SHARDS, commit_files, fetched
from weightkeeper.desired import in_grace, needed_run, update_due
from weightkeeper.planning import TURNS
from weightkeeper.errors import ConflictError, InvalidInputError
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.paths import download_to_path
from weightkeeper.flows.reconcile import reconcile
from weightkeeper.registry import Holder
from weightkeeper.tasks.cleanup import collect_shared_copy
from weightkeeper.tasks.switch import _failed

B_CHANGES = (SHARDS[1], "config.json")
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)


def test_a_tracked_ready_model_is_due_once_per_interval_or_when_a_revision_is_asked_for():
    hour_ago, minute_ago = NOW.replace(hour=11), NOW.replace(hour=11, minute=59)
    for model_id in range(2 * TURNS):
        assert update_due("Ready", True, None, None, NOW, 3600, model_id, pending=False)
        assert update_due("Ready", True, None, NOW.replace(hour=10, minute=30), NOW, 3600, model_id, pending=False)  # 1.5 intervals
        assert not update_due("Ready", True, None, minute_ago, NOW, 3600, model_id, pending=False)
        assert update_due("Ready", True, None, minute_ago, NOW, 0, model_id, pending=False)
        assert not update_due("Ready", False, None, None, NOW, 3600, model_id, pending=False)
        assert update_due("Ready", False, "v2", None, NOW, 3600, model_id, pending=False)  # asked for, not asked yet
        assert not update_due("Ready", False, "v2", minute_ago, NOW, 3600, model_id, pending=False)  # asked: the switch ran (or failed)
        for phase in ("Pending", "Downloading", "Failed", "Deleting"):
            assert not update_due(phase, True, "v2", None, NOW, 0, model_id, pending=False)
    assert {update_due("Ready", True, None, hour_ago, NOW, 3600, model_id, pending=False) for model_id in range(TURNS)} == {True, False}
    assert needed_run("Ready", None, update=True) == "ensure-model"
    assert needed_run("Ready", "ensure-model", update=True) is None and needed_run("Ready", None) is None
    assert in_grace(minute_ago, NOW, 600) and not in_grace(hour_ago, NOW, 600) and not in_grace(None, NOW, 600)


def test_a_switch_left_pending_on_a_model_not_tracked_is_due_at_its_turn_never_at_every_pass():
    """A model not tracked whose switch (or switch back) a killed run left pending is due for a run that finishes
    it: at once when never tried, else at its turn once per interval after the last try, like a tracked check. A
    switch that cannot finish yet (tried at every due pass, failing each time) is tried 3 or 4 times in 4 hours of
    passes a minute apart, not 240."""
    minute_ago, hour_and_half_ago = NOW - timedelta(minutes=1), NOW - timedelta(minutes=90)
    for model_id in range(2 * TURNS):
        assert update_due("Ready", False, None, None, NOW, 3600, model_id, pending=True)
        assert update_due("Ready", False, None, hour_and_half_ago, NOW, 3600, model_id, pending=True)
        assert not update_due("Ready", False, None, minute_ago, NOW, 3600, model_id, pending=True)  # just tried
        assert not update_due("Ready", False, None, hour_and_half_ago, NOW, 3600, model_id, pending=False)  # none
        assert update_due("Ready", False, None, minute_ago, NOW, 0, model_id, pending=True)
        for phase in ("Pending", "Downloading", "Failed", "Deleting"):
            assert not update_due(phase, False, None, hour_and_half_ago, NOW, 0, model_id, pending=True)
        tried = [NOW]
        for minute in range(1, 4 * 60 + 1):
            if update_due("Ready", False, None, tried[-1], now := NOW + timedelta(minutes=minute), 3600, model_id,
                          pending=True):
                tried.append(now)
        assert len(tried) in (4, 5)
        assert all(1800 <= (b - a).total_seconds() <= 5400 for a, b in zip(tried, tried[1:]))


@pytest.mark.parametrize("interval", [60, 3600, 86400])
def test_tracked_models_asked_together_are_asked_again_at_turns_of_their_own_once_per_interval(interval):
    """320 tracked models asked in one pass, then reconcile passes every minute for four intervals: each is asked
    again between 0.5 and 1.5 intervals later, then once per interval at its turn, and after that no pass asks more
    than the turns it spans and two turns' share of them (before: all 320 at once, every interval)."""
    step = min(60, interval // 4)
    checked = {model_id: [NOW] for model_id in range(1, 321)}
    per_pass = []
    for t in range(step, 4 * interval + 1, step):
        now = NOW + timedelta(seconds=t)
        due = [m for m, times in checked.items() if update_due("Ready", True, None, times[-1], now, interval, m,
                                                                                pending=False)]
        for m in due:
            checked[m].append(now)
        per_pass.append((t, len(due)))
    for times in checked.values():
        gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
        assert interval / 2 <= gaps[0] <= 1.5 * interval + step and len(gaps) in (3, 4, 5)
        assert all(interval - step <= gap <= interval + step for gap in gaps[1:])
    assert max(n for t, n in per_pass if t > 1.5 * interval) <= 320 * step / interval + 2 * 320 // TURNS


def test_only_a_branch_or_tag_of_a_hub_repository_with_shared_copies_is_tracked(wk, hub):
    commit = hub.add_repo("acme/track-input", commit_files("A"))
    with pytest.raises(InvalidInputError, match="branch or tag"):
        wk.declare("pinned", f"hf://acme/track-input@{commit}", track=True)
    with pytest.raises(InvalidInputError, match="reuse-if-exists"):
        wk.declare("own", "hf://acme/track-input", track=True, download_policy="always-download")
    with pytest.raises(InvalidInputError, match="outside the models root"):
        wk.declare("outside", "hf://acme/track-input", track=True, subpath="elsewhere/x")
    model = wk.declare("ok", "hf://acme/track-input@main", workspaces=["team-a"], track=True)
    assert model.track and model.download_policy == "reuse-if-exists"


class Lister(threading.Thread):
    """A user of the model: opens its path (one commit's directory, whatever the link says next), lists it and reads
    every file through that directory, over and over; records which commit each look saw."""

    def __init__(self, path: str, commits: dict[str, dict[str, bytes]]):
        super().__init__(daemon=True)
        self.path, self.commits, self.seen, self.mixed = path, commits, [], []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                names = sorted(n for n in os.listdir(fd) if not n.startswith("."))
                content = {}
                for n in names:
                    f = os.open(n, os.O_RDONLY, dir_fd=fd)
                    with os.fdopen(f, "rb") as handle:
                        content[n] = handle.read()
            finally:
                os.close(fd)
            which = [c for c, files in self.commits.items() if files == content]
            (self.seen if which else self.mixed).append(which[0] if which else sorted(content))


def test_a_tracked_model_switches_to_the_new_commit_atomically_reusing_what_did_not_change(wk, hub, download_limit):
    from test_metrics import Scraper, moved

    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0)
    a_files, b_files = commit_files("A"), commit_files("B", B_CHANGES)
    a = hub.add_repo("acme/track", a_files)
    wk.declare("tracked", "hf://acme/track@main", workspaces=["team-a"], track=True)
    assert ensure_model("tracked") == "Ready"
    path = wk.registry.get_model("tracked").local_paths[0].path
    copies = wk.volumes["team-a"] / "models" / "_artifacts" / "acme--track"
    assert os.readlink(path) == f"_artifacts/acme--track/{a}"
    held = open(f"{path}/{SHARDS[1]}", "rb")  # a reader of A's shard that B replaces
    first = held.read(1000)

    scraper = Scraper(wk)
    before = scraper.samples()
    lister = Lister(path, {"A": a_files, "B": b_files})
    lister.start()
    wait_until(lambda: lister.seen, 30, "the lister's first look")
    b = hub.add_repo("acme/track", b_files)
    hub.reset_stats()
    reconcile()
    wait_until(lambda: lister.seen[-1] == "B", 30, "the lister to see B")
    lister.stop.set()
    lister.join(30)

    model = wk.registry.get_model("tracked")
    assert model.phase == "Ready" and model.commit == b and model.pending_commit is None
    assert model.switched_at is not None and model.message == f"switched from {a} to {b}"
    assert model.to_json()["update"]["switchedAt"] and model.local_paths[0].status == "Ready"
    assert os.readlink(path) == f"_artifacts/acme--track/{b}"
    assert fetched(hub, "acme/track") == sorted(B_CHANGES)  # exactly the two files B changed
    assert moved(before, scraper.samples(), "weightkeeper_reused_bytes_total", workspace="team-a",
                 how="hard link") == 3 * 96 * 1024 + len(a_files["tokenizer.json"])
    assert lister.mixed == [] and lister.seen[0] == "A" and set(lister.seen) == {"A", "B"}
    assert wait_until(lambda: "weightkeeper.model.updated" in events("weightkeeper.model.tracked"), 30, "the event")

    assert reconcile()[str(copies / a)] == "kept: switched from recently"  # the grace period (600 s)
    assert (copies / a / SHARDS[1]).exists()
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0, track_grace_seconds=0)
    hub.reset_stats()
    assert reconcile()[str(copies / a)] == "collected"
    assert not (copies / a).exists() and (copies / b / SHARDS[0]).exists()
    assert fetched(hub, "acme/track") == []  # the head is asked again, but nothing moved
    assert held.read() == a_files[SHARDS[1]][1000:] and first == a_files[SHARDS[1]][:1000]  # read to the end
    held.close()


def test_a_failing_download_of_the_new_commit_leaves_the_model_ready_on_the_old_one(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0)
    a = hub.add_repo("acme/track-fail", commit_files("A"))
    wk.declare("stays", "hf://acme/track-fail", workspaces=["team-a"], track=True)
    assert ensure_model("stays") == "Ready"
    path = wk.registry.get_model("stays").local_paths[0].path
    b = hub.add_repo("acme/track-fail", commit_files("B", B_CHANGES))
    hub.fail_next(1, 403, repo_id="acme/track-fail", path_contains=SHARDS[1])  # a permanent refusal
    reconcile()
    model = wk.registry.get_model("stays")
    assert model.phase == "Ready" and model.commit == a and os.readlink(path).endswith(a)
    assert f"update to {b} failed" in model.message and f"stays on {a}" in model.message
    assert model.local_paths[0].status == "Ready"
    reconcile()  # the next check tries again, and switches
    assert wk.registry.get_model("stays").commit == b and os.readlink(path).endswith(b)


def test_model_update_switches_a_revision_once_on_demand(wk, hub):
    from test_cli import cli

    a = hub.add_repo("acme/track-once", commit_files("A"))
    b = hub.add_repo("acme/track-once", commit_files("B", B_CHANGES), revision="v2")
    wk.declare("once", "hf://acme/track-once@main", workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("own", "hf://acme/track-once@main", workspaces=["team-b"])
    assert ensure_model("once") == "Ready" and ensure_model("own") == "Ready"
    assert wk.registry.get_model("once").commit == a
    out = cli(wk, "model", "update", "once", "--revision", "v2", "--wait")
    assert "Ready" in out.stdout
    model = wk.registry.get_model("once")
    assert model.commit == b and model.source == "hf://acme/track-once@v2" and model.revision == "v2"
    assert model.next_revision is None and not model.track
    assert "last switch:" in cli(wk, "model", "get", "once").stdout
    assert reconcile() and wk.registry.get_model("once").commit == b  # not tracked: nothing more
    c = hub.add_repo("acme/track-once", commit_files("C", (SHARDS[2],)), revision="v3")
    hub.fail_next(1, 403, repo_id="acme/track-once", path_contains=SHARDS[2])
    out = cli(wk, "model", "update", "once", "--revision", "v3", "--wait", check=False)
    assert out.returncode == 1 and f"stays on {b}" in out.stderr and f"update to {c} failed" in out.stderr
    out = cli(wk, "model", "update", "own", "--revision", "v2", check=False)
    assert out.returncode == 2 and "keeps its own copy" in out.stderr
    out = cli(wk, "model", "update", "once", "--revision", "a..b", check=False)
    assert out.returncode == 2 and "invalid revision" in out.stderr
    from weightkeeper.service import switch_revision
    wk.declare("fresh", "hf://acme/track-once", workspaces=["team-a"], subpath="models/fresh",
               download_policy="reuse-if-exists")
    with pytest.raises(ConflictError, match="is Pending"):
        switch_revision(wk.registry, "fresh", "v2")


def test_an_update_past_the_workspace_capacity_is_held_with_a_message(wk, hub):
    a_files = commit_files("A")
    a = hub.add_repo("acme/track-full", a_files)
    size = sum(len(v) for v in a_files.values())
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0, workspaces=[
        {"name": "team-a", "volume": str(wk.volumes["team-a"]), "capacity_bytes": size + 96 * 1024}])
    wk.declare("full", "hf://acme/track-full", workspaces=["team-a"], track=True)
    assert ensure_model("full") == "Ready"
    b = hub.add_repo("acme/track-full", commit_files("B", B_CHANGES))  # B adds a shard and a config: one too many
    hub.reset_stats()
    reconcile()
    model = wk.registry.get_model("full")
    assert model.commit == a and model.pending_commit is None and model.phase == "Ready"
    assert model.message.startswith(f"update to {b} held: workspace 'team-a' stores {size} of its capacity_bytes")
    assert "it stays on" in model.message and fetched(hub, "acme/track-full") == []


def test_a_staged_model_switches_from_the_hub_not_from_its_old_commits_staged_copy(wk, hub, s3):
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0)
    a = hub.add_repo("acme/track-staged", commit_files("A"))
    wk.declare("staged", "hf://acme/track-staged", workspaces=["team-a"], track=True)
    assert ensure_model("staged") == "Ready"
    assert wk.registry.get_model("staged").staging_uri.endswith(f"/{a}/")
    b = hub.add_repo("acme/track-staged", commit_files("B", B_CHANGES))
    hub.reset_stats()
    reconcile()
    model = wk.registry.get_model("staged")
    assert model.commit == b and fetched(hub, "acme/track-staged") == sorted(B_CHANGES)
    path = model.local_paths[0].path
    assert open(f"{path}/{SHARDS[1]}", "rb").read() == commit_files("B", B_CHANGES)[SHARDS[1]]
    from weightkeeper.flows.delete_model import delete_model
    assert delete_model("staged") == "Released"  # its staged copy of A goes with it
    assert s3.keys(f"{s3.prefix}/acme--track-staged/") == []


def test_a_tracked_model_shares_its_path_with_no_other_model(wk, hub):
    hub.add_repo("acme/track-alone", commit_files("A"))
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("plain", "hf://acme/track-alone", **shared)
    assert ensure_model("plain") == "Ready"
    with pytest.raises(ConflictError, match="already owns"):  # its switch would move the other model's link
        wk.declare("follower", "hf://acme/track-alone", track=True, **shared)
    wk.declare("follower", "hf://acme/track-alone", track=True, subpath="models/follow", **shared)
    assert ensure_model("follower") == "Ready"
    with pytest.raises(ConflictError, match="already owns"):
        wk.declare("late", "hf://acme/track-alone", subpath="models/follow", **shared)
    with pytest.raises(InvalidInputError, match="is tracked"):
        from weightkeeper.service import move_model
        move_model(wk.settings, wk.registry, "follower", subpath="models/follow", download_policy="always-download")


def test_model_update_refuses_a_revision_while_another_owners_model_shares_the_path(wk, hub):
    """Two owners declare the same repository, commit and patterns with no subpath: one link serves both. A switch of
    one would rename a new link over it, so the other would serve v2 while its record says the old commit: the
    request is refused, naming no other model, and a switch claimed after another model joined the path is held."""
    from test_cli import cli

    a = hub.add_repo("acme/track-shared-owners", commit_files("A"))
    hub.add_repo("acme/track-shared-owners", commit_files("B", B_CHANGES), revision="v2")
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("alices-shared", "hf://acme/track-shared-owners", **shared)
    wk.declare("bobs-shared", "hf://acme/track-shared-owners", owner_name="bob", owner_uid=1001, **shared)
    assert ensure_model("alices-shared") == "Ready" and ensure_model("bobs-shared") == "Ready"
    path = wk.registry.get_model("alices-shared").local_paths[0].path
    assert wk.registry.get_model("bobs-shared").local_paths[0].path == path
    before = os.readlink(path)
    out = cli(wk, "model", "update", "alices-shared", "--revision", "v2", "--wait", check=False)
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"model 'alices-shared' shares {path} with another model" in out.stderr and "bobs" not in out.stderr
    assert os.readlink(path) == before == f"_artifacts/acme--track-shared-owners/{a}"
    for name in ("alices-shared", "bobs-shared"):
        model = wk.registry.get_model(name)
        assert model.commit == a and model.next_revision is None and model.pending_commit is None
        assert model.phase == "Ready" and model.revision == "main"

    b = commit_files("B", B_CHANGES)  # the other model joins the path after the request: the switch is held
    wk.registry.head_checked("alices-shared", "b" * 40, [{"path": n, "size": len(v)} for n, v in b.items()])
    entry = wk.registry.get_model("alices-shared").local_paths[0]
    assert wk.registry.claim_switch("alices-shared", entry.id, Holder.here("switch-test"), 30, "b" * 40) == "shared"
    model = wk.registry.get_model("alices-shared")
    assert model.message.startswith(f"update to {'b' * 40} held: {path} is shared with another model")
    assert os.readlink(path) == before and wk.registry.get_model("bobs-shared").commit == a


def _split(wk, hub, name: str, repo: str, **declared) -> tuple[str, str, str, str, str]:
    """A model of `repo` in team-a and team-b, Ready on A; B is added (at `main`, or as `declared` says) with a
    file planted where team-b's copy of B goes, so only team-a's path can switch: (a, b, p1, p2, copies)."""
    a = hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}", workspaces=["team-a", "team-b"], **declared)
    assert ensure_model(name) == "Ready"
    paths = {p.workspace: p.path for p in wk.registry.get_model(name).local_paths}
    b = hub.add_repo(repo, commit_files("B", B_CHANGES), revision="main" if declared.get("track") else "v2")
    copies = f"_artifacts/{repo.replace('/', '--')}"
    (wk.volumes["team-b"] / "models" / copies / b).write_bytes(b"planted")
    return a, b, paths["team-a"], paths["team-b"], copies


@pytest.mark.parametrize("then", ["reverted", "unknown"])
def test_a_partly_switched_model_goes_back_together_once_its_branch_returns(wk, hub, then):
    """team-a's path switches to B, team-b's cannot; then the branch goes back to A (or its head cannot be asked):
    team-a's link goes back to A's copy (team-b's is left as it is), and nothing says the model switched."""
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0)
    a, b, p1, p2, copies = _split(wk, hub, "split-track", "acme/track-split", track=True)
    assert ensure_model("split-track") == "Ready"
    model = wk.registry.get_model("split-track")
    assert model.commit == a and model.pending_commit == b and f"update to {b} failed" in model.message
    assert os.readlink(p1) == f"{copies}/{b}" and os.readlink(p2) == f"{copies}/{a}"
    p1_link, p2_link = os.lstat(p1).st_ino, os.lstat(p2).st_ino
    on_b = next(p.id for p in model.local_paths if p.path == p1)
    assert download_to_path("split-track", on_b).is_completed() and os.lstat(p1).st_ino == p1_link  # on B: settled

    if then == "reverted":
        hub.add_repo("acme/track-split", commit_files("A"))
    else:
        hub.fail_next(1, 403, repo_id="acme/track-split")  # a refusal: the head is not known
    assert ensure_model("split-track") == "Ready"
    model = wk.registry.get_model("split-track")
    assert os.readlink(p1) == os.readlink(p2) == f"{copies}/{a}" and os.lstat(p2).st_ino == p2_link
    assert model.commit == a and model.pending_commit is None and model.switched_at is None
    assert model.message.endswith(f"back to {a}, the model's commit, in {p1}, where an unfinished switch left "
                                  "another commit") and model.message.startswith("back" if then == "reverted" else
                                                                                 "cannot check main")
    assert all(p.status == "Ready" for p in model.local_paths)
    assert _failed(model, p1, a, "gone") == (f"switch of {p1} back to {a} failed: gone; it stays on another commit "
                                             "until the next check")


def test_model_update_that_switches_only_some_paths_switches_them_back(wk, hub):
    """Not tracked, no later check comes: the path that switched goes back at once, and the CLI says why."""
    from test_cli import cli

    a, b, p1, p2, copies = _split(wk, hub, "split-once", "acme/track-split-once", download_policy="reuse-if-exists")
    out = cli(wk, "model", "update", "split-once", "--revision", "v2", "--wait", check=False)
    assert out.returncode == 1 and f"stays on {a}: update to {b} failed" in out.stderr
    assert f"back to {a}, the model's commit, in {p1}" in out.stderr
    assert os.readlink(p1) == os.readlink(p2) == f"{copies}/{a}"
    model = wk.registry.get_model("split-once")
    assert model.commit == a and model.pending_commit is None and model.revision == "main"


def test_a_partly_switched_path_no_other_model_may_join_until_the_switch_is_settled(wk, hub):
    """`model update` acted out by hand between its switch and its switch back: team-a's path on v2's B, team-b's
    failed. Another user's model of main (A, the commit the registry records) would share team-a's path, which links
    to B: it is refused while B is pending. v2 returns to A: A is pending (the switch back), so it may join, and its
    ensure links the path to A's copy. The model is ensured: the switch back is not held as shared, its record of
    the path names A's copy again, nothing is pending, and the other model stays Ready on A."""
    from weightkeeper.errors import ConflictError
    from weightkeeper.layout import HfSource
    from weightkeeper.sources import resolve

    a, b, p1, p2, copies = _split(wk, hub, "split-joined", "acme/track-split-joined", download_policy="reuse-if-exists")
    wk.registry.request_revision("split-joined", "v2")  # what check-head does, then each path's switch
    snapshot = resolve(wk.settings, wk.registry, HfSource("acme/track-split-joined", "v2"), None, None, None)
    assert wk.registry.head_checked("split-joined", b, [f.to_json() for f in snapshot.files])
    ids = {p.path: p.id for p in wk.registry.get_model("split-joined").local_paths}
    assert download_to_path("split-joined", ids[p1]).is_completed()
    assert not download_to_path("split-joined", ids[p2], return_state=True).is_completed()
    assert os.readlink(p1) == f"{copies}/{b}" and os.readlink(p2) == f"{copies}/{a}"
    assert wk.registry.get_model("split-joined").pending_commit == b

    bobs = dict(workspaces=["team-a"], download_policy="reuse-if-exists", owner_name="bob", owner_uid=1001)
    with pytest.raises(ConflictError, match=f"already owns {p1}"):
        wk.declare("bobs-split-joined", "hf://acme/track-split-joined", **bobs)

    hub.add_repo("acme/track-split-joined", commit_files("A"), revision="v2")  # v2 returns to A: team-a goes back
    wk.registry.head_checked("split-joined", a, wk.registry.get_model("split-joined").files)
    assert wk.registry.get_model("split-joined").pending_commit == a and os.readlink(p1) == f"{copies}/{b}"
    wk.declare("bobs-split-joined", "hf://acme/track-split-joined", **bobs)  # on A, where the path goes: it may
    assert ensure_model("bobs-split-joined") == "Ready"
    other = wk.registry.get_model("bobs-split-joined")
    assert other.commit == a and other.local_paths[0].path == p1 and os.readlink(p1) == f"{copies}/{a}"

    assert ensure_model("split-joined") == "Ready"
    model = wk.registry.get_model("split-joined")
    assert os.readlink(p1) == os.readlink(p2) == f"{copies}/{a}"
    assert model.commit == a and model.pending_commit is None and model.next_revision is None
    assert model.revision == "v2" and "held" not in model.message
    on_p1 = next(p for p in model.local_paths if p.path == p1)
    assert on_p1.artifact_id == other.local_paths[0].artifact_id and on_p1.status == "Ready"
    assert wk.registry.get_artifact(on_p1.artifact_id).commit == a
    other = wk.registry.get_model("bobs-split-joined")
    assert other.phase == "Ready" and other.commit == a and other.local_paths[0].status == "Ready"


def test_a_switch_killed_before_the_registry_recorded_it_is_rolled_back_by_the_next_pass(wk, hub, monkeypatch):
    """The switch renames the link to B's copy over the link to A's and dies before the registry records it (its
    lease is gone): the link names B, the registry A, whose copy is the one it keeps. The next pass puts the
    link to A's copy back, so the files read through the path are the commit the registry records."""
    from weightkeeper.errors import WeightkeeperError
    from weightkeeper.registry import Registry

    class Killed(WeightkeeperError):
        pass

    def killed(*args, **kwargs):
        raise Killed("killed between the rename and its record")

    a_files = commit_files("A")
    a = hub.add_repo("acme/track-killed", a_files)
    wk.declare("killed-switch", "hf://acme/track-killed", workspaces=["team-a"], track=True)
    assert ensure_model("killed-switch") == "Ready"
    path = wk.registry.get_model("killed-switch").local_paths[0].path
    b = hub.add_repo("acme/track-killed", commit_files("B", B_CHANGES))
    with monkeypatch.context() as patched:
        patched.setattr(Registry, "path_switched", killed)
        ensure_model("killed-switch", return_state=True)
    model = wk.registry.get_model("killed-switch")
    assert model.commit == a and model.pending_commit == b
    assert os.readlink(path) == f"_artifacts/acme--track-killed/{b}"  # the registry still says A

    assert reconcile()[path] == "relinked"
    assert os.readlink(path) == f"_artifacts/acme--track-killed/{a}"
    assert {n: open(f"{path}/{n}", "rb").read() for n in a_files} == a_files
    model = wk.registry.get_model("killed-switch")
    entry = model.local_paths[0]
    assert model.phase == "Ready" and model.commit == a and entry.status == "Ready"
    assert wk.registry.get_artifact(entry.artifact_id).commit == a and "never recorded" in entry.message
    assert reconcile()[path] == "linked"


def _turn_came(wk, name: str, interval: float = 3600) -> None:
    """As if 1.5 intervals passed since the model was last asked or tried: its next turn came."""
    from sqlalchemy import select

    from weightkeeper.registry.schema import ModelRow

    with wk.registry._tx() as s:
        s.scalar(select(ModelRow).where(ModelRow.name == name)).head_checked_at -= timedelta(seconds=1.5 * interval)


def _back_left_pending(wk, hub, monkeypatch, name: str, repo: str) -> tuple[str, str, dict, str, str]:
    """A model not tracked, Ready on A: `model update --revision v2` (B) switches its path and the run is killed
    before it records the model's switch; v2 returns to A and the run that finds nothing to switch to is killed
    before it links the path back. Nothing is asked any more (no revision asked for, not tracked); A is pending
    (switch back), the path is on B: (a, b, a_files, path, copies)."""
    import weightkeeper.flows.ensure_model as ensure
    from weightkeeper.errors import WeightkeeperError
    from weightkeeper.registry import Registry

    def killed(*args, **kwargs):
        raise WeightkeeperError("killed")

    a_files = commit_files("A")
    a = hub.add_repo(repo, a_files)
    wk.declare(name, f"hf://{repo}", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model(name) == "Ready"
    path = wk.registry.get_model(name).local_paths[0].path
    b = hub.add_repo(repo, commit_files("B", B_CHANGES), revision="v2")
    wk.registry.request_revision(name, "v2")
    with monkeypatch.context() as patched:
        patched.setattr(Registry, "model_switched", killed)
        ensure_model(name, return_state=True)
    hub.add_repo(repo, a_files, revision="v2")
    with monkeypatch.context() as patched:
        patched.setattr(ensure, "_switch", killed)
        ensure_model(name, return_state=True)
    copies = f"_artifacts/{repo.replace('/', '--')}"
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit == a and model.next_revision is None and not model.track
    assert os.readlink(path) == f"{copies}/{b}"
    return a, b, a_files, path, copies


def test_a_switch_left_pending_on_a_model_not_tracked_is_finished_by_a_reconcile_pass(wk, hub, monkeypatch):
    """The switch back a killed run left pending on a model nothing asks again is finished by reconcile, with no
    `model ensure`: not in the pass right after the run that tried it, but at the model's next turn. The path links
    to A again, nothing is pending, and later passes start no run for it."""
    name, repo = "back-by-pass", "acme/track-back-by-pass"
    a, b, a_files, path, copies = _back_left_pending(wk, hub, monkeypatch, name, repo)
    asked = sum(r.repo_id == repo and r.path.startswith("/api/") for r in hub.requests)
    assert f"model {name}" not in reconcile()  # tried a moment ago: not due yet
    assert wk.registry.get_model(name).pending_commit == a

    _turn_came(wk, name)
    assert reconcile()[f"model {name}"] == "ensure-model: Ready"
    model = wk.registry.get_model(name)
    assert model.commit == a and model.pending_commit is None and model.phase == "Ready"
    assert os.readlink(path) == f"{copies}/{a}" and wk.registry.get_artifact(model.local_paths[0].artifact_id).commit == a
    assert {n: open(f"{path}/{n}", "rb").read() for n in a_files} == a_files
    assert sum(r.repo_id == repo and r.path.startswith("/api/") for r in hub.requests) == asked  # nothing asked
    _turn_came(wk, name)
    assert f"model {name}" not in reconcile()  # nothing pending: no run, whatever the time


def test_a_switch_left_pending_that_cannot_finish_is_tried_once_per_interval_not_at_every_pass(wk, hub, monkeypatch):
    """The killed switch's path lease has not lapsed, so the pending switch back cannot run: the pass at the model's
    turn tries it (one run), the passes after it start none, the next turn tries again; once the lease is gone the
    run at the following turn finishes it."""
    name = "back-held"
    a, b, a_files, path, copies = _back_left_pending(wk, hub, monkeypatch, name, "acme/track-back-held")
    entry = wk.registry.get_model(name).local_paths[0]
    elsewhere = Holder("run-9/1", "gpu-9", 4242, 99.0)  # the killed switch's, on another host: not lapsed yet
    assert wk.registry.claim_switch(name, entry.id, elsewhere, 600, wk.registry.get_model(name).pending_commit) == \
        "claimed"
    for turn in range(2):
        _turn_came(wk, name)
        assert reconcile()[f"model {name}"] == "ensure-model: Ready"  # tried
        assert wk.registry.get_model(name).pending_commit == a and os.readlink(path) == f"{copies}/{b}"
        for _ in range(2):
            assert f"model {name}" not in reconcile()  # not again at every pass
    wk.registry.end_switch(name, entry.id, elsewhere)  # its lease is gone
    _turn_came(wk, name)
    assert reconcile()[f"model {name}"] == "ensure-model: Ready"
    model = wk.registry.get_model(name)
    assert model.pending_commit is None and model.commit == a and os.readlink(path) == f"{copies}/{a}"


def test_a_switch_killed_mid_fill_leaves_a_copy_the_pass_keeps_and_the_next_switch_resumes(wk, hub):
    """The switch to B is SIGKILLed while it fetches B's new shard: its copy of B, partial file included, is the
    model's pending commit's, linked from nowhere yet. A pass keeps it, and the next switch fetches only the rest of
    the shard."""
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=3600)  # a pass starts no check: the test does
    repo, shard = "acme/track-resumed", "model-00001-of-00001.safetensors"
    a_files = {shard: random.Random("A").randbytes(3 << 20), "config.json": b'{"model_type": "tiny"}\n'}
    b_files = {**a_files, shard: random.Random("B").randbytes(3 << 20)}
    a = hub.add_repo(repo, a_files)
    wk.declare("resumed", f"hf://{repo}", workspaces=["team-a"], track=True)
    assert ensure_model("resumed") == "Ready"
    path = wk.registry.get_model("resumed").local_paths[0].path
    b = hub.add_repo(repo, b_files)
    copy = wk.volumes["team-a"] / "models" / "_artifacts" / "acme--track-resumed" / b
    part = copy / ".cache" / "weightkeeper" / f"{shard}.part"
    hub.set_throttle(256 * 1024, repo_id=repo)  # 12 s for the shard: killed at its first MiB, it has 8 s to go
    switch = subprocess.Popen([sys.executable, "-c", "from weightkeeper.flows.ensure_model import ensure_model; "
                               "ensure_model('resumed')"], env=dict(os.environ), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:  # the client writes what arrives a MiB at a time
        wait_until(lambda: part.exists() and part.stat().st_size >= 1 << 20, 90, "part of B's new shard")
    finally:
        switch.send_signal(signal.SIGKILL)
        switch.wait()
    hub.set_throttle(None, repo_id=repo)
    have = part.stat().st_size
    assert have < len(b_files[shard]) and wk.registry.get_model("resumed").pending_commit == b
    (artifact,) = [x for x in wk.registry.list_artifacts() if x.commit == b]
    assert artifact.users == [] and artifact.switching == ["resumed"] and artifact.in_use

    assert reconcile()[str(copy)] == "not downloaded"  # kept: the model switches to it
    assert part.stat().st_size == have and os.readlink(path).endswith(a)
    hub.reset_stats()
    assert ensure_model("resumed") == "Ready"
    model = wk.registry.get_model("resumed")
    assert model.commit == b and model.pending_commit is None and os.readlink(path).endswith(b)
    assert {n: open(f"{path}/{n}", "rb").read() for n in b_files} == b_files
    got = [r for r in hub.requests if r.method == "GET" and r.filename == shard and r.status in (200, 206)]
    assert [r.range.partition("=")[2].partition("-")[0] for r in got] == [str(have)]  # the rest, from the partial
    assert sum(r.bytes_sent for r in got) == len(b_files[shard]) - have


def test_a_failed_switchs_copy_is_kept_only_while_its_commit_is_pending(wk, hub):
    """The switch to B fails (B's new shard refused): the pass that ran it keeps B's copy, which the model still
    switches to. Models switching to B on another volume, or with patterns of their own, keep it not: once the branch
    is back at A nothing of this model is pending, and the next pass collects it."""
    repo = "acme/track-pending-copy"
    a = hub.add_repo(repo, commit_files("A"))
    shared = dict(download_policy="reuse-if-exists")
    wk.declare("pending-copy", f"hf://{repo}", workspaces=["team-a"], track=True)
    wk.declare("elsewhere", f"hf://{repo}", workspaces=["team-b"], **shared)
    wk.declare("patterned", f"hf://{repo}", workspaces=["team-a"], subpath="models/patterned",
               exclude=["tokenizer.json"], **shared)
    for name in ("pending-copy", "elsewhere", "patterned"):
        assert ensure_model(name) == "Ready"
    b_files = commit_files("B", B_CHANGES)
    b = hub.add_repo(repo, b_files)
    for name in ("elsewhere", "patterned"):  # tried now: pending, and not due before their next turn
        assert wk.registry.head_checked(name, b, [{"path": n, "size": len(v)} for n, v in b_files.items()])
    hub.fail_next(1, 403, repo_id=repo, path_contains=SHARDS[1])
    copy = wk.volumes["team-a"] / "models" / "_artifacts" / "acme--track-pending-copy" / b
    assert reconcile()[str(copy)] == "not downloaded" and copy.is_dir()  # kept
    model = wk.registry.get_model("pending-copy")
    assert model.commit == a and model.pending_commit == b and f"update to {b} failed" in model.message
    (artifact,) = [x for x in wk.registry.list_artifacts() if x.commit == b]
    assert artifact.switching == ["pending-copy"] and wk.registry.get_artifact(artifact.id).switching == ["pending-copy"]
    assert collect_shared_copy(artifact.id) == "in use" and copy.is_dir()  # a pass that listed it before the check

    hub.add_repo(repo, commit_files("A"))  # main is back at A: nothing to switch to
    _turn_came(wk, "pending-copy")
    assert reconcile()[str(copy)] == "collected" and not copy.exists()
    assert wk.registry.get_model("pending-copy").pending_commit is None
    assert wk.registry.get_model("elsewhere").pending_commit == b == wk.registry.get_model("patterned").pending_commit


def test_a_damaged_copy_no_path_links_to_is_filled_again_before_a_switch_back_links_it(wk, hub):
    """A copy switched away from (kept for the grace period) is damaged meanwhile: the pass that finds it sets it
    aside, and switching back fetches the damaged file again instead of linking it."""
    from weightkeeper.service import switch_revision

    a_files = commit_files("A")
    a = hub.add_repo("acme/back-again", a_files)
    b = hub.add_repo("acme/back-again", commit_files("B", B_CHANGES), revision="v2")
    wk.declare("back", "hf://acme/back-again@main", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("back") == "Ready"
    switch_revision(wk.registry, "back", "v2")
    assert ensure_model("back") == "Ready" and wk.registry.get_model("back").commit == b
    copy = wk.volumes["team-a"] / "models" / "_artifacts" / "acme--back-again" / a
    os.truncate(copy / SHARDS[1], 1000)  # a file B changed: no other copy shares its inode
    outcomes = reconcile()
    assert outcomes[str(copy)] == "kept: switched from recently"
    (aside,) = [c for c in wk.registry.list_artifacts() if c.commit == a]
    assert aside.state == "Pending" and "damaged" in aside.message
    hub.reset_stats()
    switch_revision(wk.registry, "back", "main")
    assert ensure_model("back") == "Ready" and wk.registry.get_model("back").commit == a
    path = wk.registry.get_model("back").local_paths[0].path
    assert (copy / SHARDS[1]).read_bytes() == a_files[SHARDS[1]] == open(f"{path}/{SHARDS[1]}", "rb").read()
    assert fetched(hub, "acme/back-again") == [SHARDS[1]]


def test_a_switch_cut_off_with_its_process_says_so_instead_of_its_last_progress(wk, hub):
    """The child that switched a Ready path died (crashed, its lease abandoned): the parent records that the switch
    did not finish, on the path and the model, and drops the lease, not leaving the dead run's progress shown; a
    switch whose run is alive elsewhere is left to say its own end."""
    from weightkeeper.flows.jobs import JobFailure, _record

    repo, name = "acme/track-cut-off", "cut-off"
    hub.add_repo(repo, commit_files("A"))
    wk.declare(name, f"hf://{repo}", workspaces=["team-a"], track=True)
    assert ensure_model(name) == "Ready"
    b_files = commit_files("B", B_CHANGES)
    b = hub.add_repo(repo, b_files)
    assert wk.registry.head_checked(name, b, [{"path": n, "size": len(v)} for n, v in b_files.items()])
    entry = wk.registry.get_model(name).local_paths[0]
    failure = JobFailure(entry, "download-to-path run x Crashed: the pod was evicted", crashed=True)
    elsewhere = Holder("run-9/1", "gpu-9", 4242, 99.0)  # alive on another host, its lease not lapsed
    assert wk.registry.claim_switch(name, entry.id, elsewhere, 600, b) == "claimed"
    assert wk.registry.path_progressed(name, entry.id, elsewhere, 1 << 20, 4 << 20, "downloading: 1 of 4 MiB")
    _record(wk.registry, name, failure)
    model = wk.registry.get_model(name)
    assert model.local_paths[0].message == "downloading: 1 of 4 MiB" and model.local_paths[0].lease is not None
    wk.registry.end_switch(name, entry.id, elsewhere)

    dead = Holder.here("switch-dead")
    assert wk.registry.claim_switch(name, entry.id, dead, 0.01, b) == "claimed"
    assert wk.registry.path_progressed(name, entry.id, dead, 1 << 20, 4 << 20, "downloading: 1 of 4 MiB")
    time.sleep(0.05)
    _record(wk.registry, name, failure)
    model = wk.registry.get_model(name)
    path = model.local_paths[0]
    assert path.status == "Ready" and path.lease is None and model.phase == "Ready" and model.pending_commit == b
    assert path.message == model.message
    assert f"switch of {path.path} to {b} did not finish" in path.message and "evicted" in path.message
