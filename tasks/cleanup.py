"""Deletion steps: stop downloads, clean each path (guarded), remove the staged S3 copy, release the model."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from prefect import get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.client.schemas.sorting import FlowRunSort
from prefect.states import Cancelled, Cancelling

from weightkeeper.tasks.download import path_holder
from weightkeeper.tasks.stage import SCRATCH
from weightkeeper.errors import CleanupError, DownloadError, LinkInTheWayError, NotOursError, UnsafePathError
from weightkeeper.events import emit_phase
from weightkeeper.anchored import remove_under
from weightkeeper.fsops import LEGACY, open_copy, remove_model_files, remove_model_path, remove_repo_dir
from weightkeeper.config import DOWNLOAD_FLOW, Settings, job_run_name
from weightkeeper.guard import check_removable, check_staged_prefix
from weightkeeper.pods import live_pods
from weightkeeper.lease import renewed
from weightkeeper.registry import Holder, Model
from weightkeeper.registry.common import this_host, utcnow
from weightkeeper.registry.leases import CLEANUP, Kind, Lease, abandoned, process_alive
from weightkeeper.registry.metrics import CLEANUP_SECONDS
from weightkeeper.context import current
from weightkeeper.s3 import delete_prefix
from weightkeeper.sharing import file_lock, links_into, unmark_ready
from weightkeeper.sources import limits, s3_client

STOP_POLL_SECONDS = 1.0
TERM_GRACE_SECONDS = 10.0
RUNS_PAGE = 100  # flow runs read per request (at most the server's limit, 200 by default)


def _alive_here(holder: Holder) -> bool:
    """True when the holder's process still runs on this host (same pid and start time)."""
    if holder.host != this_host() or holder.pid == os.getpid() or holder.started <= 0:
        return False
    return process_alive(holder)


@dataclass(frozen=True)
class _Work:
    """A download (or a staging to S3) of the model that holds a lease."""

    what: str
    lease: Lease


def _running(model: Model) -> list[_Work]:
    """The model's work that holds a live lease, or a lapsed one while its process still runs here."""
    work = [_Work(f"{p.workspace}:{p.path}", p.lease) for p in model.local_paths
            if p.lease is not None and p.lease.purpose != CLEANUP]
    if model.staging_lease is not None:
        work.append(_Work(f"staging to {model.staging_uri}", model.staging_lease))
    now, here = utcnow(), this_host()
    return [w for w in work if not abandoned(w.lease, now, here) or _alive_here(w.lease.holder)]


@task(name="stop-downloads", retries=3, retry_delay_seconds=30)
def stop_downloads(name: str) -> int:
    """Wait until no download or staging of the model is running anywhere (the model is already Deleting).

    Running work sees Deleting on its next heartbeat and stops. A holder whose lease has expired
    but whose process still runs on this host is terminated. Returns how many were stopped.
    """
    logger = get_run_logger()
    settings, registry = current()
    deadline = time.monotonic() + settings.stop_timeout_seconds
    seen: set[str] = set()
    signalled: dict[int, float] = {}
    while True:
        model = registry.get_model(name)
        active = _running(model)
        pods = [] if active else _job_pods(settings, model)  # the leases first, then what the clusters say
        if not active and not pods:
            if seen:
                logger.info("%s: %d download(s) stopped", name, len(seen))
            return len(seen)
        for w in active:
            h = w.lease.holder
            seen.add(h.run)
            if w.lease.expires_at <= utcnow() and _alive_here(h):
                first = signalled.setdefault(h.pid, time.monotonic())
                sig = signal.SIGKILL if time.monotonic() - first > TERM_GRACE_SECONDS else signal.SIGTERM
                logger.warning("%s: %s (run %s, pid %d) stopped renewing its lease; sending %s", name, w.what, h.run,
                               h.pid, sig.name)
                os.kill(h.pid, sig)
        waiting = [w.what for w in active] + [f"pod {pod}" for pod in pods]
        registry.set_message(name, f"stopping {len(waiting)} download(s) before cleanup: " + ", ".join(waiting))
        if time.monotonic() > deadline:
            raise CleanupError(f"downloads of {name!r} still running after {settings.stop_timeout_seconds:.0f}s: "
                               + ", ".join(waiting) + "; the model is kept and deletion retried")
        time.sleep(STOP_POLL_SECONDS)


def _job_pods(settings: Settings, model: Model) -> list[str]:
    """Pods of the model's download jobs that a Kubernetes workspace still runs: in every Kubernetes workspace of
    the clusters its paths are on (a path that failed over had its job in another), for every such run. Their
    unfinished runs are asked to cancel (the worker then deletes their Jobs); a Cancelled run does not prove its
    pod is gone, so only the cluster's answer counts."""
    clusters = {p.cluster for p in model.local_paths}
    runs: dict = {}  # by cluster target: workspaces sharing a pool's target are asked once
    for ws in settings.workspaces:
        if ws.kubernetes is not None and ws.cluster in clusters:
            runs.setdefault(ws.kubernetes, []).extend(str(run.id) for run in _job_runs(model.name, ws.name))
    return sorted({pod for target, ids in runs.items()
                   for pod in live_pods(target, ids, model=model.name)})  # by run, and by the model's label


