"""Download a model's snapshot into one workspace path (or link it to the shared copy), record its size."""

from __future__ import annotations

import contextvars
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run, task_run
from prefect.states import Cancelled

from weightkeeper.tasks.snapshot import retry_transient
from weightkeeper.config import Settings, Workspace
from weightkeeper.download import RemoteFile, Snapshot, in_place, listed_otherwise
from weightkeeper.hubbudget import budget_message, hub_budget
from weightkeeper.errors import (DownloadCancelled, DownloadError, NotFoundError, NotOursError, UnsafePathError,
                                 gave_up)
from weightkeeper.anchored import Dir, open_parent
from weightkeeper.fsops import (LEGACY, LINK, check_writable, directory_size, made_here, open_copy, own_copy,
                                own_directory, path_size)
from weightkeeper.layout import REUSE_IF_EXISTS, HfSource, artifact_path, link_target, parse_source, sharing_problem
from weightkeeper.lease import Held, renewed
from weightkeeper.registry import Holder, LocalPath, Model, Registry
from weightkeeper.registry.leases import Kind
from weightkeeper.registry.metrics import DOWNLOAD_SECONDS, DOWNLOADED_BYTES, REUSED_BYTES, SHARED_COPY_BYTES
from weightkeeper.registry.artifacts import A_DOWNLOADING, A_PENDING, A_READY
from weightkeeper.registry.common import DOWNLOADING, WAITING
from weightkeeper.reuse import Reused, reuse_files
from weightkeeper.runtime import fetch_in_slot
from weightkeeper.context import current
from weightkeeper.sharing import discard, file_lock, is_ready, mark_ready
from weightkeeper.sources import check_access, fetch_model_files, s3_uri
from weightkeeper.space import check_free_space
from weightkeeper.verify import verify_copy

WAIT_POLL_SECONDS = 2.0
PROGRESS_SECONDS = 2.0  # at most one progress write per path this often
ARTIFACT_SECONDS = 5.0


def path_holder(path_id: int) -> Holder:
    """The identity a flow run uses for one of its paths, shared by its download and record tasks."""
    return Holder.here(f"{flow_run.id or 'process'}/{path_id}")


def _entry(registry: Registry, name: str, path_id: int) -> LocalPath:
    return next(p for p in registry.get_model(name).local_paths if p.id == path_id)


def _missing(snapshot: Snapshot, target: Dir) -> list[str]:
    return [f.path for f in snapshot.files if not in_place(target, f)]


def _claim(registry: Registry, name: str, entry: LocalPath, holder: Holder, lease: float) -> None:
    """Wait until this run holds the path; fail the entry if another live model owns the directory or its
    path nests with another model's."""
    while True:
        claim = registry.claim_download(name, entry.id, holder, lease)
        if claim.ok:
            return
        if claim.outcome == "deleting":
            raise DownloadCancelled(f"model {name!r} is being deleted")
        if claim.outcome in ("taken", "nested"):
            message = (f"{entry.path} is already owned by {claim.who}" if claim.outcome == "taken" else
                       f"{entry.path} nests with {claim.other}'s path (one is inside the other)")
            message += "; this entry is not downloaded"
            registry.path_failed(name, entry.id, None, message)
            raise DownloadError(message, permanent=True)
        if claim.outcome == "wait":
            message = f"Waiting for deleted {claim.who} to finish cleaning up {entry.path}"
        else:
            message = f"Waiting for {claim.other}, working on {entry.path}"
        registry.set_path_message(name, entry.id, WAITING, message)
        time.sleep(WAIT_POLL_SECONDS)


