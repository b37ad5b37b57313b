"""`/metrics` of the API in the Prometheus text format, read at scrape time.

Counters and histograms come from the registry, where every process (API, workers, flow runs, on any host)
records its events (`weightkeeper.registry.metrics`); gauges are derived from the registry's state then, and
the download slots in use from Prefect's global concurrency limit. No process or platform collector: the
numbers are the platform's, whichever API process answers.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from weightkeeper.config import Settings
from weightkeeper.errors import redact_urls
from weightkeeper.hubbudget import BUDGET_WAIT
from weightkeeper.phase import PathStatus, Phase
from weightkeeper.registry import Registry
from weightkeeper.registry.metrics import RECORDED, MetricSnapshot, cumulative
from weightkeeper.runtime import SLOT_WAIT, slots_in_use

logger = logging.getLogger("weightkeeper.metrics")
PREFECT_READ_SECONDS = 5.0  # a scrape waits this long for Prefect's slot count, then answers without it


def _read_slots(future: Future, context: contextvars.Context) -> None:
    try:
        future.set_result(context.run(slots_in_use))
    except Exception as e:  # noqa: BLE001 - the scrape that waits reports it
        future.set_exception(e)


class RegistryCollector(Collector):
    """Every weightkeeper metric, read from the registry (and Prefect) on each scrape."""

    def __init__(self, settings: Settings, registry: Registry):
        self.settings, self.registry = settings, registry
        self._lock, self._read = threading.Lock(), None

    def _slots_in_use(self) -> tuple[int, int]:
        """Prefect's slot count, waited for `PREFECT_READ_SECONDS` at most: a Prefect that hangs neither holds the
        scrape past Prometheus's timeout nor piles up threads (a read still running is waited for again)."""
        with self._lock:
            if self._read is None or self._read.done():
                self._read = Future()
                threading.Thread(target=_read_slots, args=(self._read, contextvars.copy_context()), daemon=True,
                                 name="metrics-prefect").start()  # a daemon: a hung read never holds up exit
            read = self._read
        return read.result(timeout=PREFECT_READ_SECONDS)

    def collect(self) -> Iterator:
        snapshot = self.registry.metric_snapshot((SLOT_WAIT, BUDGET_WAIT))
        yield from self._state(snapshot)
        yield from self._slots(snapshot.waiting[SLOT_WAIT])
        yield from self._hub(snapshot.waiting[BUDGET_WAIT])
        yield from self._recorded(snapshot)

    def _state(self, snapshot: MetricSnapshot) -> Iterator:
        models = GaugeMetricFamily("weightkeeper_models", "Models by phase", labels=["phase"])
        for phase in Phase:
            models.add_metric([phase.value], snapshot.models.get(phase.value, 0))
        paths = GaugeMetricFamily("weightkeeper_paths", "Model paths by workspace and status",
                                  labels=["workspace", "status"])
        counts = {(w.name, status.value): 0 for w in self.settings.workspaces for status in PathStatus}
        for (workspace, status), n in sorted({**counts, **snapshot.paths}.items()):
            paths.add_metric([workspace, status], n)
        oldest = GaugeMetricFamily("weightkeeper_oldest_deletion_timestamp_seconds",
                                   "When the model Deleting longest was marked Deleting (absent: none is)")
        if snapshot.oldest_deletion is not None:
            oldest.add_metric([], snapshot.oldest_deletion.timestamp())
        yield from (models, paths, oldest)

    def _slots(self, waiting: int) -> Iterator:
        yield GaugeMetricFamily("weightkeeper_download_slots_waiting", "Path downloads and stagings waiting for a "
                                "download slot (under a live lease)", value=waiting)
        if not self.settings.downloads_limited:
            return
        try:
            in_use, limit = self._slots_in_use()
        except TimeoutError:
            logger.warning("download slots not read from Prefect: no answer in %s s", PREFECT_READ_SECONDS)
            return
        except Exception as e:  # noqa: BLE001 - Prefect unreachable: the registry's metrics are still answered
            # its URL may carry PREFECT_API_URL's user info (a password)
            logger.warning("download slots not read from Prefect: %s", redact_urls(str(e)))
            return
        yield GaugeMetricFamily("weightkeeper_download_slots_in_use", "Download slots taken (Prefect's global "
                                "concurrency limit)", value=in_use)
        yield GaugeMetricFamily("weightkeeper_download_slots_limit", "Download slots in all "
                                "(max_concurrent_downloads)", value=limit)

    def _hub(self, waiting: int) -> Iterator:
        sent = CounterMetricFamily("weightkeeper_hub_requests", "Requests sent to the Hub, by budget bucket",
                                   labels=["bucket"])
        throttled = CounterMetricFamily("weightkeeper_hub_rate_limited", "Hub answers 429 Too Many Requests, by "
                                        "budget bucket", labels=["bucket"])
        for bucket, counts in self.registry.hub_request_counts().items():
            sent.add_metric([bucket], counts.requests)
            throttled.add_metric([bucket], counts.throttled)
        yield from (sent, throttled)
        yield GaugeMetricFamily("weightkeeper_hub_budget_waiting", "Path downloads and stagings waiting for the "
                                "Hub request budget (under a live lease)", value=waiting)

    @staticmethod
    def _recorded(snapshot: MetricSnapshot) -> Iterator:
        for metric in RECORDED:
            rows = snapshot.recorded.get(metric.name, [])
            if not metric.buckets:
                family = CounterMetricFamily(metric.name, metric.help, labels=metric.labels)
                for row in rows:
                    family.add_metric(row.labels, row.count)
                if not metric.labels and not rows:
                    family.add_metric([], 0)
                yield family
                continue
            family = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
            series: dict[tuple[str, ...], list] = {(): []} if not metric.labels else {}
            for row in rows:
                series.setdefault(row.labels, []).append((row.le, row.count, row.total))
            for labels, buckets in series.items():
                counts, total = cumulative(buckets, metric.buckets)
                family.add_metric(list(labels), counts, total)
            yield family


def metrics_registry(settings: Settings, registry: Registry) -> CollectorRegistry:
    """A collector registry of its own (one per app) holding only weightkeeper's collector."""
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(RegistryCollector(settings, registry))
    return collectors