def _job_runs(name: str, workspace: str) -> list:
    """Every download run of the model in the workspace (page by page: a server answers at most a page; by its
    parameters too, as `a` in `b-c` and `a-b` in `c` name their runs alike), its unfinished ones asked to cancel."""
    named = FlowRunFilter(name=FlowRunFilterName(any_=[job_run_name(DOWNLOAD_FLOW, name, workspace)]))
    runs: list = []
    with get_client(sync_client=True) as client:
        read = 0
        while page := client.read_flow_runs(flow_run_filter=named, sort=FlowRunSort.ID_DESC, limit=RUNS_PAGE,
                                            offset=read):
            read += len(page)
            runs += [run for run in page if run.parameters.get("name") == name]
        for run in runs:
            if run.state and not run.state.is_final() and not run.state.is_cancelling():
                client.set_flow_run_state(run.id, Cancelled() if run.state.is_scheduled() else Cancelling(
                    message=f"model {name!r} is being deleted"), force=True)
    return runs


def _undeclared(settings: Settings, entry) -> str:
    """Why a path whose workspace left the config is not removed, and what to declare: a workspace of the same
    cluster whose volume holds the path may be the same one renamed, or another filesystem mounted at the same
    path (another host's disk, a Kubernetes volume), which only the admin knows."""
    config = settings.config_path or "$WEIGHTKEEPER_CONFIG"
    gone = f"refusing to remove {entry.path!r}: workspace {entry.workspace!r} is no longer declared in {config}"
    if ws := next((w for w in settings.workspaces if w.cluster == entry.cluster and w.volume
                   and entry.path.startswith(w.volume.rstrip("/") + "/")), None):
        return (f"{gone}; workspace {ws.name!r} holds its volume: if it is {entry.workspace!r} renamed, declare "
                f"{entry.workspace!r} again beside it (cluster {entry.cluster!r}, volume {ws.volume!r}) until the "
                "deletion finishes")
    return f"{gone}; declare it again with the volume that holds this path so its files can be removed"


def _retry_cleanup(task, task_run, state) -> bool:
    """Retry what may pass (a busy volume, a link someone swapped in on the way), not what the guard refuses."""
    try:
        state.result()
    except LinkInTheWayError:
        return True
    except UnsafePathError:
        return False
    except Exception:  # noqa: BLE001
        return True
    return False


@task(name="clean-path", retry_condition_fn=_retry_cleanup)
def clean_path(name: str, path_id: int) -> str:
    """Remove one path's directory (guarded), then its entry; keep the files another live model uses."""
    settings, registry = current()
    entry = next((p for p in registry.get_model(name).local_paths if p.id == path_id), None)
    if entry is None:
        return "gone"
    holder, attempt = path_holder(path_id), registry.get_model(name).cleanup_attempts + 1
    if not registry.claim_cleanup(name, path_id, holder, settings.lease_seconds):
        registry.cleanup_failed(name, attempt, f"another run is cleaning {entry.path}; retrying")
        raise CleanupError(f"another run is cleaning {entry.path}; retrying")
    started = time.monotonic()
    with renewed(registry, Kind.PATH, path_id, holder, settings.lease_seconds):
        outcome = _clean(settings, registry, name, entry, holder, attempt)
    registry.record(CLEANUP_SECONDS, time.monotonic() - started)
    return outcome


def _clean(settings: Settings, registry, name: str, entry, holder: Holder, attempt: int) -> str:
    logger, path_id = get_run_logger(), entry.id
    try:
        if not entry.owned:
            registry.remove_path(name, path_id)
            logger.info("%s: %s was never downloaded by this model; entry dropped, files untouched", name, entry.path)
            return "not-owned"
        if registry.get_model(name).keep_files:
            registry.remove_path(name, path_id)
            logger.info("%s: %s kept in place: the model was created with keep_files", name, entry.path)
            return "reserved"
        other = registry.path_in_use_elsewhere(name, path_id)
        if other:
            registry.remove_path(name, path_id)
            logger.info("%s: %s is also used by live model %r; files kept", name, entry.path, other)
            return "kept"
        if settings.workspace(entry.workspace) is None:
            raise UnsafePathError(_undeclared(settings, entry))
        check_removable(entry.path, settings.volume_rules)
        if entry.adopted and entry.made == LEGACY:  # it held others' files first: take away only what weightkeeper put there
            files = [f["path"] for f in registry.get_model(name).files or []]
            left = remove_model_files(entry.path, files, settings.volume_rules)
            registry.remove_path(name, path_id)
            logger.info("%s: removed its files from %s; %d entries that were there before are kept",
                        name, entry.path, left)
            return "removed-own-files"
        try:
            removed = remove_model_path(entry.path, settings.volume_rules, made=entry.made)
        except NotOursError as e:
            registry.remove_path(name, path_id)
            registry.set_message(name, str(e))
            logger.warning("%s: %s", name, e)
            return "not-ours"
        registry.remove_path(name, path_id)
        logger.info("%s: %s %s", name, entry.path, "removed" if removed else "was already gone")
        return "removed"
    except (CleanupError, UnsafePathError) as e:
        registry.cleanup_failed(name, attempt, f"cleanup of {entry.path} in workspace {entry.workspace!r} failed: "
                                               f"{e}; the model is kept and cleanup retried", path_id, holder)
        logger.error("%s: cleanup failed (attempt %d): %s", name, attempt, e)
        raise


