"""Publish a model's outcome: its phase from its paths, and a table artifact of the paths."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact

from weightkeeper.config import Settings
from weightkeeper.errors import InvalidInputError
from weightkeeper.events import emit_phase
from weightkeeper.phase import Phase, derive_phase
from weightkeeper.planning import plan_paths
from weightkeeper.registry import Model
from weightkeeper.context import current


@task(name="finish-model")
def finish_model(name: str) -> str:
    """Record the phase `derive_phase` gives the model from its paths; emit an event when it changed; publish
    the table of its paths."""
    settings, registry = current()
    model = registry.find_model(name)
    if model is not None:
        phase, message = model_phase(settings, model)
        if (phase, message) != (model.phase, model.message):
            before, model = model.phase, registry.set_phase(name, phase, message)
            if model.phase != before:
                emit_phase(name, model.phase, model.message)
    publish_paths(name, model)
    return model.phase if model else "Released"


def model_phase(settings: Settings, model: Model) -> tuple[Phase, str]:
    """`derive_phase` of a registered model, with the targets its plan skips under today's settings."""
    try:
        skipped = plan_paths(settings.workspaces, model.repo_id, model.owner_name, model.targets,
                             model.subpath).skipped
    except InvalidInputError as e:  # the config changed under the model
        skipped = (str(e),)
    return derive_phase(model.phase, model.message, model.local_paths, skipped)


def publish_paths(name: str, model: Model | None) -> None:
    """A table artifact of the model's paths (in the current flow or task run)."""
    rows = [{"workspace": p.workspace, "cluster": p.cluster, "path": p.path, "status": p.status,
             "sizeBytes": p.size_bytes, "message": p.message} for p in (model.local_paths if model else [])]
    phase = model.phase if model else "Released"
    create_table_artifact(key=f"paths-{name}", table=rows or [{"path": "(none)", "status": phase}],
                          description=f"Local paths of model {name}: {phase}")
