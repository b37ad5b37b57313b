"""Every request weightkeeper sends to the Hub endpoint's origin is taken from the registry's shared budget
first (`weightkeeper.registry.budget`), and a 429 answer is absorbed: its wait is recorded for every worker,
then the request is sent again, at most THROTTLE_ATTEMPTS times.

What counts: `model_info` is one `api` request; each file's HEAD (`hub.locate_file`) and each GET of a
range, or redirect hop, on the endpoint's origin is one `resolve` request. Requests to another origin (the
CDN the Hub redirects LFS files to) are not the Hub's to count and take nothing. A HEAD the Hub redirects
within its own origin (a renamed repository) counts once.

How long a 429 says to wait comes from its `Retry-After` (seconds or an HTTP date) and its IETF-draft
`RateLimit` header (`"api";r=0;t=55`: none remaining for 55 s) bounded by `RateLimit-Policy`'s window
(`"fixed window";"api";q=1000;w=300`); the server is not trusted: garbage is ignored and every wait is
bounded by the window setting.

A fetch waits for the budget while it holds a download slot only briefly: a wait longer than SLOT_WAIT_SECONDS
(a spent budget, a 429's block) gives the slot back to the downloads that need no Hub request (S3, another
token's budget) and is waited without it (`HubBudget.held`); the fetch then takes a slot again and resumes
from its partial files.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, TypeVar

from weightkeeper.config import Settings
from weightkeeper.download import TransferInterrupted
from weightkeeper.errors import DownloadError
from weightkeeper.watchdog import current

if TYPE_CHECKING:
    from weightkeeper.registry import Registry

THROTTLE_ATTEMPTS = 8  # sends of one request answered 429 before it fails (and its task retries)
WAIT_STEP_SECONDS = 1.0  # a wait sleeps in steps this long, saying so and staying cancellable
FALLBACK_WAIT_SECONDS = 2.0  # a 429 with no usable header waits this, doubled each attempt (bounded)
MIN_WAIT_SECONDS = 0.5  # a 429 that says to wait less (or 0) still waits this: no hammering
SLOT_WAIT_SECONDS = 10.0  # a longer wait for the budget gives the download slot back (`HubBudget.held`)
_NAME = re.compile(r'"[^"]{0,64}"')  # an item's name: `"api"` (a policy has two: `"fixed window";"api";q=1000;w=300`)
_KEY = re.compile(r"[a-z]{1,8}")
_DIGITS = re.compile(r"[0-9]{1,12}")
R = TypeVar("R")


def budget_key(endpoint: str, token: str | None) -> str:
    """The budget's registry key for an endpoint and token: their sha256 (the token is never stored)."""
    return hashlib.sha256(f"{endpoint.rstrip('/')}\n{token or ''}".encode()).hexdigest()


BUDGET_WAIT = "Waiting for the Hub request budget"  # how a path's message begins while it waits


def budget_message(seconds: float) -> str:
    return f"{BUDGET_WAIT} (resets in {math.ceil(seconds)} s)"


def _params(value: str) -> list[dict[str, str]]:
    """The items of a structured `RateLimit`/`RateLimit-Policy` value (`"name";k=v;...`, comma-separated), each as
    its parameters; an item that is not of that form is skipped."""
    items = []
    for item in value[:1000].lower().split(","):  # split and matched piece by piece: no regex ever backtracks
        segments = [s.strip() for s in item.split(";")]
        names = next((i for i, s in enumerate(segments) if not _NAME.fullmatch(s)), len(segments))
        params = [(k.strip(), eq, v.strip()) for k, eq, v in (s.partition("=") for s in segments[names:])]
        if names and all(eq and _KEY.fullmatch(k) and len(v) <= 32 and '"' not in v for k, eq, v in params):
            items.append({k: v for k, _, v in params})
    return items


def _seconds(text: str | None) -> int | None:
    return int(text) if text is not None and _DIGITS.fullmatch(text) else None


