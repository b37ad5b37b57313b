"""The per-path flows: one path's download or cleanup, run as a subflow here or as a deployment run in
the work pool of the path's workspace (`weightkeeper.flows.jobs` chooses per path)."""

from __future__ import annotations

from prefect import flow

from weightkeeper.tasks.cleanup import clean_path
from weightkeeper.tasks.download import download_snapshot, record_size
from weightkeeper.tasks.snapshot import pinned, resolve_revision
from weightkeeper.tasks.switch import pending, switch_path
from weightkeeper.config import CLEAN_FLOW, DOWNLOAD_FLOW, Settings
from weightkeeper.context import current
from weightkeeper.registry import Model
from weightkeeper.registry.common import READY

CLEANUP_RETRIES = 10
MARGIN_SECONDS = 600  # for what a run does besides its bounded steps: start, claim, slot wait, verification


def cleanup_delays(first: float, cap: float, retries: int = CLEANUP_RETRIES) -> list[float]:
    """30 s, doubling, capped: keep-and-retry without hammering a broken volume."""
    return [min(first * 2**i, cap) for i in range(retries)]


def _workspace(model: Model | None, path_id: int) -> str:
    return next((p.workspace for p in model.local_paths if p.id == path_id), "gone") if model else "gone"


@flow(name=DOWNLOAD_FLOW)  # runs are named download-<model>-<workspace> by whoever starts them
def download_to_path(name: str, path_id: int):
    """Fill one path of a model that ensure-model resolved, then record its size; or switch the path of a Ready
    model to the commit it is switching to."""
    _, registry = current()
    model = registry.find_model(name)
    ws = _workspace(model, path_id)
    if model and model.phase == READY and (switch_to := pending(model)):  # a Ready model switching commit
        return switch_path.with_options(task_run_name=f"switch-{name}-{ws}")(name, path_id, switch_to,
                                                                             return_state=True)
    snapshot = (model and pinned(model)) or resolve_revision(name)  # pinned by ensure-model: no task, no request
    state = download_snapshot.with_options(task_run_name=f"download-{name}-{ws}")(
        name, path_id, snapshot, return_state=True)
    if not state.is_completed():
        return state
    sized = record_size.with_options(task_run_name=f"record-size-{name}-{ws}")(name, path_id, return_state=True)
    return sized.result() if sized.is_completed() else sized


@flow(name=CLEAN_FLOW)
def clean_one_path(name: str, path_id: int) -> str:
    """Remove one path of a deleting model (guarded, retried with back-off)."""
    settings, registry = current()
    cleaner = clean_path.with_options(
        task_run_name=f"clean-{name}-{_workspace(registry.find_model(name), path_id)}", retries=CLEANUP_RETRIES,
        retry_delay_seconds=cleanup_delays(settings.cleanup_retry_seconds, settings.cleanup_retry_max_seconds))
    return cleaner(name, path_id)


PATH_FLOWS = {DOWNLOAD_FLOW: download_to_path, CLEAN_FLOW: clean_one_path}


def run_budget(flow: str, settings: Settings) -> float:
    """How long a started run of a per-path flow may take: its steps' own deadlines (`download_timeout_seconds`
    for each download attempt; `stop_timeout_seconds` plus the back-off between attempts for a cleanup),
    plus MARGIN_SECONDS."""
    if flow == DOWNLOAD_FLOW:
        work = settings.download_timeout_seconds * (1 + download_snapshot.retries)
    else:
        work = settings.stop_timeout_seconds + sum(cleanup_delays(settings.cleanup_retry_seconds,
                                                                  settings.cleanup_retry_max_seconds))
    return work + MARGIN_SECONDS
