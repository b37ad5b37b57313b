"""Capacity per workspace: a model that would take a workspace past `capacity_bytes` is refused at creation."""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import expected_size, tiny_files
from test_cli import cli
from test_tenancy import Api
from weightkeeper.errors import ConflictError, UnavailableError
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.planning import capacity_problem


def test_the_capacity_is_reached_exactly_and_never_passed():
    assert capacity_problem("a", 100, 60, 40) is None
    assert capacity_problem("a", 100, 0, 0) is None
    problem = capacity_problem("a", 100, 60, 41)
    assert problem == ("workspace 'a' stores 60 of its capacity_bytes = 100 bytes, and this model needs 41 bytes "
                       "(1 too many)")


def limited(wk, capacity: int, users: bool = False) -> None:
    """team-a holds at most `capacity` bytes; with `users`, alice may call the API."""
    wk.rewrite(hf_endpoint=wk.settings.hf_endpoint, workspaces=[
        {"name": "team-a", "volume": str(wk.volumes["team-a"]), "capacity_bytes": capacity},
        {"name": "team-b", "volume": str(wk.volumes["team-b"])}])
    if users:
        with open(wk.config, "a") as f:
            f.write(f'[[users]]\nname = "alice"\nuid = 1000\n'
                    f'token_sha256 = "{hashlib.sha256(b"alice-token").hexdigest()}"\n')


def test_a_model_past_the_capacity_is_refused_with_both_numbers(wk, hub):
    first, second = tiny_files("cap-1"), tiny_files("cap-2", shards=1)
    hub.add_repo("acme/cap-1", first)
    hub.add_repo("acme/cap-2", second)
    limited(wk, expected_size(first))
    hub.reset_stats()
    model = wk.declare("fits", "hf://acme/cap-1", workspaces=["team-a"])  # exactly the capacity: accepted
    assert model.commit and model.size_bytes == expected_size(first)  # sized, so pinned, at creation
    assert ensure_model("fits") == "Ready"
    assert [r.path.split("?")[0] for r in hub.requests if r.path.startswith("/api/")] == [
        "/api/models/acme/cap-1/revision/main"]  # resolved once: the run used the pinned snapshot
    rows = {r["name"]: r for r in json.loads(cli(wk, "workspace", "list", "--json").stdout)}
    assert rows["team-a"]["capacityBytes"] == rows["team-a"]["storedBytes"] == expected_size(first)
    assert rows["team-b"]["capacityBytes"] is None

    with pytest.raises(ConflictError) as e:
        wk.declare("over", "hf://acme/cap-2", workspaces=["team-a"])
    assert e.value.code == "InsufficientCapacity"
    assert f"stores {expected_size(first)} of its capacity_bytes = {expected_size(first)} bytes" in str(e.value)
    assert f"needs {expected_size(second)} bytes" in str(e.value)
    assert wk.registry.find_model("over") is None
    wk.declare("elsewhere", "hf://acme/cap-2", workspaces=["team-b"])  # no capacity there
    assert wk.registry.get_model("elsewhere").commit is None  # and so not resolved at creation


def test_a_pending_model_counts_at_its_size_so_a_burst_cannot_pass_the_capacity(wk, hub):
    files = tiny_files("burst")
    hub.add_repo("acme/burst-1", files)
    hub.add_repo("acme/burst-2", files)
    limited(wk, 2 * expected_size(files) - 1)
    wk.declare("first", "hf://acme/burst-1", workspaces=["team-a"])  # not downloaded yet
    with pytest.raises(ConflictError, match="InsufficientCapacity|too many"):
        wk.declare("second", "hf://acme/burst-2", workspaces=["team-a"])


def test_the_api_answers_409_and_503_and_the_cli_one_line(wk, hub):
    files = tiny_files("cap-api")
    hub.add_repo("acme/cap-api", files)
    limited(wk, expected_size(files) - 1, users=True)
    api = Api(wk)
    r = api.create("too-big", "hf://acme/cap-api", workspaces=["team-a"])
    assert r.status_code == 409 and r.json()["code"] == "InsufficientCapacity"
    assert f"capacity_bytes = {expected_size(files) - 1}" in r.json()["message"]
    assert f"needs {expected_size(files)} bytes" in r.json()["message"]
    out = cli(wk, "model", "create", "too-big", "--source", "hf://acme/cap-api", "--workspace", "team-a", check=False)
    assert out.returncode == 2 and "InsufficientCapacity" not in out.stderr and "1 too many" in out.stderr
    assert "Traceback" not in out.stderr

    hub.set_offline(True)
    try:
        r = api.create("unsized", "hf://acme/cap-api", workspaces=["team-a"])
        assert r.status_code == 503 and r.json()["code"] == "Unavailable" and "try again" in r.json()["message"]
        with pytest.raises(UnavailableError):
            wk.declare("unsized", "hf://acme/cap-api", workspaces=["team-a"])
    finally:
        hub.set_offline(False)
    assert wk.registry.find_model("unsized") is None
    r = api.create("missing", "hf://acme/no-such-repo", workspaces=["team-a"])
    assert r.status_code == 422 and "was not found" in r.json()["message"]


def test_sizing_at_creation_never_waits_for_a_spent_hub_budget(wk, hub):
    files = tiny_files("cap-budget")
    hub.add_repo("acme/cap-budget", files)
    wk.rewrite(hf_endpoint=hub.url, hub_api_requests_per_5min=1, hub_budget_window_seconds=30, workspaces=[
        {"name": "team-a", "volume": str(wk.volumes["team-a"]), "capacity_bytes": 10 * expected_size(files)}])
    wk.declare("first", "hf://acme/cap-budget", workspaces=["team-a"])  # the budget's one API call
    with pytest.raises(UnavailableError, match=r"budget is spent for \d+ s; try again then"):
        wk.declare("second", "hf://acme/cap-budget", workspaces=["team-a"], subpath="models/second")
    assert wk.registry.find_model("second") is None


def test_a_shared_copy_being_filled_counts_at_its_files_then_at_its_measured_size(wk):
    """A copy not measured yet still takes room: its manifest's sizes count until its size is recorded, so models
    created while it fills cannot pass the capacity."""
    from weightkeeper.registry import Holder

    ws = wk.settings.workspace("team-a")
    copy = wk.registry.artifact_for("acme/filling", "c" * 40, ws.cluster, ws.volume, f"{ws.volume}/.shared/filling",
                                    [{"path": "a.safetensors", "size": 700}, {"path": "config.json", "size": 23}])
    assert wk.registry.workspace_usage(wk.settings.workspaces)["team-a"]["storedBytes"] == 723
    holder = Holder.here("measure")
    assert wk.registry.claim_artifact(copy.id, holder, 60) is None
    wk.registry.set_artifact(copy.id, holder, "Ready", size_bytes=4096, release=True)
    assert wk.registry.workspace_usage(wk.settings.workspaces)["team-a"]["storedBytes"] == 4096
