"""`download_slot`: what its callers rely on besides the cap (tests/test_lifecycle.py) and the leases
(tests/test_server_restart.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from weightkeeper.errors import DownloadError


def in_use() -> tuple[int, int]:
    from weightkeeper.runtime import slots_in_use

    return slots_in_use()


def test_a_missing_limit_fails_the_download_for_good_and_unlimited_downloads_need_none(wk):
    from prefect.client.orchestration import get_client

    from weightkeeper.config import DOWNLOAD_LIMIT_NAME
    from weightkeeper.runtime import download_slot, ensure_download_limit

    ensure_download_limit(wk.settings)
    with get_client(sync_client=True) as client:
        client.delete_global_concurrency_limit_by_name(DOWNLOAD_LIMIT_NAME)
    try:
        with pytest.raises(DownloadError, match="download limit 'weightkeeper-downloads' does not exist.*"
                                                "`weightkeeper serve` or any ensure-model run creates it") as e:
            with download_slot(wk.settings, lambda *_: None):
                pytest.fail("the body ran without a slot")
        assert e.value.permanent
        wk.rewrite(max_concurrent_downloads=-1)
        ran = []
        with download_slot(wk.settings, lambda *_: None):  # unlimited: no slot, so no limit needed
            ran.append(True)
        assert ran
    finally:
        wk.rewrite()
        ensure_download_limit(wk.settings)


@contextlib.contextmanager
def another_holds_the_only_slot(wk) -> Iterator[threading.Event]:
    """The limit at 1 and its slot held by another thread until the event yielded is set (at the latest when
    the block ends); the limit restored afterwards."""
    from weightkeeper.runtime import download_slot, ensure_download_limit

    wk.rewrite(max_concurrent_downloads=1)
    ensure_download_limit(wk.settings)
    taken, free = threading.Event(), threading.Event()

    def other() -> None:
        with download_slot(wk.settings, lambda *_: None):
            taken.set()
            free.wait(60)

    holder = threading.Thread(target=other)
    holder.start()
    try:
        assert taken.wait(60)
        yield free
    finally:
        free.set()
        holder.join(60)
        wk.rewrite()
        ensure_download_limit(wk.settings)


def test_while_every_slot_is_taken_on_wait_is_called_and_can_stop_the_wait(wk, download_limit):
    from weightkeeper.runtime import download_slot

    with another_holds_the_only_slot(wk) as free:
        calls: list[tuple[int, int]] = []

        class Stop(Exception):
            pass

        def stop_on_second(in_use_: int, limit: int) -> None:
            calls.append((in_use_, limit))
            if len(calls) == 2:
                raise Stop

        with pytest.raises(Stop):
            with download_slot(wk.settings, stop_on_second):
                pytest.fail("took a slot beyond the limit")
        assert calls == [(1, 1), (1, 1)] and in_use() == (1, 1)  # the stopped wait took no slot

        def free_on_first(in_use_: int, limit: int) -> None:
            calls.append((in_use_, limit))
            free.set()

        calls.clear()
        with download_slot(wk.settings, free_on_first):
            assert in_use() == (1, 1)
        assert calls and set(calls) == {(1, 1)} and in_use() == (0, 1)


def test_a_slot_taken_between_the_read_and_the_ask_is_waited_for_without_an_error_line(wk, download_limit,
                                                                                       monkeypatch):
    """The other process takes the last slot after our read said one was free: the ask answers 423, the wait
    goes on, and the log says nothing is wrong."""
    import logging.handlers

    import weightkeeper.runtime
    from weightkeeper.runtime import download_slot

    reads = []
    real = weightkeeper.runtime.slots_in_use

    def stale_read() -> tuple[int, int]:  # the read before the other process's take
        reads.append(real())
        return (0, 1) if len(reads) <= 2 else reads[-1]

    lines = logging.handlers.BufferingHandler(100)  # Prefect's internal loggers do not propagate to pytest's
    logging.getLogger("prefect._internal.concurrency").addHandler(lines)
    try:
        with another_holds_the_only_slot(wk) as free:
            monkeypatch.setattr(weightkeeper.runtime, "slots_in_use", stale_read)
            waits = []
            with download_slot(wk.settings, lambda *args: waits.append(args) or (len(waits) == 2 and free.set())):
                assert real() == (1, 1)
        assert reads[:2] == [(1, 1), (1, 1)] and waits  # asked twice while taken (423s), then waited it out
        assert not [r.getMessage() for r in lines.buffer if r.levelno >= logging.ERROR]
    finally:
        logging.getLogger("prefect._internal.concurrency").removeHandler(lines)


@pytest.mark.parametrize("status, shown", [(423, False), (500, True), (None, True)])
def test_only_the_line_of_a_423_slot_request_is_dropped(status, shown):
    import concurrent.futures
    import logging

    import httpx

    from weightkeeper.runtime import _SlotRequestFailed

    future = concurrent.futures.Future()
    request = httpx.Request("POST", "http://prefect/v2/concurrency_limits/increment-with-lease")
    if status is None:
        future.set_exception(httpx.ConnectError("refused", request=request))
    else:
        future.set_exception(httpx.HTTPStatusError("x", request=request, response=httpx.Response(status, request=request)))
    record = logging.LogRecord("prefect._internal.concurrency", logging.ERROR, __file__, 1,
                               "Service %r failed to process item %r",
                               ("ConcurrencySlotAcquisitionWithLeaseService", (1, "concurrency", future)), None)
    assert _SlotRequestFailed().filter(record) is shown


def test_a_limit_another_run_creates_meanwhile_is_resized_not_an_error(wk, monkeypatch):
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.exceptions import ObjectNotFound

    from weightkeeper.runtime import ensure_download_limit

    ensure_download_limit(wk.settings)  # it exists, at 4
    read = SyncPrefectClient.read_global_concurrency_limit_by_name
    reads = []

    def missing_at_first(self, name):  # as if another run created it between this run's read and its create
        reads.append(name)
        if len(reads) == 1:
            raise ObjectNotFound(None)
        return read(self, name)

    monkeypatch.setattr(SyncPrefectClient, "read_global_concurrency_limit_by_name", missing_at_first)
    wk.rewrite(max_concurrent_downloads=3)
    try:
        ensure_download_limit(wk.settings)
        assert len(reads) == 2 and in_use() == (0, 3)
    finally:
        monkeypatch.undo()
        wk.rewrite()
        ensure_download_limit(wk.settings)
