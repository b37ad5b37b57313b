"""What a task needs at run time: settings, the registry, the download limit, the token."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.exceptions import ObjectNotFound
from prefect.runtime import task_run
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from weightkeeper.config import DOWNLOAD_LIMIT_NAME, Settings, load_settings
from weightkeeper.errors import DownloadError
from weightkeeper.registry import Registry, open_registry

SLOT_POLL_SECONDS = 1.0
SLOT_LEASE_SECONDS = 60.0

logger = logging.getLogger("weightkeeper.runtime")


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


def _acquire_slot(client, on_wait: Callable[[int, int], None]) -> UUID:
    """One slot of the download limit under a lease; waits (calling `on_wait`) while all are taken."""
    holder = ConcurrencyLeaseHolder(type="task_run", id=task_run.id) if task_run.id else None
    while True:
        try:
            # no client-side backoff (2 to 32 s): a 503 (the SQLite of the server was locked) is polled like a 423
            with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
                response = client.increment_concurrency_slots_with_lease(
                    names=[DOWNLOAD_LIMIT_NAME], slots=1, mode="concurrency", lease_duration=SLOT_LEASE_SECONDS,
                    holder=holder)
        except httpx.HTTPStatusError as e:
            if e.response.status_code not in (423, 503):  # 423 Locked: every slot is taken
                raise
            if e.response.status_code == 423:
                on_wait(*slots_in_use())
            retry_after = float(e.response.headers.get("Retry-After") or SLOT_POLL_SECONDS)
            time.sleep(min(max(retry_after, SLOT_POLL_SECONDS / 4), SLOT_POLL_SECONDS))
            continue
        granted = response.json()
        if not granted.get("limits"):
            raise DownloadError(f"the download limit {DOWNLOAD_LIMIT_NAME!r} does not exist on the Prefect server; "
                                "`weightkeeper serve` or any ensure-model run creates it", permanent=True)
        return UUID(granted["lease_id"])


@contextmanager
def download_slot(settings: Settings, on_wait: Callable[[int, int], None]) -> Iterator[None]:
    """Hold one slot of the download limit (which must exist) while the body runs; `on_wait(in_use, limit)`
    is called while waiting. The slot is leased: renewed while held, freed by the server if this process dies."""
    if not settings.downloads_limited:
        yield
        return
    with get_client(sync_client=True) as client:
        lease_id = _acquire_slot(client, on_wait)
        released = threading.Event()

        def renew() -> None:
            while not released.wait(SLOT_LEASE_SECONDS / 4):
                try:
                    with get_client(sync_client=True) as renewer:
                        renewer.renew_concurrency_lease(lease_id, lease_duration=SLOT_LEASE_SECONDS)
                except Exception as e:  # noqa: BLE001 - the server may be restarting; the lease outlives a few misses
                    logger.warning("could not renew download slot lease %s: %s", lease_id, e)

        renewer = threading.Thread(target=renew, name="download-slot-lease", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            released.set()
            renewer.join()
            try:
                client.release_concurrency_slots_with_lease(lease_id)
            except Exception as e:  # noqa: BLE001 - the lease expires on its own
                logger.warning("could not release download slot lease %s (it expires in %.0f s): %s", lease_id,
                               SLOT_LEASE_SECONDS, e)


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
