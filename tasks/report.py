"""Publish a model's outcome: its phase from its paths, and a table artifact of the paths."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact

from weightkeeper.errors import InvalidInputError
from weightkeeper.events import emit_phase
from weightkeeper.planning import plan_paths
from weightkeeper.registry.common import DELETING, FAILED, READY
from weightkeeper.runtime import runtime


@task(name="finish-model")
def finish_model(name: str) -> str:
    """Ready when every path is Ready; Failed (with the reasons) when any failed; else unchanged."""
    settings, registry = runtime()
    model = registry.find_model(name)
    if model is None:
        return "Released"
    if model.phase == DELETING:
        return model.phase
    before = model.phase
    current = [p for p in model.local_paths if not p.retired]
    failed = [p for p in current if p.status == FAILED]
    try:
        skipped = plan_paths(settings.workspaces, model.repo_id, model.owner_name, model.targets,
                             model.subpath).skipped
    except InvalidInputError as e:  # the config changed under the model
        skipped = (str(e),)
    if not current or skipped:
        model = registry.set_phase(name, FAILED, "; ".join(skipped) or "the model has no download target")
    elif failed:
        model = registry.set_phase(name, FAILED, "; ".join(f"{p.workspace}: {p.message}" for p in failed))
    elif all(p.status == READY for p in current):
        total = sum(p.size_bytes or 0 for p in current)
        leftovers = "".join(f"; old path {p.path} not cleaned yet: {p.message}" for p in model.local_paths
                            if p.retired)
        model = registry.set_phase(name, READY, f"{len(current)} path(s) ready, {total} bytes{leftovers}")
    if model.phase != before:
        emit_phase(name, model.phase, model.message)
    return model.phase


@task(name="publish-paths")
def publish_paths(name: str) -> None:
    _, registry = runtime()
    model = registry.find_model(name)
    rows = [{"workspace": p.workspace, "cluster": p.cluster, "path": p.path, "status": p.status,
             "sizeBytes": p.size_bytes, "message": p.message} for p in (model.local_paths if model else [])]
    phase = model.phase if model else "Released"
    create_table_artifact(key=f"paths-{name}", table=rows or [{"path": "(none)", "status": phase}],
                          description=f"Local paths of model {name}: {phase}")
