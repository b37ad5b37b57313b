"""One way to run a lifecycle: each path is one run of the per-path flow, a subflow here or a deployment
run in its workspace's pool, and the wait for a deployment run ends: a dead worker, no worker, a pod that never
ran, a run past its budget."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import tiny_files
from served import POOL_B, _descendants, served_weightkeeper

from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from test_lifecycle import in_thread, wait_until

MIB = 1 << 20


def flow_runs(**filters):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(**filters))


def named(name: str):
    from prefect.client.schemas.filters import FlowRunFilterName

    return flow_runs(name=FlowRunFilterName(any_=[name]))


def subflows(parent_name: str, tasks: dict[str, set[str]]) -> dict:
    """The parent's subflow runs: name -> (flow, state, task-run names), once each run named in `tasks` shows
    those task runs (the server records task runs in batches, up to a second late)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    (parent,) = named(parent_name)
    children = flow_runs(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent.id]))
    with get_client(sync_client=True) as client:
        def tasks_of(run) -> set[str]:
            return {t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run.id]}))}

        def runs() -> dict:
            found = {run.name: (client.read_flow(run.flow_id).name, run.state.name, tasks_of(run)) for run in children}
            return found if all(names <= found.get(run, ("", "", set()))[2] for run, names in tasks.items()) else {}

        return wait_until(runs, what=f"the task runs {tasks} of {parent_name}")


def test_a_lifecycle_here_runs_each_path_as_a_subflow_of_the_per_path_flow(wk, hub):
    hub.add_repo("acme/sub", tiny_files("sub"))
    wk.declare("sub", "hf://acme/sub")
    assert ensure_model("sub") == "Ready"
    downloads = subflows("ensure-sub", {f"download-sub-{ws}": {f"download-sub-{ws}", f"record-size-sub-{ws}"}
                                        for ws in ("team-a", "team-b")})
    assert set(downloads) == {"download-sub-team-a", "download-sub-team-b"}
    for ws in ("team-a", "team-b"):
        flow, state, tasks = downloads[f"download-sub-{ws}"]
        assert (flow, state) == ("download-to-path", "Completed")
        assert {f"download-sub-{ws}", f"record-size-sub-{ws}"} <= tasks
    assert delete_model("sub") == "Released"
    cleanups = subflows("delete-sub", {"clean-sub-team-a": {"clean-sub-team-a"}})
    assert {name: (flow, state) for name, (flow, state, _) in cleanups.items()} == {
        f"clean-sub-{ws}": ("clean-path", "Completed") for ws in ("team-a", "team-b")}
    assert "clean-sub-team-a" in cleanups["clean-sub-team-a"][2]


def test_only_the_childs_own_abandoned_lease_tells_that_its_worker_died(wk):
    import uuid

    from weightkeeper.flows.jobs import child_alive
    from weightkeeper.registry import Holder

    path = wk.declare("alive", "hf://acme/alive", workspaces=["team-a"]).local_paths[0]
    child, other = uuid.uuid4(), uuid.uuid4()

    def held_by(run, seconds: float):
        assert wk.registry.claim_download("alive", path.id, Holder.here(f"{run}/{path.id}"), seconds).ok
        time.sleep(0.05)
        return wk.registry.get_model("alive").local_paths[0]

    assert child_alive(path, child)  # not claimed yet: nothing to tell
    assert child_alive(held_by(child, 60), child)  # renewed in time
    assert not child_alive(held_by(child, 0.01), child)  # lapsed: nothing renews it
    # an earlier run's abandoned lease (a failover's new child about to take it over) is not the child's
    assert child_alive(held_by(other, 0.01), child)


def test_a_failure_is_recorded_only_on_a_path_nobody_works_on(wk):
    from weightkeeper.flows.jobs import JobFailure, _record
    from weightkeeper.registry import Holder

    path = wk.declare("record", "hf://acme/record", workspaces=["team-a"]).local_paths[0]
    failure = JobFailure(path, "download-to-path run x still Running after 3 s", crashed=False)
    live = Holder.here(f"live/{path.id}")
    assert wk.registry.claim_download("record", path.id, live, 60).ok
    _record(wk.registry, "record", failure)  # a cancelled run still holds the path: it records its own end
    now = wk.registry.get_model("record").local_paths[0]
    assert now.status == "Downloading" and now.lease.holder.run == live.run
    wk.registry.release_lease("path", path.id, live)
    assert wk.registry.claim_download("record", path.id, Holder.here(f"dead/{path.id}"), 0.01).ok
    time.sleep(0.05)
    _record(wk.registry, "record", failure)  # its holder is gone: the failure is recorded, the lease dropped
    now = wk.registry.get_model("record").local_paths[0]
    assert now.status == "Failed" and "still Running after 3 s" in now.message and now.lease is None


