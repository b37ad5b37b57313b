"""The shared Hub request budget, per endpoint, token and bucket."""

from __future__ import annotations


class BudgetOps:
    """Mixed into `Registry` (uses its `_tx`)."""
