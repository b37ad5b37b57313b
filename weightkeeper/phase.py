"""A model's phase and its paths' statuses, and the one pure function that decides the phase from the paths."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Protocol


class Phase(StrEnum):
    """A model's phase; the values are what the registry stores."""

    PENDING = "Pending"
    STAGING = "Staging"
    DOWNLOADING = "Downloading"
    READY = "Ready"
    FAILED = "Failed"
    DELETING = "Deleting"


class PathStatus(StrEnum):
    """A local path's status; the values are what the registry stores."""

    PENDING = "Pending"
    WAITING = "Waiting"
    DOWNLOADING = "Downloading"
    READY = "Ready"
    FAILED = "Failed"
    CLEANING = "Cleaning"


class PathView(Protocol):
    """What `derive_phase` reads of a path (`weightkeeper.registry.LocalPath` has it)."""

    workspace: str
    path: str
    status: str
    message: str
    size_bytes: int | None
    retired: bool


def derive_phase(phase: str, message: str, paths: Sequence[PathView],
                 skipped: Iterable[str] = ()) -> tuple[Phase, str]:
    """The phase and message a model in `phase` (with `message`) has from its `paths` and the reasons its
    plan skipped targets (`skipped`), without I/O:

    - Deleting stays Deleting: deletion is never undone by a path.
    - Failed when the plan skipped a target or no current path is left (with the reasons), or when any
      current path is Failed (each as "workspace: message").
    - Ready when every current path is Ready: "N path(s) ready, B bytes".
    - otherwise unchanged (Pending, Staging, Downloading, or a Failed set by an earlier step).

    Retired paths (left behind when the model moved) never make a model Failed and never keep it from
    Ready, whatever their status: they are only cleaned. Whenever the phase is decided here, each one
    still there is reported in the message as "; old path P not cleaned yet: its message" (its cleanup
    failure when cleanup failed).
    """
    if phase == Phase.DELETING:
        return Phase.DELETING, message
    current = [p for p in paths if not p.retired]
    leftovers = "".join(f"; old path {p.path} not cleaned yet: {p.message}" for p in paths if p.retired)
    reasons = list(skipped)
    if reasons or not current:
        return Phase.FAILED, ("; ".join(reasons) or "the model has no download target") + leftovers
    if failed := [p for p in current if p.status == PathStatus.FAILED]:
        return Phase.FAILED, "; ".join(f"{p.workspace}: {p.message}" for p in failed) + leftovers
    if all(p.status == PathStatus.READY for p in current):
        total = sum(p.size_bytes or 0 for p in current)
        return Phase.READY, f"{len(current)} path(s) ready, {total} bytes{leftovers}"
    return Phase(phase), message
