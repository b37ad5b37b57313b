"""Resolve a model's revision to a commit and the files it needs."""

from __future__ import annotations

from collections.abc import Callable

from prefect import get_run_logger, task

from weightkeeper.config import Settings
from weightkeeper.download import RemoteFile, Snapshot
from weightkeeper.hubbudget import BUDGET_WAIT, budget_message
from weightkeeper.errors import DownloadCancelled, DownloadError, WeightkeeperError
from weightkeeper.layout import S3Source, copy_name, parse_source
from weightkeeper.registry.common import DOWNLOADING, FAILED
from weightkeeper.registry import Model
from weightkeeper.context import current
from weightkeeper.sources import check_access, resolve


def retry_transient(task, task_run, state) -> bool:
    """Retry network trouble; not what a retry cannot fix (permanent errors, a vanished model)."""
    try:
        state.result()
    except DownloadError as e:
        return not e.permanent
    except WeightkeeperError:
        return False
    except Exception:  # noqa: BLE001
        return True
    return False


def pinned(model: Model) -> Snapshot | None:
    """The snapshot a model is pinned to, recorded in the registry (None until resolved)."""
    if model.commit and model.files is not None:
        return Snapshot(model.repo_id, model.commit, tuple(RemoteFile.from_json(f) for f in model.files),
                        copy_name(model.commit, model.include, model.exclude))
    return None


def job_token_not_its_own(settings: Settings, model: Model) -> bool:
    """The model's files will be fetched with a token other than its own block's: a Kubernetes workspace's job
    reads its namespace's `token_secret` for any model that names a block. Its own must then prove it may read
    them (as for a copy another model fetched), or naming any block would lend it the namespace's access."""
    return bool(model.token_block) and any(
        (w := settings.workspace(p.workspace)) and w.kubernetes and w.kubernetes.token_secret
        for p in model.local_paths)


def budget_wait(registry, model: Model) -> Callable[[float | None], None]:
    """An `on_wait` for a model's own Hub requests (resolve, head, access): it says on the model that it waits, and
    puts the model's message back once it no longer does; a deletion meanwhile stops the wait."""
    said = False

    def on_wait(seconds: float | None) -> None:
        nonlocal said
        if seconds is None:
            if said:
                registry.set_message(model.name, model.message, live=True, replacing=BUDGET_WAIT)  # if still ours
            said = False
        elif registry.set_message(model.name, budget_message(seconds), live=True):
            said = True
        else:
            raise DownloadCancelled(f"model {model.name!r} is being deleted: its wait for the Hub request budget "
                                    "stopped")

    return on_wait


@task(name="resolve-revision", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_transient)
def resolve_revision(name: str) -> Snapshot:
    """Pin the model to a commit (a 40-hex revision is used as is) and record the files to fetch. A model whose
    jobs fetch with a token not its own proves its own first, pinned or not (one request each run).

    An s3:// source is listed instead: its "commit" is a digest of the listing."""
    logger = get_run_logger()
    settings, registry = current()
    model = registry.get_model(name)
    source, snapshot = parse_source(model.source), pinned(model)
    try:
        fresh = snapshot is None
        if fresh:
            snapshot = resolve(settings, registry, source, model.token_block, model.include, model.exclude,
                               budget_wait(registry, model))
        if job_token_not_its_own(settings, model):
            check_access(settings, registry, model.source, model.token_block, snapshot, budget_wait(registry, model))
    except DownloadError as e:
        if e.permanent:
            registry.set_phase(name, FAILED, str(e))
        raise
    if not fresh:
        logger.info("%s is pinned to %s@%s (%d files)", name, model.repo_id, model.commit, len(model.files))
        return snapshot
    registry.set_snapshot(name, snapshot.commit, [f.to_json() for f in snapshot.files],
                          source.uri if isinstance(source, S3Source) else None)
    registry.set_phase(name, DOWNLOADING, f"downloading {len(snapshot.files)} files "
                                          f"({snapshot.total_bytes} bytes) of {model.repo_id}@{snapshot.commit}")
    logger.info("%s resolved %s to %s: %d files, %d bytes", name, model.source, snapshot.commit,
                len(snapshot.files), snapshot.total_bytes)
    return snapshot
