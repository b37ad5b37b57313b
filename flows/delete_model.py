"""delete-model: stop every download, remove every path, and only then release the model."""

from __future__ import annotations

from prefect import flow, get_run_logger

from weightkeeper.flows.jobs import deployed, run_path_jobs
from weightkeeper.flows.paths import CLEANUP_RETRIES, cleanup_delays
from weightkeeper.tasks.cleanup import collect_shared_copy, release_model, remove_staged_snapshot, stop_downloads
from weightkeeper.tasks.report import publish_paths
from weightkeeper.config import CLEAN_FLOW, DELETE_FLOW, Settings
from weightkeeper.desired import in_grace
from weightkeeper.errors import CleanupError
from weightkeeper.registry import Model, Registry
from weightkeeper.registry.common import utcnow
from weightkeeper.runs import holds_run_lease
from weightkeeper.context import current


@flow(name=DELETE_FLOW, flow_run_name="delete-{name}")
@holds_run_lease(DELETE_FLOW)
def delete_model(name: str, bound: str | None = None) -> str:
    """Mark Deleting, stop downloads and staging, clean each path (guarded, retried), collect shared copies no
    one uses any more, remove the staged S3 copy (retried), release. Never releases early. `bound`: the model a
    started run is for (`runs.start_deployment`), which `holds_run_lease` checks."""
    logger = get_run_logger()
    settings, registry = current()
    model = registry.find_model(name)
    if model is None:
        logger.info("%s is already released", name)
        return "Released"
    registry.mark_deleting(name)
    stop_downloads(name)
    paths = registry.get_model(name).local_paths
    if failed := run_path_jobs(CLEAN_FLOW, name, paths, here=not deployed()):  # a clean-path run per path
        raise CleanupError(f"cleanup of {name!r} incomplete, the model is kept: {'; '.join(map(str, failed))}")
    for artifact_id in _copies(settings, registry, model, paths):
        collect_shared_copy(artifact_id, return_state=True)  # a copy that cannot go now is reconcile's
    if registry.get_model(name).staging_uri:
        remove_staged_snapshot.with_options(retries=CLEANUP_RETRIES, retry_delay_seconds=cleanup_delays(
            settings.cleanup_retry_seconds, settings.cleanup_retry_max_seconds))(name)
    release_model(name)
    publish_paths(name, registry.find_model(name))
    return "Released"


def _copies(settings: Settings, registry: Registry, model: Model, paths: list) -> list[int]:
    """The shared copies to collect: those the model's paths link to, and every copy of its repository that no model
    uses and no switch left within its grace period, as the next reconcile pass would collect it. A delete killed
    after cleaning a path dropped that path's entry, and with it the only record of which copy it linked to."""
    now = utcnow()
    unused = {a.id for a in registry.list_artifacts(model.repo_id) if not a.in_use
              and not in_grace(a.released_at, now, settings.track_grace_seconds)} if model.repo_id else set()
    return sorted(unused | {p.artifact_id for p in paths if p.artifact_id})
