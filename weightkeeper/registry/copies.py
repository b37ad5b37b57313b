"""Registry reads and writes of a reconcile pass's checks: every own copy's check times in one query, the
manifests of the copies due in one more, and what a pass found in one statement per 500 copies."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import select, update

from weightkeeper.registry.common import FAILED, READY, _utc, utcnow
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


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    ids = sorted(set(ids))
    return (ids[i:i + CHUNK] for i in range(0, len(ids), CHUNK))


class CopyOps:
    """Mixed into `Registry`; uses its `_tx`."""

    def own_copies(self) -> list[OwnCopy]:
        """Every own copy that a pass checks: owned, not retired, not linked to a shared copy, Ready or Failed, of a
        Ready or Failed model whose snapshot is pinned (the others are being downloaded, cleaned or deleted, or
        have no manifest to check against)."""
        with self._tx() as s:
            rows = s.execute(
                select(LocalPathRow.id, LocalPathRow.model_id, ModelRow.name, LocalPathRow.workspace, LocalPathRow.path,
                       LocalPathRow.status, LocalPathRow.verified_at, LocalPathRow.checked_at,
                       LocalPathRow.made).join(ModelRow)
                .where(ModelRow.phase.in_((READY, FAILED)), ModelRow.commit.is_not(None),
                       LocalPathRow.status.in_((READY, FAILED)),
                       LocalPathRow.owned.is_(True), LocalPathRow.retired.is_(False),
                       LocalPathRow.artifact_id.is_(None)).order_by(LocalPathRow.id))
            return [OwnCopy(i, m, name, ws, path, status, _utc(verified), _utc(checked), made)
                    for i, m, name, ws, path, status, verified, checked, made in rows]

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
