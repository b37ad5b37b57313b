"""Prefect events for automations: a model's phase changes (`weightkeeper.model.ready|failed|released`) and its
switch to a new commit (`weightkeeper.model.updated`)."""

from __future__ import annotations

from prefect.events import emit_event

PHASE_EVENTS = {"Ready": "ready", "Failed": "failed", "Released": "released"}


def model_resource(name: str) -> dict[str, str]:
    return {"prefect.resource.id": f"weightkeeper.model.{name}", "prefect.resource.name": name}


def emit_phase(name: str, phase: str, message: str = "") -> None:
    """Emit the event of a phase a model just entered (no event for the in-progress phases)."""
    if phase in PHASE_EVENTS:
        emit_event(event=f"weightkeeper.model.{PHASE_EVENTS[phase]}", resource=model_resource(name),
                   payload={"phase": phase, "message": message})


def emit_updated(name: str, before: str | None, after: str) -> None:
    """Emit the event of a model whose paths all switched from commit `before` to `after`."""
    emit_event(event="weightkeeper.model.updated", resource=model_resource(name),
               payload={"from": before, "to": after})
