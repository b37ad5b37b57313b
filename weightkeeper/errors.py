"""Errors that carry what the user needs to act on them."""

import logging
import re
from collections.abc import Iterable

_URL = re.compile(r"(https?://)(?:[^\s/?#@'\"<>]*@)?([^\s?#'\"<>]*)([?#][^\s'\"<>]*)?", re.IGNORECASE)
_PATH = re.compile(r"((?<![^\s'\"(=,])/[^\s?#'\"<>]*)[?#][^\s'\"<>)]*")  # a bare path, its query: "url: /p?q"


MESSAGE_LIMIT = 2000  # characters of a message: the registry keeps no more, and a DownloadError says no more
SAID_CHARS = 200  # of what a server said (or its client library said of the answer), quoted in a message


def scrubbed(text: object, secrets: Iterable[str | None] = ()) -> str:
    """`text` with each of `secrets` (what a request sent, which a server may repeat) replaced by "…"."""
    line = str(text or "")
    for secret in filter(None, secrets):
        line = line.replace(secret, "…")
    return line


def said(text: object, secrets: Iterable[str | None] = ()) -> str:
    """What a server said, quoted in a message: one line of at most SAID_CHARS characters, `scrubbed` of `secrets`
    before it is cut."""
    line = " ".join(scrubbed(text, secrets).split())
    return line if len(line) <= SAID_CHARS else f"{line[:SAID_CHARS]}..."


def one_line(text: str) -> str:
    """`text` on one line (its line breaks become spaces) of at most MESSAGE_LIMIT characters, cut in the middle:
    what to do next comes last."""
    text = " ".join(text.splitlines())
    half = MESSAGE_LIMIT // 2
    return text if len(text) <= MESSAGE_LIMIT else f"{text[:half]} … {text[-(MESSAGE_LIMIT - half - 3):]}"


def redact_urls(text: str) -> str:
    """`text` with every URL's user info, query and fragment dropped: signed URLs carry credentials there."""
    return _PATH.sub(lambda m: m[1] + "?…", _URL.sub(lambda m: m[1] + m[2] + ("?…" if m[3] else ""), text))


class RedactUrls(logging.Filter):
    """For a library's logger that names the URLs it retries (urllib3's connection pools): records lose the queries."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_urls(record.getMessage()), ()
        return True


class DropDebug(logging.Filter):
    """For a library's logger whose DEBUG records carry secrets (botocore's: a request's `Authorization` and
    `X-Amz-Security-Token` headers, the string it signs and the signature, a response body with credentials):
    those records are dropped; the others pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.DEBUG


class WeightkeeperError(Exception):
    """Base class: its message is shown to the user as one line."""


class InvalidInputError(WeightkeeperError):
    """A name, source, path or setting is not acceptable."""


class ConfigError(WeightkeeperError):
    """The configuration file or environment is invalid."""


class UnsafePathError(WeightkeeperError):
    """A path failed the cleanup guard and must never be removed."""


class LinkInTheWayError(UnsafePathError):
    """A symlink (or a file) stands where a directory on the way to a path was: someone's race or doing. The
    operation is refused, never redirected; unlike a path the guard refuses, it may succeed when retried."""


class NotFoundError(WeightkeeperError):
    """A model or workspace does not exist."""


class ConflictError(WeightkeeperError):
    """The request conflicts with the registry's state. `code` is machine-readable."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class DownloadError(WeightkeeperError):
    """A download failed. `permanent` errors are not retried. Its message is one line (`one_line`: whatever a server
    said in it) and names no URL's query (`redact_urls`): it reaches logs, Prefect states and the registry."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(one_line(redact_urls(message)))
        self.permanent = permanent


RETRIES = "; will retry"  # how a transient DownloadError's message ends


def gave_up(error: DownloadError, name: str) -> str:
    """What a model's record says of a transient `error` once its task's retries are spent: nothing retries it on its
    own then (a Failed model waits for its owner), so its `will retry` becomes what does."""
    return f"{str(error).removesuffix(RETRIES)}; `weightkeeper model retry {name}` tries again"


class DeadlineExceeded(DownloadError):
    """A download ran past its deadline (`download_timeout_seconds`); its partial files are kept."""

    def __init__(self, message: str):
        super().__init__(message, permanent=True)


class UnavailableError(WeightkeeperError):
    """A source could not be asked now (network, a Hub outage); the same request may succeed later."""


class DownloadCancelled(WeightkeeperError):
    """The model is being deleted, or another run took over the path: stop at once."""


class CleanupError(WeightkeeperError):
    """A path could not be removed; the model is kept and cleanup retried."""


class NotOursError(WeightkeeperError):
    """What stands at a model path is not what weightkeeper made there: it is left alone."""
