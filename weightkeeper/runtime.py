"""What a task needs at run time: settings, the registry, the download limit, the token."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectNotFound

from weightkeeper.config import DOWNLOAD_LIMIT_NAME, Settings, load_settings
from weightkeeper.errors import DownloadError
from weightkeeper.registry import Registry, open_registry

SLOT_POLL_SECONDS = 1.0
SLOT_LEASE_SECONDS = 60.0


def runtime() -> tuple[Settings, Registry]:
    settings = load_settings()
    return settings, open_registry(settings.registry_url)


def ensure_download_limit(settings: Settings) -> None:
    """Create or resize the global concurrency limit that caps downloads (unless unlimited)."""
    if not settings.downloads_limited:
        return
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(DOWNLOAD_LIMIT_NAME)
        except ObjectNotFound:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                name=DOWNLOAD_LIMIT_NAME, limit=settings.max_concurrent_downloads, active=True))
            return
        if limit.limit != settings.max_concurrent_downloads or not limit.active:
            client.update_global_concurrency_limit(DOWNLOAD_LIMIT_NAME, GlobalConcurrencyLimitUpdate(
                limit=settings.max_concurrent_downloads, active=True))


def slots_in_use() -> tuple[int, int]:
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(DOWNLOAD_LIMIT_NAME)
        return limit.active_slots, limit.limit


class _SlotTimeoutFilter(logging.Filter):
    """Prefect logs each timed-out slot acquisition as an error; for us a timeout is a poll, not a failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith("Service 'ConcurrencySlotAcquisitionWithLeaseService' failed")
                    and "TimeoutError" in record.getMessage())


logging.getLogger("prefect._internal.concurrency").addFilter(_SlotTimeoutFilter())


@contextmanager
def download_slot(settings: Settings, on_wait: Callable[[int, int], None]) -> Iterator[None]:
    """Hold one download slot (strict: the limit must exist); call `on_wait(in_use, limit)` while waiting."""
    if not settings.downloads_limited:
        yield
        return
    while True:
        stack = ExitStack()
        try:
            stack.enter_context(concurrency(DOWNLOAD_LIMIT_NAME, occupy=1, timeout_seconds=SLOT_POLL_SECONDS,
                                            strict=True, lease_duration=SLOT_LEASE_SECONDS))
        except TimeoutError:
            on_wait(*slots_in_use())
            continue
        with stack:
            yield
        return


def _load_secret(block: str, what: str):
    from prefect.blocks.system import Secret

    try:
        return Secret.load(block).get()
    except (ValueError, ObjectNotFound) as e:
        raise DownloadError(f"cannot load {what} block {block!r}: {e}; create it with "
                            f"`prefect block create secret` or the Prefect UI", permanent=True) from None


def load_token(block: str | None) -> str | None:
    """The token in a Prefect Secret block; never returned from a task or logged.

    In a Kubernetes workspace job the token comes from the namespace's Secret instead, as the
    variable that `WEIGHTKEEPER_TOKEN_ENV` names (set by the job template only for models with a token).
    """
    if not block:
        return None
    if (variable := os.environ.get("WEIGHTKEEPER_TOKEN_ENV")) and os.environ.get(variable):
        return os.environ[variable]
    return _load_secret(block, "token")


def load_s3_credentials(block: str | None) -> dict | None:
    """S3 credentials from a Prefect Secret block holding a JSON object; None: boto3's own chain."""
    if not block:
        return None
    value = _load_secret(block, "S3 credentials")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise DownloadError(f"S3 credentials block {block!r} must hold a JSON object with aws_access_key_id and "
                            "aws_secret_access_key", permanent=True)
    return value