def ratelimit_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds until the exhausted `RateLimit` item resets (`r=0;t=N`), at most the policy's window `w`; None
    when no item is exhausted or none parses."""
    lower = {k.lower(): v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}
    waits = [t for item in _params(lower.get("ratelimit", "")) if _seconds(item.get("r")) == 0
             and (t := _seconds(item.get("t"))) is not None]
    if not waits:
        return None
    windows = [w for item in _params(lower.get("ratelimit-policy", "")) if (w := _seconds(item.get("w")))]
    return float(min(max(waits), max(windows))) if windows else float(max(waits))


def retry_after_wait(headers: Mapping[str, str], now: float) -> float | None:
    """`Retry-After` in seconds (delta-seconds or an HTTP date, from `now`); None when absent or garbage."""
    value = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == "retry-after"), None)
    if not isinstance(value, str) or len(value) > 64:
        return None
    if (seconds := _seconds(value.strip())) is not None:
        return float(seconds)
    try:
        return max(0.0, parsedate_to_datetime(value.strip()).timestamp() - now)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def throttle_wait(headers: Mapping[str, str], attempt: int, window: float, now: float) -> float:
    """How long a 429 says to wait: the longer of `Retry-After` and `RateLimit`, else FALLBACK_WAIT_SECONDS
    doubled per attempt; at least MIN_WAIT_SECONDS, never more than one `window` (whatever the server says)."""
    told = [w for w in (retry_after_wait(headers, now), ratelimit_wait(headers)) if w is not None]
    wait = max(told) if told else FALLBACK_WAIT_SECONDS * 2 ** min(attempt, 16)
    return min(max(wait, MIN_WAIT_SECONDS), window)


class Throttled(Exception):
    """The Hub answered 429 Too Many Requests (with these headers)."""

    def __init__(self, headers: Mapping[str, str]):
        super().__init__("429 Too Many Requests")
        self.headers = dict(headers)


class SlotYielded(Exception):
    """A wait for the budget longer than SLOT_WAIT_SECONDS in a download slot: the fetch stops (its partial files
    kept) and waits `seconds` without the slot (`HubBudget.held`)."""

    def __init__(self, seconds: float):
        super().__init__(f"{budget_message(seconds)}; the download slot is given back meanwhile")
        self.seconds = seconds


class HubBudget:
    """Takes Hub requests from the registry's budget (None: no budget, only 429s are waited for). `on_wait`
    is told the seconds left while a request waits (at most every WAIT_STEP_SECONDS; it may raise to stop the
    wait), and None when no request of this budget waits any more."""

    def __init__(self, registry: Registry | None, limits: Mapping[str, int], window: float,
                 on_wait: Callable[[float | None], None] = lambda seconds: None):
        self.registry, self.limits, self.window, self.on_wait = registry, dict(limits), window, on_wait
        self._lock = threading.Lock()
        self._waiting, self._told = 0, 0.0
        self._in_slot = False  # set by `held`: a long wait raises SlotYielded instead of sleeping
        self._throttled: dict[tuple[str, str, str], int] = {}  # 429s in a row of a request: across `held`'s reruns

    def _sleep(self, seconds: float) -> None:
        """Sleep `seconds` in steps, telling `on_wait`; a fetch stopped meanwhile ends the wait (TransferInterrupted)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            with self._lock:
                if tell := time.monotonic() - self._told >= WAIT_STEP_SECONDS:
                    self._told = time.monotonic()
            if tell:
                self.on_wait(left)
            connection = current()
            with connection.idle():
                if connection.pause(min(left, WAIT_STEP_SECONDS)):
                    raise TransferInterrupted("the fetch stopped while waiting for the Hub request budget")

    def _waits(self, wait: Callable[[], float]) -> None:
        """Sleep while `wait()` says to (seconds), counted among this budget's waiters."""
        with self._lock:
            self._waiting += 1
        try:
            while (seconds := wait()) > 0:
                if self._in_slot and seconds > SLOT_WAIT_SECONDS:
                    raise SlotYielded(seconds)
                self._sleep(seconds)
        finally:
            with self._lock:
                self._waiting -= 1
                last = self._waiting == 0 and self._told > 0
                if last:
                    self._told = 0.0
        if last:  # not after an error: what stopped the wait says why
            self.on_wait(None)

    def held(self, slot: Callable[[], AbstractContextManager], seconds: float, work: Callable[[float], R],
             yields: bool = True) -> R:
        """`work(deadline)` (a fetch taking its requests from this budget, within `seconds` of holding a slot) inside
        `slot()` (a download slot); with `yields` (there is a slot to give back), when a request would wait longer
        than SLOT_WAIT_SECONDS the fetch stops, the slot is given back, the wait is slept without it, and `work()`
        runs again in a slot (resuming from its partial files), its deadline moved by the time it had none."""
        deadline = stopped = 0.0
        while True:
            with slot():
                now = time.monotonic()
                deadline = deadline + now - stopped if deadline else now + seconds
                self._in_slot = yields
                try:
                    return work(deadline)
                except SlotYielded as e:
                    stopped = time.monotonic()
                    until = stopped + e.seconds
                finally:
                    self._in_slot = False
            self._waits(lambda: until - time.monotonic())

    def take(self, key: str, bucket: str) -> None:
        """Wait until the budget grants one request of `bucket` (counted as sent)."""
        if self.registry is not None:
            registry, limit, window = self.registry, self.limits[bucket], self.window
            self._waits(lambda: registry.take_hub_request(key, bucket, limit, window))

    def call(self, key: str, bucket: str, send: Callable[[], R], what: str) -> R:
        """`send()` one request of `bucket` (it raises Throttled on a 429), taken from the budget; a 429 blocks
        the bucket for every worker as long as it says, then the request is sent again, until it was answered 429
        THROTTLE_ATTEMPTS times in a row (`what` names it: counted across the reruns `held` makes)."""
        while True:
            self.take(key, bucket)
            try:
                answer = send()
            except Throttled as e:
                with self._lock:
                    attempt = self._throttled.get((key, bucket, what), 0)
                    self._throttled[(key, bucket, what)] = attempt + 1
                if attempt + 1 >= THROTTLE_ATTEMPTS:
                    break
                wait = throttle_wait(e.headers, attempt, self.window, time.time())
            else:
                with self._lock:
                    self._throttled.pop((key, bucket, what), None)
                return answer
            if self.registry is not None:
                self.registry.hub_throttled(key, bucket, wait, self.window)
            else:
                until = time.monotonic() + wait
                self._waits(lambda: until - time.monotonic())
        raise DownloadError(f"the Hub answered 429 Too Many Requests {THROTTLE_ATTEMPTS} times in a row for {what} "
                            "(lower hub_api_requests_per_5min / hub_resolve_requests_per_5min to the token's limits); "
                            "will retry")


def hub_budget(settings: Settings, registry: Registry | None,
               on_wait: Callable[[float | None], None] = lambda seconds: None) -> HubBudget:
    """The budget of the settings' limits, shared through `registry`."""
    return HubBudget(registry, {"api": settings.hub_api_requests_per_5min,
                                "resolve": settings.hub_resolve_requests_per_5min},
                     settings.hub_budget_window_seconds, on_wait)


UNMETERED = HubBudget(None, {}, 300.0)  # no budget (a caller without a registry): only 429s are waited for