@task(name="remove-staged-snapshot", retry_condition_fn=_retry_cleanup)
def remove_staged_snapshot(name: str) -> str:
    """Delete the model's staged prefix in S3 (guarded, `.../<commit>/` with its trailing slash) once no
    other live model records it. An s3:// source is never ours to delete."""
    logger = get_run_logger()
    settings, registry = current()
    model = registry.get_model(name)
    remove_under(settings.home, f"{SCRATCH}/{name}")  # this host's leftovers of a staging run, whatever follows
    uri = model.staging_uri
    if not uri:
        return "none"
    if not model.staging_owned:
        registry.clear_staging(name)
        logger.info("%s: %s is the model's source, not a copy weightkeeper staged; left in place", name, uri)
        return "source"
    if other := registry.staging_in_use_elsewhere(name):
        registry.clear_staging(name)
        logger.info("%s: staged copy %s is also used by live model %r; kept", name, uri, other)
        return "kept"
    attempt = model.cleanup_attempts + 1
    try:
        if settings.s3 is None:
            raise CleanupError("S3 is no longer configured: restore the [s3] table so the staged copy can be removed")
        bucket, prefix = check_staged_prefix(uri, settings.s3.bucket, settings.s3.prefix)
        removed = delete_prefix(s3_client(settings), bucket, prefix, limits(settings))
    except (CleanupError, UnsafePathError, DownloadError) as e:
        registry.cleanup_failed(name, attempt, f"removal of the staged copy {uri} failed: {e}; the model is kept "
                                               "and the removal retried")
        logger.error("%s: removal of %s failed (attempt %d): %s", name, uri, attempt, e)
        if isinstance(e, UnsafePathError):
            raise
        raise CleanupError(str(e)) from None
    registry.clear_staging(name)
    logger.info("%s: removed %d object(s) under %s", name, removed, uri)
    return "removed"


@task(name="release-model")
def release_model(name: str) -> None:
    """Let the model go: only once every path entry is gone."""
    _, registry = current()
    if not registry.release_model(name):
        left = [p.path for p in registry.get_model(name).local_paths]
        raise CleanupError(f"model {name!r} still has paths {left}; it is kept")
    emit_phase(name, "Released", "every file it put down is gone")
    get_run_logger().info("%s released", name)


@task(name="collect-shared-copy")
def collect_shared_copy(artifact_id: int) -> str:
    """Delete a shared copy once no model uses it (`Artifact.in_use`) and no link under the models root points into
    it."""
    logger = get_run_logger()
    settings, registry = current()
    artifact = registry.get_artifact(artifact_id)
    if artifact is None:
        return "gone"
    if artifact.in_use:
        return "in use"
    holder = Holder.here(f"collect/{artifact_id}")
    if registry.claim_artifact(artifact_id, holder, settings.lease_seconds):
        return "busy"

    def busy() -> None:
        raise CleanupError(f"another process holds the lock on {artifact.path}")

    try:
        with file_lock(artifact.path, settings.volume_rules, on_wait=busy):
            links = links_into(artifact.path, settings.volume_rules)
            if registry.get_artifact(artifact_id).in_use or links:
                registry.set_artifact(artifact_id, holder, artifact.state, f"kept: linked from {', '.join(links)}"
                                      if links else "kept: in use", release=True)
                logger.info("shared copy %s kept: %s", artifact.path, ", ".join(links) or "in use")
                return "linked"
            done = "deleted"
            try:
                if artifact.made is not None:  # else nothing was made: only an empty directory is removed
                    with open_copy(artifact.path, settings.volume_rules, artifact.made) as copy:
                        unmark_ready(copy)
                if not remove_model_path(artifact.path, settings.volume_rules, artifact.made, artifact=True):
                    done = "forgotten (already gone)"
            except FileNotFoundError:
                done = "forgotten (already gone)"
            except NotOursError as e:  # someone else's directory stands there: left to its owner
                logger.warning("%s", e)
                done = "forgotten"
            if not registry.delete_artifact(artifact_id):
                raise CleanupError(f"a model linked to {artifact.path} while it was being collected")
            remove_repo_dir(artifact.path, settings.volume_rules)  # once empty (its lock file stays: `file_lock`)
    except (CleanupError, UnsafePathError, OSError) as e:  # OSError: its lock, on a shelf this process may not enter
        why = f"{e.filename or artifact.path}: {e.strerror}" if isinstance(e, OSError) and e.strerror else str(e)
        registry.set_artifact(artifact_id, holder, artifact.state, f"cannot collect: {why}", release=True)
        logger.warning("shared copy %s not collected: %s", artifact.path, why)
        return "busy"
    logger.info("shared copy %s %s: no model uses it", artifact.path, done)
    return "collected"
