"""Registry operations: each public method is one transaction.

SQLite writers are serialised with `BEGIN IMMEDIATE`; on PostgreSQL the rows a transaction
changes are locked with `SELECT ... FOR UPDATE`, and creation and deletion, which look at
other models' paths, take one advisory lock so two of them never decide on stale reads.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import ColumnElement, case, create_engine, delete, event, func, or_, select, text, true
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, selectinload

from weightkeeper.errors import ConfigError, ConflictError, InvalidInputError, NotFoundError, UnavailableError
from weightkeeper.layout import REUSE_IF_EXISTS
from weightkeeper.config import Settings, Workspace
from weightkeeper.planning import Plan, capacity_problem, path_decision, workspace_usage
from weightkeeper.registry.artifacts import ArtifactOps
from weightkeeper.registry.budget import BudgetOps
from weightkeeper.registry.copies import CopyOps
from weightkeeper.registry.leases import CLEANUP, Kind, Lease, LeaseOps, abandoned, as_lease, held_by
from weightkeeper.registry.listing import ListOps
from weightkeeper.registry.metrics import CLEANUP_FAILURES, MetricOps
from weightkeeper.registry.runs import RunLease, RunOps
from weightkeeper.registry.common import (
    CLEANING,
    DELETING,
    DOWNLOADING,
    FAILED,
    PENDING,
    READY,
    STAGING,
    Holder,
    _iso,
    _utc,
    scrub_message,
    this_host,
    utcnow,
)
from weightkeeper.registry.schema import ArtifactRow, LeaseRow, LocalPathRow, ModelRow
from weightkeeper.registry.updates import UpdateOps, update_due


@dataclass
class LocalPath:
    id: int
    workspace: str
    cluster: str
    path: str
    status: str
    message: str
    size_bytes: int | None
    bytes_done: int
    bytes_total: int
    owned: bool
    artifact_id: int | None
    lease: Lease | None  # who works on the path now
    verified_at: datetime | None
    retired: bool
    adopted: bool
    failover_attempts: int = 0
    made: str | None = None  # what weightkeeper made at the path: `fsops.LINK`, a directory's uid@dev:inode, ...

    def to_json(self, shared: dict | None = None) -> dict:
        out = {"workspace": self.workspace, "cluster": self.cluster, "path": self.path, "status": self.status,
               "retired": self.retired, "failoverAttempts": self.failover_attempts,
               "sizeBytes": self.size_bytes, "message": self.message, "shared": self.artifact_id is not None,
               "progress": {"bytesDone": self.bytes_done, "bytesTotal": self.bytes_total}}
        if shared is not None:
            out["sharedCopy"] = shared
        return out


@dataclass
class Model:
    name: str
    owner_name: str
    owner_uid: int
    source: str
    repo_id: str
    revision: str
    commit: str | None
    token_block: str | None
    targets: list[str] | None
    subpath: str | None
    files: list[dict] | None
    phase: str
    message: str
    created_at: datetime
    updated_at: datetime
    deletion_time: datetime | None
    cleanup_attempts: int
    download_policy: str
    keep_files: bool
    staging_uri: str | None = None  # where the snapshot is staged in S3 (or the s3:// source itself)
    staging_owned: bool = False  # weightkeeper staged it, so deletion removes it
    staging_lease: Lease | None = None  # the run staging it
    local_paths: list[LocalPath] = field(default_factory=list)
    id: int = 0
    size_bytes: int = 0  # of its snapshot, once pinned
    include: list[str] | None = None  # its own file patterns (None: the default set)
    exclude: list[str] | None = None
    track: bool = False  # follows its branch or tag
    next_revision: str | None = None  # asked for by `model update --revision`, until switched to
    pending_commit: str | None = None  # being downloaded beside the current commit, to switch to
    pending_files: list[dict] | None = None
    head_checked_at: datetime | None = None
    switched_at: datetime | None = None

    @property
    def is_deleted(self) -> bool:
        return self.deletion_time is not None

    def to_json(self, shared: dict[int, dict] | None = None) -> dict:
        """`shared` maps artifact ids to their description, to show which copy a path links to."""
        shared = shared or {}
        return {
            "name": self.name, "owner": {"name": self.owner_name, "uid": self.owner_uid}, "source": self.source,
            "commit": self.commit, "tokenBlock": self.token_block, "targets": self.targets, "subpath": self.subpath,
            "include": self.include, "exclude": self.exclude, "track": self.track,
            "update": {"nextRevision": self.next_revision, "pendingCommit": self.pending_commit,
                       "headCheckedAt": _iso(self.head_checked_at), "switchedAt": _iso(self.switched_at)},
            "downloadPolicy": self.download_policy, "keepFiles": self.keep_files, "stagingUri": self.staging_uri,
            "phase": self.phase, "message": self.message, "createdAt": _iso(self.created_at),
            "updatedAt": _iso(self.updated_at), "isDeleted": self.is_deleted, "deletionTime": _iso(self.deletion_time),
            "sizeBytes": self.size_bytes if self.files is not None else None,
            "localPaths": [p.to_json(shared.get(p.artifact_id)) for p in self.local_paths],
        }


@dataclass(frozen=True)
class Claim:
    """Outcome of a claim: `claimed`, `deleting`, `busy` (another worker), `wait` or `taken` (another model,
    `foreign` when another user's)."""

    outcome: str
    other: str | None = None
    foreign: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "claimed"

    @property
    def who(self) -> str:
        """The other model as the claimant's owner may read it."""
        return named(self.other, self.foreign)


def named(model: str, foreign: bool) -> str:
    """A model as a message names it: by name, unless it is another user's (its owner may keep it from others)."""
    return "another user's model" if foreign else f"model {model!r}"


@dataclass(frozen=True)
class ModelSpec:
    """What a user declares; validated by `weightkeeper.service` before it reaches the registry."""

    name: str
    owner_name: str
    owner_uid: int
    source: str
    repo_id: str
    revision: str
    token_block: str | None = None
    targets: list[str] | None = None
    subpath: str | None = None
    download_policy: str = "always-download"
    keep_files: bool = False
    include: list[str] | None = None
    exclude: list[str] | None = None
    track: bool = False
    commit: str | None = None  # pinned at creation (when a workspace's capacity needed its size)
    files: list[dict] | None = None
    source_uri: str | None = None  # an s3:// source pinned at creation: where its files are
    request_key: str | None = None  # digest of the API request (caller, Idempotency-Key, body) that declares it


def _patterns(include: list | None, exclude: list | None) -> tuple[list | None, list]:
    """A model's file selection as compared for sharing a path (as `layout.copy_name` names its copy)."""
    return (sorted(include) if include is not None else None), sorted(exclude or [])


def _path_view(row: LocalPathRow, leases: dict[int, Lease]) -> LocalPath:
    return LocalPath(row.id, row.workspace, row.cluster, row.path, row.status, row.message, row.size_bytes,
                     row.bytes_done, row.bytes_total, row.owned, row.artifact_id, leases.get(row.id),
                     _utc(row.verified_at), row.retired, row.adopted, row.failover_attempts, row.made)


def _with_paths(s: Session, models: list, which: ColumnElement[bool]) -> list[SimpleNamespace]:
    """Models read as plain rows, each with its paths (those `which` selects) read in one query: no ORM object is
    built, which costs most of a read of many models."""
    paths: dict[int, list] = {}
    for p in s.execute(select(LocalPathRow.__table__).where(which).order_by(LocalPathRow.id)):
        paths.setdefault(p.model_id, []).append(p)
    return [SimpleNamespace(**m._mapping, paths=paths.get(m.id, [])) for m in models]


def _views(s: Session, rows: list[ModelRow], leases: dict[str, dict[int, Lease]] | None = None) -> list[Model]:
    """Views of models, with their leases read in two queries (or already read: `leases` by kind, then key)."""
    if leases is None:
        leases = {Kind.PATH: LeaseOps._leases(s, Kind.PATH, [p.id for row in rows for p in row.paths]),
                  Kind.STAGING: LeaseOps._leases(s, Kind.STAGING, [row.id for row in rows])}
    return [_view(row, leases[Kind.PATH], leases[Kind.STAGING].get(row.id)) for row in rows]


def _view(row: ModelRow, paths: dict[int, Lease] | None = None, staging: Lease | None = None) -> Model:
    if paths is None:
        return _views(Session.object_session(row), [row])[0]
    return Model(
        row.name, row.owner_name, row.owner_uid, row.source, row.repo_id, row.revision, row.commit, row.token_block,
        row.targets, row.subpath, row.files, row.phase, row.message, _utc(row.created_at), _utc(row.updated_at),
        _utc(row.deletion_time), row.cleanup_attempts, row.download_policy, row.keep_files, row.staging_uri,
        row.staging_owned, staging, [_path_view(p, paths) for p in row.paths],
        id=row.id, size_bytes=row.size_bytes, include=row.include_patterns, exclude=row.exclude_patterns,
        track=bool(row.track), next_revision=row.next_revision, pending_commit=row.pending_commit,
        pending_files=row.pending_files, head_checked_at=_utc(row.head_checked_at), switched_at=_utc(row.switched_at),
    )


logger = logging.getLogger("weightkeeper.registry")
_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()
MIGRATIONS = Path(__file__).parent / "migrations"


def _engine(url: str, announce_new: bool) -> Engine:
    with _engines_lock:
        if url not in _engines:
            made = None
            if url.startswith("sqlite"):
                db = make_url(url).database
                if db and db != ":memory:":
                    Path(db).parent.mkdir(parents=True, exist_ok=True)
                    made = db if announce_new and not Path(db).exists() else None
                engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

                @event.listens_for(engine, "connect")
                def _sqlite_connect(dbapi_conn, _record):
                    dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below be the only one
                    dbapi_conn.execute("PRAGMA journal_mode=WAL")
                    dbapi_conn.execute("PRAGMA foreign_keys=ON")
                    dbapi_conn.execute("PRAGMA busy_timeout=60000")

                @event.listens_for(engine, "begin")
                def _sqlite_begin(conn):
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
            _migrate(engine)
            if made:  # a typo in registry_url would go unnoticed: an empty registry lists no model
                logger.warning("weightkeeper: made a new, empty registry at %s; if registry_url should name an "
                               "existing one, correct it", made)
            _engines[url] = engine
        return _engines[url]


HEAD = max(p.name[:4] for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))  # the newest migration


