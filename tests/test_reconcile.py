"""reconcile drives every model to its desired state, safely when two passes run at once."""

from __future__ import annotations

import threading
from pathlib import Path

from conftest import tiny_files

from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile
from weightkeeper.config import DELETE_FLOW, ENSURE_FLOW
from weightkeeper.desired import needed_run, orphans
from weightkeeper.registry import Holder


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
