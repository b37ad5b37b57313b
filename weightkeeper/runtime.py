"""What a task needs at run time: settings, the registry, the download limit, the token."""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import httpx
import prefect.context
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.exceptions import ObjectNotFound
from prefect.runtime import task_run
from prefect.settings.legacy import Setting

from weightkeeper.config import DOWNLOAD_LIMIT_NAME, Settings, load_settings
from weightkeeper.errors import DownloadError
from weightkeeper.registry import Registry, open_registry

SLOT_POLL_SECONDS = 1.0
SLOT_LEASE_SECONDS = 60.0
RELEASE_SECONDS = 5.0
LOCKED_DB_RETRY_SECONDS = 0.05

logger = logging.getLogger("weightkeeper.runtime")
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


def _post(client, path: str, body: dict) -> httpx.Response:
    """POST through the Prefect client, retrying no status. Its own loop backs a 503 (the server's SQLite
    was locked) off by 2 to 32 s, and in Prefect 3.9 sleeps even after its last attempt; slot requests
    poll instead. (`_send_with_retry` keeps the client's CSRF handling; Prefect is pinned to 3.9.)"""
    http = client._client
    return http._send_with_retry(request=http.build_request("POST", path, json=body),
                                 send=functools.partial(httpx.Client.send, http), send_args=(), send_kwargs={})


def _acquire_slot(client, on_wait: Callable[[int, int], None]) -> UUID:
    """One slot of the download limit under a lease; waits (calling `on_wait`) while all are taken."""
    body = {"names": [DOWNLOAD_LIMIT_NAME], "slots": 1, "mode": "concurrency", "lease_duration": SLOT_LEASE_SECONDS}
    if task_run.id:
        body["holder"] = ConcurrencyLeaseHolder(type="task_run", id=task_run.id).model_dump(mode="json")
    busy, busy_since = LOCKED_DB_RETRY_SECONDS, None
    while True:
        response = _post(client, "/v2/concurrency_limits/increment-with-lease", body)
        if response.status_code == 423:  # Locked: every slot is taken
            busy, busy_since = LOCKED_DB_RETRY_SECONDS, None
            on_wait(*slots_in_use())
            retry_after = float(response.headers.get("Retry-After") or SLOT_POLL_SECONDS)
            time.sleep(min(max(retry_after, SLOT_POLL_SECONDS / 4), SLOT_POLL_SECONDS))
            continue
        busy_since = busy_since or time.monotonic()
        if response.status_code == 503 and time.monotonic() - busy_since < SLOT_LEASE_SECONDS:
            time.sleep(busy)  # the server's database was busy for a moment
            busy = min(2 * busy, SLOT_POLL_SECONDS)
            continue
        response.raise_for_status()  # an unavailable server fails the attempt: the task's retries take over
        granted = response.json()
        if not granted.get("limits"):
            raise DownloadError(f"the download limit {DOWNLOAD_LIMIT_NAME!r} does not exist on the Prefect server; "
                                "`weightkeeper serve` or any ensure-model run creates it", permanent=True)
        return UUID(granted["lease_id"])


def _release_slot(client, lease_id: UUID) -> None:
    """Free the slot now; a 503 or a dropped connection is tried again for a few seconds, then the lease
    expires on its own."""
    deadline, busy = time.monotonic() + RELEASE_SECONDS, LOCKED_DB_RETRY_SECONDS
    while True:
        try:
            response = _post(client, "/v2/concurrency_limits/decrement-with-lease", {"lease_id": str(lease_id)})
            if response.status_code != 503:
                response.raise_for_status()
                return
            problem: object = "the server's database stayed busy"
        except httpx.TransportError as e:
            problem = e
        except Exception as e:  # noqa: BLE001 - the lease expires on its own
            problem, deadline = e, 0.0
        if time.monotonic() > deadline:
            logger.warning("could not release download slot lease %s (it expires in %.0f s): %s", lease_id,
                           SLOT_LEASE_SECONDS, problem)
            return
        time.sleep(busy)
        busy = min(2 * busy, SLOT_POLL_SECONDS)


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
            _release_slot(client, lease_id)


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
    variable that `WEIGHTKEEPER_TOKEN_ENV` names (set by the job template of a workspace with a token Secret).
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
