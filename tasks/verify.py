"""Verify copies against their manifest and repair them: only damaged or missing files are fetched again; check
that each linked path's link names its recorded shared copy."""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import NamedTuple

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from weightkeeper.tasks.download import reuse_into
from weightkeeper.tasks.report import model_phase
from weightkeeper.config import Settings
from weightkeeper.download import RemoteFile, Snapshot, in_place
from weightkeeper.anchored import Dir, PathOpener, open_parent, open_path
from weightkeeper.errors import (DeadlineExceeded, DownloadCancelled, DownloadError, LinkInTheWayError, NotFoundError,
                                 NotOursError, UnsafePathError)
from weightkeeper.fsops import LEGACY, directory_size, made_here, own_copy, own_directory, path_size, shelf_problem
from weightkeeper.hubbudget import budget_message, hub_budget
from weightkeeper.layout import copy_name, link_target
from weightkeeper.lease import Held, renewed
from weightkeeper.registry import Holder, Model, Registry
from weightkeeper.registry.leases import Kind
from weightkeeper.registry.artifacts import A_DOWNLOADING, A_FAILED, A_PENDING, A_READY, A_REPAIRING
from weightkeeper.registry.common import FAILED, READY, utcnow
from weightkeeper.registry.copies import LinkedPath
from weightkeeper.runtime import fetch_in_slot
from weightkeeper.context import current
from weightkeeper.sharing import discard, mark_ready, unmark_ready
from weightkeeper.sources import fetch_model_files
from weightkeeper.space import room_problem
from weightkeeper.verify import Listed, Problem, check_sizes, hash_due, verify_copy


class Copy(NamedTuple):  # a tuple: a pass builds one per copy due
    """A copy for a pass's bulk check: its path and manifest, its id (a shared copy's, or an own copy's path id),
    and whether its content is hashed too (`files` are then `RemoteFile`s)."""

    path: str
    files: tuple[Listed, ...] | tuple[RemoteFile, ...]
    id: int
    artifact: bool = False
    deep: bool = False
    made: str | None = None  # the copy's recorded identity: another directory there is not it


def _replaced(d: Dir, path: str, made: str | None) -> list[Problem]:
    """A copy whose directory is not the one weightkeeper made (someone put another there): one problem."""
    if made_here(d, made):
        return []
    return [Problem(path, "replaced: not the directory weightkeeper made there (left in place)")]


def _unshut(path: str, settings: Settings) -> list[Problem]:
    """A shared copy whose directories someone else may write (`fsops.shelf_problem`): one problem (checked with
    each full hash; its repair refuses such a shelf and fails the copy's models, naming it)."""
    problem = shelf_problem(path, settings.volume_rules)
    return [Problem(path, problem)] if problem else []


@task(name="check-copies", cache_policy=NO_CACHE)  # pass the list quote()d: Prefect then leaves it unwalked
def check_copies(copies: list[Copy]) -> dict[str, str]:
    """A pass's bulk check, in one task: each copy opened from its volume root as `open_path` opens it (a parent
    once for its children), no link followed; each file present, regular and of its size (a stat), and hashed
    when the copy is `deep`; a directory weightkeeper did not make there (`made`) is not the copy. Records when
    each copy that passed was checked (and verified); returns the first problem of each that did not, by path (its
    own task repairs it). A shared copy recorded before identities were kept (`legacy`) gets the identity of the
    directory that passed a full hash."""
    settings, registry = current()
    damaged: dict[str, str] = {}
    found: dict[int, str] = {}
    with PathOpener(settings.volume_rules) as opener, ThreadPoolExecutor(max(1, settings.verify_workers)) as pool:
        for copy in sorted(copies, key=lambda c: c.path):
            try:
                with opener.open(copy.path, copy.artifact) as d:
                    problems = _replaced(d, copy.path, copy.made) or (
                        copy.artifact and copy.deep and _unshut(copy.path, settings)) or (
                        verify_copy(d, copy.files, deep=True, pool=pool) if copy.deep else check_sizes(d, copy.files))
                    if copy.artifact and copy.deep and copy.made == LEGACY and not problems:
                        found[copy.id] = d.identity()
            except (FileNotFoundError, UnsafePathError):
                problems = [Problem(copy.path, "missing (the directory is gone or a link stands in its way)")]
            except OSError as e:  # its own task meets it again and says so
                problems = [Problem(copy.path, f"cannot be opened: {e.strerror or e}")]
            if problems:
                damaged[copy.path] = str(problems[0])
    for deep in (False, True):
        passed = [c for c in copies if c.deep == deep and c.path not in damaged]
        registry.mark_checked([c.id for c in passed if not c.artifact], [c.id for c in passed if c.artifact], deep)
    for artifact_id, made in found.items():  # once per copy, after the upgrade
        registry.set_artifact_made(artifact_id, None, made)
    return damaged


