"""Registry operations on the `run` lease of a model's lifecycle run (ensure-model or delete-model).

Whoever starts a run first reserves the lease (a holder without a process, for `RESERVATION_SECONDS`), so two
starters (the API, two reconcile passes) never start the same work twice; once Prefect has the run, the
reservation names it, and a pass renews it while the run still waits for a worker (a burst queues behind the
workers' run limit for longer than any fixed time). The run takes its reservation over and holds the lease
while it works. delete-model takes the lease over from ensure-model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from weightkeeper.registry.common import Holder, this_host, utcnow
from weightkeeper.registry.leases import Kind, Lease, abandoned, as_lease
from weightkeeper.registry.schema import LeaseRow, ModelRow

if TYPE_CHECKING:
    from weightkeeper.registry.store import Model

RESERVATION_SECONDS = 120.0  # a started run gets this long to reach a worker and take its reservation over
DELETE = "delete-model"


RESERVED = "reserved:"


def reservation(key: str) -> Holder:
    """The holder of a reservation (`key`: the starter's idempotency key, then the flow run's id): no process of
    its own (pid 0), so it only lapses."""
    return Holder(f"{RESERVED}{key}", "", 0, 0.0)


@dataclass(frozen=True)
class RunLease:
    model: str
    phase: str
    lease: Lease

    @property
    def flow(self) -> str:
        return self.lease.purpose

    @property
    def reserved(self) -> bool:
        return self.lease.holder.is_reservation

    @property
    def fresh(self) -> bool:
        """A live run holds it (neither lapsed nor left by a process of this host that is gone)."""
        return not abandoned(self.lease, utcnow(), this_host())


class RunOps:
    """Mixed into `Registry`; uses its `_tx`, `_model` and lease operations."""

    def claim_run(self, name: str, flow: str, holder: Holder, lease_seconds: float,
                  phases: tuple[str, ...] | None = None, seen: Model | None = None) -> Lease | str | None:
        """Take the model's run lease for `flow`; returns what prevents it: the lease of another run, or
        `phase <phase>` when the model is no longer in one of `phases` (decided under the same lock).

        A run takes over a reservation for its own flow; delete-model takes over from ensure-model
        (whose downloads stop when they see Deleting). Raises NotFoundError for an unknown model, and with
        `seen`, for any model but that very one (one declared since under its name).
        """
        with self._tx() as s:
            model = self._model(s, name, seen=seen)  # locked: claims on one model are serialised
            if phases is not None and model.phase not in phases:
                return f"phase {model.phase}"
            blocker = self._blocker(s, Kind.RUN, model.id, holder)
            reserved = holder.is_reservation
            force = blocker is not None and (
                (blocker.holder.is_reservation and blocker.purpose == flow and not reserved)
                or (flow == DELETE and blocker.purpose != DELETE))
            if blocker is not None and not force:
                return blocker
            seconds = max(lease_seconds, RESERVATION_SECONDS) if reserved else lease_seconds
            self._take(s, Kind.RUN, model.id, holder, seconds, flow, force=True)
            return None

    def name_reserved_run(self, name: str, key: str, run_id: str) -> None:
        """The run started for the reservation `key` is the flow run `run_id`: the reservation names it from now on
        (unless the run, or another, has taken the lease meanwhile)."""
        with self._tx() as s:
            model = s.scalars(select(ModelRow).where(ModelRow.name == name).with_for_update()).first()
            row = self._lease_row(s, Kind.RUN, model.id) if model is not None else None
            if row is not None and row.holder == reservation(key).run:
                row.holder = reservation(run_id).run

    def release_run(self, name: str, holder: Holder, abandoned_only: bool = False) -> None:
        """Let `holder`'s run lease on the model go (`abandoned_only`: only while it still is, not renewed since)."""
        with self._tx() as s:
            model = s.scalars(select(ModelRow).where(ModelRow.name == name).with_for_update()).first()
            lease = model and self._lease_row(s, Kind.RUN, model.id)
            if lease is not None and (not abandoned_only or abandoned(as_lease(lease), utcnow(), this_host())):
                self._drop(s, Kind.RUN, model.id, holder)

    def run_leases(self) -> dict[str, RunLease]:
        """Every model's run lease, by model name."""
        with self._tx() as s:
            rows = s.execute(select(ModelRow.name, ModelRow.phase, LeaseRow).join(
                LeaseRow, (LeaseRow.kind == Kind.RUN) & (LeaseRow.key == ModelRow.id)))
            return {name: RunLease(name, phase, as_lease(r)) for name, phase, r in rows}
