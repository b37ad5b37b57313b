"""reconcile: drive every model to its desired state, prove every copy complete and correct, repair what
is not, collect unused shared copies, report directories that no model owns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from weightkeeper.flows.jobs import deployed
from weightkeeper.tasks.cleanup import collect_shared_copy
from weightkeeper.tasks.verify import Copy, check_copies, check_links, verify_model_path, verify_shared_copy
from weightkeeper.config import DELETE_FLOW, RECONCILE_FLOW, Settings
from weightkeeper.desired import IN_PROGRESS, in_grace, needed_run, orphans, update_due
from weightkeeper.registry import Model, Registry
from weightkeeper.registry.artifacts import A_DOWNLOADING, A_PENDING, A_READY, Artifact
from weightkeeper.registry.common import DELETING, READY, utcnow
from weightkeeper.registry.runs import RunLease
from weightkeeper.runs import NoDeployment, flow_run_of, mark_run_crashed, reserve, start_deployment, still_queued
from weightkeeper.download import RemoteFile
from weightkeeper.errors import DownloadError, NotFoundError
from weightkeeper.layout import is_artifacts_dir
from weightkeeper.verify import Due, listed
from weightkeeper.runtime import ensure_download_limit
from weightkeeper.context import current


@task(name="mark-crashed")
def mark_crashed(run_id: str, model: str) -> str:
    """A run whose lease lapsed is dead (killed with its worker): show it Crashed instead of Running."""
    return mark_run_crashed(run_id, f"no heartbeat on the lease of model {model!r}; reconcile redoes its work")


@task(name="start-run")
def start_run(flow_name: str, name: str, update: bool = False) -> str:
    """Start the lifecycle run a model needs: a deployment run (when deployed), else here as a subflow. `update`:
    the run of a Ready model whose next commit is due."""
    settings, registry = current()
    key = f"reconcile/{flow_run.id or 'local'}/{flow_name}/{name}"
    # only while the model is still where this pass saw it: another pass may have finished it
    phases = (DELETING,) if flow_name == DELETE_FLOW else (READY,) if update else IN_PROGRESS
    try:
        if deployed():
            run_id = start_deployment(registry, settings, flow_name, name, key, phases)
            return f"{flow_name} started: {run_id}" if run_id else "busy"
        if reserve(registry, settings, flow_name, name, key, phases):
            return "busy"
    except NoDeployment as e:
        return f"not started: {e}"
    except NotFoundError:
        return "gone"  # released by another run meanwhile
    return f"{flow_name}: {_run_here(flow_name, name)}"


def _run_here(flow_name: str, name: str) -> str:
    from weightkeeper.flows.delete_model import delete_model
    from weightkeeper.flows.ensure_model import ensure_model

    state = (delete_model if flow_name == DELETE_FLOW else ensure_model)(name, return_state=True)
    return state.result() if state.is_completed() else f"{state.name}: {state.message}"


def _drive_models(settings: Settings, registry: Registry, models: list[Model],
                  runs: dict[str, RunLease]) -> dict[str, str]:
    logger = get_run_logger()
    outcomes: dict[str, str] = {}
    now = utcnow()
    lapsed = {name: run_id for name, lease in runs.items()
              if lease.reserved and not lease.fresh and (run_id := flow_run_of(lease.lease))}
    queued = still_queued(list(lapsed.values())) if lapsed else set()
    for model in models:
        lease = runs.get(model.name)
        if lapsed.get(model.name) in queued:  # its run waits for a worker: keep it reserved, start no other
            try:  # renewed, unless that run (or another) took the lease meanwhile
                registry.claim_run(model.name, lease.flow, lease.lease.holder, settings.lease_seconds, seen=model)
            except NotFoundError:
                pass
            outcomes[f"model {model.name}"] = "queued"
            continue
        if lease is not None and not lease.fresh and (run_id := flow_run_of(lease.lease)):
            logger.warning("%s: run %s of %s has not renewed its lease since %s; treated as crashed", model.name,
                           run_id, lease.flow, lease.lease.expires_at)
            mark_crashed(run_id, model.name, return_state=True)
            registry.release_run(model.name, lease.lease.holder, abandoned_only=True)  # marked once
        update = update_due(model.phase, model.track, model.next_revision, model.head_checked_at, now,
                            settings.track_interval_seconds, model.id, pending=model.pending_commit is not None)
        if flow_name := needed_run(model.phase, lease.flow if lease is not None and lease.fresh else None, update):
            outcomes[f"model {model.name}"] = start_run(flow_name, model.name, update)
    return outcomes


def _verify(settings: Settings, registry: Registry, artifacts: list[Artifact]) -> dict[str, str]:
    """Every copy due: one `check-copies` task for all of them (a size check, and a full hash of those due for
    one); then a task of its own for each copy not Ready, found damaged, or with a malformed manifest (it
    hashes, or repairs). A copy not due costs its row alone."""
    when = Due.at(utcnow(), settings.verify_interval_seconds, settings.check_interval_seconds)
    outcomes = {a.path: "not downloaded" for a in artifacts if a.state in (A_PENDING, A_DOWNLOADING)}
    shared = [a for a in artifacts if a.path not in outcomes]
    own = registry.own_copies()
    alone = {a.path: (verify_shared_copy, f"verify-{a.id}", (a.id,)) for a in shared}  # a task of its own
    alone |= {c.path: (verify_model_path, f"verify-{c.model}-{c.workspace}", (c.model, c.path_id)) for c in own}
    due = {c.path: when.of(c.verified_at, c.checked_at, c.path_id) for c in own if c.status == READY}
    due |= {a.path: when.of(a.verified_at, a.checked_at, a.id) for a in shared if a.state == A_READY}
    manifests = registry.manifests({c.model_id for c in own if due.get(c.path) is not None})
    wanted = [(a.path, a.files, a.id, a.made) for a in shared] + \
             [(c.path, manifests[c.model_id], c.path_id, c.made) for c in own if c.model_id in manifests]
    artifacts = {a.path for a in shared}
    sizes = {id(files): listed(files) for _, files, *_ in wanted}  # a model's copies share its manifest
    copies = [copy for path, files, key, made in wanted if due.get(path) is not None
              and (copy := _copy(path, files, key, path in artifacts, due[path], sizes[id(files)], made))]
    damaged = check_copies(quote(copies)) if copies else {}
    outcomes.update({copy.path: "verified" if copy.deep else "checked" for copy in copies if copy.path not in damaged})
    malformed = {path for path, *_ in wanted if due.get(path) is not None} - {copy.path for copy in copies}
    by_itself = [path for path in alone if path not in due or path in damaged or path in malformed]  # or not Ready
    futures = {path: task_.with_options(task_run_name=name).submit(*args)
               for path in by_itself for task_, name, args in [alone[path]]}
    for path, future in futures.items():
        future.wait()
        outcomes[path] = future.result() if future.state.is_completed() else f"error: {future.state.message}"
    outcomes.update({path: "not due" for path, deep in due.items() if deep is None})
    return outcomes


def _copy(path: str, files: list, key: int, artifact: bool, deep: bool, sizes: tuple | None,
          made: str | None) -> Copy | None:
    """The copy for the bulk check (`sizes`: `listed(files)`; `made`: its directory's identity); None when its
    manifest is malformed (its own task says so)."""
    if deep:
        try:
            return Copy(path, tuple(RemoteFile.from_json(f) for f in files), key, artifact, True, made)
        except DownloadError:
            return None
    return Copy(path, sizes, key, artifact, False, made) if sizes is not None else None


def _collect(artifact_id: int) -> str:
    """Collect an unused copy; a failure is this copy's outcome, never the pass's end."""
    state = collect_shared_copy(artifact_id, return_state=True)
    return state.result() if state.is_completed() else f"failed: {state.message}"


def _orphans(settings: Settings, registry: Registry) -> list[str]:
    """Directories directly under each models dir that no model path or shared copy is at or below (the
    recorded paths read after the directories are listed, so a model made meanwhile is never reported)."""
    children: list[str] = []
    for ws in settings.workspaces:
        root = Path(ws.volume or "/nonexistent") / ws.models_dir
        if root.is_dir():
            children += [str(c) for c in root.iterdir() if not (c.name.startswith(".") or is_artifacts_dir(c.name))
                         and (c.is_dir() or c.is_symlink())]
    return orphans(sorted(set(children)), registry.recorded_paths()) if children else []


class Outcomes(Mapping[str, str]):
    """A pass's outcome of each model and copy, by name or path. A mapping, not a dict: Prefect walks a flow's
    dict result item by item (looking for futures), which cost a quarter of a pass at 20,000 copies."""

    def __init__(self, outcomes: dict[str, str]):
        self._outcomes = outcomes

    def __getitem__(self, key: str) -> str:
        return self._outcomes[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._outcomes)

    def __len__(self) -> int:
        return len(self._outcomes)


@flow(name=RECONCILE_FLOW, flow_run_name="reconcile")
def reconcile() -> Outcomes:
    """One pass: every linked path's link checked, lifecycle runs for models not in their desired state, a size
    check of every copy (a full hash when due), repairs, garbage collection, and a report of orphaned directories
    (never deleted)."""
    logger = get_run_logger()
    settings, registry = current()
    ensure_download_limit(settings)  # repairs take download slots
    links = registry.linked_paths()  # first: a killed switch is rolled back before a head check drops its commit
    outcomes = dict(check_links(quote(links))) if links else {}
    models, runs = registry.reconcile_state(settings.track_interval_seconds)
    outcomes.update(_drive_models(settings, registry, models, runs))
    artifacts = registry.list_artifacts()
    outcomes.update(_verify(settings, registry, artifacts))
    now = utcnow()
    for artifact in artifacts:
        if not artifact.in_use:
            outcomes[artifact.path] = "kept: switched from recently" if in_grace(
                artifact.released_at, now, settings.track_grace_seconds) else _collect(artifact.id)
    found = _orphans(settings, registry)
    outcomes.update({path: "orphan" for path in found})
    rows = "\n".join(f"| {path} | {outcome} |" for path, outcome in sorted(outcomes.items()))
    create_markdown_artifact(key="reconcile", markdown=f"| copy | outcome |\n|---|---|\n{rows}\n",
                             description="Last reconcile pass")
    orphan_rows = "\n".join(f"| {path} |" for path in found) or "| (none) |"
    create_markdown_artifact(key="orphans", markdown=(
        "Directories under a models dir that no model owns. weightkeeper never deletes them: check and remove "
        f"them by hand.\n\n| directory |\n|---|\n{orphan_rows}\n"), description="Orphaned directories")
    logger.info("reconcile: %d entries: %s", len(outcomes),
                ", ".join(f"{v}={n}" for v, n in sorted(Counter(outcomes.values()).items())))
    return Outcomes(outcomes)
