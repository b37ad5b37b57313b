"""A fetch's watchdog: its deadline, its cancellation and a minimum pace hold while no byte arrives.

A range reads its body in large blocking reads (`read_body`), so while a server keeps a connection
open and sends nothing, or a byte now and then, no fetching thread looks at the clock. The
watchdog thread of each fetch does, every TICK seconds: once the deadline has passed, `poll` raises
(the model is being deleted), or fewer than `min_bytes_per_second * stall_seconds` bytes arrived in
the last `stall_seconds` while a range was in flight, it fails the fetch and shuts down the socket
of every range in flight, so that their blocked reads return at once. So it does once this process's
parent is gone (`ORPHANED`, set by `prefectserver.exit_with_parent`), in whatever thread the fetch runs.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import urllib3

from weightkeeper.errors import DeadlineExceeded, DownloadCancelled, DownloadError

TICK = 0.5
ORPHANED = threading.Event()  # this process's parent is gone: every fetch stops, keeping its partial files
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Pace:
    """The slowest a fetch may go: settings `min_download_bytes_per_second` (0: no minimum), `stall_seconds`."""
    min_bytes_per_second: int = 1024
    stall_seconds: float = 60


class Connection:
    """One range's request in flight: the bytes received so far (counted by its thread) and how to cut it."""

    def __init__(self, watchdog: Watchdog | None):
        self.watchdog, self.received = watchdog, 0
        self.abort: Callable[[], None] | None = None

    @contextmanager
    def abortable(self, abort: Callable[[], None]) -> Iterator[None]:
        """While inside, the watchdog may call `abort` from its thread (to shut down the socket a read waits on)."""
        if self.watchdog is None:
            yield
            return
        with self.watchdog.lock:
            self.abort = abort
            if self.watchdog.fired:
                _quietly(abort)
        try:
            yield
        finally:
            with self.watchdog.lock:  # never aborts a connection handed back to its pool
                self.abort = None

    @contextmanager
    def idle(self) -> Iterator[None]:
        """While inside, the range waits before sending (for the Hub request budget): no stall is counted."""
        if self.watchdog is None:
            yield
            return
        with self.watchdog.lock:
            self.watchdog.busy.discard(self)
            self.watchdog.done += self.received
            self.watchdog.waiting += 1
            self.received = 0
        try:
            yield
        finally:
            with self.watchdog.lock:
                self.watchdog.waiting -= 1
                self.watchdog.busy.add(self)

    def pause(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True (at once) when the fetch stops meanwhile."""
        if self.watchdog is None or self.watchdog.stop is None:
            time.sleep(seconds)
            return False
        return self.watchdog.stop.wait(seconds)


_local = threading.local()


def current() -> Connection:
    """The connection of the range this thread fetches (one no watchdog looks at outside a fetch)."""
    return getattr(_local, "connection", None) or Connection(None)


def _quietly(abort: Callable[[], None]) -> None:
    try:
        abort()
    except (OSError, ValueError, RuntimeError):  # already closed or released
        pass


class Watchdog:
    """Watches one fetch from its own thread while used as a context manager. `fail(error)` records the
    fetch's error and stops its ranges; the watchdog then aborts the ranges in flight."""

    def __init__(self, deadline: float, pace: Pace, poll: Callable[[], None],
                 fail: Callable[[BaseException], None], what: str, stop: threading.Event | None = None):
        self.deadline, self.pace, self.poll, self.fail, self.what = deadline, pace, poll, fail, what
        self.stop = stop  # set when the fetch stops (by `fail` or another range's error)
        self.lock, self.fired, self.done, self.waiting = threading.Lock(), False, 0, 0  # waiting: ranges in idle()
        self.busy: set[Connection] = set()
        self.samples: deque[tuple[float, int]] = deque()  # (time, bytes received) while a range was in flight
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A range's request, from before it is sent until its body is read."""
        conn = Connection(self)
        with self.lock:
            self.busy.add(conn)
        _local.connection = conn
        try:
            yield conn
        finally:
            _local.connection = None
            with self.lock:
                self.busy.discard(conn)
                self.done += conn.received

    def _run(self) -> None:
        last = time.monotonic()
        while not self.stopped.wait(TICK):
            now = time.monotonic()
            with self.lock:
                if self.waiting and not self.busy:  # every range waits for the budget: no download time passes
                    self.deadline += now - last
            last = now
            try:
                if ORPHANED.is_set():
                    raise DownloadCancelled(f"{self.what} stopped: the process that started this run is gone; "
                                            "the partial files are kept for the next run")
                if time.monotonic() > self.deadline:
                    raise DeadlineExceeded(f"{self.what} exceeded its timeout; `weightkeeper model ensure` resumes "
                                           "it from the partial files")
                self.poll()
                self._check_pace(time.monotonic())
            except BaseException as e:  # noqa: BLE001 - the fetch raises it
                self.fail(e)
                self.abort()
                return

    def abort(self) -> None:
        """Shut down the socket of every range in flight: their blocked reads return at once."""
        with self.lock:
            self.fired = True
            for conn in self.busy:
                if conn.abort:
                    _quietly(conn.abort)

    def _moved(self) -> tuple[bool, int]:
        """Whether bytes are on their way (a range in flight), and how many moved so far."""
        with self.lock:
            return bool(self.busy), self.done + sum(c.received for c in self.busy)

    def _stalled(self, moved: int, window: float) -> str:
        return (f"{self.what} stalled: {moved} bytes arrived in the last {window:g} s, below the minimum of "
                f"{self.pace.min_bytes_per_second} B/s (min_download_bytes_per_second); the partial files are kept "
                "and the next attempt resumes them")

    def _check_pace(self, now: float) -> None:
        """Fail when fewer than the minimum bytes moved over the last `stall_seconds` while bytes were on their way."""
        busy, moved = self._moved()
        if not busy or not self.pace.min_bytes_per_second:
            self.samples.clear()
            return
        self.samples.append((now, moved))
        window = self.pace.stall_seconds
        while len(self.samples) > 1 and self.samples[1][0] <= now - window:
            self.samples.popleft()
        since, before = self.samples[0]
        if now - since >= window and moved - before < self.pace.min_bytes_per_second * window:
            raise DownloadError(self._stalled(moved - before, window))


class BodyRefused(Exception):
    """An answer read whole held more than its bytes, or took longer than its time (`late`)."""

    def __init__(self, why: str, late: bool):
        super().__init__(why)
        self.late = late


def read_whole(response, cap: int, seconds: float) -> bytes:
    """A urllib3 response's whole body, at most `cap` bytes, within `seconds`: past them a timer shuts the connection
    down, whatever a read waits for (a dripping body, endless chunked trailers within one read), and BodyRefused
    says which; any other read error is raised as it is."""
    body, late = bytearray(), threading.Event()

    def cut() -> None:
        late.set()
        response.shutdown()

    timer = threading.Timer(seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        while chunk := response.read1(65536):
            body += chunk
            if len(body) > cap:
                raise BodyRefused(f"an answer held over {cap} bytes", late=False)
    except (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError):
        if not late.is_set():
            raise
    finally:
        timer.cancel()
        timer.join()  # a cut under way has ended: `late` says whether there was one
    if late.is_set():
        raise BodyRefused(f"an answer's body took over {seconds:.0f} s", late=True)
    return bytes(body)


def read_body(response, left: int, write: Callable[[memoryview], None]) -> int:
    """Read up to `left` bytes of a urllib3 response's body into one reused buffer, passing each full buffer
    to `write`; the bytes read. It reads from the socket's buffered reader under urllib3's and `http.client`'s
    responses (urllib3 2's `readinto` reads into new bytes and copies them: 1 GiB took 1.85 s that way, 1.49 s
    this way, best of 7 on 2 CPUs), one system call at a time, counting what arrives for the watchdog."""
    body: http.client.HTTPResponse = response._fp
    if body.fp is None:
        return 0
    plain = not body.chunked and body.length is not None  # else http.client decodes the framing (with a copy)
    if plain:
        left = min(left, body.length)
    conn, total = current(), 0
    buf = memoryview(bytearray(min(READ_CHUNK, left)))
    while total < left:
        want, n = min(len(buf), left - total), 0
        while n < want:
            if plain:
                got = body.fp.readinto1(buf[n:want])
            else:
                chunk = body.read1(want - n)
                got = len(chunk)
                buf[n:n + got] = chunk
            if not got:
                break
            n += got
            conn.received += got
        if n:
            write(buf[:n])
            total += n
        if n < want:
            break  # the body ended early
    if plain:
        body.length -= total
        if not body.length:
            body._close_conn()  # as http.client does once the body is read: the connection can be reused
    return total
