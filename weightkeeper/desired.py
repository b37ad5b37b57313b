"""What reconcile decides, free of I/O: which lifecycle run a model needs, which directories nobody owns."""

from __future__ import annotations

import posixpath

from weightkeeper.config import DELETE_FLOW, ENSURE_FLOW
from weightkeeper.registry.common import DELETING, DOWNLOADING, PENDING, STAGING

IN_PROGRESS = (PENDING, STAGING, DOWNLOADING)


def needed_run(phase: str, live_run: str | None) -> str | None:
    """The flow that drives a model to its desired state, unless a live run (of flow `live_run`) already does.

    Deleting -> delete-model (it takes over from an ensure-model run); Pending, Staging and
    Downloading -> ensure-model; Ready and Failed need none (Ready copies are checked by reconcile).
    A run whose lease was abandoned is not live: its work is redone.
    """
    if phase == DELETING:
        return None if live_run == DELETE_FLOW else DELETE_FLOW
    if phase in IN_PROGRESS:
        return None if live_run else ENSURE_FLOW
    return None


def orphans(children: list[str], recorded: list[str]) -> list[str]:
    """The directories among `children` (of a models dir) that no recorded path is at or below: each recorded
    path and the directories above it are owned (linear in the paths, not their product)."""
    owned = set()
    for path in map(posixpath.normpath, recorded):
        while path not in owned and path not in ("/", ""):
            owned.add(path)
            path = posixpath.dirname(path)
    return sorted(c for c in children if c.rstrip("/") not in owned)
