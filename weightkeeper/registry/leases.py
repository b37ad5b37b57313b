"""One lease table for every kind of exclusive work.

A lease names its holder (a run id, the host, the process id and start time) and when it lapses. It can be
taken when nobody holds it, when its holder asks again, when it lapsed, or at once when its holder was a
process on this host that is gone (pid and start time: a reused pid is another process). A holder is all four:
a second process of one run (a rescheduled pod, a re-run engine) is another holder. `takeable` is that rule,
pure; the registry takes, renews and drops leases inside the transactions that change what they guard, and
`weightkeeper.lease` renews them from one thread per process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import delete, select

from weightkeeper.registry.common import DELETING, Holder, _utc, process_start_time, this_host, utcnow
from weightkeeper.registry.metrics import LEASE_TAKEOVERS
from weightkeeper.registry.schema import LeaseRow, LocalPathRow, ModelRow


CLEANUP = "cleanup"  # the purpose of a path lease taken to remove the path
SWITCH = "switch"  # the purpose of a path lease taken to switch a Ready path to another commit


class Kind(StrEnum):
    RUN = "run"  # a model's lifecycle run (key: model id; purpose: the flow)
    STAGING = "staging"  # a model's S3 staging (key: model id)
    PATH = "path"  # a local path's download, repair or cleanup (key: path id)
    ARTIFACT = "artifact"  # a shared copy's download, repair or removal (key: artifact id)


@dataclass(frozen=True)
class Lease:
    kind: str
    key: int
    holder: Holder
    purpose: str
    acquired_at: datetime
    expires_at: datetime

    def lapses_in(self, now: datetime | None = None) -> float:
        return max(0.0, (self.expires_at - (now or utcnow())).total_seconds())

    def describe(self, now: datetime | None = None) -> str:
        """`run X on host H (pid P) since 12:00:01 UTC; its lease lapses in 42 s`."""
        h = self.holder
        who = f"run {h.run} on host {h.host}" + (f" (pid {h.pid})" if h.pid else "")
        return (f"{who} since {self.acquired_at:%H:%M:%S} UTC; its lease lapses in "
                f"{self.lapses_in(now):.0f} s")


def process_alive(holder: Holder) -> bool:
    """The holder's process still runs on this host (same pid and start time)."""
    return process_start_time(holder.pid) == holder.started


def abandoned(lease: Lease, now: datetime, here: str, alive: Callable[[Holder], bool] = process_alive) -> bool:
    """Nobody works under the lease any more: it lapsed, or its holder was a process of this host that is
    gone. A holder without a process identity (pid or start time 0: a reservation) only lapses."""
    h = lease.holder
    return lease.expires_at <= now or (h.host == here and h.pid > 0 and h.started > 0 and not alive(h))


def takeable(lease: Lease | None, holder: Holder, now: datetime, here: str,
             alive: Callable[[Holder], bool] = process_alive) -> bool:
    """`holder` may take the lease: free, its own (the same run in the same process), or abandoned."""
    return lease is None or lease.holder == holder or abandoned(lease, now, here, alive)


def takeover(lease: Lease, holder: Holder, now: datetime, here: str,
             alive: Callable[[Holder], bool] = process_alive) -> str | None:
    """Why taking `lease` for `holder` takes it from another run: `abandoned` (it lapsed, or its process is gone)
    or `preempted` (a live run's, taken by force); None for its own lease or a reservation (no work is lost)."""
    if lease.holder == holder or lease.holder.is_reservation:
        return None
    return "abandoned" if abandoned(lease, now, here, alive) else "preempted"


def held_by(row: LeaseRow, holder: Holder) -> bool:
    """The lease row names `holder`: its run, host, process and start time."""
    return (row.holder, row.host, row.pid, row.started) == (holder.run, holder.host, holder.pid, holder.started)


def as_lease(row: LeaseRow) -> Lease:
    return Lease(row.kind, row.key, Holder(row.holder, row.host, row.pid, row.started), row.purpose,
                 _utc(row.acquired_at), _utc(row.expires_at))


