"""Registry writes of a model that changes commit: the head asked, the pending commit, each path's switch, the model's.

A Ready model with a pending commit stays Ready on its current one: each path downloads the pending commit's
shared copy beside the current one and switches its link (`path_switched`); once every live path has switched,
`model_switched` records the new commit. A failed download leaves the path and the model as they were, with a
message. The copy switched away from is marked `released_at`, and garbage collection keeps it for
`track_grace_seconds`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, true
from sqlalchemy.orm import Session, selectinload

from weightkeeper.config import Workspace
from weightkeeper.download import listed_otherwise
from weightkeeper.errors import ConflictError
from weightkeeper.layout import copy_name
from weightkeeper.planning import TURNS, changed_bytes, last_turn
from weightkeeper.registry.common import DELETING, READY, scrub_message, utcnow
from weightkeeper.registry.leases import SWITCH, Kind
from weightkeeper.registry.schema import ArtifactRow, LocalPathRow, ModelRow


def update_due(now: datetime, interval: float):
    """The SQL condition of a Ready model due for a run that asks for its next commit or finishes a switch (as
    `desired.update_due` decides for one model): a revision `model update` asked for and not asked yet, or a tracked
    branch or a pending switch never asked or tried, or whose turn (`planning.last_turn`, one condition per turn)
    came half an interval or more after it was last asked or tried."""
    half = timedelta(seconds=interval / 2)
    asked = or_(ModelRow.head_checked_at.is_(None), true() if interval <= 0 else or_(*(
        and_(ModelRow.id % TURNS == turn, ModelRow.head_checked_at <= last_turn(turn, now, interval) - half)
        for turn in range(TURNS))))
    requested = and_(ModelRow.next_revision.is_not(None), ModelRow.head_checked_at.is_(None))
    following = or_(ModelRow.track.is_(True), ModelRow.pending_commit.is_not(None))
    return and_(ModelRow.phase == READY, or_(requested, and_(following, asked)))


def _relisted(s: Session, row: ModelRow, commit: str, files: list[dict]) -> str | None:
    """A file the Hub now lists otherwise for `commit` than when a shared copy of that selection of it was made
    (a commit's files never change: the answer is not to be trusted): its name."""
    copy = copy_name(commit, row.include_patterns, row.exclude_patterns)
    made = s.scalars(select(ArtifactRow.files).where(ArtifactRow.repo_id == row.repo_id, ArtifactRow.commit == commit,
                                                     ArtifactRow.path.endswith(f"/{copy}", autoescape=True)))
    return next((name for recorded in made if (name := listed_otherwise(recorded, files))), None)


def _commits(s: Session, paths: list[LocalPathRow]) -> dict[int, str]:
    """The commit of each shared copy these paths link to, by copy id (a path linking to none has no entry)."""
    ids = [p.artifact_id for p in paths if p.artifact_id]
    if not ids:
        return {}
    return dict(s.execute(select(ArtifactRow.id, ArtifactRow.commit).where(ArtifactRow.id.in_(ids))).all())


def _made_otherwise(s: Session, paths: list[LocalPathRow], files: list[dict] | None) -> tuple[str, str] | None:
    """A path whose shared copy was made from another listing than `files` (a switch run that started before a
    check recorded the commit listed otherwise): (its path, the file listed otherwise)."""
    made = dict(s.execute(select(ArtifactRow.id, ArtifactRow.files).where(
        ArtifactRow.id.in_([p.artifact_id for p in paths if p.artifact_id]))).all())
    return next(((p.path, name) for p in paths if (name := listed_otherwise(made.get(p.artifact_id), files))), None)


class UpdateOps:
    """Mixed into `Registry`; uses its `_tx`, `_model`, `_path` and lease helpers."""

    def request_revision(self, name: str, revision: str) -> None:
        """Ask a Ready model to switch to `revision` once, unless another live model shares one of its paths."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            if row.phase == DELETING:
                raise ConflictError(f"model {name!r} is being deleted; it cannot be changed", "ResourceProcessing")
            if row.phase != READY:
                raise ConflictError(f"model {name!r} is {row.phase}; a revision can be switched once it is Ready",
                                    "NotReady")
            if shared := next((p.path for p in row.paths if not p.retired and self._shared(s, row, p)), None):
                raise ConflictError(f"model {name!r} shares {shared} with another model, whose link a switch would "
                                    f"move too; give it a path of its own first (model update {name} --subpath S)",
                                    "PathShared")
            row.next_revision, row.head_checked_at, row.updated_at = revision, None, utcnow()

    def _shared(self, s: Session, row: ModelRow, p: LocalPathRow) -> bool:
        """Another live model also puts files at the model's path `p` (`_owners`): one link serves both, so a switch
        would move the other model's files too."""
        return any(not deleting for _, deleting in self._owners(s, p.cluster, p.path, row, share=False))

    def head_checked(self, name: str, commit: str | None, files: list[dict], held: str | None = None,
                     asked: str | None = None, permanent: bool = False) -> bool:
        """Record what asking the model's revision answered: the commit it points at now; True when the model has to
        switch to it (it is pending). `held`: why it may not (recorded as the model's message instead). `asked`: the
        revision that was asked; an answer for another than the model's now (`model update` asked for one since) is
        dropped, and that one stays due. With nothing to switch to, paths an unfinished switch left on another
        commit switch back to the model's (`_switch_back`). `commit` None: no commit came back (`held` says why), or
        none was asked for (a switch left pending is tried again: only when is recorded).
        Only a `permanent` answer (the revision does not exist, or may not be read) drops the revision asked for
        and the pending commit; after a transient failure both stay as they were (the pending commit is what tells
        a link a killed switch renamed to its copy from someone else's) and nothing switches; asked now, the model is
        asked again at its next interval (tracked, or with a switch pending) or its next `model ensure`, not at every
        pass while the Hub is down."""
        with self._tx() as s:
            row = self._model(s, name)
            if asked is not None and asked != (row.next_revision or row.revision):
                return False  # stale: head_checked_at stays None (`request_revision`), so the request is asked next
            row.head_checked_at = row.updated_at = utcnow()
            if row.phase != READY:
                return False
            if held:
                row.message = scrub_message(held)
            if commit is None and not permanent:
                return False
            if commit not in (None, row.commit) and not held and (name := _relisted(s, row, commit, files)):
                held = (f"update to {commit} held: the Hub lists {name} of it otherwise than when a shared copy of "
                        f"it was made; it stays on {row.commit}: check the Hub endpoint (if that copy was made from a "
                        "wrong listing, delete the models on it so that garbage collection removes it)")
                row.message = scrub_message(held)
            if commit is None or held or commit == row.commit:
                row.pending_commit = row.pending_files = None
                if commit == row.commit:
                    _settle_revision(row)
                elif commit is None:
                    row.next_revision = None
                return self._switch_back(s, row, held)
            row.pending_commit, row.pending_files = commit, files
            row.message = scrub_message(f"downloading {commit} beside {row.commit} to switch to it")
            return True

    def switches_coming(self, name: str, ws: Workspace) -> int:
        """The bytes other Ready models' pending switches will add in `ws` (their changed files) whose new copy is
        not recorded yet: a recorded one counts in `storedBytes` already, one not started yet nowhere else. Their
        copy is recorded when a copy stands where theirs goes (`layout.copy_paths`): a copy of the commit with other
        file patterns, or on another owner's shelf, is another model's."""
        if not ws.volume:  # no copy is made there
            return 0
        with self._tx() as s:
            others = s.scalars(select(ModelRow).options(selectinload(ModelRow.paths)).where(
                ModelRow.name != name, ModelRow.phase == READY, ModelRow.pending_commit.is_not(None),
                ModelRow.pending_commit != ModelRow.commit)).all()
            goes: dict[int, set[tuple[str, str]]] = {}  # a model with a path in ws: (cluster, path) of its new copy
            for o in others:
                if p := next((p for p in o.paths if not p.retired and p.workspace == ws.name), None):
                    copy = copy_name(o.pending_commit, o.include_patterns, o.exclude_patterns)
                    goes[o.id] = {(p.cluster, path) for path in ws.copy_paths(o.repo_id, copy, o.owner_uid)}
            wanted = {path for places in goes.values() for _, path in places}
            made = {(cluster, path) for cluster, path in s.execute(select(ArtifactRow.cluster, ArtifactRow.path).where(
                ArtifactRow.volume == ws.volume, ArtifactRow.path.in_(wanted)))} if wanted else set()
            return sum(changed_bytes(o.files or [], o.pending_files or []) for o in others
                       if o.id in goes and not goes[o.id] & made)

    def _strays(self, s: Session, row: ModelRow) -> list[str]:
        """The model's live Ready paths whose link names a copy of another commit than the model's (a switch that
        did not finish left them there)."""
        live = [p for p in row.paths if not p.retired and p.status == READY and p.artifact_id]
        commits = _commits(s, live)
        return [p.path for p in live if commits.get(p.artifact_id, row.commit) != row.commit]

    def _switch_back(self, s: Session, row: ModelRow, held: str | None) -> bool:
        """With nothing to switch to, the model's commit is pending when a path is on another (True): the switch
        machinery links those paths back to its copy, and leaves the others be (`claim_switch`)."""
        if not (strays := self._strays(s, row)):
            return False
        row.pending_commit, row.pending_files = row.commit, row.files
        row.message = scrub_message(f"{held + '; ' if held else ''}back to {row.commit}, the model's commit, in "
                                    f"{', '.join(strays)}, where an unfinished switch left another commit")
        return True

    def claim_switch(self, name: str, path_id: int, holder, lease_seconds: float, commit: str) -> str:
        """Take a Ready path to switch it to `commit`, the model's pending commit: `claimed`, `deleting`, `busy`,
        `shared` (another live model has the path: held, with a message) or `settled` (nothing pending, or another
        commit than the run's, which started before the pending one changed; the path is not a Ready link to a
        shared copy, or it links to a copy of the pending commit already). Its status stays Ready."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if row.phase == DELETING:
                return "deleting"
            if row.phase != READY or row.pending_commit != commit or p.status != READY or p.retired:
                return "settled"
            if _commits(s, [p]).get(p.artifact_id) == row.pending_commit:
                return "settled"
            back = row.pending_commit == row.commit  # restores the commit another model joined the path on
            if not back and self._shared(s, row, p):  # another model took the path since the switch was asked for
                held = (f"update to {row.pending_commit} held: {p.path} is shared with another model, whose link a "
                        f"switch would move too; it stays on {row.commit}")
                p.message = row.message = held
                return "shared"
            if self._take(s, Kind.PATH, p.id, holder, lease_seconds, SWITCH):
                return "busy"
            return "claimed"

    def path_switched(self, name: str, path_id: int, holder, artifact_id: int, size_bytes: int) -> None:
        """The path's link now points at the copy `artifact_id`; the copy it pointed at is released (kept for the
        grace period). The path's lease stays with the run until `end_switch`."""
        now = utcnow()
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            old, p.artifact_id, p.size_bytes, p.bytes_done = p.artifact_id, artifact_id, size_bytes, size_bytes
            p.message, p.verified_at, p.checked_at, p.updated_at = "switched", now, now, now
            if old is not None and old != artifact_id and (copy := s.get(ArtifactRow, old)) is not None:
                copy.released_at = now

    def end_switch(self, name: str, path_id: int, holder, failed: str | None = None) -> None:
        """Release the path after its switch; `failed`: why it did not switch (it stays Ready on its current
        commit, and the model says so)."""
        with self._tx() as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if failed and p.status == READY:
                p.message, p.updated_at = scrub_message(failed), utcnow()
            if failed and row.phase == READY:
                row.message = scrub_message(failed)
            self._drop(s, Kind.PATH, p.id, holder)

    def model_switched(self, name: str) -> tuple[str, str] | None:
        """Record the pending commit as the model's once every live path links to a copy of it: (from, to), or
        None while a path has not switched, and for paths switched back to the model's own commit (nothing pending
        once none is left on another; the message `_switch_back` wrote stays)."""
        with self._tx() as s:
            row = self._model(s, name)
            if row.phase != READY or not row.pending_commit:
                return None
            if row.pending_commit == row.commit:
                if not self._strays(s, row):
                    row.pending_commit = row.pending_files = None
                return None
            live = [p for p in row.paths if not p.retired]
            commits = _commits(s, live)
            if not live or any(commits.get(p.artifact_id) != row.pending_commit for p in live):
                return None
            if relisted := _made_otherwise(s, live, row.pending_files):  # a run that carried another listing
                path, name = relisted
                held = (f"update to {row.pending_commit} held: the Hub lists {name} of it otherwise than when the "
                        f"shared copy {path} links to was made; it stays on {row.commit}: check the Hub endpoint")
                row.pending_commit = row.pending_files = None
                row.message = scrub_message(held)
                self._switch_back(s, row, held)
                return None
            switched = (row.commit, row.pending_commit)
            row.commit, row.files = row.pending_commit, row.pending_files
            row.size_bytes = sum(f["size"] for f in row.pending_files or ())
            row.pending_commit = row.pending_files = None
            if row.head_checked_at is not None:  # else `model update` asked for another revision since: asked next
                _settle_revision(row)
            row.switched_at = row.updated_at = utcnow()
            row.message = f"switched from {switched[0]} to {switched[1]}"
            return switched


def _settle_revision(row: ModelRow) -> None:
    """The model is at the commit of the revision `model update` asked for: that revision is now its own."""
    if row.next_revision:
        head = row.source.rpartition("@")[0] or row.source
        row.revision, row.source, row.next_revision = row.next_revision, f"{head}@{row.next_revision}", None
