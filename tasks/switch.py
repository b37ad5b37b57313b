"""A Ready model that changes commit: ask the head, switch each path's link to the new copy, record the switch."""

from __future__ import annotations

import stat

from prefect import get_run_logger, task
from prefect.states import Cancelled

from weightkeeper.anchored import open_parent
from weightkeeper.context import current
from weightkeeper.download import RemoteFile, Snapshot
from weightkeeper.errors import ConflictError, DownloadCancelled, DownloadError, NotFoundError, UnsafePathError
from weightkeeper.events import emit_updated
from weightkeeper.fsops import LINK
from weightkeeper.layout import HfSource, copy_name
from weightkeeper.lease import renewed
from weightkeeper.planning import capacity_problem, changed_bytes
from weightkeeper.registry import Model
from weightkeeper.registry.common import READY
from weightkeeper.registry.copies import LinkedPath
from weightkeeper.registry.leases import Kind
from weightkeeper.sources import check_access, resolve
from weightkeeper.tasks.download import Reporter, _entry, link_shared_copy, path_holder
from weightkeeper.tasks.snapshot import budget_wait, job_token_not_its_own, retry_transient
from weightkeeper.tasks.verify import _check_link, _switch_targets


def pending(model: Model) -> Snapshot | None:
    """The commit a Ready model is switching to, with its files (None: none)."""
    if model.pending_commit and model.pending_files is not None:
        return Snapshot(model.repo_id, model.pending_commit,
                        tuple(RemoteFile.from_json(f) for f in model.pending_files),
                        copy_name(model.pending_commit, model.include, model.exclude))
    return None


def _held(settings, registry, model: Model, snapshot: Snapshot) -> str | None:
    """Why the switch must wait: a workspace whose capacity the new commit's changed files would pass, counting the
    changed files of other models' switches recorded there whose copies are not made yet."""
    adding = changed_bytes(model.files or [], [f.to_json() for f in snapshot.files])
    usage = None
    for ws in {p.workspace for p in model.local_paths if not p.retired}:
        capacity = (w := settings.workspace(ws)) and w.capacity_bytes
        if capacity is None:
            continue
        usage = usage or registry.workspace_usage(settings.workspaces)
        coming = registry.switches_coming(model.name, w)
        if problem := capacity_problem(ws, capacity, usage[ws]["storedBytes"] + coming, adding):
            problem += f" (its stored bytes count the {coming} that other models' recorded switches add)" \
                if coming else ""
            return f"update to {snapshot.commit} held: {problem}; it stays on {model.commit}"
    return None


def _mend_links(settings, registry, model: Model) -> None:
    """Before a check replaces or drops the pending commit: a path a killed switch left linking to that commit's
    copy (renamed, never recorded) gets its recorded link back, as reconcile's `check-links` does; once the
    commit is no longer pending, that link could not be told from one someone else put there. Such a link that
    cannot be put back now (its path busy: the killed switch's lease has not lapsed; or unreadable) is raised
    (`ConflictError`), so the commit stays pending until it is. Any other link is left to the switch and to
    `check-links`."""
    if not model.pending_commit:
        return
    for link in registry.linked_paths(model.name):
        try:
            if _names_pending(settings, link) and (outcome := _check_link(settings, registry, link)) not in (
                    "relinked", "linked", "failed"):
                why = "its path is busy: a killed switch's lease lapses after lease_seconds" if outcome == "busy" \
                    else outcome
                raise ConflictError(f"{link.path} links to the copy of {model.pending_commit}, a switch never "
                                    f"recorded, and cannot be linked back now ({why}); the next check does it first",
                                    "LinkNotBack")
        except NotFoundError:
            return  # deleted meanwhile


def _names_pending(settings, link: LinkedPath) -> bool:
    """The path's link, read from its parent and never followed, names the pending commit's copy."""
    try:
        parent, leaf = open_parent(link.path, settings.volume_rules)
    except (OSError, UnsafePathError):
        return False
    with parent:
        return parent.readlink(leaf) in _switch_targets(settings, link)


def _refused(settings, registry, model: Model, snapshot: Snapshot) -> str | None:
    """Why the switch must wait: the new commit's files would be fetched with the namespace's token (a Kubernetes
    job's), and the model's own token block may not read them (one request; network trouble is raised, retried)."""
    if not job_token_not_its_own(settings, model):
        return None
    try:
        check_access(settings, registry, model.source, model.token_block, snapshot, budget_wait(registry, model))
    except DownloadError as e:
        if not e.permanent:
            raise
        return f"update to {snapshot.commit} held: {e}; it stays on {model.commit}"
    return None


@task(name="check-head", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_transient)
def check_head(name: str) -> bool:
    """Ask which commit the model's revision (or the one `model update --revision` asked for) points at now, from
    the Hub request budget; record it as pending when it moved and fits. True when a switch is pending."""
    logger = get_run_logger()
    settings, registry = current()
    model = registry.get_model(name)
    revision = model.next_revision or model.revision
    _mend_links(settings, registry, model)
    try:
        snapshot = resolve(settings, registry, HfSource(model.repo_id, revision), model.token_block, model.include,
                           model.exclude, budget_wait(registry, model))
    except DownloadError as e:
        if e.permanent:
            logger.error("%s: cannot check %s: %s; it stays on %s", name, revision, e, model.commit)
            return registry.head_checked(name, None, [], held=f"cannot check {revision}: {e}; it stays on "
                                                              f"{model.commit}", asked=revision, permanent=True)
        raise
    if snapshot.commit == model.commit:
        logger.info("%s: %s is still at %s", name, revision, snapshot.commit)
        return registry.head_checked(name, snapshot.commit, [], asked=revision)
    held = _refused(settings, registry, model, snapshot) or _held(settings, registry, model, snapshot)
    logger.info("%s: %s moved from %s to %s%s", name, revision, model.commit, snapshot.commit,
                f"; {held}" if held else "; downloading it beside the current one")
    return registry.head_checked(name, snapshot.commit, [f.to_json() for f in snapshot.files], held, asked=revision)


