"""What reconcile decides, free of I/O: which lifecycle run a model needs, which directories nobody owns."""

from __future__ import annotations

import posixpath
from datetime import datetime

from weightkeeper.config import DELETE_FLOW, ENSURE_FLOW
from weightkeeper.planning import last_turn
from weightkeeper.registry.common import DELETING, DOWNLOADING, PENDING, READY, STAGING

IN_PROGRESS = (PENDING, STAGING, DOWNLOADING)


def needed_run(phase: str, live_run: str | None, update: bool = False) -> str | None:
    """The flow that drives a model to its desired state, unless a live run (of flow `live_run`) already does.

    Deleting -> delete-model (it takes over from an ensure-model run); Pending, Staging and
    Downloading -> ensure-model; Ready -> ensure-model when an `update` is due (`update_due`), else none, as
    Failed (Ready copies are checked by reconcile). A run whose lease was abandoned is not live: its work is
    redone.
    """
    if phase == DELETING:
        return None if live_run == DELETE_FLOW else DELETE_FLOW
    if phase in IN_PROGRESS or phase == READY and update:
        return None if live_run else ENSURE_FLOW
    return None


def update_due(phase: str, track: bool, next_revision: str | None, head_checked_at: datetime | None,
               now: datetime, interval: float, model_id: int, *, pending: bool) -> bool:
    """A Ready model is due for a run that asks for its next commit or finishes a switch: a revision `model update`
    asked for and not asked yet, or a tracked branch or a `pending` switch (one a killed run left, tracked or not)
    never asked or tried, or whose turn (`last_turn`) came half an interval or more after it was last asked or
    tried: once per interval, at its turn (the first time between 0.5 and 1.5 intervals after the last), so a
    switch that cannot finish yet is not run again at every pass."""
    if phase != READY:
        return False
    if next_revision and head_checked_at is None:
        return True
    if not (track or pending):
        return False
    return head_checked_at is None or interval <= 0 or \
        (last_turn(model_id, now, interval) - head_checked_at).total_seconds() >= interval / 2


def orphans(children: list[str], recorded: list[str]) -> list[str]:
    """The directories among `children` (of a models dir) that no recorded path is at or below: each recorded
    path and the directories above it are owned (linear in the paths, not their product)."""
    owned = set()
    for path in map(posixpath.normpath, recorded):
        while path not in owned and path not in ("/", ""):
            owned.add(path)
            path = posixpath.dirname(path)
    return sorted(c for c in children if c.rstrip("/") not in owned)


def in_grace(released_at: datetime | None, now: datetime, grace: float) -> bool:
    """A shared copy a model switched away from `grace` seconds ago or less is kept (readers may still open it)."""
    return released_at is not None and (now - released_at).total_seconds() < grace