@contextmanager
def _opened(path: str, settings: Settings, artifact: bool = False) -> Iterator[Dir | None]:
    """The copy at `path`, walked from its volume root; None when it is missing or a link is in the way."""
    try:
        d = open_path(path, settings.volume_rules, artifact=artifact)
    except (FileNotFoundError, UnsafePathError):
        yield None
        return
    with d:
        yield d


def _check(d: Dir | None, files: tuple[RemoteFile, ...], deep: bool, settings: Settings) -> list[Problem]:
    if d is None:
        return [Problem(f.path, "missing (the directory is gone or a link stands in its way)") for f in files]
    return verify_copy(d, files, deep=deep, workers=settings.verify_workers)


class Waits(DownloadError):
    """A repair the volume or the clock stops for now (no room, its download time over): no fault of the copy nor
    of where its files come from, but every user's concern; the next pass tries again."""


Beat = Callable[..., None]  # beat(done=None, message=None, force=False), as `tasks.download.Reporter.beat`


def _beats(held: Held, stopped: str, say: Callable[[str], None]) -> Beat:
    """A repair's progress callback, for its fetch and its waits (a download slot, the Hub budget): raises
    DownloadCancelled (`stopped`) once `held` stops (a deletion, another run's takeover); says a wait's message."""

    def beat(done: int | None = None, message: str | None = None, force: bool = False) -> None:
        if held.stopped:
            raise DownloadCancelled(stopped)
        if message is not None and force:
            say(message)

    return beat


def _refetch(settings: Settings, registry: Registry, snapshot: Snapshot, root: Dir, model: Model,
             problems: list[Problem], beat: Beat, workspace: str, cluster: str) -> None:
    """Drop the damaged entries, take those that verified copies on the volume hold, and fetch the others again
    from where `model` gets its files (the rest of the copy is left alone), as a download fetches: only when they
    fit on the volume, its requests taken from the Hub budget, in a download slot, within the download deadline."""
    for problem in problems:
        discard(root, problem.path)
    missing = [f.path for f in snapshot.files if not in_place(root, f)]
    if missing and reuse_into(settings, registry, model, snapshot, root, missing, workspace, cluster) and all(
            in_place(root, f) for f in snapshot.files):
        return
    _check_room(settings, root, snapshot.files)
    repairing = f"repairing {root}"
    budget = hub_budget(settings, registry, lambda seconds: beat(
        message=repairing if seconds is None else budget_message(seconds), force=True))

    def fetch(deadline: float) -> None:  # in a download slot (again after a long wait for the Hub request budget)
        beat(message=repairing, force=True)
        _fetch_again(settings, model, snapshot, root, beat, budget, deadline)

    fetch_in_slot(settings, budget, beat, fetch)


def _check_room(settings: Settings, d: Dir, files: Iterable[RemoteFile]) -> None:
    """`Waits` when the files missing in `d` do not fit on its volume (a shared copy names no model)."""
    if problem := room_problem(d, files, settings.free_space_margin_bytes):
        raise Waits(f"no space to fetch its files again: it {problem}; free space on the volume (or lower "
                    "free_space_margin_bytes)")


def _fetch_again(settings: Settings, model: Model, snapshot: Snapshot, root: Dir, beat: Beat, budget,
                 deadline: float) -> None:
    """Fetch the files not in place from where `model` gets them, by `deadline` (past it: `Waits`)."""
    try:
        fetch_model_files(settings, model.source, model.staging_uri, model.token_block, snapshot, root, beat,
                          deadline, budget, lambda d, files: _check_room(settings, d, files))
    except DeadlineExceeded:
        raise Waits(f"fetching its files again took longer than download_timeout_seconds = "
                    f"{settings.download_timeout_seconds}; the partial files are kept (raise it for a slow source)") \
            from None


