"""Holding leases: a registry claim takes one, `renewed` keeps it, one thread per process renews them all.

Renewal is separate from progress: the renewer writes one transaction per tick for every lease this
process holds (`Registry.renew_leases`), whatever their number. A lease another run took over sets
`lost`; a path or staging lease of a model being deleted sets `stop`. The work checks `held.stopped`, which
also holds once the lease went unrenewed for LAPSE_SHARE of its time (the registry cut off or hung): the work
stops before the lease lapses and another run may take it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from weightkeeper.registry import Holder, Registry

logger = logging.getLogger("weightkeeper.lease")
MIN_PERIOD_SECONDS = 0.2
LAPSE_SHARE = 0.8  # unrenewed for this share of its lease, a holder stops: others may take it at 1.0
RENEWALS = 4  # per lease time: up to two may fail in a row before a holder stops


@dataclass(eq=False)
class Held:
    registry: Registry
    kind: str
    key: int
    holder: Holder
    seconds: float
    lost: threading.Event = field(default_factory=threading.Event)  # another run took it over
    stop: threading.Event = field(default_factory=threading.Event)  # its model is being deleted or is gone
    renewed_at: float = field(default_factory=time.monotonic)  # when its last renewal that held was sent

    @property
    def lapsing(self) -> bool:
        """Not renewed for LAPSE_SHARE of its time: it may lapse before this process hears again."""
        return time.monotonic() - self.renewed_at > self.seconds * LAPSE_SHARE

    @property
    def stopped(self) -> bool:
        return self.lost.is_set() or self.stop.is_set() or self.lapsing


class Renewer:
    """Renews every held lease every RENEWALS-th of the shortest lease time, from one daemon thread."""

    def __init__(self) -> None:
        self._held: set[Held] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, held: Held) -> None:
        with self._lock:
            self._held.add(held)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="weightkeeper-lease-renewer", daemon=True)
                self._thread.start()
        self._wake.set()  # the period may be shorter now

    def remove(self, held: Held) -> None:
        with self._lock:
            self._held.discard(held)

    def _loop(self) -> None:
        while True:
            with self._lock:
                held = list(self._held)
            period = max(MIN_PERIOD_SECONDS, min((h.seconds for h in held), default=60.0) / RENEWALS)
            self._wake.wait(period)
            self._wake.clear()
            with self._lock:
                held = list(self._held)
            by_registry: dict[int, list[Held]] = {}
            for h in held:
                by_registry.setdefault(id(h.registry), []).append(h)
            for group in by_registry.values():
                self.renew(group)

    @staticmethod
    def renew(group: list[Held]) -> None:
        sent = time.monotonic()
        try:
            lost, stop = group[0].registry.renew_leases((h.kind, h.key, h.holder, h.seconds) for h in group)
        except Exception as e:  # noqa: BLE001 - the registry may be restarting: the next tick tries again
            logger.warning("could not renew %d lease(s): %s", len(group), e)
            return
        for h in group:
            if (h.kind, h.key) in lost:
                h.lost.set()
            else:
                h.renewed_at = sent
            if (h.kind, h.key) in stop:
                h.stop.set()


RENEWER = Renewer()


@contextmanager
def renewed(registry: Registry, kind: str, key: int, holder: Holder, seconds: float) -> Iterator[Held]:
    """Keep renewing a lease `holder` took (by a registry claim) while the block runs. Releasing it is the
    registry event that ends the work (`path_downloaded`, `release_run`, ...), not this."""
    held = Held(registry, kind, key, holder, seconds)
    RENEWER.add(held)
    try:
        yield held
    finally:
        RENEWER.remove(held)
