"""Registry reads and writes of a reconcile pass's checks: every own copy's check times in one query, the
manifests of the copies due in one more, and what a pass found in one statement per 500 copies; every linked
path's recorded copy in one query, and what its link check did."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import and_, or_, select, update

from weightkeeper.registry.common import DELETING, FAILED, READY, Holder, _utc, scrub_message, utcnow
from weightkeeper.registry.leases import Kind, held_by
from weightkeeper.registry.schema import ArtifactRow, LocalPathRow, ModelRow

CHUNK = 500  # ids per IN (...): well under SQLite's and PostgreSQL's limits on bound parameters


class OwnCopy(NamedTuple):  # a tuple: a pass reads one per copy
    """A model's own copy (not linked to a shared one) as a pass decides whether it is due."""

    path_id: int
    model_id: int
    model: str
    workspace: str
    path: str
    status: str
    verified_at: datetime | None
    checked_at: datetime | None
    made: str | None  # the identity of the directory weightkeeper made there (fsops.made_here)


class LinkedPath(NamedTuple):
    """A live Ready path linked to a shared copy, as a pass checks its link."""

    path_id: int
    model: str
    workspace: str
    path: str
    artifact_id: int
    copy: str  # the shared copy the registry records the path links to
    repo_id: str
    pending: str | None  # the commit the model is switching to, if any
    include: list | None
    exclude: list | None
    owner_uid: int


# The own copies a pass checks: owned, not retired, not linked to a shared copy, of a Ready or Failed model whose
# snapshot is pinned (the others are being downloaded, cleaned or deleted, or have no manifest to check against);
# Ready, or Failed by a repair (`repair_failed`). A path a download failed (complete once or never) is its owner's
# to retry (`model retry`): a pass never fetches what a download gave up on (no space, a deadline, a refusal).
CHECKED = and_(ModelRow.phase.in_((READY, FAILED)), ModelRow.commit.is_not(None),
               or_(LocalPathRow.status == READY,
                   and_(LocalPathRow.status == FAILED, LocalPathRow.checked_at >= LocalPathRow.updated_at)),
               LocalPathRow.owned.is_(True), LocalPathRow.retired.is_(False), LocalPathRow.artifact_id.is_(None))


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    ids = sorted(set(ids))
    return (ids[i:i + CHUNK] for i in range(0, len(ids), CHUNK))