def _refetch_hashed(settings: Settings, registry: Registry, snapshot: Snapshot, root: Dir, model: Model,
                    problems: list[Problem], beat: Beat, workspace: str, cluster: str) -> list[Problem]:
    """`_refetch`, then hash the whole copy (a size check misses changed bytes) and refetch what the hash finds,
    once: the problems a last hash still finds (none: every file was hashed)."""
    for _ in range(2):
        _refetch(settings, registry, snapshot, root, model, problems, beat, workspace, cluster)
        if not (problems := verify_copy(root, snapshot.files, deep=True, workers=settings.verify_workers)):
            break
    return problems


def _workspace_of(settings: Settings, artifact) -> str:
    """The first workspace (in config order) on the shared copy's volume: the one its bytes count in."""
    return next((w.name for w in settings.workspaces if w.cluster == artifact.cluster and w.volume == artifact.volume),
                "")


@task(name="verify-shared-copy")
def verify_shared_copy(artifact_id: int) -> str:
    """Cheap check every pass, full hash when due; repair in place, failing the copy's models meanwhile."""
    logger = get_run_logger()
    settings, registry = current()
    artifact = registry.get_artifact(artifact_id)
    if artifact is None or artifact.state in (A_PENDING, A_DOWNLOADING):
        return "not downloaded"
    files = tuple(RemoteFile.from_json(f) for f in artifact.files)
    deep = hash_due(artifact.verified_at, settings.verify_interval_seconds, utcnow()) or artifact.state != A_READY
    with _opened(artifact.path, settings, artifact=True) as copy:
        problems = (copy is not None and (_replaced(copy, artifact.path, artifact.made)
                                          or deep and _unshut(artifact.path, settings))) or \
            _check(copy, files, deep, settings)
    if not problems and artifact.state == A_READY:
        if deep:
            registry.set_artifact(artifact_id, None, A_READY, "verified", verified=True)
        return "verified" if deep else "checked"
    if not artifact.users:  # nothing to repair it for: garbage collection decides its fate
        return _set_aside(settings, registry, artifact, problems) if artifact.state == A_READY else "unused"
    holder = Holder.here(f"repair/{flow_run.id or 'process'}/{artifact_id}")
    if registry.claim_artifact(artifact_id, holder, settings.lease_seconds):
        return "busy"
    with renewed(registry, Kind.ARTIFACT, artifact_id, holder, settings.lease_seconds) as held:
        return _repair_shared_copy(settings, registry, artifact, files, problems, held, logger)


def _set_aside(settings, registry: Registry, artifact, problems) -> str:
    """A Ready copy no path links to (switched away from, or a switch's), found damaged, is Ready no more: a switch to
    it then fills it again, hashing what it finds, instead of linking what it holds."""
    holder = Holder.here(f"set-aside/{flow_run.id or 'process'}/{artifact.id}")
    try:
        if registry.claim_artifact(artifact.id, holder, settings.lease_seconds):
            return "busy"
    except NotFoundError:
        return "gone"
    now = registry.get_artifact(artifact.id)
    if now.users or now.state != A_READY:  # linked meanwhile: the next pass repairs it for them
        registry.set_artifact(now.id, holder, now.state, now.message, release=True)
        return "in use"
    registry.set_artifact(now.id, holder, A_PENDING, f"damaged ({problems[0]}); no path links to it: filled again "
                                                     "before a model switches to it", release=True)
    return "damaged: set aside"


