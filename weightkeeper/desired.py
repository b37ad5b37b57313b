"""What reconcile decides, free of I/O: which lifecycle run a model needs, which directories nobody owns."""

from __future__ import annotations

import posixpath

from weightkeeper.config import DELETE_FLOW, ENSURE_FLOW
from weightkeeper.registry.common import DELETING, DOWNLOADING, PENDING, STAGING
from weightkeeper.registry.runs import RunLease

IN_PROGRESS = (PENDING, STAGING, DOWNLOADING)


def needed_run(phase: str, lease: RunLease | None) -> str | None:
    """The flow that drives a model to its desired state, unless a live run already does.

    Deleting -> delete-model (it takes over from an ensure-model run); Pending, Staging and
    Downloading -> ensure-model; Ready and Failed need none (Ready copies are checked by reconcile).
    A lease without a fresh heartbeat is a crashed run: its work is redone.
    """
    live = lease is not None and lease.fresh
    if phase == DELETING:
        return None if live and lease.flow == DELETE_FLOW else DELETE_FLOW
    if phase in IN_PROGRESS:
        return None if live else ENSURE_FLOW
    return None


def orphans(children: list[str], recorded: list[str]) -> list[str]:
    """The directories among `children` (of a models dir) that no recorded path is at or below."""
    return sorted(c for c in children
                  if not any(r == c or r.startswith(c.rstrip("/") + "/") for r in map(posixpath.normpath, recorded)))