class LeaseOps:
    """Mixed into `Registry`; uses its `_tx`. The `_` methods run inside a caller's transaction."""

    @staticmethod
    def _lease_row(s, kind: str, key: int) -> LeaseRow | None:
        return s.scalars(select(LeaseRow).where(LeaseRow.kind == kind, LeaseRow.key == key).with_for_update()).first()

    def _blocker(self, s, kind: str, key: int, holder: Holder) -> Lease | None:
        """The lease that keeps `holder` from taking it, if any."""
        row = self._lease_row(s, kind, key)
        if row is None or takeable(lease := as_lease(row), holder, utcnow(), this_host()):
            return None
        return lease

    def _take(self, s, kind: str, key: int, holder: Holder, seconds: float, purpose: str = "",
              force: bool = False) -> Lease | None:
        """Take the lease for `holder` (or `force` it away); the lease that prevents it, or None once taken."""
        if not force and (blocker := self._blocker(s, kind, key, holder)):
            return blocker
        row, now = self._lease_row(s, kind, key), utcnow()
        if row is None:
            row = LeaseRow(kind=kind, key=key)
            s.add(row)
        elif reason := takeover(as_lease(row), holder, now, this_host()):
            self._add(s, LEASE_TAKEOVERS, kind=kind, reason=reason)
        if not held_by(row, holder):
            row.acquired_at = now
        row.holder, row.host, row.pid, row.started = holder.run, holder.host, holder.pid, holder.started
        row.purpose, row.expires_at = purpose, now + timedelta(seconds=seconds)
        return None

    def _holds(self, s, kind: str, key: int, holder: Holder | None) -> bool:
        """`holder` holds the lease (None: whoever, or nobody)."""
        row = self._lease_row(s, kind, key)
        return holder is None or (row is not None and held_by(row, holder))

    @staticmethod
    def _drop(s, kind: str, key: int | Iterable[int], holder: Holder | None = None) -> None:
        """Release the lease (only `holder`'s, unless None)."""
        keys = [key] if isinstance(key, int) else list(key)
        query = delete(LeaseRow).where(LeaseRow.kind == kind, LeaseRow.key.in_(keys))
        s.execute(query if holder is None else query.where(
            LeaseRow.holder == holder.run, LeaseRow.host == holder.host, LeaseRow.pid == holder.pid,
            LeaseRow.started == holder.started))

    @staticmethod
    def _leases(s, kind: str, keys: Iterable[int]) -> dict[int, Lease]:
        keys = list(keys)
        if not keys:
            return {}
        return {r.key: as_lease(r) for r in s.scalars(select(LeaseRow).where(LeaseRow.kind == kind,
                                                                           LeaseRow.key.in_(keys)))}

    def lease_of(self, kind: str, key: int) -> Lease | None:
        with self._tx() as s:
            row = s.get(LeaseRow, (kind, key))
            return as_lease(row) if row else None

    def release_lease(self, kind: str, key: int, holder: Holder) -> None:
        with self._tx() as s:
            self._drop(s, kind, key, holder)

    def renew_leases(self, held: Iterable[tuple[str, int, Holder, float]]) -> tuple[set, set]:
        """Renew each (kind, key, holder, seconds) still held by `holder`, in one transaction. Returns the ones lost
        (taken over or released) and, of the rest, the ones whose work must stop: a path, staging or run
        or staging lease of a model that is being deleted or is gone (cleanup leases never stop)."""
        held, lost, stop, now = list(held), set(), set(), utcnow()
        with self._tx() as s:
            for kind, key, holder, seconds in held:
                row = s.get(LeaseRow, (kind, key))
                if row is None or not held_by(row, holder):
                    lost.add((kind, key))
                else:
                    row.expires_at = now + timedelta(seconds=seconds)
            live = [(k, key) for k, key, _, _ in held if (k, key) not in lost]
            paths = [key for k, key in live if k == Kind.PATH]
            if paths:
                phases = dict(s.execute(select(LocalPathRow.id, ModelRow.phase).join(
                    ModelRow, ModelRow.id == LocalPathRow.model_id).where(LocalPathRow.id.in_(paths))).all())
                purposes = {key: lease.purpose for key, lease in self._leases(s, Kind.PATH, paths).items()}
                stop |= {(Kind.PATH, key) for key in paths
                         if key not in phases or phases[key] == DELETING and purposes.get(key) != CLEANUP}
            models = [key for k, key in live if k == Kind.STAGING]
            if models:
                phases = dict(s.execute(select(ModelRow.id, ModelRow.phase).where(ModelRow.id.in_(models))).all())
                stop |= {(Kind.STAGING, key) for key in models if phases.get(key, DELETING) == DELETING}
        return lost, stop