def _repair_shared_copy(settings, registry: Registry, artifact, files, problems, held: Held, logger) -> str:
    holder = held.holder
    summary = "; ".join(map(str, problems[:3])) + (f" and {len(problems) - 3} more" if len(problems) > 3 else "")
    message = f"shared copy {artifact.path} is under repair ({summary})"
    registry.set_artifact(artifact.id, holder, A_REPAIRING, message)
    touched = registry.set_users(artifact.id, FAILED, message)
    logger.warning("%s; models failed meanwhile: %s", message, ", ".join(touched) or "none")
    source = registry.get_model(artifact.users[0].model)  # the files come from where its users get them

    beat = _beats(held, f"another run took over the shared copy {artifact.path}",
                  lambda said: registry.set_artifact(artifact.id, holder, A_REPAIRING, f"{message}; {said}"))
    try:
        copy, made = own_copy(artifact.path, settings.volume_rules, artifact.made)  # never another's directory
        with copy:
            if made != artifact.made and not registry.set_artifact_made(artifact.id, holder, made):
                raise DownloadCancelled(f"another run took over the shared copy {artifact.path}")
            unmark_ready(copy)
            snapshot = Snapshot(artifact.repo_id, artifact.commit, files, artifact.path.rsplit("/", 1)[-1])
            _refetch(settings, registry, snapshot, copy, source, problems,
                     beat, _workspace_of(settings, artifact), artifact.cluster)
            remaining = verify_copy(copy, files, deep=True, workers=settings.verify_workers)
            if not remaining:
                mark_ready(copy, artifact.commit)
                size = directory_size(copy)
    except DownloadCancelled as e:
        logger.warning("repair of %s stopped: %s", artifact.path, e)
        return "taken over"
    except Waits as e:  # the copy stays under repair, every user told why
        waits = f"{message}; it waits: {e}; the next pass tries again"
        registry.set_artifact(artifact.id, holder, A_REPAIRING, waits, release=True)
        registry.set_users(artifact.id, FAILED, waits)
        logger.warning("repair of %s postponed: %s", artifact.path, e)
        return "postponed"
    except (DownloadError, UnsafePathError, OSError) as e:  # OSError: the volume's own (I/O, permissions)
        since = artifact.unreachable_since or utcnow()
        down_for = (utcnow() - since).total_seconds()
        if getattr(e, "permanent", True) or down_for >= settings.hub_unreachable_seconds:
            final = f"repair of shared copy {artifact.path} failed: {e} (for {down_for:.0f}s)"
            registry.set_artifact(artifact.id, holder, A_FAILED, final, unreachable_since=since, release=True)
            others = final if isinstance(e, (UnsafePathError, OSError)) else (  # the copy's own: anyone's concern
                f"repair of shared copy {artifact.path} failed: its files could not be fetched again from where "
                f"another user's model gets them (for {down_for:.0f}s); the next pass tries again")
            registry.set_users(artifact.id, FAILED, others, {source.owner_name: final})  # its source: its owner's
            logger.error("%s", final)
            return "failed"
        registry.set_artifact(artifact.id, holder, A_REPAIRING, f"{message}; {e}; retried on the next pass",
                              unreachable_since=since, release=True)
        logger.warning("repair of %s postponed: %s", artifact.path, e)
        return "postponed"
    if remaining:
        registry.set_artifact(artifact.id, holder, A_REPAIRING, f"{message}; still damaged: {remaining[0]}",
                              release=True)
        return "postponed"
    registry.set_artifact(artifact.id, holder, A_READY, "repaired and verified", size_bytes=size,
                          verified=True, unreachable_since=None, release=True)
    registry.set_users(artifact.id, READY, f"restored: shared copy {artifact.path} repaired")
    logger.info("shared copy %s repaired (%d file(s) fetched again)", artifact.path, len(problems))
    return "repaired"


@task(name="verify-model-path")
def verify_model_path(name: str, path_id: int) -> str:
    """The same check and repair for a model's own copy (not linked to a shared one)."""
    logger = get_run_logger()
    settings, registry = current()
    model = registry.find_model(name)
    entry = next((p for p in model.local_paths if p.id == path_id), None) if model else None
    if entry is None:
        return "gone"
    if entry.status != READY and not registry.is_checked(path_id):  # a download failed it since the pass read it
        return f"left to its owner: `weightkeeper model retry {name}`"
    files = tuple(RemoteFile.from_json(f) for f in model.files or [])
    deep = hash_due(entry.verified_at, settings.verify_interval_seconds, utcnow()) or entry.status != READY
    with _opened(entry.path, settings) as own:
        problems = (own is not None and _replaced(own, entry.path, entry.made)) or _check(own, files, deep, settings)
    if not problems:
        if not deep:
            return "checked"
        if entry.status != READY and not (restored := _restore_path(settings, registry, name, path_id, None,
                                                                    entry.path, entry.made, "verified complete")):
            if restored is None:
                return "failed"
            return "busy"  # complete and correct after all, but another run works on the path now
        registry.set_path_verified(name, path_id, READY)
        return "verified"
    holder = Holder.here(f"repair/{flow_run.id or 'process'}/{path_id}")
    if not registry.claim_download(name, path_id, holder, settings.lease_seconds).ok:
        return "busy"
    with renewed(registry, Kind.PATH, path_id, holder, settings.lease_seconds) as held:
        return _repair_model_path(settings, registry, model, entry, files, problems, held, logger)