def _given_up(wk, monkeypatch, name: str, model):
    """A parent run of `model`'s one path in its pool, with a 3 s start deadline, that gives up on it: the path then."""
    from prefect import flow

    import weightkeeper.flows.jobs
    from weightkeeper.flows.jobs import download_paths

    monkeypatch.setattr(weightkeeper.flows.jobs, "START_SECONDS", 3)
    monkeypatch.setattr(weightkeeper.flows.jobs, "POLL_SECONDS", 0.5)

    @flow(name="deployed-parent")
    def parent() -> bool:
        return download_paths(name, model.local_paths)

    run = in_thread(parent)
    run.join(30)
    assert not run.is_alive() and run.result.get("value") is False
    (path,) = wk.registry.get_model(name).local_paths
    return path


def test_a_pool_without_a_worker_fails_the_path_naming_the_pool(wk, hub, monkeypatch):
    from weightkeeper.deployments import declared, ensure_work_pools

    wk.rewrite(hf_endpoint=hub.url, workspaces=[{"name": "idle", "volume": str(wk.volumes["team-a"]),
                                                 "work_pool": "wk-idle"}])
    ensure_work_pools(wk.settings)
    for deployment, pool in declared(wk.settings):
        if pool == "wk-idle" and deployment.flow_name == "download-to-path":
            deployment.apply(work_pool_name=pool)  # no worker serves the pool
    hub.add_repo("acme/idle", tiny_files("idle"))
    path = _given_up(wk, monkeypatch, "idle", wk.declare("idle", "hf://acme/idle"))
    assert path.status == "Failed" and "no worker serves work pool 'wk-idle'" in path.message
    assert "prefect worker start --pool wk-idle" in path.message and path.lease is None
    (child,) = named("download-idle-idle")
    assert child.state.is_cancelled()  # not left Scheduled for a worker started later


def test_a_run_a_worker_took_whose_pod_never_ran_fails_the_path_saying_what_to_check(wk, monkeypatch):
    """A worker of the Kubernetes pool took the child run (Pending) and submitted its job, but the pod never ran
    (its image cannot be pulled, a quota, a Secret that is missing): the path fails saying so and naming the
    kubectl command that shows why, not that no worker serves the pool."""
    import textwrap

    from prefect.client.orchestration import get_client
    from prefect.states import Pending

    import weightkeeper.flows.jobs
    from weightkeeper.deployments import declared, ensure_work_pools

    wk.config.write_text(textwrap.dedent(f"""
        home = "{wk.root}"
        registry_url = "{wk._registry_url}"
        [[workspaces]]
        name = "gpu"
        cluster = "east"
        volume = "{wk.volumes['team-a']}"
        work_pool = "kube-stuck"
        [workspaces.kubernetes]
        namespace = "team-a"
        image = "registry.local/weightkeeper:0.1"
        volume_claim = "models-a"
    """))
    ensure_work_pools(wk.settings)
    for deployment, pool in declared(wk.settings):
        if pool == "kube-stuck" and deployment.flow_name == "download-to-path":
            deployment.apply(work_pool_name=pool)
    start = weightkeeper.flows.jobs.run_deployment

    def taken_by_a_worker(*args, **kwargs):  # a worker takes the run and submits its job, whose pod never runs
        run = start(*args, **kwargs)
        with get_client(sync_client=True) as client:
            assert client.set_flow_run_state(run.id, Pending()).state.is_pending()
        return run

    monkeypatch.setattr(weightkeeper.flows.jobs, "run_deployment", taken_by_a_worker)
    path = _given_up(wk, monkeypatch, "stuck", wk.declare("stuck", "hf://acme/stuck", owner_uid=4242))
    (child,) = named("download-stuck-gpu")
    assert path.status == "Failed" and "its job was submitted to namespace 'team-a' but its pod never ran" in path.message
    assert f"`kubectl -n team-a describe pod -l prefect.io/flow-run-id={child.id}`" in path.message
    assert "no worker" not in path.message and "\n" not in path.message
    assert child.state.is_cancelling()  # asked to stop: the worker deletes the job it submitted


def test_a_moved_models_old_path_is_cleaned_only_once_the_registry_shows_the_new_one_ready(wk, hub, monkeypatch):
    """Whoever holds the Prefect credential (a pod's owner may) forges Completed on the new path's download run: the
    lifecycle believes the registry, not the run, and keeps the old path (the model's only copy) until the new path
    is Ready there; the next ensure fills the new path and cleans the old one."""
    from pathlib import Path

    import weightkeeper.flows.jobs
    from weightkeeper.service import move_model

    hub.add_repo("acme/moving", tiny_files("moving"))
    wk.declare("moving", "hf://acme/moving", workspaces=["team-a"], subpath="models/old")
    assert ensure_model("moving") == "Ready"
    old = Path(wk.registry.get_model("moving").local_paths[0].path)
    move_model(wk.settings, wk.registry, "moving", subpath="models/new", download_policy=None)
    with monkeypatch.context() as forged:  # every child run reports success without having run
        forged.setattr(weightkeeper.flows.jobs, "run_path_jobs", lambda *args, **kwargs: [])
        assert ensure_model("moving") != "Ready"
    retired, new = wk.registry.get_model("moving").local_paths
    assert retired.retired and retired.path == str(old) and old.is_dir() and any(old.iterdir())
    assert not new.retired and new.status != "Ready" and not os.path.lexists(new.path)
    assert ensure_model("moving") == "Ready"
    (new,) = wk.registry.get_model("moving").local_paths
    assert new.status == "Ready" and not new.retired and Path(new.path).is_dir() and not os.path.lexists(old)