def _migrate(engine: Engine) -> None:
    """Bring the schema to `HEAD`. A registry already there costs one query: alembic (a second of imports) is
    loaded only when there is a migration to run, which matters to every flow-run process a worker starts."""
    if _version(engine) == HEAD:
        return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PATH_LOCK + 1})
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


def _version(engine: Engine) -> str | None:
    """The schema's migration, None before the first."""
    with engine.connect() as conn:
        try:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except DBAPIError:
            return None


def open_registry(url: str, announce_new: bool = False) -> Registry:
    """The registry at `url`, migrated to the current schema; `ConfigError` naming it (its password hidden) when
    that URL names no database SQLAlchemy knows, `UnavailableError` when the database answers with an error (it
    cannot be reached, refuses the login, is locked or read-only, ...). `announce_new`: a SQLite file made anew is
    logged (a `registry_url` someone wrote, which a typo would otherwise turn into an empty registry)."""
    if _ats(url) > 1:  # the parser would take what follows the first '@' of a password for the host, and show it
        raise ConfigError(f"registry_url {_shown(url)}: its user name or password holds an '@'; write it as %40")
    try:
        return Registry(_engine(url, announce_new))
    except (ArgumentError, ValueError) as e:
        raise ConfigError(f"registry_url {_shown(url)}: {e}; use sqlite:///PATH or postgresql+psycopg://...") from None
    except ImportError as e:
        raise ConfigError(f"registry_url {_shown(url)}: its database driver is not installed here ({e}); use "
                          "sqlite:///PATH or postgresql+psycopg://...") from None
    except OperationalError as e:
        why = (str(e.orig).strip().splitlines() or [type(e.orig).__name__])[0]
        raise UnavailableError(f"the registry at {_shown(url)} cannot be used: {why}") from e