def _repair_model_path(settings: Settings, registry: Registry, model, entry, files, problems, held: Held,
                       logger) -> str:
    name, path_id, holder = model.name, entry.id, held.holder
    message = f"{entry.path} is under repair ({problems[0]}{' and more' if len(problems) > 1 else ''})"
    registry.path_progressed(name, path_id, holder, message=message)
    registry.set_phase(name, FAILED, message)
    logger.warning("%s: %s", name, message)

    beat = _beats(held, f"model {name!r} is being deleted; repair of {entry.path} stopped",
                  lambda said: registry.path_progressed(name, path_id, holder, message=f"{message}; {said}"))
    try:
        parent, leaf = open_parent(entry.path, settings.volume_rules, create=True)
        with parent:
            own, made = own_directory(parent, leaf, entry.path, entry.made)
            with own:
                if made != entry.made and not registry.set_path_made(name, path_id, holder, made):
                    raise DownloadCancelled(f"another run took over {entry.path}")
                snapshot = Snapshot(model.repo_id, model.commit, files, copy_name(model.commit, model.include,
                                                                                  model.exclude))
                remaining = _refetch_hashed(settings, registry, snapshot, own, model, problems,
                                            beat, entry.workspace, entry.cluster)
    except DownloadCancelled as e:
        registry.repair_failed(name, path_id, holder, str(e))
        return "cancelled"
    except (DownloadError, UnsafePathError, OSError) as e:  # and the volume's own errors (I/O, permissions, no space)
        registry.repair_failed(name, path_id, holder, f"{message}; {_why(e, entry.path)}; the next pass repairs it "
                                                      "again")
        return "postponed"
    if remaining:
        registry.repair_failed(name, path_id, holder, f"{message}; still damaged: {remaining[0]}; repaired on the "
                                                      "next pass")
        return "postponed"
    if not (restored := _restore_path(settings, registry, name, path_id, holder, entry.path, made, "repaired")):
        return "failed" if restored is None else "cancelled"
    registry.set_path_verified(name, path_id, READY)
    return "repaired"


def _restore_path(settings: Settings, registry: Registry, name: str, path_id: int, holder: Holder | None, path: str,
                  made: str | None, how: str) -> bool | None:
    """Mark an own copy (`made` there) Ready with its size, and the model once `derive_phase` says it is Ready;
    False when `holder` no longer holds the path (nothing is marked); None when what stands at the path now cannot
    be measured (swapped, gone, unreadable: nothing is followed, the path is failed saying why)."""
    try:
        size = path_size(path, settings.volume_rules, made)
    except (OSError, UnsafePathError, NotOursError) as e:
        _unmeasured(registry, name, path_id, holder, f"{path} was {how}, then could not be measured: {_why(e, path)}")
        return None
    if not registry.path_downloaded(name, path_id, holder, size, f"{size} bytes ({how})"):
        return False
    phase, message = model_phase(settings, registry.get_model(name))
    if phase == READY:
        registry.set_phase(name, READY, f"restored: {path} {how}; {message}")
    return True


def _why(e: Exception, path: str) -> str:
    return f"{e.filename or path}: {e.strerror}" if isinstance(e, OSError) and e.strerror else str(e)


def _unmeasured(registry: Registry, name: str, path_id: int, holder: Holder | None, what: str) -> None:
    """Fail a path whose copy cannot be measured (left to the passes, as a failed repair is), saying what next."""
    registry.repair_failed(name, path_id, holder, f"{what}; nothing was followed: move away what stands there, "
                                                  "and the next pass checks it again")
    get_run_logger().error("%s: %s", name, what)


def _switch_targets(settings: Settings, link: LinkedPath) -> set[str]:
    """The links a switch of the path to its model's pending commit makes (`tasks.download.shared_copy_path`: the
    copy on the service's shelf, or in a Kubernetes workspace on its owner's too)."""
    ws = settings.workspace(link.workspace)
    if not link.pending or ws is None or not ws.volume:
        return set()
    copy = copy_name(link.pending, link.include, link.exclude)
    return {link_target(link.path, target) for target in ws.copy_paths(link.repo_id, copy, link.owner_uid)}