@pytest.fixture(scope="module")
def served(tmp_path_factory, hub, registry_base_url):
    if registry_base_url:
        from conftest import _truncate

        _truncate(registry_base_url)
    with served_weightkeeper(tmp_path_factory.mktemp("paths-flow"), hub, registry_base_url) as served:
        yield served


def kill_worker(served, pool: str) -> None:
    """SIGKILL the pool's worker and every process under it (its flow runs), as a node dying does."""
    worker = served.workers[[w.args[w.args.index("--pool") + 1] for w in served.workers].index(pool)]
    for pid in [worker.pid, *_descendants(worker.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.wait()
    served.workers.remove(worker)


def test_a_deployed_ensure_whose_worker_dies_ends_with_a_message(served, hub):
    files = tiny_files("orphan", shards=1, shard_size=8 * MIB)
    hub.add_repo("acme/orphan", files)
    with hub.throttled(256 * 1024, repo_id="acme/orphan"):
        r = served.api.post("/api/v1/models", json={"name": "orphan", "source": "hf://acme/orphan",
                                                    "workspaces": ["team-b"]}, headers=served.as_user("alice"))
        assert r.status_code == 201, r.text
        wait_until(lambda: served.env.registry.get_model("orphan").local_paths[0].bytes_done > 0, 90,
                   "the download in team-b's pool to be under way")
        kill_worker(served, POOL_B)
        killed = time.monotonic()
        model = served.wait_phase("orphan", "Failed", timeout=60)
    assert time.monotonic() - killed < 30  # noticed at once: its process is gone (else once its lease lapsed)
    (path,) = served.env.registry.get_model("orphan").local_paths
    assert "Crashed: its worker is gone" in path.message and "weightkeeper model ensure orphan" in path.message
    assert "team-b" in model["message"] and "Crashed" in model["message"]
    assert path.lease is None  # the dead run's lease went with the failure: the next ensure starts at once
    (child,) = named("download-orphan-team-b")
    assert child.state.is_crashed()
    wait_until(lambda: named("ensure-orphan")[0].state.is_completed(), 30, "the ensure run to complete")


def test_a_deployed_run_past_its_budget_is_cancelled_and_the_wait_ends(served, hub, monkeypatch):
    from prefect import flow

    import weightkeeper.flows.jobs
    from weightkeeper.flows.jobs import run_path_jobs

    monkeypatch.setattr(weightkeeper.flows.jobs, "run_budget", lambda flow, settings: 3)
    monkeypatch.setattr(weightkeeper.flows.jobs, "POLL_SECONDS", 0.5)
    served.start_workers()  # team-b's, if a test before killed it
    hub.add_repo("acme/budget", tiny_files("budget", shards=1, shard_size=8 * MIB))
    model = served.env.declare("budget", "hf://acme/budget", workspaces=["team-b"])

    @flow(name="deployed-parent")
    def parent():
        return run_path_jobs("download-to-path", "budget", model.local_paths)

    with hub.throttled(256 * 1024, repo_id="acme/budget"):
        run = in_thread(parent)
        run.join(60)
        assert not run.is_alive()
    (failure,) = run.result["value"]
    assert "still Running after 3 s" in failure.message and not failure.crashed
    wait_until(lambda: named("download-budget-team-b")[0].state.is_cancelled(), 60, "the run to be cancelled")


def test_a_tracked_models_old_path_whose_cleanup_failed_is_cleaned_at_its_next_check(wk, hub, immutable):
    """A tracked model moved to a new subpath: its old path (a link) cannot be removed at first; the model is Ready at
    its new path, and its next check cleans the old one (a tracked model's runs go to the check, not the download)."""
    from pathlib import Path

    from weightkeeper.service import move_model

    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0)
    hub.add_repo("acme/tracked-mover", tiny_files("tracked-mover"))
    wk.declare("tracked-mover", "hf://acme/tracked-mover@main", workspaces=["team-a"], subpath="models/held/old",
               track=True)
    assert ensure_model("tracked-mover") == "Ready"
    old = Path(wk.registry.get_model("tracked-mover").local_paths[0].path)
    move_model(wk.settings, wk.registry, "tracked-mover", subpath="models/new", download_policy=None)
    with immutable(old.parent):
        assert ensure_model("tracked-mover") == "Ready"
        retired, new = wk.registry.get_model("tracked-mover").local_paths
        assert retired.retired and os.path.lexists(old) and new.status == "Ready"
    assert ensure_model("tracked-mover") == "Ready"
    (new,) = wk.registry.get_model("tracked-mover").local_paths
    assert not new.retired and not os.path.lexists(old)