def registry_for(settings: Settings) -> Registry:
    """The registry of `settings` (a SQLite file made anew is announced only when `registry_url` was given)."""
    return open_registry(settings.registry_url, settings.registry_named)


def _shown(url: str) -> str:
    """`url` as a message may show it: its password and query (which may carry one) hidden; only the scheme of a URL
    that does not parse, or whose password holds an unescaped '@'."""
    scheme = repr(url.partition("://")[0] + "://..." if "://" in url else "...")
    if _ats(url) > 1:
        return scheme
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return scheme
    return parsed.set(query={}).render_as_string(hide_password=True) + ("?..." if parsed.query else "")


def _ats(url: str) -> int:
    """How many '@' follow the URL's '://' when it names a host (SQLite's '///' names none): more than one is a
    password's unescaped '@' (SQLAlchemy ends the password at the first, and reads the rest, '/' and all, as host,
    database and query)."""
    rest = url.partition("://")[2]
    return 0 if rest.startswith("/") else rest.count("@")


_PATH_LOCK = 7_243_001  # advisory lock key for decisions that read other models' paths


class Registry(ArtifactOps, RunOps, LeaseOps, ListOps, BudgetOps, MetricOps, CopyOps, UpdateOps):
    def __init__(self, engine: Engine):
        self.engine = engine

    @contextmanager
    def _tx(self, path_lock: bool = False) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            if path_lock and self.engine.dialect.name == "postgresql":
                session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PATH_LOCK})
            yield session

    @staticmethod
    def _model(session: Session, name: str, lock: bool = True, seen: Model | None = None) -> ModelRow:
        """The model of that name (`seen`: only while it is that very model; SQLite may give a model declared
        since under the name the same id, never the same creation time)."""
        query = select(ModelRow).where(ModelRow.name == name).options(selectinload(ModelRow.paths))
        row = session.scalars(query.with_for_update() if lock else query).first()
        if row is None or seen is not None and (row.id, _utc(row.created_at)) != (seen.id, seen.created_at):
            raise NotFoundError(f"model {name!r} does not exist")
        return row

    @staticmethod
    def _path(row: ModelRow, path_id: int) -> LocalPathRow:
        for p in row.paths:
            if p.id == path_id:
                return p
        raise NotFoundError(f"model {row.name!r} has no local path #{path_id}")

    @staticmethod
    def _owners(session: Session, cluster: str, path: str, exclude: ModelRow | ModelSpec | None,
                share: bool = True, holding: bool = False) -> list[tuple[str, bool]]:
        """Other models whose entries put (or are putting) files at this directory: (name, deleting).

        Live models that link this path to the same shared snapshot as `exclude` share it and do not
        count unless `share` is False (before `exclude` has a commit, the same repository is enough).
        `holding`: an entry that failed before it made anything there does not count.
        """
        rows = session.execute(
            select(ModelRow.name, ModelRow.phase, ModelRow.download_policy, ModelRow.repo_id, ModelRow.commit,
                   ModelRow.include_patterns, ModelRow.exclude_patterns, ModelRow.track, ModelRow.pending_commit)
            .join(LocalPathRow)
            .where(LocalPathRow.cluster == cluster, LocalPathRow.path == path, LocalPathRow.owned.is_(True),
                   ModelRow.id != getattr(exclude, "id", -1),
                   or_(LocalPathRow.made.is_not(None), LocalPathRow.status != FAILED) if holding else true())
        )
        # a tracked model switches its path's link: it shares the path with no other model; nor does one while it
        # switches (a path of it may link to the pending commit's copy already, and each is moved in turn)
        sharing = share and exclude is not None and exclude.download_policy == REUSE_IF_EXISTS and not exclude.track
        commit = getattr(exclude, "commit", None)
        patterns = None if exclude is None else _patterns(exclude.include, exclude.exclude) if isinstance(
            exclude, ModelSpec) else _patterns(exclude.include_patterns, exclude.exclude_patterns)
        return [(n, phase == DELETING) for n, phase, policy, repo, their_commit, include, excluded, track, pending in rows
                if not (sharing and phase != DELETING and policy == REUSE_IF_EXISTS and repo == exclude.repo_id
                        and commit in (None, their_commit) and not track and pending in (None, their_commit)
                        and patterns == _patterns(include, excluded))]

    @staticmethod
    def _nested(session: Session, cluster: str, path: str, exclude: ModelRow | ModelSpec | None,
                owner: str | None) -> str | None:
        """Another model (live or deleting) or a shared copy whose path on `cluster` is inside `path` or
        contains it: deleting the outer one would remove the inner. Its name (with `owner`, a model not theirs is
        not named: its owner may keep it from the others), the copy's path, or None."""
        outer = [path[:i] for i in range(len(path)) if path[i] == "/" and i > 0]
        near = or_(LocalPathRow.path.in_(outer), LocalPathRow.path.startswith(path + "/", autoescape=True))
        other = session.execute(select(ModelRow.name, ModelRow.owner_name).join(LocalPathRow).where(
            LocalPathRow.cluster == cluster, near, ModelRow.id != getattr(exclude, "id", -1))).first()
        if other is not None:
            return named(other.name, owner not in (None, other.owner_name))
        copy = session.scalars(select(ArtifactRow.path).where(ArtifactRow.cluster == cluster, or_(
            ArtifactRow.path.in_(outer), ArtifactRow.path.startswith(path + "/", autoescape=True)))).first()
        return f"the shared copy {copy}" if copy is not None else None

    def _refuse_nested(self, session: Session, paths, exclude: ModelRow | ModelSpec | None,
                       owner: str | None) -> None:
        for p in paths:
            if other := self._nested(session, p.cluster, p.path, exclude, owner):
                raise InvalidInputError(f"path {p.path} in workspace {p.workspace!r} nests with {other}'s path: a "
                                        "model path may not be inside, or contain, another's; choose another --subpath")

    # -- models ----------------------------------------------------------------------------

    @staticmethod
    def _usage(s: Session, workspaces: Sequence[Workspace]) -> dict[str, dict[str, int]]:
        """`planning.workspace_usage` of the live models: a path not measured yet counts at its model's size, a
        shared copy not measured yet (being filled) at its files'."""
        paths = s.execute(select(LocalPathRow.workspace, LocalPathRow.path,
                                 func.coalesce(LocalPathRow.size_bytes, ModelRow.size_bytes), LocalPathRow.artifact_id)
                          .join(ModelRow).where(ModelRow.deletion_time.is_(None),
                                                LocalPathRow.workspace.in_([w.name for w in workspaces])))
        copies = [(cluster, volume, size if size is not None else sum(f.get("size") or 0 for f in files or ()))
                  for cluster, volume, size, files in s.execute(select(  # a manifest is read only while unmeasured
                      ArtifactRow.cluster, ArtifactRow.volume, ArtifactRow.size_bytes,
                      case((ArtifactRow.size_bytes.is_(None), ArtifactRow.files))))]
        return workspace_usage(workspaces, list(paths), copies)

    def workspace_usage(self, workspaces: Sequence[Workspace]) -> dict[str, dict[str, int]]:
        """Bytes each workspace stores (`storedBytes`) and would store without sharing."""
        with self._tx() as s:
            return self._usage(s, workspaces)

    def create_model(self, spec: ModelSpec, plan: Plan, workspaces: Sequence[Workspace] = (),
                     names_others: bool = True, sees: Callable[[Model], bool] | None = None,
                     max_models: int | None = None) -> Model:
        """Record a new Pending model with one Pending entry per planned path.

        Refused with `ResourceProcessing` while a deleting model still holds a target path, with
        `AlreadyExists` when the name is taken (unless by this very request repeated: `request_key`, and then that
        model is the answer; by a model the declarer may not see, `sees`, saying neither whose nor in which
        phase) or live models hold every target path, and with
        `InsufficientCapacity` when its pinned size would take a workspace of `workspaces` past its
        `capacity_bytes` (decided in the transaction that records it, so two creations never both fit), and with
        `QuotaExceeded` when its owner already holds `max_models` models (Deleting ones too: until released).
        """
        now = utcnow()
        with self._tx(path_lock=True) as s:
            existing = s.scalars(select(ModelRow).where(ModelRow.name == spec.name)).first()
            if existing is not None:
                if spec.request_key and existing.request_key == spec.request_key and existing.phase != DELETING:
                    return _view(existing)
                if sees is not None and not sees(_view(existing)):
                    raise ConflictError(f"the name {spec.name!r} is taken; choose another", "AlreadyExists")
                if existing.phase == DELETING:
                    raise ConflictError(f"model {spec.name!r} is still being deleted; create it again once it is released", "ResourceProcessing")
                raise ConflictError(f"model {spec.name!r} already exists; choose another name, or delete "
                                    "that model first", "AlreadyExists")
            if max_models is not None:
                held = s.scalar(select(func.count()).select_from(ModelRow)
                                .where(ModelRow.owner_name == spec.owner_name))
                if held >= max_models:
                    raise ConflictError(f"user {spec.owner_name!r} holds {held} models, the most they may "
                                        f"({max_models}, max_models); delete some first (a model being deleted counts "
                                        "until it is released)", "QuotaExceeded")
            self._refuse_nested(s, plan.paths, spec, None if names_others else spec.owner_name)

            def who(holder: str) -> str:  # another owner's model is named only where `names_others`
                owner = s.scalar(select(ModelRow.owner_name).where(ModelRow.name == holder))
                return named(holder, not names_others and owner != spec.owner_name)

            taken = []
            for p in plan.paths:
                decision, holder = path_decision(self._owners(s, p.cluster, p.path, spec))
                if decision == "wait":
                    raise ConflictError(
                        f"path {p.path} in workspace {p.workspace!r} is still being cleaned up by deleted "
                        f"{who(holder)}; retry once it is released", "ResourceProcessing")
                if decision == "taken":
                    taken.append((p, holder))
            if plan.paths and len(taken) == len(plan.paths):
                p, holder = taken[0]
                raise ConflictError(f"{who(holder)} already owns {p.path} in workspace {p.workspace!r}; give this "
                                    "model another subpath", "AlreadyExists")
            self._check_capacity(s, spec, plan, workspaces)
            row = ModelRow(
                name=spec.name, owner_name=spec.owner_name, owner_uid=spec.owner_uid, source=spec.source,
                repo_id=spec.repo_id, revision=spec.revision, token_block=spec.token_block, targets=spec.targets,
                subpath=spec.subpath, download_policy=spec.download_policy, keep_files=spec.keep_files,
                include_patterns=spec.include, exclude_patterns=spec.exclude, track=spec.track, commit=spec.commit,
                files=spec.files,
                size_bytes=sum(f["size"] for f in spec.files or ()), staging_uri=spec.source_uri, phase=PENDING,
                message="; ".join(plan.skipped), created_at=now, updated_at=now,
                cleanup_attempts=0, request_key=spec.request_key,
            )
            row.paths = [LocalPathRow(workspace=p.workspace, cluster=p.cluster, path=p.path, status=PENDING, message="",
                                      bytes_done=0, bytes_total=0, owned=False, updated_at=now) for p in plan.paths]
            s.add(row)
            try:
                s.flush()
            except IntegrityError:
                raise ConflictError(f"model {spec.name!r} already exists; choose another name, or delete "
                                    "that model first", "AlreadyExists") from None
            return _view(row)

    def _check_capacity(self, s: Session, spec: ModelSpec, plan: Plan, workspaces: Sequence[Workspace]) -> None:
        limited = {w.name: w.capacity_bytes for w in workspaces if w.capacity_bytes is not None}
        wanted = {p.workspace for p in plan.paths} & limited.keys()
        if not wanted:
            return
        usage = self._usage(s, workspaces)
        adding = sum(f["size"] for f in spec.files or ())
        for name in sorted(wanted):
            if problem := capacity_problem(name, limited[name], usage[name]["storedBytes"], adding):
                raise ConflictError(f"model {spec.name!r} refused: {problem}; free space there (delete models) or "
                                    "raise its capacity_bytes", "InsufficientCapacity")

    def update_model(self, name: str, plan: Plan, subpath: str | None, download_policy: str) -> Model:
        """Move a live model: entries the new plan keeps stay, new ones are added Pending, the others are
        retired (cleaned by the next ensure once the new paths are Ready). Its phase becomes Pending. A switch's
        pending commit and a revision asked for stay (the switch goes on once it is Ready again): the pending
        commit is what tells a link a killed switch renamed to its copy from someone else's."""
        now = utcnow()
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            if row.phase == DELETING:
                raise ConflictError(f"model {name!r} is being deleted; it cannot be changed", "ResourceProcessing")
            for p in plan.paths:
                decision, holder = path_decision(self._owners(s, p.cluster, p.path, row))
                if decision == "wait":
                    raise ConflictError(f"path {p.path} is still being cleaned up by deleted model {holder!r}",
                                        "ResourceProcessing")
            wanted = {(p.cluster, p.path): p for p in plan.paths}
            known = {(e.cluster, e.path) for e in row.paths}  # new paths must not nest with its old ones either
            self._refuse_nested(s, [p for p in plan.paths if (p.cluster, p.path) not in known], None, None)
            for entry in row.paths:
                entry.retired = (entry.cluster, entry.path) not in wanted
                wanted.pop((entry.cluster, entry.path), None)
            row.paths.extend(LocalPathRow(workspace=p.workspace, cluster=p.cluster, path=p.path, status=PENDING,
                                          message="", bytes_done=0, bytes_total=0, owned=False, updated_at=now)
                             for p in wanted.values())
            row.subpath, row.download_policy = subpath, download_policy
            row.phase, row.message, row.updated_at = PENDING, "moving to new paths", now
            s.flush()
            return _view(row)

    def get_model(self, name: str) -> Model:
        with self._tx() as s:
            return _view(self._model(s, name, lock=False))

    def find_model(self, name: str) -> Model | None:
        try:
            return self.get_model(name)
        except NotFoundError:
            return None

    def list_models(self, include_deleting: bool = False, phase: str | None = None,
                    workspace: str | None = None) -> list[Model]:
        with self._tx() as s:
            query = select(ModelRow).options(selectinload(ModelRow.paths)).order_by(ModelRow.name)
            if not include_deleting:
                query = query.where(ModelRow.deletion_time.is_(None))
            if phase:
                query = query.where(ModelRow.phase == phase)
            if workspace:
                query = query.where(ModelRow.paths.any(LocalPathRow.workspace == workspace))
            return _views(s, list(s.scalars(query)))

    def reconcile_state(self, track_interval: float = 3600) -> tuple[list[Model], dict[str, RunLease]]:
        """The models a pass may have to drive (those not Ready or Failed, those a run lease names, and Ready ones
        due for a run that asks for their next commit or finishes a pending switch: `updates.update_due`) with
        their paths and leases, and the run leases by model name, in three queries whatever the count (plain rows: no
        ORM object is built). A settled model costs nothing here: its copies are read by `own_copies`."""
        with self._tx() as s:
            leases: dict[str, dict[int, Lease]] = {kind: {} for kind in Kind}
            for lease in s.scalars(select(LeaseRow).where(LeaseRow.kind.in_([Kind.RUN, Kind.PATH, Kind.STAGING]))):
                leases[lease.kind][lease.key] = as_lease(lease)
            driven = or_(ModelRow.phase.not_in((READY, FAILED)), ModelRow.id.in_(list(leases[Kind.RUN]) or [-1]),
                         update_due(utcnow(), track_interval))
            models = s.execute(select(ModelRow.__table__).where(driven).order_by(ModelRow.name)).all()
            rows = _with_paths(s, models, LocalPathRow.model_id.in_(select(ModelRow.id).where(driven)))
            runs = {m.name: RunLease(m.name, m.phase, leases[Kind.RUN][m.id]) for m in rows if m.id in leases[Kind.RUN]}
            return _views(s, rows, leases), runs

    def recorded_paths(self) -> list[str]:
        """Every path a model (deleting ones too) or a shared copy records, in one query."""
        with self._tx() as s:
            return list(s.scalars(select(LocalPathRow.path).union_all(select(ArtifactRow.path))))

    def set_phase(self, name: str, phase: str, message: str = "") -> Model:
        """Set a live model's phase; a deleting model keeps `Deleting`."""
        with self._tx() as s:
            row = self._model(s, name)
            if row.phase != DELETING:
                row.phase, row.message, row.updated_at = phase, scrub_message(message), utcnow()
            return _view(row)

    def retry_model(self, name: str, seen: Model | None = None) -> Model:
        """Make a Failed model Pending again, with its failed paths; refused in any other phase. With `seen`, as
        `mark_deleting`."""
        with self._tx() as s:
            row = self._model(s, name, seen=seen)
            if row.phase != FAILED:
                raise ConflictError(f"model {name!r} is {row.phase}; only a Failed model can be retried", "NotFailed")
            row.phase, row.message, row.updated_at = PENDING, "retry requested", utcnow()
            for p in row.paths:
                if p.status == FAILED:
                    p.status, p.message, p.updated_at = PENDING, "retry requested", row.updated_at
            return _view(row)

    def set_message(self, name: str, message: str, live: bool = False, replacing: str | None = None) -> bool:
        """Set the model's message; with `live`, only while it is not being deleted, and with `replacing`, only over
        a message that begins so (False: nothing written)."""
        with self._tx() as s:
            row = self._model(s, name)
            if live and row.phase == DELETING or replacing is not None and not row.message.startswith(replacing):
                return False
            row.message, row.updated_at = scrub_message(message), utcnow()
            return True

    def set_snapshot(self, name: str, commit: str, files: list[dict], source_uri: str | None = None) -> Model:
        """Pin the commit and files; `source_uri` records an s3:// source as where the files are (never ours)."""
        with self._tx() as s:
            row = self._model(s, name)
            row.commit, row.files, row.updated_at = commit, files, utcnow()
            row.size_bytes = sum(f["size"] for f in files)
            if source_uri:
                row.staging_uri, row.staging_owned = source_uri, False
            return _view(row)

    # -- S3 staging ------------------------------------------------------------------------

    def claim_staging(self, name: str, uri: str, holder: Holder, lease_seconds: float) -> Claim:
        """Take the model's staging lease and record `uri` as its own staged copy, unless the model is
        deleting, another run's lease is fresh (`busy`), or a deleting model still removes the same
        prefix (`wait`). Phase becomes Staging."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            if row.phase == DELETING:
                return Claim("deleting")
            if busy := self._blocker(s, Kind.STAGING, row.id, holder):
                return Claim("busy", busy.describe())
            other = s.execute(select(ModelRow.name, ModelRow.owner_name).where(
                ModelRow.staging_uri == uri, ModelRow.staging_owned.is_(True), ModelRow.phase == DELETING,
                ModelRow.id != row.id)).first()
            if other:
                return Claim("wait", other.name, other.owner_name != row.owner_name)
            self._take(s, Kind.STAGING, row.id, holder, lease_seconds)
            row.staging_uri, row.staging_owned = uri, True
            row.phase, row.message = STAGING, f"staging {row.repo_id}@{(row.commit or '')[:12]} to {uri}"
            return Claim("claimed")

    def staging_progressed(self, name: str, holder: Holder, message: str) -> bool:
        """Record how far the staging got; False when it must stop (deleting, or taken over)."""
        with self._tx() as s:
            row = self._model(s, name)
            if row.phase == DELETING or not self._holds(s, Kind.STAGING, row.id, holder):
                return False
            row.message, row.updated_at = scrub_message(message), utcnow()
            return True

    def release_staging(self, name: str, holder: Holder) -> None:
        with self._tx() as s:
            self._drop(s, Kind.STAGING, self._model(s, name).id, holder)

    def staging_in_use_elsewhere(self, name: str) -> str | None:
        """Another live model that records the same staged prefix (so it must be kept)."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name, lock=False)
            if not row.staging_uri:
                return None
            return s.scalars(select(ModelRow.name).where(
                ModelRow.staging_uri == row.staging_uri, ModelRow.phase != DELETING, ModelRow.id != row.id)).first()

    def clear_staging(self, name: str) -> None:
        """The staged prefix is gone (or left to another model): the model no longer holds it."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            row.staging_uri, row.staging_owned, row.updated_at = None, False, utcnow()

    def mark_deleting(self, name: str, seen: Model | None = None) -> Model:
        """Mark a model Deleting (idempotent). From here on it never becomes live again. With `seen`, only that
        model: one declared since under the same name answers as if it did not exist."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name, seen=seen)
            if row.phase != DELETING:
                row.phase, row.message = DELETING, "deletion requested: stopping downloads"
                row.deletion_time = row.updated_at = utcnow()
            return _view(row)

    def cleanup_failed(self, name: str, attempt: int, message: str, path_id: int | None = None,
                       holder: Holder | None = None) -> None:
        """A cleanup of the model failed: its `attempt`-th (idempotent: recorded again, it counts once). With a
        path, the path keeps Cleaning with the message and `holder` releases its lease."""
        with self._tx() as s:
            row = self._model(s, name)
            if attempt > row.cleanup_attempts:
                self._add(s, CLEANUP_FAILURES)
            row.cleanup_attempts = max(row.cleanup_attempts, attempt)
            row.message, row.updated_at = scrub_message(message), utcnow()
            if path_id is not None and self._holds(s, Kind.PATH, path_id, holder):
                p = self._path(row, path_id)
                p.message, p.updated_at = row.message, row.updated_at
                self._drop(s, Kind.PATH, path_id)

    def release_model(self, name: str) -> bool:
        """Remove a deleting model's row once no local path is left; False if some remain."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            if row.phase != DELETING:
                raise ConflictError(f"model {name!r} is {row.phase}, not Deleting: it cannot be released", "NotDeleting")
            if row.paths or (row.staging_owned and row.staging_uri):
                return False
            self._drop(s, Kind.RUN, row.id)
            self._drop(s, Kind.STAGING, row.id)
            s.delete(row)
            return True

    # -- local paths -----------------------------------------------------------------------

    def path_in_use_elsewhere(self, name: str, path_id: int) -> str | None:
        """The name of another live model that owns the same directory, if any (one whose download failed before
        it made anything there holds nothing: a tokenless model of a gated repository never keeps its files)."""
        with self._tx() as s:
            row = self._model(s, name, lock=False)
            p = self._path(row, path_id)
            live = [n for n, deleting in self._owners(s, p.cluster, p.path, row, share=False, holding=True)
                    if not deleting]
            return live[0] if live else None

    def claim_download(self, name: str, path_id: int, holder: Holder, lease_seconds: float) -> Claim:
        """Take a path for downloading, unless the model is deleting, another worker's lease on the
        entry is fresh, another model owns the directory (deleting: wait; live: taken) or its path nests
        with another model's (`nested`)."""
        with self._tx(path_lock=True) as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if row.phase == DELETING:
                return Claim("deleting")
            if busy := self._blocker(s, Kind.PATH, p.id, holder):
                return Claim("busy", busy.describe())
            decision, other = path_decision(self._owners(s, p.cluster, p.path, row))
            if decision != "free":
                owner = s.scalar(select(ModelRow.owner_name).where(ModelRow.name == other))
                return Claim(decision, other, owner != row.owner_name)
            if nested := self._nested(s, p.cluster, p.path, row, row.owner_name):
                return Claim("nested", nested)
            self._take(s, Kind.PATH, p.id, holder, lease_seconds, "download")
            p.status, p.owned, p.updated_at = DOWNLOADING, True, utcnow()
            return Claim("claimed")

    def claim_cleanup(self, name: str, path_id: int, holder: Holder, lease_seconds: float) -> bool:
        """Take a deleting model's (or a retired) path for cleanup unless another worker's lease is fresh."""
        with self._tx() as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if (row.phase != DELETING and not p.retired) or \
                    self._take(s, Kind.PATH, p.id, holder, lease_seconds, CLEANUP):
                return False
            p.status, p.updated_at = CLEANING, utcnow()
            return True

    def path_progressed(self, name: str, path_id: int, holder: Holder, bytes_done: int | None = None,
                        bytes_total: int | None = None, message: str | None = None) -> bool:
        """Record a path's progress (the lease is renewed apart); False when the work must stop (the model is
        being deleted, or another run took the path over)."""
        with self._tx() as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if (row.phase == DELETING and p.status != CLEANING) or not self._holds(s, Kind.PATH, p.id, holder):
                return False
            p.updated_at = utcnow()
            if bytes_done is not None:
                p.bytes_done = bytes_done
            if bytes_total is not None:
                p.bytes_total = bytes_total
            if message is not None:
                p.message = scrub_message(message)
            return True

    def path_downloaded(self, name: str, path_id: int, holder: Holder | None, size_bytes: int, message: str) -> bool:
        """The path is complete (Ready, `size_bytes`); its lease is released. False, and nothing recorded, unless
        `holder` still holds the path: a run whose lease was dropped (by a delete, or another run's end) or taken
        has nothing to vouch for. `holder` None: every file was just hashed here, whoever holds it."""
        return self._finish(name, path_id, holder, READY, message, size_bytes)

    def path_failed(self, name: str, path_id: int, holder: Holder | None, message: str) -> None:
        """The path's work failed for good (Failed); its lease is released. `holder` None: refused before any
        run held it."""
        self._finish(name, path_id, holder, FAILED, message)

    def path_stopped(self, name: str, path_id: int, holder: Holder, message: str) -> None:
        """The path's work stopped before the end and is to be resumed (Pending); its lease is released."""
        self._finish(name, path_id, holder, PENDING, message)

    def _finish(self, name: str, path_id: int, holder: Holder | None, status: str, message: str,
                size_bytes: int | None = None) -> bool:
        """Record the outcome of a path's work and release its lease, unless another run holds the path. A run's
        outcome (`holder`) counts only while it holds the lease, or, with no lease left, for a path not Ready (a
        Ready already recorded with that size answers True: a retried call). Without `holder` (refused before a
        claim, or hashed here whole), it counts unless another run works on the path. False when nothing was
        recorded."""
        with self._tx() as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            lease = self._lease_row(s, Kind.PATH, p.id)
            if holder is None:
                if lease is not None and not abandoned(as_lease(lease), utcnow(), this_host()):
                    return False
            elif lease is None:
                if p.status == READY or status == READY:
                    return status == p.status == READY and p.size_bytes == size_bytes
            elif not held_by(lease, holder):
                return False
            p.status, p.message, p.updated_at = status, scrub_message(message), utcnow()
            if size_bytes is not None:
                p.size_bytes = p.bytes_done = size_bytes
            self._drop(s, Kind.PATH, p.id)
            return True

    def fail_over(self, name: str, path_id: int, workspace: str, limit: int) -> bool:
        """Move a path whose job crashed to another workspace (same cluster and volume root, so the same
        directory), at most `limit` times per path; False when the attempts are used up or the model is
        deleting. A crashed job's lease is kept: the new job waits until it lapses."""
        with self._tx() as s:
            row = self._model(s, name)
            p = self._path(row, path_id)
            if row.phase == DELETING or p.failover_attempts >= limit:
                return False
            p.failover_attempts += 1
            p.message = (f"the job in workspace {p.workspace!r} crashed; moved to workspace {workspace!r} "
                         f"(failover {p.failover_attempts} of {limit})")
            p.workspace, p.status, p.updated_at = workspace, PENDING, utcnow()
            return True

    def set_path_made(self, name: str, path_id: int, holder: Holder, made: str) -> bool:
        """Record what this path's run made at it (before it writes anything there); False when the run no
        longer holds the path."""
        with self._tx() as s:
            p = self._path(self._model(s, name), path_id)
            if not self._holds(s, Kind.PATH, p.id, holder):
                return False
            p.made = made
            return True

    def set_path_verified(self, name: str, path_id: int, status: str) -> None:
        with self._tx() as s:
            p = self._path(self._model(s, name), path_id)
            p.status, p.verified_at = status, utcnow()

    def set_path_message(self, name: str, path_id: int, status: str, message: str) -> None:
        with self._tx() as s:
            p = self._path(self._model(s, name), path_id)
            p.status, p.message, p.updated_at = status, scrub_message(message), utcnow()

    def remove_path(self, name: str, path_id: int) -> None:
        """Drop a path entry of a deleting model (or a retired one): call only once its directory is gone."""
        with self._tx() as s:
            row = self._model(s, name)
            if row.phase != DELETING and not self._path(row, path_id).retired:
                raise ConflictError(f"model {name!r} is not being deleted; its paths stay", "NotDeleting")
            s.execute(delete(LocalPathRow).where(LocalPathRow.id == path_id, LocalPathRow.model_id == row.id))
            self._drop(s, Kind.PATH, path_id)



DISCONNECT_RETRIES = 3


# Writes whose second run after a committed first one would answer differently (or count twice): never
# retried, since a connection cut during COMMIT leaves unknown whether the first one landed.
NOT_IDEMPOTENT = frozenset({"create_model", "update_model", "retry_model", "release_model", "fail_over",
                            "delete_artifact", "record"})


def _retry_on_disconnect(method):
    """Run an idempotent registry method again when its connection was cut (a database restart or failover, a
    killed backend). Each method is one transaction, rolled back with the connection, so a retry never sees
    half of it; the pool replaces the dead connection."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        for attempt in range(1, DISCONNECT_RETRIES + 1):
            try:
                return method(*args, **kwargs)
            except DBAPIError as e:
                if not e.connection_invalidated or attempt == DISCONNECT_RETRIES:
                    raise
                time.sleep(0.2 * attempt)

    return run


for _name, _method in inspect.getmembers(Registry, inspect.isfunction):
    if not _name.startswith("_") and _name not in NOT_IDEMPOTENT:
        setattr(Registry, _name, _retry_on_disconnect(_method))