class CopyOps:
    """Mixed into `Registry`; uses its `_tx`."""

    def own_copies(self) -> list[OwnCopy]:
        """Every own copy that a pass checks (`CHECKED`), with its check times."""
        with self._tx() as s:
            rows = s.execute(
                select(LocalPathRow.id, LocalPathRow.model_id, ModelRow.name, LocalPathRow.workspace, LocalPathRow.path,
                       LocalPathRow.status, LocalPathRow.verified_at, LocalPathRow.checked_at,
                       LocalPathRow.made).join(ModelRow).where(CHECKED).order_by(LocalPathRow.id))
            return [OwnCopy(i, m, name, ws, path, status, _utc(verified), _utc(checked), made)
                    for i, m, name, ws, path, status, verified, checked, made in rows]

    def is_checked(self, path_id: int) -> bool:
        """The path is an own copy that a pass checks (`CHECKED`) still: no download failed it since."""
        with self._tx() as s:
            return s.scalar(select(LocalPathRow.id).join(ModelRow).where(CHECKED, LocalPathRow.id == path_id)) \
                is not None

    def repair_failed(self, name: str, path_id: int, holder: Holder, message: str) -> None:
        """The repair of a damaged own copy failed: the path is Failed and its lease released, and it stays the
        passes' to repair (`CHECKED`): its check time is its last change, which any later write to the path (a
        download's, a retry's) moves past. Nothing is recorded while another run holds the path, nor over a Ready
        one (as `path_failed`)."""
        with self._tx() as s:
            p = self._path(self._model(s, name), path_id)
            lease = self._lease_row(s, Kind.PATH, p.id)
            if lease is not None and not held_by(lease, holder) or lease is None and p.status == READY:
                return
            p.status, p.message = FAILED, scrub_message(message)
            p.updated_at = p.checked_at = utcnow()
            self._drop(s, Kind.PATH, p.id)

    def linked_paths(self, model: str | None = None) -> list[LinkedPath]:
        """Every live Ready path linked to a shared copy (of `model` only, when given), with the copy the registry
        records for it."""
        with self._tx() as s:
            rows = s.execute(
                select(LocalPathRow.id, ModelRow.name, LocalPathRow.workspace, LocalPathRow.path, ArtifactRow.id,
                       ArtifactRow.path, ModelRow.repo_id, ModelRow.pending_commit, ModelRow.include_patterns,
                       ModelRow.exclude_patterns, ModelRow.owner_uid)
                .join(ModelRow).join(ArtifactRow, ArtifactRow.id == LocalPathRow.artifact_id)
                .where(ModelRow.phase != DELETING, LocalPathRow.status == READY, LocalPathRow.owned.is_(True),
                       LocalPathRow.retired.is_(False), *([ModelRow.name == model] if model else []))
                .order_by(LocalPathRow.id))
            return [LinkedPath(*row) for row in rows]

    def claim_link(self, name: str, path_id: int, artifact_id: int, holder: Holder, lease_seconds: float) -> bool:
        """Take a linked path to mend its link: only while it is live, Ready and recorded on the copy `artifact_id`,
        and no live run holds it (a switch at work moves the link itself; a killed one's lease is taken over)."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if row.phase == DELETING or p.retired or p.status != READY or p.artifact_id != artifact_id:
                return False
            return self._take(s, Kind.PATH, p.id, holder, lease_seconds, "link") is None

    def link_mended(self, name: str, path_id: int, holder: Holder, message: str, failed: bool = False) -> None:
        """Release a path taken by `claim_link`, saying what was done (`message`; "": nothing): its link put back
        (it stays Ready), or (`failed`) something not weightkeeper's found standing there (the path and its model
        Failed)."""
        with self._tx() as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if not self._holds(s, Kind.PATH, p.id, holder):
                return
            if message:
                p.message, p.updated_at = scrub_message(message), utcnow()
            if failed and row.phase != DELETING:
                p.status = FAILED
                row.phase, row.message, row.updated_at = FAILED, p.message, p.updated_at
            self._drop(s, Kind.PATH, p.id, holder)

    def verified_copies(self, repo_id: str, cluster: str, volume: str,
                        token_block: str | None) -> list[tuple[str, list]]:
        """Ready copies of a repository on one volume, any commit, as (directory, recorded files): shared copies,
        and own copies of live Ready models (the files a new commit may take instead of fetching them again).
        Only copies of models fetched with the same token block: a gated or private repository's files never
        reach a model that could not fetch them."""
        inside = volume.rstrip("/") + "/"
        same_token = ModelRow.token_block.is_not_distinct_from(token_block)
        with self._tx() as s:
            used = select(LocalPathRow.artifact_id).join(ModelRow).where(
                same_token, ModelRow.deletion_time.is_(None), LocalPathRow.status == READY)
            shared = s.execute(select(ArtifactRow.path, ArtifactRow.files).where(
                ArtifactRow.repo_id == repo_id, ArtifactRow.cluster == cluster, ArtifactRow.volume == volume,
                ArtifactRow.state == READY, ArtifactRow.id.in_(used)).order_by(ArtifactRow.id))
            own = s.execute(select(LocalPathRow.path, ModelRow.files).join(ModelRow).where(
                same_token, ModelRow.repo_id == repo_id, ModelRow.deletion_time.is_(None), ModelRow.files.is_not(None),
                LocalPathRow.cluster == cluster, LocalPathRow.status == READY, LocalPathRow.owned.is_(True),
                LocalPathRow.retired.is_(False), LocalPathRow.artifact_id.is_(None)).order_by(LocalPathRow.id))
            return [(path, files or []) for path, files in [*shared, *own] if path.startswith(inside)]

    def manifests(self, model_ids: Iterable[int]) -> dict[int, list]:
        """The recorded manifest of each of these models (those without one left out)."""
        out: dict[int, list] = {}
        with self._tx() as s:
            for chunk in _chunks(model_ids):
                out.update((i, files) for i, files in s.execute(
                    select(ModelRow.id, ModelRow.files).where(ModelRow.id.in_(chunk))) if files)
        return out

    def mark_checked(self, path_ids: Iterable[int], artifact_ids: Iterable[int], verified: bool) -> None:
        """These copies passed the cheap check now (`verified`: their content was hashed too)."""
        now = utcnow()
        with self._tx() as s:
            for table, ids in ((LocalPathRow, path_ids), (ArtifactRow, artifact_ids)):
                values = {"checked_at": now, **({"verified_at": now} if verified else {})}
                for chunk in _chunks(ids):
                    s.execute(update(table).where(table.id.in_(chunk)).values(**values))
