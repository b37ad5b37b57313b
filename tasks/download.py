"""Download a model's snapshot into one workspace path, and record its size."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run, task_run
from prefect.states import Cancelled

from weightkeeper.download import Snapshot, fetch_snapshot
from weightkeeper.errors import DownloadCancelled, DownloadError, NotFoundError
from weightkeeper.fsops import directory_size
from weightkeeper.layout import HfSource
from weightkeeper.registry import Holder, LocalPath, Registry
from weightkeeper.registry.store import DOWNLOADING, FAILED, PENDING, READY, WAITING
from weightkeeper.runtime import download_slot, load_token, runtime
from tasks.snapshot import _transient

WAIT_POLL_SECONDS = 2.0
HEARTBEAT_SECONDS = 1.0
ARTIFACT_SECONDS = 5.0


def path_holder(path_id: int) -> Holder:
    """The identity a flow run uses for one of its paths, shared by its download and record tasks."""
    return Holder.here(f"{flow_run.id or 'local'}/{path_id}")


def _entry(registry: Registry, name: str, path_id: int) -> LocalPath:
    return next(p for p in registry.get_model(name).local_paths if p.id == path_id)


def _missing(snapshot: Snapshot, target: Path) -> list[str]:
    return [f.path for f in snapshot.files
            if not ((target / f.path).is_file() and (target / f.path).stat().st_size == f.size)]


def _claim(registry: Registry, name: str, entry: LocalPath, holder: Holder, lease: float) -> None:
    """Wait until this run holds the path; fail the entry if another live model owns the directory."""
    while True:
        claim = registry.claim_download(name, entry.id, holder, lease)
        if claim.ok:
            return
        if claim.outcome == "deleting":
            raise DownloadCancelled(f"model {name!r} is being deleted")
        if claim.outcome == "taken":
            message = f"{entry.path} is already owned by live model {claim.other!r}; this entry is not downloaded"
            registry.finish_path(name, entry.id, None, FAILED, message)
            raise DownloadError(message, permanent=True)
        if claim.outcome == "wait":
            message = f"Waiting for deleted model {claim.other!r} to finish cleaning up {entry.path}"
        else:
            message = f"Waiting for another run ({claim.other}) that is working on {entry.path}"
        registry.set_path_message(name, entry.id, WAITING, message)
        time.sleep(WAIT_POLL_SECONDS)


class _Reporter:
    """Heartbeat, progress and cancellation, throttled: called on every chunk from many threads."""

    def __init__(self, registry: Registry, name: str, entry: LocalPath, holder: Holder, total: int):
        self.registry, self.name, self.entry, self.holder, self.total = registry, name, entry, holder, total
        self.last_beat = self.last_artifact = 0.0
        self.cancelled = False
        self.artifact = create_progress_artifact(
            progress=0.0, key=f"progress-{name}-{entry.workspace}"[:100],
            description=f"Download of {name} into {entry.path}")

    def beat(self, done: int | None = None, message: str | None = None, force: bool = False) -> None:
        now = time.monotonic()
        if self.cancelled:
            raise DownloadCancelled(f"model {self.name!r} is being deleted; download into {self.entry.path} stopped")
        if not force and now - self.last_beat < HEARTBEAT_SECONDS:
            return
        self.last_beat = now
        if not self.registry.heartbeat(self.name, self.entry.id, self.holder, done, self.total, message):
            self.cancelled = True
            raise DownloadCancelled(f"model {self.name!r} is being deleted; download into {self.entry.path} stopped")
        if done is not None and (force or now - self.last_artifact >= ARTIFACT_SECONDS) and self.artifact:
            self.last_artifact = now
            update_progress_artifact(self.artifact, progress=100.0 * done / max(self.total, 1))


@task(name="download-snapshot", retries=2, retry_delay_seconds=[10, 30], retry_condition_fn=_transient)
def download_snapshot(name: str, path_id: int, snapshot: Snapshot):
    """Fetch the snapshot into one path: claim it, wait for a slot, fetch only what is missing."""
    logger = get_run_logger()
    settings, registry = runtime()
    try:
        entry = _entry(registry, name, path_id)
    except (NotFoundError, StopIteration):
        return Cancelled(message=f"model {name!r} or its path #{path_id} is gone; nothing to download")
    holder = path_holder(path_id)
    target = Path(entry.path)
    try:
        _claim(registry, name, entry, holder, settings.lease_seconds)
        reporter = _Reporter(registry, name, entry, holder, snapshot.total_bytes)
        missing = _missing(snapshot, target)
        if not missing:
            logger.info("%s: all %d files already in %s; nothing to download", name, len(snapshot.files), target)
            return target
        logger.info("%s: %d of %d files to fetch into %s", name, len(missing), len(snapshot.files), target)

        def on_wait(in_use: int, limit: int) -> None:
            reporter.beat(message=f"Waiting for a download slot ({in_use}/{limit} in use)", force=True)

        with download_slot(settings, on_wait):
            registry.set_path_message(name, path_id, DOWNLOADING,
                                      f"downloading {snapshot.repo_id}@{snapshot.commit[:12]}")
            model = registry.get_model(name)
            deadline = time.monotonic() + settings.download_timeout_seconds
            fetched = fetch_snapshot(HfSource(model.repo_id, snapshot.commit), snapshot, target,
                                     settings.hf_endpoint, load_token(model.token_block), reporter.beat, deadline)
        reporter.beat(snapshot.total_bytes, force=True)
        logger.info("%s: fetched %d bytes into %s", name, fetched, target)
        return target
    except (DownloadCancelled, NotFoundError) as e:
        if registry.find_model(name):
            registry.finish_path(name, path_id, holder, PENDING, str(e))
        logger.warning("%s", e)
        return Cancelled(message=str(e))
    except DownloadError as e:
        last_try = e.permanent or task_run.run_count > download_snapshot.retries
        registry.finish_path(name, path_id, holder, FAILED if last_try else PENDING,
                             str(e) if last_try else f"{e} (attempt {task_run.run_count}, retrying)")
        logger.error("%s: download into %s failed: %s", name, target, e)
        raise
    except OSError as e:
        error = DownloadError(f"cannot write into {target}: {e.strerror or e}", permanent=True)
        registry.finish_path(name, path_id, holder, FAILED, str(error))
        raise error from None


@task(name="record-size")
def record_size(name: str, path_id: int) -> int:
    """Measure the path (without its cache) and mark it Ready."""
    _, registry = runtime()
    entry = _entry(registry, name, path_id)
    size = directory_size(entry.path)
    registry.finish_path(name, path_id, path_holder(path_id), READY, f"{size} bytes", size)
    get_run_logger().info("%s: %s is Ready, %d bytes", name, entry.path, size)
    return size