class Reporter:
    """Progress and cancellation, throttled: called on every chunk from many threads. The leases are renewed
    apart (`weightkeeper.lease`); `held` is the path's, `also` a shared copy's while the run writes it. A
    progress artifact appears once the download has gone on for ARTIFACT_SECONDS (a shorter one has only the
    model's table of paths)."""

    def __init__(self, registry: Registry, name: str, entry: LocalPath, held: Held, total: int,
                 status: str = DOWNLOADING):
        self.registry, self.name, self.entry, self.held, self.total = registry, name, entry, held, total
        self.status = status  # of the path while this runs: Ready while it downloads the commit it switches to
        self.also: Held | None = None
        self.last_beat = 0.0
        self.last_artifact = time.monotonic()
        self.stopped: str | None = None
        self.artifact: UUID | None = None
        self.beating, self.showing = threading.Lock(), threading.Lock()
        self.task_context = contextvars.copy_context()

    def _check(self) -> None:
        if self.held.stopped:
            self.stopped = self.stopped or (
                f"another run took over {self.entry.path}" if self.held.lost.is_set() else
                f"model {self.name!r} is being deleted; download into {self.entry.path} stopped"
                if self.held.stop.is_set() else f"the lease on {self.entry.path} could not be renewed (the registry "
                "is unreachable?); the download stopped before another run may take it over")
        elif (also := self.also) and also.stopped:
            self.stopped = self.stopped or f"another run took over the shared copy for {self.entry.path}"
        if self.stopped:
            raise DownloadCancelled(self.stopped)

    def beat(self, done: int | None = None, message: str | None = None, force: bool = False) -> None:
        now = time.monotonic()
        self._check()
        if not force and now - self.last_beat < PROGRESS_SECONDS:
            return
        with self.beating:
            if not force and now - self.last_beat < PROGRESS_SECONDS:
                return  # another thread wrote meanwhile
            self.last_beat = now
            if not self.registry.path_progressed(self.name, self.entry.id, self.held.holder, done, self.total,
                                                 message):
                self.held.stop.set()
            self._check()
            show = done is not None and (now - self.last_artifact >= ARTIFACT_SECONDS or force and self.artifact)
            if show:
                self.last_artifact = now
        if show and self.showing.acquire(blocking=False):  # one artifact call at a time; the others go on
            try:
                self.task_context.run(self._show_progress, 100.0 * done / max(self.total, 1))
            finally:
                self.showing.release()

    def _show_progress(self, percent: float) -> None:
        """Create or update the progress artifact, in the task run's context (this may be a transfer thread)."""
        try:
            if self.artifact is None:
                self.artifact = create_progress_artifact(
                    progress=percent, key=f"progress-{self.name}-{self.entry.workspace}"[:100],
                    description=f"Download of {self.name} into {self.entry.path}")
            else:
                update_progress_artifact(self.artifact, progress=percent)
        except Exception as e:  # noqa: BLE001 - progress is for show: the download goes on
            get_run_logger().warning("%s: could not show progress of %s: %s", self.name, self.entry.path, e)


class FetchMeter:
    """A fetch's progress callback that counts the fetch in /metrics as it ends: the bytes it transferred (the
    progress it reports is the bytes present, first at its start), a failed fetch's too, and the time a
    complete one took from that start. Entered around the download slot, it records once the slot is free."""

    def __init__(self, registry: Registry, workspace: str, source: str, on_progress: Callable[[int], None]):
        self.registry, self.workspace, self.source, self.on_progress = registry, workspace, source, on_progress
        self.first: int | None = None
        self.most, self.started = 0, time.monotonic()

    def __call__(self, present: int) -> None:
        if self.first is None:
            self.first, self.started = present, time.monotonic()
        self.most = max(self.most, present)
        self.on_progress(present)

    def __enter__(self) -> FetchMeter:
        return self

    def __exit__(self, error: type | None, *_) -> None:
        if fetched := self.most - (self.first or 0):
            self.registry.record(DOWNLOADED_BYTES, fetched, workspace=self.workspace, source=self.source)
        if error is None:
            self.registry.record(DOWNLOAD_SECONDS, time.monotonic() - self.started, source=self.source)


