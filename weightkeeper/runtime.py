"""Download slots (Prefect's global concurrency limit) and the Prefect settings a run here starts with."""

from __future__ import annotations

import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import prefect.context
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import task_run
from prefect.settings.legacy import Setting

from weightkeeper.config import DOWNLOAD_LIMIT_NAME, Settings
from weightkeeper.errors import DownloadError

if TYPE_CHECKING:
    from weightkeeper.hubbudget import HubBudget

R = TypeVar("R")

SLOT_POLL_SECONDS = 1.0
SLOT_LEASE_SECONDS = 60.0  # the shortest lease Prefect's server grants (`lease_duration` >= 60)
SLOT_WAIT = "Waiting for a download slot"  # how a waiting download's (or staging's) message begins: /metrics counts them

logger = logging.getLogger("weightkeeper.runtime")


class _SlotRequestFailed(logging.Filter):
    """Drops Prefect's ERROR line "Service 'ConcurrencySlotAcquisitionWithLeaseService' failed to process item"
    when the item's future holds a 423 (every slot taken between `_take_slot`'s read and its ask): the caller
    gets that answer and polls again, so the line only says, alarmingly, what is handled. Any other failure's
    line stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (str(record.msg).startswith("Service %r failed to process item") and isinstance(record.args, tuple)
                and len(record.args) == 2 and record.args[0] == "ConcurrencySlotAcquisitionWithLeaseService"
                and isinstance(record.args[1], tuple) and record.args[1]):
            return True
        future = record.args[1][-1]  # Prefect's FutureQueueService puts the caller's future last
        if not isinstance(future, concurrent.futures.Future) or not future.done() or future.cancelled():
            return True
        error = future.exception()
        return not (isinstance(error, httpx.HTTPStatusError) and error.response.status_code == 423)


logging.getLogger("prefect._internal.concurrency").addFilter(_SlotRequestFailed())
_TAKING = threading.Lock()  # one slot request at a time in this process (Prefect's slot service queues them too)
_PREFECT_SETTINGS: dict[tuple, tuple[Any, Any]] = {}  # (base id, updates) -> (base, updated)


def prefect_settings(updates: dict[Setting, Any]) -> prefect.context.SettingsContext:
    """Prefect's `temporary_settings(updates)` as a context manager, the updated settings built once per base
    settings: building them re-reads every source (~30 ms), and this runs for every flow started here."""
    context = prefect.context.get_settings_context()
    key = (id(context.settings), tuple((setting.name, value) for setting, value in updates.items()))
    base, updated = _PREFECT_SETTINGS.get(key, (None, None))
    if base is not context.settings:
        if len(_PREFECT_SETTINGS) > 32:
            _PREFECT_SETTINGS.clear()
        updated = context.settings.copy_with_update(updates=updates)
        _PREFECT_SETTINGS[key] = (context.settings, updated)
    return prefect.context.SettingsContext(profile=context.profile, settings=updated)


def ensure_download_limit(settings: Settings) -> None:
    """Create or resize the global concurrency limit that caps downloads (unless unlimited)."""
    if not settings.downloads_limited:
        return
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(DOWNLOAD_LIMIT_NAME)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                    name=DOWNLOAD_LIMIT_NAME, limit=settings.max_concurrent_downloads, active=True))
                return
            except ObjectAlreadyExists:  # another run created it meanwhile
                limit = client.read_global_concurrency_limit_by_name(DOWNLOAD_LIMIT_NAME)
        if limit.limit != settings.max_concurrent_downloads or not limit.active:
            client.update_global_concurrency_limit(DOWNLOAD_LIMIT_NAME, GlobalConcurrencyLimitUpdate(
                limit=settings.max_concurrent_downloads, active=True))


def _no_limit() -> DownloadError:
    return DownloadError(f"the download limit {DOWNLOAD_LIMIT_NAME!r} does not exist (or is inactive) on the Prefect "
                         "server; `weightkeeper serve` or any ensure-model run creates it", permanent=True)


def slots_in_use() -> tuple[int, int]:
    """(slots taken, limit) of the download limit."""
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(DOWNLOAD_LIMIT_NAME)
        except ObjectNotFound:
            raise _no_limit() from None
        return limit.active_slots, limit.limit


def _take_slot(on_wait: Callable[[int, int], None]) -> AbstractContextManager[None]:
    """Prefect's `concurrency` for one slot, entered once one is free.

    Left to wait, Prefect sleeps out each 423 (every slot taken) for the server's Retry-After (up to 30 s)
    where `on_wait` cannot run. So the limit is read about every SLOT_POLL_SECONDS, `on_wait(in_use, limit)`
    (which may raise to stop waiting) called in between, and a slot asked for only when one is free, once
    (`max_retries=0`); reading and asking are one step per process, so only another process can take the
    slot in between (a 423: polled again, Prefect's ERROR line for it dropped)."""
    holder = ConcurrencyLeaseHolder(type="task_run", id=task_run.id) if task_run.id else None
    while True:
        with _TAKING:
            in_use, limit = slots_in_use()
            if in_use < limit:
                slot = concurrency(DOWNLOAD_LIMIT_NAME, occupy=1, strict=True, lease_duration=SLOT_LEASE_SECONDS,
                                   max_retries=0, holder=holder, raise_on_lease_renewal_failure=False)
                try:
                    slot.__enter__()
                    return slot
                except ConcurrencySlotAcquisitionError as e:
                    if e.__cause__ is None:  # strict: no limit answered
                        raise _no_limit() from None
                    if not (isinstance(e.__cause__, httpx.HTTPStatusError) and e.__cause__.response.status_code == 423):
                        raise
        on_wait(in_use, limit)
        time.sleep(random.uniform(0.5, 1.0) * SLOT_POLL_SECONDS)  # waiters out of step


def fetch_in_slot(settings: Settings, budget: HubBudget, beat: Callable[..., None], work: Callable[[float], R],
                  suffix: str = "") -> R:
    """`work(deadline)` in a download slot, within `download_timeout_seconds` of holding one (saying the wait for it
    through `beat`, `suffix` after), the slot given back during a long wait for the Hub request budget
    (`HubBudget.held`)."""
    return budget.held(lambda: download_slot(settings, say_slot_wait(beat, suffix)), settings.download_timeout_seconds,
                       work, settings.downloads_limited)


def say_slot_wait(beat: Callable[..., None], suffix: str = "") -> Callable[[int, int], None]:
    """An `on_wait` for `download_slot` that says `Waiting for a download slot (n/limit in use)<suffix>` through
    `beat(message=, force=)`: a changed message at once, the same one only as often as `beat` writes unforced
    (a poll each SLOT_POLL_SECONDS would otherwise write the registry each time)."""
    shown = ""

    def on_wait(in_use: int, limit: int) -> None:
        nonlocal shown
        message = f"{SLOT_WAIT} ({in_use}/{limit} in use){suffix}"
        beat(message=message, force=message != shown)
        shown = message

    return on_wait


@contextmanager
def download_slot(settings: Settings, on_wait: Callable[[int, int], None]) -> Iterator[None]:
    """Hold one slot of the download limit (which must exist) while the body runs; `on_wait(in_use, limit)`
    is called while waiting. Prefect's `concurrency` leases the slot and renews the lease while held; the
    server frees it if this process dies. A renewal or a release that fails (the server restarting) does
    not fail the body: the lease then expires on its own."""
    if not settings.downloads_limited:
        yield
        return
    with prefect.context.SyncClientContext.get_or_create():  # one client for the polls and the renewals
        slot = _take_slot(on_wait)
        try:
            yield
        finally:
            try:
                slot.__exit__(None, None, None)
            except Exception as e:  # noqa: BLE001 - the lease expires on its own
                logger.warning("could not release a download slot (its lease expires within %.0f s): %s",
                               SLOT_LEASE_SECONDS, e)