def _standing(parent: Dir, leaf: str) -> tuple[str | None, str]:
    """What stands at `leaf`: (its target when it is a link, how a message names it; "" when nothing does)."""
    st = parent.lstat(leaf)
    if st is None:
        return None, ""
    if stat.S_ISLNK(st.st_mode):
        return (target := parent.readlink(leaf)), f"a link to {target}"
    return None, "a directory" if stat.S_ISDIR(st.st_mode) else "a file" if stat.S_ISREG(st.st_mode) else \
        "a special file"


@task(name="check-links", cache_policy=NO_CACHE)  # pass the list quote()d, as `check_copies`'
def check_links(links: list[LinkedPath]) -> dict[str, str]:
    """Each live Ready linked path's link, read relative to its parent and never followed, against the link to the
    shared copy the registry records for it: `linked` when it names that copy. Otherwise, under the path's lease
    (a switch at work is left alone: `busy`), the recorded link is put back when nothing stands there or the link
    names the copy of the model's pending commit (a switch killed before the registry recorded it: the registry's
    copy is the one it keeps and counts as used, while the unrecorded one may be collected); anything else (a
    directory, a file, a link elsewhere) is left in place and fails the path, naming it."""
    settings, registry = current()
    outcomes = {}
    for link in links:
        try:
            outcomes[link.path] = _check_link(settings, registry, link)
        except NotFoundError:
            outcomes[link.path] = "gone"  # deleted meanwhile
    return outcomes


def _check_link(settings: Settings, registry: Registry, link: LinkedPath) -> str:
    recorded = link_target(link.path, link.copy)
    try:
        parent, leaf = open_parent(link.path, settings.volume_rules)
    except (LinkInTheWayError, FileNotFoundError):  # readers of the path would follow a link, or find nothing
        parent, leaf = None, ""
    except (OSError, UnsafePathError) as e:  # an I/O error, the volume left the config: checked on the next pass
        return f"unchecked: {e.strerror if isinstance(e, OSError) else e}"
    try:
        if parent is not None and parent.readlink(leaf) == recorded:
            return "linked"
        holder = Holder.here(f"link/{flow_run.id or 'process'}/{link.path_id}")
        if not registry.claim_link(link.model, link.path_id, link.artifact_id, holder, settings.lease_seconds):
            return "busy"
        outcome, message = _mend(settings, link, parent, leaf, recorded)
    finally:
        if parent is not None:
            parent.close()
    registry.link_mended(link.model, link.path_id, holder, message, failed=outcome == "failed")
    if message:
        logger = get_run_logger()
        (logger.error if outcome == "failed" else logger.warning)("%s: %s", link.model, message)
    return outcome


def _mend(settings: Settings, link: LinkedPath, parent: Dir | None, leaf: str, recorded: str) -> tuple[str, str]:
    """Under the path's lease: the recorded link put back where nothing stands or an unrecorded switch left its
    link, else what stands there (left in place): the outcome, and the path's message ("": unchanged)."""
    retry = f"`weightkeeper model retry {link.model}` links the path to {link.copy} again"
    if parent is None:
        return "failed", (f"{link.path} cannot be checked: a directory on its way is missing or a link; restore it "
                          f"(is the volume mounted?), then {retry}")
    try:
        target, what = _standing(parent, leaf)
        if target == recorded:
            return "linked", ""  # put back meanwhile
        if not what or target in _switch_targets(settings, link):
            parent.symlink(recorded, leaf)  # swapped atomically with the link there
            return "relinked", f"{link.path} links to {link.copy} again: " + (
                f"its link named {target}, the copy of {link.pending}, a switch the registry never recorded" if what
                else "its link was gone")
    except NotOursError:
        what = "something put there while its link was put back"
    except OSError as e:
        return "failed", (f"{link.path}: its link cannot be checked or put back ({e.strerror or e}): correct that, "
                          f"then {retry}")
    return "failed", (f"{link.path} is {what} where weightkeeper's link to the shared copy {link.copy} was; it is "
                      f"left in place: move it away, then {retry}")