def reuse_into(settings: Settings, registry: Registry, model: Model, snapshot: Snapshot, target: Dir,
               missing: list[str], workspace: str, cluster: str) -> Reused | None:
    """Take the missing files that verified copies of the Hub repository on the workspace's volume hold, fetched
    with the model's token block (`weightkeeper.reuse`), counted apart from fetched bytes; None when none was
    taken."""
    ws = settings.workspace(workspace)
    hub = isinstance(parse_source(model.source), HfSource)  # an S3 "repository" is only a prefix's last segment
    copies = registry.verified_copies(snapshot.repo_id, cluster, ws.volume, model.token_block) \
        if hub and ws and ws.volume else []
    if not copies:
        return None
    wanted = set(missing)
    reused = reuse_files(target, [f for f in snapshot.files if f.path in wanted], copies, settings.volume_rules,
                         settings.verify_workers, margin=settings.free_space_margin_bytes)
    if not reused.files:
        return None
    for how, size in reused.by_how.items():
        registry.record(REUSED_BYTES, size, workspace=workspace, how=how)
    get_run_logger().info("%s@%s: %s into %s from verified copies on %s", snapshot.repo_id, snapshot.commit[:12],
                          reused, target, ws.volume)
    return reused



def fetch_into(settings: Settings, registry: Registry, model: Model, snapshot: Snapshot, target: Dir,
               reporter: Reporter) -> None:
    """Fetch what is missing in `target`, holding a download slot while bytes flow (`HubBudget.held`)."""
    logger = get_run_logger()
    missing = _missing(snapshot, target)
    entry = reporter.entry
    if missing and (reused := reuse_into(settings, registry, model, snapshot, target, missing, entry.workspace,
                                         entry.cluster)):
        registry.set_path_message(model.name, entry.id, reporter.status, f"{reused} from copies on the volume")
        missing = _missing(snapshot, target)
    if not missing:
        logger.info("%s: all %d files already in %s; nothing to download", model.name, len(snapshot.files), target)
        return
    logger.info("%s: %d of %d files to fetch into %s", model.name, len(missing), len(snapshot.files), target)
    check_free_space(model.name, target, snapshot.files, settings.free_space_margin_bytes)

    uri = s3_uri(settings, model.source, model.staging_uri, snapshot.copy)
    origin, source = (uri, "s3") if uri else (f"{snapshot.repo_id}@{snapshot.commit[:12]}", "hub")
    downloading = f"downloading {origin} into {target}"
    budget = hub_budget(settings, registry, lambda seconds: reporter.beat(
        message=downloading if seconds is None else budget_message(seconds), force=True))

    def fetch(deadline: float) -> None:  # in a download slot (again after a long wait for the Hub budget)
        registry.set_path_message(model.name, reporter.entry.id, reporter.status, downloading)
        fetch_model_files(settings, model.source, model.staging_uri, model.token_block, snapshot, target, meter,
                          deadline, budget, lambda d, files: check_free_space(
                              model.name, d, files, settings.free_space_margin_bytes,
                              "a file whose resumed bytes failed their digest was not fetched again"))

    with FetchMeter(registry, reporter.entry.workspace, source, reporter.beat) as meter:
        fetch_in_slot(settings, budget, reporter.beat, fetch)
    reporter.beat(snapshot.total_bytes, force=True)
    logger.info("%s: fetched %d bytes into %s", model.name, meter.most - (meter.first or 0), target)


def shared_copy_path(ws: Workspace, model: Model, snapshot: Snapshot) -> str:
    """The shared copy of `snapshot` that a path of `model` in `ws` links to, on the shelf of whoever writes it
    (`layout.artifact_path`): the owner's, when this process is a job that runs as the model's owner (a Kubernetes
    workspace's); else the service's (a process pool's run, or a run in this process)."""
    owners = ws.kubernetes is not None and os.geteuid() == model.owner_uid
    return artifact_path(ws.volume, snapshot.repo_id, snapshot.copy, ws.models_dir,
                         maker_uid=model.owner_uid if owners else None)


def _prove_access(settings: Settings, registry: Registry, model: Model, entry: LocalPath, snapshot: Snapshot,
                  switch: bool, reporter: Reporter) -> None:
    """Prove the model's token before it is given files another model fetched (a wait for the Hub request budget
    said on the path); refused, a path not yet linked is no user of the copy (it never keeps the files of a gated
    repository once their owner's model is gone)."""
    try:
        check_access(settings, registry, model.source, model.token_block, snapshot, lambda seconds: seconds is None
                     or reporter.beat(message=budget_message(seconds), force=True))
    except DownloadError as e:
        if e.permanent and not switch and entry.made is None:  # refused, and nothing made at the path yet
            registry.link_path(model.name, entry.id, None)
        raise


