"""The paginated, filtered model list (keyset pagination)."""

from __future__ import annotations


class ListOps:
    """Mixed into `Registry` (uses its `_tx`)."""
