"""Counters and histograms every process writes, read by /metrics.

weightkeeper runs as many processes on many hosts (the API, workers, flow runs): a count kept in one
process's memory would miss the others' work. Whichever process sees an event adds to the event's row of
`metric_counters` with one UPSERT, inside the event's own transaction where it has one (`_add`), else in one of
its own (`record`). A histogram keeps a row per bucket (the observations that fell in it and their sum), so an
observation is one UPSERT too; the reader makes the buckets cumulative. `metric_snapshot` reads the rows and
the gauges derived from the registry's state in one transaction, at scrape time (`weightkeeper.metrics`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from weightkeeper.registry.common import DELETING, _utc, utcnow
from weightkeeper.registry.schema import LeaseRow, LocalPathRow, MetricRow, ModelRow

logger = logging.getLogger("weightkeeper.metrics")


@dataclass(frozen=True)
class Metric:
    """A counter (no buckets) or a histogram, as /metrics names it (a counter without its `_total`)."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, +Inf implied


DOWNLOADED_BYTES = Metric("weightkeeper_downloaded_bytes", "Bytes fetched from the Hub or S3 into model paths and "
                          "shared copies (counted as each fetch ends, a failed one too)", ("workspace", "source"))
SHARED_COPY_BYTES = Metric("weightkeeper_shared_copy_served_bytes", "Bytes of model paths filled by linking a "
                           "shared copy that was already there instead of downloading", ("workspace",))
REUSED_BYTES = Metric("weightkeeper_reused_bytes", "Bytes of files a download or repair took from a verified copy "
                      "of another commit or model on the volume instead of fetching them", ("workspace", "how"))
DOWNLOAD_SECONDS = Metric("weightkeeper_download_duration_seconds", "Time a completed fetch into a model path or "
                          "shared copy took (a download slot held)", ("source",),
                          (1, 5, 15, 60, 300, 900, 1800, 3600, 10800))
CLEANUP_SECONDS = Metric("weightkeeper_cleanup_duration_seconds", "Time a completed cleanup of one model path took",
                         (), (0.1, 0.5, 1, 5, 15, 60, 300, 1800))
CLEANUP_FAILURES = Metric("weightkeeper_cleanup_failures", "Failed cleanup attempts (a model's attempt counts once "
                          "however many of its paths failed)")
LEASE_TAKEOVERS = Metric("weightkeeper_lease_takeovers", "Leases taken from another run: abandoned (it lapsed or "
                         "its process is gone) or preempted (delete-model from a live ensure-model)",
                         ("kind", "reason"))
RECORDED = (DOWNLOADED_BYTES, SHARED_COPY_BYTES, REUSED_BYTES, DOWNLOAD_SECONDS, CLEANUP_SECONDS, CLEANUP_FAILURES, LEASE_TAKEOVERS)


def bucket_bound(value: float, buckets: Iterable[float]) -> str:
    """The `le` of the bucket `value` falls in: the smallest bound at or above it, else `+Inf`."""
    return repr(float(min((b for b in buckets if value <= b), default=math.inf))).replace("inf", "+Inf")


def cumulative(rows: Iterable[tuple[str, int, float]], buckets: Iterable[float]) -> tuple[list[tuple[str, int]], float]:
    """Prometheus buckets (`le`, observations at or below it, ending with `+Inf`) and the sum, from per-bucket
    rows (`le`, count, sum); a row of a bound no longer declared counts in every bucket above it."""
    rows = [(float(le), count, total) for le, count, total in rows]
    bounds = [*map(float, buckets), math.inf]
    return ([(bucket_bound(b, [b]), sum(count for le, count, _ in rows if le <= b)) for b in bounds],
            sum(total for _, _, total in rows))


def _encode(metric: Metric, labels: dict[str, str]) -> str:
    if set(labels) != set(metric.labels):
        raise ValueError(f"metric {metric.name} takes the labels {metric.labels}, not {sorted(labels)}")
    return json.dumps([str(labels[k]) for k in metric.labels])


@dataclass(frozen=True)
class Recorded:
    """One row of a recorded metric: its label values, and a counter's value or a histogram bucket's."""

    labels: tuple[str, ...]
    le: str  # "" for a counter
    count: int
    total: float


@dataclass(frozen=True)
class MetricSnapshot:
    models: dict[str, int]  # by phase
    paths: dict[tuple[str, str], int]  # by (workspace, status)
    waiting: dict[str, int]  # path downloads and stagings under a live lease, by how their message begins
    oldest_deletion: datetime | None  # the deletion time of the model Deleting longest
    recorded: dict[str, list[Recorded]]  # by metric name


class MetricOps:
    """Mixed into `Registry` (uses its `_tx`)."""

    @staticmethod
    def _add(s, metric: Metric, value: float = 1, **labels: str) -> None:
        """Add `value` to a counter, or observe it in a histogram, in the caller's transaction: one UPSERT."""
        table = MetricRow.__table__
        histogram = bool(metric.buckets)
        insert = (postgresql if s.get_bind().dialect.name == "postgresql" else sqlite).insert(table).values(
            name=metric.name, labels=_encode(metric, labels),
            le=bucket_bound(value, metric.buckets) if histogram else "",
            count=1 if histogram else int(value), total=float(value) if histogram else 0.0)
        s.execute(insert.on_conflict_do_update(
            index_elements=[table.c.name, table.c.labels, table.c.le],
            set_={"count": table.c.count + insert.excluded.count, "total": table.c.total + insert.excluded.total}))

    def record(self, metric: Metric, value: float = 1, **labels: str) -> None:
        """An event seen outside any registry transaction, in one of its own. A failure is logged, never raised:
        the work being counted goes on."""
        try:
            with self._tx() as s:
                self._add(s, metric, value, **labels)
        except SQLAlchemyError as e:
            logger.warning("metric %s not recorded (%s); the work it counts goes on", metric.name,
                           str(e).splitlines()[0])

    def metric_snapshot(self, waits: Iterable[str]) -> MetricSnapshot:
        """Everything /metrics shows from the registry, read in one transaction. `waits`: how the messages of
        paths (or staging models) waiting for something begin (a download slot, the Hub request budget); those
        whose lease is live are counted."""
        from weightkeeper.registry.leases import Kind  # here: `leases` imports this module

        with self._tx() as s:
            models = dict(s.execute(select(ModelRow.phase, func.count()).group_by(ModelRow.phase)).all())
            paths = {(workspace, status): n for workspace, status, n in s.execute(
                select(LocalPathRow.workspace, LocalPathRow.status, func.count())
                .group_by(LocalPathRow.workspace, LocalPathRow.status))}
            live, waiting = LeaseRow.expires_at > utcnow(), {}
            for prefix in waits:
                waiting[prefix] = sum(s.scalar(select(func.count()).select_from(row).join(
                    LeaseRow, (LeaseRow.kind == kind) & (LeaseRow.key == row.id)).where(
                    live, row.message.startswith(prefix, autoescape=True)))
                    for kind, row in ((Kind.PATH, LocalPathRow), (Kind.STAGING, ModelRow)))
            oldest = s.scalar(select(func.min(ModelRow.deletion_time)).where(ModelRow.phase == DELETING))
            recorded: dict[str, list[Recorded]] = {}
            for name, labels, le, count, total in s.execute(
                    select(MetricRow.name, MetricRow.labels, MetricRow.le, MetricRow.count, MetricRow.total)):
                recorded.setdefault(name, []).append(Recorded(tuple(json.loads(labels)), le, count, total))
        return MetricSnapshot(models, paths, waiting, _utc(oldest), recorded)