def link_shared_copy(settings: Settings, registry: Registry, model: Model, entry: LocalPath, holder: Holder,
                     parent: Dir, name: str, snapshot: Snapshot, reporter: Reporter, switch: bool = False) -> str:
    """Link the entry's path (`name` in `parent`) to the verified shared copy of the snapshot on its volume (the
    copy's path is returned), downloading the copy first if needed. Everything happens under the copy's lease (registry) and file
    lock (volume), so exactly one run downloads it and garbage collection never races a new link.

    `switch`: the path is a link to another commit's copy, which it keeps until the new copy is verified; then
    a new link is renamed over it (a reader sees one commit or the other), and the registry records the switch
    (`path_switched`) before the new copy's lease is let go."""
    ws, volumes = settings.workspace(entry.workspace), settings.volume_rules
    path = shared_copy_path(ws, model, snapshot)
    check_writable(path, volumes, artifact=True)
    files = [f.to_json() for f in snapshot.files]
    while True:
        artifact = registry.artifact_for(snapshot.repo_id, snapshot.commit, entry.cluster, ws.volume, path, files)
        if relisted := listed_otherwise(artifact.files, files):  # the copy holds (or is filled with) other files
            raise DownloadError(f"the Hub lists {relisted} of {snapshot.repo_id}@{snapshot.commit} otherwise than when "
                                f"its shared copy {path} was made (a commit's files never change): check the Hub "
                                "endpoint (if that copy was made from a wrong listing, delete the models on it so "
                                "that garbage collection removes it)", permanent=True)
        copy_holder = Holder.here(f"artifact/{flow_run.id or 'process'}/{artifact.id}")
        try:
            if (blocker := registry.claim_artifact(artifact.id, copy_holder, settings.lease_seconds)) is None:
                break
        except NotFoundError:  # collected meanwhile: record it again
            continue
        reporter.beat(message=f"Waiting for {blocker.describe()}, working on the shared copy {path}", force=True)
        time.sleep(WAIT_POLL_SECONDS)
    if not switch:
        registry.link_path(model.name, entry.id, artifact.id)  # a user from now on: never collected under us
    message, ready = "download interrupted", False
    try:
        with renewed(registry, Kind.ARTIFACT, artifact.id, copy_holder, settings.lease_seconds) as reporter.also:
            with file_lock(path, volumes, on_wait=lambda: reporter.beat(
                    message=f"Waiting for the lock on the shared copy {path}", force=True)):
                recorded = registry.get_artifact(artifact.id)  # read under the lease: no one else sets it
                copy, made = own_copy(path, volumes, recorded.made)  # never a directory someone else put there
                with copy:
                    if made != recorded.made and not registry.set_artifact_made(artifact.id, copy_holder, made):
                        raise DownloadCancelled(f"another run took over the shared copy {path}")
                    # its marker counts while the registry says Ready: a copy whose repair failed is hashed first
                    ready = served = recorded.state == A_READY and is_ready(copy, snapshot.commit)
                    if not registry.fetched_with(artifact.id, model.token_block, model.name):
                        _prove_access(settings, registry, model, entry, snapshot, switch, reporter)
                    if not ready:
                        _fill_shared_copy(settings, registry, model, snapshot, copy, artifact.id, copy_holder,
                                          reporter)
                        ready = True
                if not registry.set_path_made(model.name, entry.id, holder, LINK):
                    raise DownloadCancelled(f"another run took over {entry.path}")
                try:  # the path was free when checked, maybe hours ago: what stands there now is someone's
                    _empty_dir_away(parent, name, entry.path)
                    parent.symlink(link_target(entry.path, path), name)
                except NotOursError as e:
                    raise DownloadError(f"{e}; move it away and ensure {model.name!r} again", permanent=True) \
                        from None
                if switch:
                    with open_copy(path, volumes, made) as copy:
                        registry.path_switched(model.name, entry.id, holder, artifact.id, directory_size(copy))
                message = "verified"
        if served:
            registry.record(SHARED_COPY_BYTES, snapshot.total_bytes, workspace=entry.workspace)
    finally:
        reporter.also = None
        state = A_READY if ready else A_PENDING
        registry.set_artifact(artifact.id, copy_holder, state, message if state == A_PENDING else "verified",
                              release=True)
    return path


