"""Stage a model's snapshot to S3 once, so that every workspace is filled from there."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from prefect import get_run_logger, task
from prefect.runtime import flow_run, task_run
from prefect.states import Cancelled

from weightkeeper.tasks.snapshot import retry_transient
from weightkeeper.anchored import Dir, open_under, remove_under
from weightkeeper.sharing import discard
from weightkeeper.download import RemoteFile, Snapshot, fetch_file
from weightkeeper.hub import hub_transfer
from weightkeeper.hubbudget import budget_message, hub_budget
from weightkeeper.errors import DownloadCancelled, DownloadError
from weightkeeper.layout import HfSource, staging_uri
from weightkeeper.lease import renewed
from weightkeeper.registry import Holder
from weightkeeper.registry.leases import Kind
from weightkeeper.registry.common import DOWNLOADING, FAILED, PENDING
from weightkeeper.credentials import load_token
from weightkeeper.runtime import fetch_in_slot
from weightkeeper.context import current
from weightkeeper.s3 import stage_snapshot
from weightkeeper.sources import check_access, pace, s3_client

SCRATCH = "staging"  # below weightkeeper's home: this host's files on their way to S3, by model and snapshot
WAIT_POLL_SECONDS = 2.0
PROGRESS_SECONDS = 2.0


@task(name="stage-to-s3", retries=2, retry_delay_seconds=[10, 30], retry_condition_fn=retry_transient)
def stage_to_s3(name: str, snapshot: Snapshot) -> str:
    """Upload the snapshot to `s3://<bucket>/<prefix>/<owner>--<name>/<commit>/`, multipart and in parallel.

    Objects already there with the right size and digest are skipped (another model may have staged them:
    the model's token is then proven on the Hub first, one request), and each file comes from the
    Hub through a resumable `.part` file, so an interrupted staging run loses little. The staging
    lease on the model lets `delete-model` wait for this run; a deletion stops it at its next beat.
    """
    logger = get_run_logger()
    settings, registry = current()
    model = registry.get_model(name)
    uri = staging_uri(settings.s3.bucket, settings.s3.prefix, snapshot.repo_id, snapshot.copy)
    holder = Holder.here(f"stage/{flow_run.id or 'local'}")
    while not (claim := registry.claim_staging(name, uri, holder, settings.lease_seconds)).ok:
        if claim.outcome == "deleting":
            return Cancelled(message=f"model {name!r} is being deleted; staging to {uri} not started")
        waiting = f"deleted {claim.who}" if claim.outcome == "wait" else f"run {claim.other}"
        registry.set_message(name, f"Waiting for {waiting} to finish with {uri}")
        time.sleep(WAIT_POLL_SECONDS)
    last, stopped = [0.0], threading.Event()

    def beat(done: int | None = None, message: str | None = None, force: bool = False) -> None:
        """Record progress (at most every PROGRESS_SECONDS); once the model is deleting, every thread stops."""
        if held.stopped:
            stopped.set()
        if not stopped.is_set() and (message or done is not None) and \
                (force or time.monotonic() - last[0] >= PROGRESS_SECONDS):
            last[0] = time.monotonic()
            if done is not None:
                message = f"staging to {uri}: {done} of {snapshot.total_bytes} bytes"
            if not registry.staging_progressed(name, holder, message):
                stopped.set()
        if stopped.is_set():
            why = "its lease could not be renewed (the registry is unreachable?)" if held.lapsing else \
                f"model {name!r} is being deleted"
            raise DownloadCancelled(f"{why}; staging to {uri} stopped")

    deadline = float("inf")  # set once a download slot is held: waiting for one is no download time

    def fetch_one(remote: RemoteFile, poll: Callable[[], None]) -> tuple[BinaryIO, Callable[[], None]]:
        """The file, fetched and verified into this host's scratch space, open; and how to remove it. `poll()` raises
        once the staging stopped (another file's upload failed, too slowly or too late)."""
        if time.monotonic() > deadline:
            raise DownloadError(f"staging {name!r} to {uri} exceeded its timeout; `weightkeeper model ensure` "
                                "resumes it", permanent=True)

        def fetched(_n: int) -> None:
            beat()
            poll()

        fetch_file(workdir, remote, transfer, fetched, f"{model.repo_id}@{snapshot.commit[:12]}", deadline,
                   pace(settings))
        folder, _, leaf = remote.path.rpartition("/")
        with workdir.descend(folder) as d:
            return os.fdopen(d.open(leaf, os.O_RDONLY), "rb"), lambda: discard(workdir, remote.path)

    workdir: Dir | None = None
    try:
        with open_under(settings.home, f"{SCRATCH}/{name}", create=True) as scratch:
            for other in set(scratch.entries()) - {snapshot.copy}:  # an earlier snapshot's files: never this one's
                scratch.remove(other)
            workdir = scratch.descend(snapshot.copy, create=True)
        with renewed(registry, Kind.STAGING, model.id, holder, settings.lease_seconds) as held:
            budget = hub_budget(settings, registry, lambda seconds: seconds is not None and beat(
                message=budget_message(seconds), force=True))
            transfer = hub_transfer(HfSource(model.repo_id, snapshot.commit), snapshot.commit, settings.hf_endpoint,
                                    load_token(model.token_block), settings.hub_redirect_hosts, budget)

            counts = {"bytes": 0, "uploaded": 0, "skipped": 0}  # kept across the reruns of `held`

            def stage(by: float) -> tuple[int, int]:  # in a download slot (again after a long wait for the budget)
                nonlocal deadline
                deadline, before = by, counts["uploaded"]
                counts.update(bytes=0, skipped=0)
                stage_snapshot(s3_client(settings), uri, snapshot, fetch_one, beat, counts, deadline, pace(settings),
                               f"staging {name!r} to {uri}")  # each upload, as each fetch: deadline and pace
                return counts["uploaded"], counts["skipped"] - before  # skipped: those another model staged

            uploaded, skipped = fetch_in_slot(settings, budget, beat, stage, f" to stage to {uri}")
            if skipped:  # another model staged them: its token proved nothing for this one
                check_access(settings, registry, model.source, model.token_block, snapshot)
    except DownloadCancelled as e:
        logger.warning("%s", e)
        return Cancelled(message=str(e))
    except DownloadError as e:
        last_try = e.permanent or task_run.run_count > stage_to_s3.retries
        registry.set_phase(name, FAILED if last_try else PENDING,
                           f"staging to {uri} failed: {e}" + ("" if last_try else " (retrying)"))
        logger.error("%s: staging to %s failed: %s", name, uri, e)
        raise
    finally:
        if workdir is not None:
            workdir.close()
        registry.release_staging(name, holder)
    remove_under(settings.home, f"{SCRATCH}/{name}")
    registry.set_phase(name, DOWNLOADING, f"staged to {uri} ({uploaded} uploaded, {skipped} already there); "
                                          "filling the workspaces from it")
    logger.info("%s: staged %d files to %s (%d uploaded, %d already there)", name, len(snapshot.files), uri,
                uploaded, skipped)
    return uri