def hold_switch(model: Model, asked: str) -> bool:
    """A model no check comes to by itself, whose pending commit (the answer for `asked`) some paths did not reach:
    links its switch renamed and did not record are put back (`_mend_links`), then the commit is held
    (`head_checked`, with the model's message): True when paths that did switch go back. A link not put back keeps
    it pending, as a check that fails for now does (reconcile at the model's next turn, `model ensure` or
    `model update` tries again)."""
    _, registry = current()
    try:
        _mend_links(*current(), model)
    except ConflictError as e:  # said once, however often `model ensure` finds it so
        held = model.message if str(e) in model.message else f"{model.message}; {e}"
        return registry.head_checked(model.name, None, [], held=held, asked=asked)
    return registry.head_checked(model.name, model.pending_commit, model.pending_files or [], held=model.message,
                                 asked=asked)


@task(name="switch-path", retries=2, retry_delay_seconds=[10, 30], retry_condition_fn=retry_transient)
def switch_path(name: str, path_id: int, snapshot: Snapshot):
    """Download the pending commit's shared copy beside the path's current one, verify it, then point the path's
    link at it (a rename: readers see one commit or the other). A failure leaves the path on its commit."""
    logger = get_run_logger()
    settings, registry = current()
    try:
        entry = _entry(registry, name, path_id)
    except (NotFoundError, StopIteration):
        return Cancelled(message=f"model {name!r} or its path #{path_id} is gone")
    holder = path_holder(path_id)
    claim = registry.claim_switch(name, path_id, holder, settings.lease_seconds, snapshot.commit)
    if claim == "settled":  # nothing to switch here: no download, no new link
        logger.info("%s: %s has nothing to switch", name, entry.path)
        return entry.path
    if claim != "claimed":
        return Cancelled(message=f"{entry.path} not switched: {claim}")
    model = registry.get_model(name)
    failed: str | None = f"switch of {entry.path} to {snapshot.commit} interrupted"
    try:
        with renewed(registry, Kind.PATH, path_id, holder, settings.lease_seconds) as held:
            parent, leaf = open_parent(entry.path, settings.volume_rules)
            with parent:
                st = parent.lstat(leaf)
                if entry.made != LINK:
                    raise DownloadError(f"{entry.path} is the model's own copy, not a link to a shared one, so it "
                                        "cannot switch in place; declare a new model for the new revision",
                                        permanent=True)
                if st is None or not stat.S_ISLNK(st.st_mode):  # someone replaced the link weightkeeper put there
                    raise DownloadError(f"{entry.path} is not a link: it is left alone, and not switched; move what "
                                        f"stands there away, if anything, and ensure {name!r} again", permanent=True)
                reporter = Reporter(registry, name, entry, held, snapshot.total_bytes, status=READY)
                link_shared_copy(settings, registry, model, entry, holder, parent, leaf, snapshot, reporter,
                                 switch=True)
        failed = None
        logger.info("%s: %s now links to the copy of %s", name, entry.path, snapshot.commit)
        return entry.path
    except DownloadCancelled as e:
        logger.warning("%s", e)
        return Cancelled(message=str(e))
    except DownloadError as e:
        failed = _failed(model, entry.path, snapshot.commit, e, _on(registry, entry.artifact_id))
        logger.error("%s: %s", name, failed)
        raise
    except (OSError, UnsafePathError) as e:
        failed = _failed(model, entry.path, snapshot.commit, getattr(e, "strerror", None) or e,
                         _on(registry, entry.artifact_id))
        raise DownloadError(failed, permanent=True) from None
    finally:
        registry.end_switch(name, path_id, holder, failed)


def _on(registry, artifact_id: int | None) -> str | None:
    """The commit of the shared copy a path is recorded on (None: unknown)."""
    copy = artifact_id and registry.get_artifact(artifact_id)
    return copy.commit if copy else None


def _failed(model: Model, path: str, commit: str, why, on: str | None = None) -> str:
    """What a path whose switch to `commit` failed says: it keeps the copy it links to (of commit `on`, when known:
    an earlier switch may have left it on another than the model's)."""
    if commit == model.commit:  # back to the model's commit (`head_checked`): the path is on another
        return f"switch of {path} back to {commit} failed: {why}; it stays on another commit until the next check"
    return f"update to {commit} failed: {why}; {path} stays on {on or model.commit}"


@task(name="finish-switch")
def finish_switch(name: str) -> str:
    """Record the new commit once every path switched, and emit `weightkeeper.model.updated`."""
    _, registry = current()
    switched = registry.model_switched(name)
    model = registry.get_model(name)
    if switched:
        emit_updated(name, *switched)
        get_run_logger().info("%s: switched from %s to %s", name, *switched)
    return model.commit or ""
