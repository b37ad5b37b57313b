"""Registry operations on the lease of a model's lifecycle run (ensure-model or delete-model).

Whoever starts a run first reserves the lease (`reserved:<key>`), so two starters (the API, two
reconcile passes) never start the same work twice; the run takes its reservation over and renews it.
A lease whose heartbeat is older than the lease time belongs to a crashed run: its work is redone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select

from weightkeeper.registry.common import Holder, _utc, utcnow
from weightkeeper.registry.schema import ModelRow, ModelRunRow

RESERVED = "reserved:"
RESERVATION_SECONDS = 120.0  # a started run gets this long to reach a worker and take its reservation over
DELETE = "delete-model"


@dataclass(frozen=True)
class RunLease:
    model: str
    phase: str
    flow: str
    holder: str
    heartbeat_at: datetime | None
    fresh: bool

    @property
    def reserved(self) -> bool:
        return self.holder.startswith(RESERVED)


def _fresh(row: ModelRunRow, lease_seconds: float, now: datetime) -> bool:
    ttl = max(lease_seconds, RESERVATION_SECONDS) if (row.holder or "").startswith(RESERVED) else lease_seconds
    return bool(row.holder) and row.heartbeat_at is not None and _utc(row.heartbeat_at) > now - timedelta(seconds=ttl)


class RunOps:
    """Mixed into `Registry`; uses its `_tx` and `_model`."""

    def claim_run(self, name: str, flow: str, holder: Holder, lease_seconds: float,
                  phases: tuple[str, ...] | None = None) -> str | None:
        """Take the model's run lease for `flow`; returns what prevents it: the holder of a fresh lease,
        or `phase <phase>` when the model is no longer in one of `phases` (decided under the same lock).

        A run takes over a reservation for its own flow; delete-model takes over from ensure-model
        (whose downloads stop when they see Deleting). Raises NotFoundError for an unknown model.
        """
        with self._tx() as s:
            model = self._model(s, name)  # locked: claims on one model are serialised
            if phases is not None and model.phase not in phases:
                return f"phase {model.phase}"
            row = s.get(ModelRunRow, model.id)
            if row is not None and row.holder != holder.run and _fresh(row, lease_seconds, utcnow()):
                takes_reservation = (row.holder.startswith(RESERVED) and row.flow == flow
                                     and not holder.run.startswith(RESERVED))
                if not (takes_reservation or (flow == DELETE and row.flow != DELETE)):
                    return row.holder
            if row is None:
                row = ModelRunRow(model_id=model.id, flow=flow)
                s.add(row)
            row.flow, row.holder, row.holder_host, row.holder_pid = flow, holder.run, holder.host, holder.pid
            row.holder_started, row.heartbeat_at = holder.started, utcnow()
            return None

    @staticmethod
    def _locked(s, name: str) -> ModelRow | None:
        """The model row, locked: every change to a run lease takes this lock first, as `claim_run` does,
        so on PostgreSQL a claim never meets a lease that a finishing run removes meanwhile."""
        return s.scalars(select(ModelRow).where(ModelRow.name == name).with_for_update()).first()

    def renew_run(self, name: str, holder: Holder) -> bool:
        """Renew the lease; False once another run took it over or the model is gone."""
        with self._tx() as s:
            model = self._locked(s, name)
            row = s.get(ModelRunRow, model.id) if model else None
            if row is None or row.holder != holder.run:
                return False
            row.heartbeat_at = utcnow()
            return True

    def release_run(self, name: str, holder: Holder) -> None:
        with self._tx() as s:
            model = self._locked(s, name)
            row = s.get(ModelRunRow, model.id) if model else None
            if row is not None and row.holder == holder.run:
                s.delete(row)

    def run_leases(self, lease_seconds: float) -> dict[str, RunLease]:
        """Every model's run lease, by model name."""
        now = utcnow()
        with self._tx() as s:
            rows = s.execute(select(ModelRow.name, ModelRow.phase, ModelRunRow).join(
                ModelRunRow, ModelRunRow.model_id == ModelRow.id))
            return {name: RunLease(name, phase, r.flow, r.holder or "", _utc(r.heartbeat_at),
                                   _fresh(r, lease_seconds, now)) for name, phase, r in rows}
