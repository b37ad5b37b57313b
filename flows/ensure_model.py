"""ensure-model: drive a declared model to Ready in every target path."""

from __future__ import annotations

from prefect import flow, get_run_logger

from tasks.cleanup import clean_path
from tasks.download import download_snapshot, record_size
from tasks.report import finish_model, publish_paths
from tasks.snapshot import resolve_revision
from weightkeeper.registry.common import DELETING, FAILED
from weightkeeper.runtime import ensure_download_limit, runtime


@flow(name="ensure-model", flow_run_name="ensure-{name}", log_prints=True)
def ensure_model(name: str) -> str:
    """Resolve the revision, download into each target path (capped by the global limit), record sizes."""
    logger = get_run_logger()
    settings, registry = runtime()
    model = registry.get_model(name)
    if model.phase == DELETING:
        logger.info("%s is being deleted; nothing to ensure", name)
        return model.phase
    if model.local_paths:
        ensure_download_limit(settings)
        snapshot = resolve_revision(name, return_state=True)
        if snapshot.is_completed():
            snapshot = snapshot.result()
            recorded = []
            paths = registry.get_model(name).local_paths
            for p in (p for p in paths if not p.retired):
                download = download_snapshot.with_options(task_run_name=f"download-{name}-{p.workspace}").submit(
                    name, p.id, snapshot)
                recorded.append(record_size.with_options(task_run_name=f"record-size-{name}-{p.workspace}").submit(
                    name, p.id, wait_for=[download]))
            for future in recorded:
                future.wait()
            if all(f.state.is_completed() for f in recorded):
                for p in (p for p in paths if p.retired):
                    clean_path.with_options(task_run_name=f"clean-{name}-{p.workspace}-retired")(
                        name, p.id, return_state=True)
        elif registry.get_model(name).phase != FAILED:
            registry.set_phase(name, FAILED, f"cannot resolve {model.source}: {snapshot.message}")
    phase = finish_model(name)
    publish_paths(name)
    model = registry.find_model(name)
    logger.info("%s is %s%s", name, phase, f": {model.message}" if model else "")
    return phase
