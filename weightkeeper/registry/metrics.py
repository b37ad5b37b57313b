"""Counters and histograms every process writes, read by /metrics."""

from __future__ import annotations


class MetricOps:
    """Mixed into `Registry` (uses its `_tx`)."""
