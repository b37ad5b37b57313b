"""The shared Hub request budget, per endpoint, token and bucket.

The Hub counts requests in fixed windows, in separate buckets: `api` (`/api/...`) and `resolve` (`/resolve/`
URLs). Where its windows start is not known here, so the budget holds for every window: no `window` seconds
hold more than the limit. Each budget row counts one bucket of one endpoint and token (its `key`: the sha256
of both, never the token) in SLOTS slots of a window and more: a request is granted while the latest
SLOTS + 1 slots, which cover any window wherever it starts, and those of MARGIN_SECONDS before them (at
least one: the time a request may take to arrive) hold fewer than the limit. The row also records until when a 429 answer blocked the
bucket. `take` is the rule, pure; every worker takes from the same rows in one short transaction, so
together they never send more, whatever host they run on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import func, select, text
from sqlalchemy.dialects import postgresql, sqlite

from weightkeeper.registry.schema import HubBudgetRow

BUCKETS = ("api", "resolve")
SLOTS = 30  # a window is counted in this many slots (10 s of a 5-minute window)
MARGIN_SECONDS = 1.0


@dataclass(frozen=True)
class Window:
    slot: int  # the latest slot counted: epoch seconds // the slot's length
    counts: tuple[int, ...]  # requests granted in the slots up to `slot` (the latest last)
    blocked_until: float  # epoch seconds


class HubCounts(NamedTuple):
    requests: int  # sent
    throttled: int  # answered 429


def take(window: Window, now: float, limit: int, seconds: float) -> tuple[Window, float]:
    """Ask at `now` for one request of a budget of `limit` per `seconds`: the window after, and 0.0 when the
    request is granted, else the seconds until it can be (a slot frees up, or a 429's block ends). A block
    further ahead than one window, or counts from a clock more than a window off, are ignored."""
    if now < window.blocked_until <= now + seconds:
        return window, window.blocked_until - now
    length = seconds / SLOTS
    size = SLOTS + 1 + max(1, math.ceil(MARGIN_SECONDS / length))
    slot, counts = math.floor(now / length), window.counts
    shift = slot - window.slot
    if len(counts) != size or not -SLOTS <= shift < size or min(counts) < 0:
        counts = (0,) * size
    elif shift > 0:
        counts = counts[shift:] + (0,) * shift
    else:
        slot = window.slot  # a clock a little behind another's counts in the latest slot
    if sum(counts) < limit:
        return Window(slot, counts[:-1] + (counts[-1] + 1,), window.blocked_until), 0.0
    oldest = next((i for i, n in enumerate(counts) if n), SLOTS)  # the slot whose end frees a request
    return Window(slot, counts, window.blocked_until), max((slot + oldest + 1) * length - now, 0.001)


class BudgetOps:
    """Mixed into `Registry` (uses its `_tx`)."""

    def _budget_row(self, s, key: str, bucket: str) -> HubBudgetRow:
        """The bucket's row, locked; made (by whichever worker comes first) when missing."""
        if bucket not in BUCKETS:
            raise ValueError(f"unknown Hub request bucket {bucket!r}; one of {BUCKETS}")
        query = select(HubBudgetRow).where(HubBudgetRow.key == key, HubBudgetRow.bucket == bucket).with_for_update()
        if (row := s.scalars(query).first()) is None:
            insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
            s.execute(insert(HubBudgetRow).values(key=key, bucket=bucket, slot=0, counts=[], blocked_until=0.0,
                                                  requests=0, throttled=0).on_conflict_do_nothing())
            row = s.scalars(query).one()
        return row

    def _clock(self, s) -> float:
        """Now, in epoch seconds, by the database's clock where several hosts share it (PostgreSQL): one host's clock
        off by a window would otherwise reset every other host's counts, or block them all."""
        if self.engine.dialect.name == "postgresql":
            return float(s.scalar(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")))
        return time.time()

    def take_hub_request(self, key: str, bucket: str, limit: int, window_seconds: float) -> float:
        """Take one request of `bucket` for the endpoint and token hashed as `key` (at most `limit` per
        `window_seconds`): 0.0 when granted (it is counted as sent), else the seconds to wait before asking again."""
        with self._tx() as s:
            row = self._budget_row(s, key, bucket)
            counts = row.counts if isinstance(row.counts, list) and all(type(n) is int for n in row.counts) else []
            window, wait = take(Window(row.slot, tuple(counts), row.blocked_until), self._clock(s), limit,
                                window_seconds)
            if not wait:
                row.slot, row.counts, row.requests = window.slot, list(window.counts), row.requests + 1
            return wait

    def hub_throttled(self, key: str, bucket: str, wait_seconds: float, window_seconds: float) -> None:
        """A request of `bucket` was answered 429: counted, and no worker sends another for `wait_seconds`
        (a longer block already recorded stays, unless it lies more than a window ahead: a clock's mistake)."""
        with self._tx() as s:
            row = self._budget_row(s, key, bucket)
            row.throttled += 1
            now = self._clock(s)
            kept = row.blocked_until if row.blocked_until <= now + window_seconds else 0.0
            row.blocked_until = max(kept, now + wait_seconds)

    def hub_request_counts(self) -> dict[str, HubCounts]:
        """Requests sent and 429 answers received, by bucket (every bucket, over all endpoints and tokens)."""
        with self._tx() as s:
            rows = s.execute(select(HubBudgetRow.bucket, func.sum(HubBudgetRow.requests),
                                    func.sum(HubBudgetRow.throttled)).group_by(HubBudgetRow.bucket)).all()
        counts = {bucket: HubCounts(int(sent or 0), int(throttled or 0)) for bucket, sent, throttled in rows}
        return {bucket: counts.get(bucket, HubCounts(0, 0)) for bucket in BUCKETS}
