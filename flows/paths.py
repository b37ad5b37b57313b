"""Per-path jobs, deployed once per work pool: the existing download and cleanup tasks, one path each."""

from __future__ import annotations

from prefect import flow

from flows.delete_model import CLEANUP_RETRIES, cleanup_delays
from tasks.cleanup import clean_path
from tasks.download import download_snapshot, record_size
from tasks.snapshot import resolve_revision
from weightkeeper.config import CLEAN_FLOW, DOWNLOAD_FLOW
from weightkeeper.runtime import runtime


def _workspace(name: str, path_id: int) -> str:
    _, registry = runtime()
    model = registry.find_model(name)
    return next((p.workspace for p in model.local_paths if p.id == path_id), "gone") if model else "gone"


@flow(name=DOWNLOAD_FLOW)  # runs are named download-<model>-<workspace> by whoever starts them
def download_to_path(name: str, path_id: int):
    """Fill one path of a model that ensure-model resolved, then record its size."""
    ws = _workspace(name, path_id)
    snapshot = resolve_revision(name)  # pinned by ensure-model: read from the registry, no request
    state = download_snapshot.with_options(task_run_name=f"download-{name}-{ws}")(
        name, path_id, snapshot, return_state=True)
    if not state.is_completed():
        return state
    return record_size.with_options(task_run_name=f"record-size-{name}-{ws}")(name, path_id)


@flow(name=CLEAN_FLOW)
def clean_one_path(name: str, path_id: int) -> str:
    """Remove one path of a deleting model (guarded, retried with back-off)."""
    settings, _ = runtime()
    cleaner = clean_path.with_options(
        task_run_name=f"clean-{name}-{_workspace(name, path_id)}", retries=CLEANUP_RETRIES,
        retry_delay_seconds=cleanup_delays(settings.cleanup_retry_seconds, settings.cleanup_retry_max_seconds))
    return cleaner(name, path_id)
