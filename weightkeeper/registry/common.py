"""Shared by the registry modules: states, time, and the identity of a lease holder."""

from __future__ import annotations

import functools
import os
import re
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from weightkeeper.errors import MESSAGE_LIMIT, redact_urls
from weightkeeper.phase import PathStatus, Phase

PENDING, DOWNLOADING, READY, FAILED = Phase.PENDING, Phase.DOWNLOADING, Phase.READY, Phase.FAILED  # paths' too
STAGING, DELETING = Phase.STAGING, Phase.DELETING
WAITING, CLEANING = PathStatus.WAITING, PathStatus.CLEANING
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def scrub_message(text: str) -> str:
    """A message as the registry stores it: URLs lose their user info, query and fragment (signed URLs carry
    credentials there), control characters become '?', and it is cut to `MESSAGE_LIMIT` characters."""
    text = _CONTROL.sub("?", redact_urls(text))
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


def _iso(value: datetime | None) -> str | None:
    return _utc(value).isoformat() if value else None


@dataclass(frozen=True)
class Holder:
    """Who is working on a path: a run, on a host, in a process (pid + start time beat pid reuse)."""

    run: str
    host: str
    pid: int
    started: float

    @property
    def is_reservation(self) -> bool:
        """A lease reserved for a run about to start: no process holds it yet."""
        return self.pid == 0

    @classmethod
    def here(cls, run: str) -> Holder:
        return cls(run=run, host=this_host(), pid=os.getpid(), started=process_start_time(os.getpid()))


INIT_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's first pid namespace (PROC_PID_INIT_INO)


@functools.cache
def this_host() -> str:
    """This host as lease holders name it: its host name, and in a container also its pid namespace, since a
    pid (and so "that process is gone") means something only within its namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = INIT_PID_NAMESPACE
    host = socket.gethostname()
    return host if namespace == INIT_PID_NAMESPACE else f"{host}/{namespace.removeprefix('pid:').strip('[]')}"


def process_start_time(pid: int) -> float:
    """The process start time in clock ticks since boot (0.0 when unknown)."""
    try:
        return float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0.0
