"""Registry operations on shared copies of snapshots (artifacts) and the paths linked to them."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import and_, select
from sqlalchemy.orm import aliased

from weightkeeper.errors import NotFoundError
from weightkeeper.layout import copy_name
from weightkeeper.phase import derive_phase
from weightkeeper.registry.common import DELETING, FAILED, READY, _utc, scrub_message, utcnow
from weightkeeper.registry.leases import Kind, Lease, held_by
from weightkeeper.registry.schema import ArtifactRow, LocalPathRow, ModelRow

A_PENDING, A_DOWNLOADING, A_READY, A_REPAIRING, A_FAILED = "Pending", "Downloading", "Ready", "Repairing", "Failed"


@dataclass
class ArtifactUser:
    model: str
    path_id: int
    workspace: str
    path: str
    keep_files: bool
    deleting: bool


@dataclass
class Artifact:
    id: int
    repo_id: str
    commit: str
    cluster: str
    volume: str
    path: str
    files: list[dict]
    state: str
    message: str
    size_bytes: int | None
    verified_at: datetime | None
    checked_at: datetime | None
    unreachable_since: datetime | None
    lease: Lease | None  # who writes or removes it now
    users: list[ArtifactUser]
    released_at: datetime | None = None  # a model switched away from it: kept for track_grace_seconds after
    made: str | None = None  # its directory's identity once weightkeeper made it (`fsops.own_directory`)
    switching: list[str] = field(default_factory=list)  # models whose pending commit it is (`_switching`)

    @property
    def in_use(self) -> bool:
        """Garbage collection keeps it: a path links to it, or a model switches to it (the copy its switch fills,
        or resumes after one that failed or was killed). Repairs are for `users` alone."""
        return bool(self.users or self.switching)

    def to_json(self) -> dict:
        return {"path": self.path, "repo": self.repo_id, "commit": self.commit, "state": self.state,
                "sizeBytes": self.size_bytes, "models": sorted({u.model for u in self.users})}


def by_repair(p: LocalPathRow) -> bool:
    """A path a repair of its shared copy failed (`set_users`): nothing wrote to it since (as `copies.CHECKED`)."""
    return p.status == FAILED and p.checked_at is not None and _utc(p.checked_at) >= _utc(p.updated_at)


class ArtifactOps:
    """Mixed into `Registry`; uses its `_tx`, `_model`, `_path` and lease operations."""

    def _artifact(self, s, artifact_id: int) -> ArtifactRow:
        row = s.scalars(select(ArtifactRow).where(ArtifactRow.id == artifact_id).with_for_update()).first()
        if row is None:
            raise NotFoundError(f"shared copy #{artifact_id} does not exist")
        return row

    def _artifact_view(self, s, row: ArtifactRow) -> Artifact:
        return self._artifact_views(s, [row], lambda copy_id: copy_id == row.id)[0]

    def _artifact_views(self, s, rows: list[ArtifactRow], which: Callable) -> list[Artifact]:
        """Views of shared copies, their users and switching models (of the copies `which` selects, given a copy id
        column) and leases read in one query each."""
        users: dict[int, list[ArtifactUser]] = {}
        for artifact_id, name, pid, ws, path, keep, phase in s.execute(
                select(LocalPathRow.artifact_id, ModelRow.name, LocalPathRow.id, LocalPathRow.workspace,
                       LocalPathRow.path, ModelRow.keep_files, ModelRow.phase).join(ModelRow)
                .where(which(LocalPathRow.artifact_id)).order_by(LocalPathRow.id)):
            users.setdefault(artifact_id, []).append(ArtifactUser(name, pid, ws, path, keep, phase == DELETING))
        switching = self._switching(s, which)
        leases = self._leases(s, Kind.ARTIFACT, [row.id for row in rows])
        return [Artifact(row.id, row.repo_id, row.commit, row.cluster, row.volume, row.path, row.files, row.state,
                         row.message, row.size_bytes, _utc(row.verified_at), _utc(row.checked_at), _utc(row.unreachable_since),
                         leases.get(row.id), users.get(row.id, []), _utc(row.released_at), row.made,
                         switching.get(row.id, [])) for row in rows]

    def _switching(self, s, which: Callable) -> dict[int, list[str]]:
        """The models (not being deleted: a move or a failure keeps a pending switch) switching to each shared copy
        `which` selects, by copy id: its commit is their pending one, of their repository and patterns (its name is
        their `copy_name`), on the cluster and volume of the copy a Ready path of theirs links to (where its switch
        fills the new one)."""
        new, now = aliased(ArtifactRow), aliased(ArtifactRow)
        rows = s.execute(
            select(new.id, new.path, ModelRow.name, ModelRow.pending_commit, ModelRow.include_patterns,
                   ModelRow.exclude_patterns)
            .select_from(ModelRow).join(LocalPathRow, LocalPathRow.model_id == ModelRow.id)
            .join(now, now.id == LocalPathRow.artifact_id)
            .join(new, and_(new.repo_id == ModelRow.repo_id, new.commit == ModelRow.pending_commit,
                            new.cluster == now.cluster, new.volume == now.volume))
            .where(ModelRow.phase != DELETING, LocalPathRow.status == READY, which(new.id)).order_by(ModelRow.name))
        out: dict[int, list[str]] = {}
        for artifact_id, path, name, commit, include, exclude in rows:  # a row for each path of theirs there
            if posixpath.basename(path) == copy_name(commit, include, exclude) and name not in out.get(artifact_id, ()):
                out.setdefault(artifact_id, []).append(name)
        return out

    def artifact_for(self, repo_id: str, commit: str, cluster: str, volume: str, path: str,
                     files: list[dict]) -> Artifact:
        """The shared copy of a snapshot on a volume, recorded Pending if it is new."""
        with self._tx(path_lock=True) as s:
            row = s.scalars(select(ArtifactRow).where(ArtifactRow.cluster == cluster, ArtifactRow.path == path)
                            .with_for_update()).first()
            if row is None:
                now = utcnow()
                row = ArtifactRow(repo_id=repo_id, commit=commit, cluster=cluster, volume=volume, path=path,
                                  files=files, state=A_PENDING, message="", created_at=now, updated_at=now)
                s.add(row)
                s.flush()
            return self._artifact_view(s, row)

    def get_artifact(self, artifact_id: int) -> Artifact | None:
        with self._tx() as s:
            row = s.get(ArtifactRow, artifact_id)
            return self._artifact_view(s, row) if row else None

    def list_artifacts(self, repo_id: str | None = None) -> list[Artifact]:
        """Every shared copy (of one repository: `repo_id`), in four queries whatever the count."""
        with self._tx() as s:
            query = select(ArtifactRow).order_by(ArtifactRow.id)
            if repo_id is None:
                return self._artifact_views(s, list(s.scalars(query)), lambda copy_id: copy_id.is_not(None))
            rows = list(s.scalars(query.where(ArtifactRow.repo_id == repo_id)))
            return self._artifact_views(s, rows, lambda copy_id: copy_id.in_([row.id for row in rows]))

    def claim_artifact(self, artifact_id: int, holder, lease_seconds: float) -> Lease | None:
        """Make `holder` the one writer of a shared copy; the lease of the run that keeps it from it, if any."""
        with self._tx() as s:
            return self._take(s, Kind.ARTIFACT, self._artifact(s, artifact_id).id, holder, lease_seconds)

    def set_artifact(self, artifact_id: int, holder, state: str, message: str = "", *, size_bytes: int | None = None,
                     verified: bool = False, unreachable_since: datetime | None | bool = False,
                     release: bool = False) -> None:
        """Record a shared copy's state (only by its lease holder); `release` ends the lease."""
        with self._tx() as s:
            row = self._artifact(s, artifact_id)
            lease = self._lease_row(s, Kind.ARTIFACT, row.id)
            if holder is not None and lease is not None and not held_by(lease, holder):
                return
            row.state, row.message, row.updated_at = state, scrub_message(message), utcnow()
            if size_bytes is not None:
                row.size_bytes = size_bytes
            if verified:
                row.verified_at = utcnow()
            if unreachable_since is not False:
                row.unreachable_since = unreachable_since
            if release:
                self._drop(s, Kind.ARTIFACT, row.id)

    def set_artifact_made(self, artifact_id: int, holder, made: str) -> bool:
        """Record the directory this holder made for the shared copy (before it writes anything there); False when
        it no longer holds the copy. Without a holder: the directory a copy recorded as `legacy` was found to be
        (after a full hash), only while it still is recorded so."""
        with self._tx() as s:
            row = self._artifact(s, artifact_id)
            if not (self._holds(s, Kind.ARTIFACT, row.id, holder) if holder else row.made == "legacy"):
                return False
            row.made = made
            return True

    def fetched_with(self, artifact_id: int, token_block: str | None, besides: str) -> bool:
        """A live model other than `besides` has a Ready path on the copy with this token block: the copy's files
        were fetched (or given, after the Hub said yes) to someone with the same access."""
        same = ModelRow.token_block.is_not_distinct_from(token_block)
        with self._tx() as s:
            return s.execute(select(LocalPathRow.id).join(ModelRow).where(
                LocalPathRow.artifact_id == artifact_id, LocalPathRow.status == READY, ModelRow.name != besides,
                ModelRow.phase != DELETING, same).limit(1)).first() is not None

    def link_path(self, name: str, path_id: int, artifact_id: int | None) -> None:
        with self._tx() as s:
            self._path(self._model(s, name), path_id).artifact_id = artifact_id

    def set_users(self, artifact_id: int, status: str, message: str, by_owner: dict[str, str] | None = None
                  ) -> list[str]:
        """Set the status of the live paths linked to a copy that stand on it (Failed during repair, Ready after)
        and the phase of their models to match, with `message` (`by_owner`: an owner's models get theirs instead);
        returns the models touched. Only a Ready path is failed, and only one a repair failed (`by_repair`) is
        restored: a path failed for a reason of its own (its link replaced, its download) keeps its status."""
        with self._tx() as s:
            rows = s.scalars(select(LocalPathRow).where(LocalPathRow.artifact_id == artifact_id)).all()
            touched = []
            for p in rows:
                model = self._model(s, p.model.name)
                if model.phase == DELETING or not (p.status == READY or by_repair(p)):
                    continue
                text = scrub_message((by_owner or {}).get(model.owner_name, message))
                p.status, p.message = status, text
                p.updated_at = p.checked_at = utcnow()  # Failed so: `by_repair`
                if p.retired:  # an old path never decides its model's phase
                    continue
                phase, why = derive_phase(model.phase, model.message, model.paths)
                if status == FAILED:
                    model.phase, model.message = FAILED, text
                elif phase in (READY, FAILED):  # Failed: another path's own reason, named
                    model.phase, model.message = phase, text if phase == READY else why
                touched.append(model.name)
            return touched

    def delete_artifact(self, artifact_id: int) -> bool:
        """Forget a shared copy once no path links to it (its directory must already be gone)."""
        with self._tx(path_lock=True) as s:
            row = self._artifact(s, artifact_id)
            if s.scalars(select(LocalPathRow.id).where(LocalPathRow.artifact_id == artifact_id)).first():
                return False
            self._drop(s, Kind.ARTIFACT, row.id)
            s.delete(row)
            return True