def _check_filled(copy: Dir, files: tuple[RemoteFile, ...], found: set[str], workers: int) -> list:
    """Problems of a copy just filled: the files `found` in place before (written by another run) are hashed;
    those this run fetched or took were hashed as they came, so their size is checked."""
    return (verify_copy(copy, [f for f in files if f.path in found], deep=True, workers=workers)
            + verify_copy(copy, [f for f in files if f.path not in found], deep=False))


def _fill_shared_copy(settings: Settings, registry: Registry, model: Model, snapshot: Snapshot, copy: Dir,
                      artifact_id: int, holder: Holder, reporter: Reporter) -> None:
    """Download the shared copy, verify every file (fetching damaged ones again once), then mark it ready."""
    registry.set_artifact(artifact_id, holder, A_DOWNLOADING, f"downloading for model {model.name!r}")
    found = {f.path for f in snapshot.files if in_place(copy, f)}
    fetch_into(settings, registry, model, snapshot, copy, reporter)
    problems = _check_filled(copy, snapshot.files, found, settings.verify_workers)
    if problems:  # files found in place (not fetched now) can be damaged: fetch those again
        get_run_logger().warning("%s: shared copy %s: %s; fetching again", model.name, copy,
                                 "; ".join(map(str, problems)))
        for problem in problems:
            discard(copy, problem.path)
        found -= {problem.path for problem in problems}
        fetch_into(settings, registry, model, snapshot, copy, reporter)
        problems = _check_filled(copy, snapshot.files, found, settings.verify_workers)
    if problems:
        raise DownloadError(f"shared copy {copy} failed verification ({problems[0]})")
    mark_ready(copy, snapshot.commit)
    registry.set_artifact(artifact_id, holder, A_DOWNLOADING, "verified", size_bytes=directory_size(copy),
                          verified=True)
    get_run_logger().info("%s: shared copy %s downloaded and verified", model.name, copy)


