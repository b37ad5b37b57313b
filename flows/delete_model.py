"""delete-model: stop every download, remove every path, and only then release the model."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.jobs import deployed, run_path_jobs
from tasks.cleanup import clean_path, collect_shared_copy, release_model, remove_staged_snapshot, stop_downloads
from tasks.report import publish_paths
from weightkeeper.config import CLEAN_FLOW, DELETE_FLOW
from weightkeeper.errors import CleanupError
from weightkeeper.runs import holds_run_lease
from weightkeeper.runtime import runtime

CLEANUP_RETRIES = 10


def cleanup_delays(first: float, cap: float, retries: int = CLEANUP_RETRIES) -> list[float]:
    """30 s, doubling, capped: keep-and-retry without hammering a broken volume."""
    return [min(first * 2**i, cap) for i in range(retries)]


@flow(name=DELETE_FLOW, flow_run_name="delete-{name}")
@holds_run_lease(DELETE_FLOW)
def delete_model(name: str) -> str:
    """Mark Deleting, stop downloads and staging, clean each path (guarded, retried), collect shared copies no
    one uses any more, remove the staged S3 copy (retried), release. Never releases early."""
    logger = get_run_logger()
    settings, registry = runtime()
    model = registry.find_model(name)
    if model is None:
        logger.info("%s is already released", name)
        return "Released"
    registry.mark_deleting(name)
    stop_downloads(name)
    cleaner = clean_path.with_options(retries=CLEANUP_RETRIES, retry_delay_seconds=cleanup_delays(
        settings.cleanup_retry_seconds, settings.cleanup_retry_max_seconds))
    paths = registry.get_model(name).local_paths
    if deployed():  # each path is a clean-path run in the work pool of its workspace
        if failed := run_path_jobs(CLEAN_FLOW, name, paths):
            raise CleanupError(f"cleanup of {name!r} incomplete, the model is kept: {'; '.join(map(str, failed))}")
    else:
        futures = [cleaner.with_options(task_run_name=f"clean-{name}-{p.workspace}").submit(name, p.id) for p in paths]
        for future in futures:
            future.result()
    for artifact_id in sorted({p.artifact_id for p in paths if p.artifact_id}):
        collect_shared_copy(artifact_id, return_state=True)  # a copy that cannot go now is reconcile's
    if registry.get_model(name).staging_uri:
        remove_staged_snapshot.with_options(retries=CLEANUP_RETRIES, retry_delay_seconds=cleanup_delays(
            settings.cleanup_retry_seconds, settings.cleanup_retry_max_seconds))(name)
    release_model(name)
    publish_paths(name)
    return "Released"
