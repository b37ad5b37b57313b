"""Where a model's bytes come from: the Hub directly, or S3 (its staged copy, or an s3:// source)."""

from __future__ import annotations

from collections.abc import Callable

from weightkeeper.anchored import Dir
from weightkeeper.config import Settings
from weightkeeper.download import Limits, RoomCheck, Snapshot
from weightkeeper.hub import check_access as hub_check
from weightkeeper.hub import fetch_snapshot, resolve_snapshot
from weightkeeper.hubbudget import UNMETERED, HubBudget, hub_budget
from weightkeeper.errors import DownloadError
from weightkeeper.layout import HfSource, S3Source, parse_source
from weightkeeper.credentials import load_s3_credentials, load_token
from weightkeeper.s3 import fill_from_s3, list_source, make_client
from weightkeeper.watchdog import Pace


def limits(settings: Settings) -> Limits:
    return Limits(settings.max_file_bytes, settings.max_manifest_files)


def pace(settings: Settings) -> Pace:
    return Pace(settings.min_download_bytes_per_second, settings.stall_seconds)


def s3_client(settings: Settings):
    """The S3 client of the `[s3]` settings, with credentials from its block or the environment."""
    if settings.s3 is None:
        raise DownloadError("S3 is not configured: add an [s3] table (bucket, prefix, endpoint_url) to "
                            f"{settings.config_path or 'the config'}", permanent=True)
    return make_client(settings.s3, load_s3_credentials(settings.s3.credentials_block))


def s3_uri(settings: Settings, source: str, staging_uri: str | None, copy: str) -> str | None:
    """The S3 prefix to fill the copy named `copy` from: an s3:// source always; a staged copy only while staging is
    enabled, and only the one of that copy (a model switching commit has the old commit's staged)."""
    if isinstance(parse_source(source), S3Source):
        return staging_uri or source
    return staging_uri if settings.staging and staging_uri and staging_uri.endswith(f"/{copy}/") else None


def resolve(settings: Settings, registry, source: HfSource | S3Source, token_block: str | None,
            include: list[str] | None, exclude: list[str] | None,
            on_wait: Callable[[float | None], None] = lambda seconds: None) -> Snapshot:
    """The commit and the files to fetch of a source: an S3 prefix listed, a Hub revision resolved (its request
    taken from the Hub budget shared through `registry`, `on_wait` told while it waits)."""
    if isinstance(source, S3Source):
        return list_source(s3_client(settings), source, limits(settings), include, exclude)
    return resolve_snapshot(source, settings.hf_endpoint, load_token(token_block), limits(settings),
                            hub_budget(settings, registry, on_wait), include, exclude, settings.hub_redirect_hosts)


def check_access(settings: Settings, registry, source: str, token_block: str | None, snapshot: Snapshot,
                 on_wait: Callable[[float | None], None] = lambda seconds: None) -> None:
    """Before files another model fetched are given to this one: prove that its token may read them from the Hub
    (one request, for its largest file: a weight, never a model card a gated repository may show). An s3:// source
    needs none: the API lets each user name only their own prefixes."""
    if isinstance(parse_source(source), S3Source) or not snapshot.files:
        return
    largest = max(snapshot.files, key=lambda f: f.size)
    hub_check(HfSource(snapshot.repo_id, snapshot.commit), largest.path, settings.hf_endpoint, load_token(token_block),
              hub_budget(settings, registry, on_wait))


def fetch_model_files(settings: Settings, source: str, staging_uri: str | None, token_block: str | None,
                      snapshot: Snapshot, target: Dir, on_progress: Callable[[int], None], deadline: float,
                      budget: HubBudget = UNMETERED, room: RoomCheck | None = None) -> int:
    """Fetch the snapshot's missing files into `target` from S3 when the model has it there, else the Hub
    (its requests taken from `budget`); `room`: as `weightkeeper.download.fetch_files`."""
    if uri := s3_uri(settings, source, staging_uri, snapshot.copy):
        return fill_from_s3(s3_client(settings), uri, snapshot, target, on_progress, deadline, pace(settings), room)
    return fetch_snapshot(HfSource(snapshot.repo_id, snapshot.commit), snapshot, target, settings.hf_endpoint,
                          load_token(token_block), on_progress, deadline, pace(settings), settings.hub_redirect_hosts,
                          budget, room)