def _empty_dir_away(parent: Dir, name: str, path: str) -> None:
    """An empty directory standing where the link goes is removed (only ever an empty one)."""
    st = parent.lstat(name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        try:
            parent.rmdir(name)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise NotOursError(f"{path} is no longer empty: it is left alone, and not linked") from None


def _links_or_free(parent: Dir, name: str, made: str | None) -> bool:
    """The path can become (or stay) a link to the shared copy: nothing there, a link, or an empty
    directory that is not the model's own copy."""
    st = parent.lstat(name)
    if st is None or stat.S_ISLNK(st.st_mode):
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    with parent.descend(name) as d:
        return (made == LEGACY or not made_here(d, made)) and not d.entries()


@task(name="download-snapshot", retries=2, retry_delay_seconds=[10, 30], retry_condition_fn=retry_transient)
def download_snapshot(name: str, path_id: int, snapshot: Snapshot):
    """Fill one path: claim it, then fetch an own copy, or link it to the shared copy (reuse-if-exists)."""
    logger = get_run_logger()
    settings, registry = current()
    try:
        entry = _entry(registry, name, path_id)
    except (NotFoundError, StopIteration):
        return Cancelled(message=f"model {name!r} or its path #{path_id} is gone; nothing to download")
    holder = path_holder(path_id)
    target = Path(entry.path)
    try:
        model = registry.get_model(name)
        ws = settings.workspace(entry.workspace)
        if ws is None or not ws.volume:
            raise DownloadError(f"workspace {entry.workspace!r} of {entry.path} is no longer declared with a volume "
                                f"in {settings.config_path or 'the config'}", permanent=True)
        if not os.path.isdir(ws.volume):
            raise DownloadError(f"volume {ws.volume} of workspace {entry.workspace!r} is not a directory on this host "
                                "(not mounted?): mount it, or correct the workspace's volume, and retry the model",
                                permanent=True)
        sharing = model.download_policy == REUSE_IF_EXISTS
        if sharing and (problem := sharing_problem(entry.path, ws.volume, ws.models_dir)):
            raise DownloadError(f"{problem}; use always-download or a path inside the models root", permanent=True)
        check_writable(entry.path, settings.volume_rules)
        _claim(registry, name, entry, holder, settings.lease_seconds)
        with renewed(registry, Kind.PATH, path_id, holder, settings.lease_seconds) as held:
            reporter = Reporter(registry, name, entry, held, snapshot.total_bytes)
            if not sharing and not os.path.lexists(entry.path):  # nothing is made where the model does not fit
                check_free_space(name, entry.path, snapshot.files, settings.free_space_margin_bytes)
            parent, leaf = open_parent(entry.path, settings.volume_rules, create=True)
            with parent:
                if sharing and _links_or_free(parent, leaf, entry.made):
                    shared = link_shared_copy(settings, registry, model, entry, holder, parent, leaf, snapshot,
                                              reporter)
                    logger.info("%s: %s links to the shared copy %s", name, target, shared)
                    return target
                own, made = own_directory(parent, leaf, entry.path, entry.made)
                with own:
                    if made != entry.made and not registry.set_path_made(name, path_id, holder, made):
                        raise DownloadCancelled(f"another run took over {entry.path}")
                    if sharing:
                        logger.warning("%s: %s is the model's own copy already; it is kept rather than linked to "
                                       "the shared one", name, entry.path)
                    fetch_into(settings, registry, model, snapshot, own, reporter)
        return target
    except (DownloadCancelled, NotFoundError) as e:
        if registry.find_model(name):
            registry.path_stopped(name, path_id, holder, str(e))
        logger.warning("%s", e)
        return Cancelled(message=str(e))
    except DownloadError as e:
        if e.permanent or task_run.run_count > download_snapshot.retries:
            registry.path_failed(name, path_id, holder, str(e) if e.permanent else gave_up(e, name))
        else:
            registry.path_stopped(name, path_id, holder, f"{e} (attempt {task_run.run_count}, retrying)")
        logger.error("%s: download into %s failed: %s", name, target, e)
        raise
    except (OSError, UnsafePathError) as e:
        error = DownloadError(f"cannot write into {target}: {getattr(e, 'strerror', None) or e}", permanent=True)
        registry.path_failed(name, path_id, holder, str(error))
        raise error from None
    except Exception as e:  # noqa: BLE001 - never leave the path Downloading behind a lease
        registry.path_failed(name, path_id, holder, f"unexpected error: {type(e).__name__}: {e}")
        raise


@task(name="record-size")
def record_size(name: str, path_id: int) -> int:
    """Measure the path (without its cache; a link counts its shared copy) and mark it Ready."""
    settings, registry = current()
    entry = _entry(registry, name, path_id)
    try:
        size = path_size(entry.path, settings.volume_rules, entry.made)
    except (OSError, UnsafePathError, NotOursError) as e:  # swapped (or gone) since the download: never left Downloading
        message = f"cannot measure {entry.path}: {getattr(e, 'strerror', None) or e}"
        registry.path_failed(name, path_id, path_holder(path_id), message)
        raise DownloadError(message, permanent=True) from None
    note = ""
    if registry.get_model(name).download_policy == REUSE_IF_EXISTS and entry.artifact_id is None:
        note = " (own copy: the model's own directory was there before it shared, so it was kept)"
    if not registry.path_downloaded(name, path_id, path_holder(path_id), size, f"{size} bytes{note}"):
        message = (f"{entry.path} was not marked Ready: this run no longer holds it (its lease was dropped or taken "
                   "over); the run that holds it, or the next pass, decides")
        get_run_logger().warning("%s: %s", name, message)
        return Cancelled(message=message)
    get_run_logger().info("%s: %s is Ready, %d bytes", name, entry.path, size)
    return size
