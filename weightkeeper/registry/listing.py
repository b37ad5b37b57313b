"""The paginated, filtered model list (keyset pagination).

A page is the next `limit` models after the cursor's position in a stable order: the sort key, then the model
name where the key is not unique (never its id: ids count every model declared, so a cursor holding one would tell
a user how many models others declared between two of theirs). Who may see a model is decided in SQL (the rule of
`tenancy.visible`), so a page is full and a cursor walk never skips or repeats a model that stays. The cursor is
opaque: urlsafe base64 of JSON holding the sort, a hash of the filters, and the last model's key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal, get_args

from sqlalchemy import ColumnElement, Select, and_, func, literal, not_, or_, select, true, tuple_
from sqlalchemy.dialects.postgresql import array

from weightkeeper.errors import InvalidInputError, NotFoundError
from weightkeeper.registry.schema import LocalPathRow, ModelRow

if TYPE_CHECKING:
    from weightkeeper.registry.store import Model

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
SORT_KEYS = {"name": (ModelRow.name,), "created": (ModelRow.created_at, ModelRow.name),  # names are unique
             "size": (ModelRow.size_bytes, ModelRow.name)}
Sort = Literal["name", "-name", "created", "-created", "size", "-size"]  # `-`: descending
SORTS: tuple[str, ...] = get_args(Sort)


@dataclass(frozen=True)
class ListQuery:
    """Which models, in which order. `search` is a case-insensitive substring of the name or the source."""

    workspace: str | None = None
    phase: str | None = None
    owner: str | None = None
    search: str | None = None
    sort: Sort = "name"
    include_deleting: bool = False

    def digest(self) -> str:
        """What a cursor is bound to besides the sort: the filters."""
        filters = [self.workspace, self.phase, self.owner, self.search, self.include_deleting]
        return hashlib.sha256(json.dumps(filters).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Viewer:
    """Whose list: `name` sees their own models and those with a target or an entry in a `public` workspace, and
    searches only the sources shown to them; None sees every model (an admin)."""

    name: str | None
    public: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Page:
    items: list[Model]
    next_cursor: str | None  # None: this was the last page


def _key(model: Model, sort: str) -> list:
    return {"name": [model.name], "created": [model.created_at.isoformat(), model.name],
            "size": [model.size_bytes, model.name]}[sort.lstrip("-")]


def encode_cursor(query: ListQuery, model: Model) -> str:
    """The cursor of the page after `model`."""
    raw = json.dumps({"s": query.sort, "f": query.digest(), "k": _key(model, query.sort)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, query: ListQuery) -> list:
    """The key values a cursor holds, checked against the query it must belong to."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        sort, digest, key = raw["s"], raw["f"], raw["k"]
        kinds = {"name": (str,), "created": (str, str), "size": (int, str)}[sort.lstrip("-")]
        if type(key) is not list or len(key) != len(kinds) or any(type(v) is not t for v, t in zip(key, kinds)):
            raise ValueError(key)
        if any(v >= 1 << 63 or v < -(1 << 63) if type(v) is int else "\x00" in v or not v.encode()
               for v in key):  # encode(): a lone surrogate is no UTF-8 (UnicodeEncodeError is a ValueError)
            raise ValueError(key)  # no column holds it: a forged cursor
        if sort.lstrip("-") == "created":
            key[0] = datetime.fromisoformat(key[0])
    except (binascii.Error, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise InvalidInputError("cursor: not a cursor of this list; start again without `cursor`") from None
    if sort != query.sort or digest != query.digest():
        raise InvalidInputError(f"cursor: made for another sort or other filters (this list: sort={query.sort!r}); "
                                "repeat the request that gave it, or start again without `cursor`")
    return key


MANIFESTS = ("files", "pending_files")  # up to `max_manifest_files` entries each: a page never fetches them


class ListOps:
    """Mixed into `Registry` (uses its `_tx` and `engine`)."""

    def list_page(self, query: ListQuery, viewer: Viewer, limit: int = DEFAULT_LIMIT,
                  cursor: str | None = None) -> Page:
        """One page of the models `viewer` may see that match `query`, after `cursor` (None: the first page)."""
        if query.sort not in SORTS:
            raise InvalidInputError(f"sort: {query.sort!r} is not one of {', '.join(SORTS)}")
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidInputError(f"limit: {limit} is not between 1 and {MAX_LIMIT}")
        keys, descending = SORT_KEYS[query.sort.lstrip("-")], query.sort.startswith("-")
        stmt = self._shown().where(*self._matching(query, viewer))
        if cursor is not None:
            after = tuple_(*map(literal, decode_cursor(cursor, query), (k.type for k in keys)))
            stmt = stmt.where(tuple_(*keys) < after if descending else tuple_(*keys) > after)
        stmt = stmt.order_by(*(k.desc() if descending else k for k in keys)).limit(limit + 1)
        with self._tx() as s:
            models = s.execute(stmt).all()
            items = self._views_shown(s, models[:limit])
        return Page(items, encode_cursor(query, items[-1]) if len(models) > limit else None)

    def shown_model(self, name: str) -> Model:
        """The model of that name as a page shows it: without its manifests (they may hold `max_manifest_files`
        entries each, that an answer never shows)."""
        with self._tx() as s:
            if not (models := s.execute(self._shown().where(ModelRow.name == name)).all()):
                raise NotFoundError(f"model {name!r} does not exist")
            return self._views_shown(s, models)[0]

    def _shown(self) -> Select:
        """The models' columns but their manifests, and whether a manifest is recorded: plain rows, no ORM objects."""
        columns = [c for c in ModelRow.__table__.c if c.name not in MANIFESTS]
        return select(*columns, self._has_manifest().label("has_manifest"))

    @staticmethod
    def _views_shown(s, models: list) -> list[Model]:
        """Views of `_shown` rows, with their paths: no manifest, [] saying there is one (as `sizeBytes` needs)."""
        from weightkeeper.registry.store import _views, _with_paths  # store mixes this class in

        rows = _with_paths(s, models, LocalPathRow.model_id.in_([m.id for m in models]))
        for row in rows:
            row.files, row.pending_files = [] if row.has_manifest else None, None
        return _views(s, rows)

    def _has_manifest(self) -> ColumnElement[bool]:
        """The model's manifest is recorded (a JSON array, not JSON null), told in the database by its first token."""
        if self.engine.dialect.name == "postgresql":
            return func.json_typeof(ModelRow.files) == "array"
        return func.substr(ModelRow.files, 1, 1) == "["

    def _matching(self, query: ListQuery, viewer: Viewer) -> list[ColumnElement[bool]]:
        """The WHERE clauses of the query as `viewer` sees it."""
        sees_all = viewer.name is None
        mine = true() if sees_all else ModelRow.owner_name == viewer.name
        where = [self._visible(viewer)]
        if not query.include_deleting:
            where.append(ModelRow.deletion_time.is_(None))
        if query.phase:
            where.append(ModelRow.phase == query.phase)
        if query.owner:
            where.append(ModelRow.owner_name == query.owner)
        if query.workspace:  # only by the entries the viewer sees: others' entries in private workspaces do not count
            entry = ModelRow.paths.any(LocalPathRow.workspace == query.workspace)
            where.append(entry if sees_all or query.workspace in viewer.public else and_(mine, entry))
        if query.search:  # others' S3 sources are storage locations, not shown: not searched either
            source_shown = or_(mine, not_(ModelRow.source.startswith("s3://")))
            where.append(or_(ModelRow.name.icontains(query.search, autoescape=True),
                             and_(source_shown, ModelRow.source.icontains(query.search, autoescape=True))))
        return where

    def _visible(self, viewer: Viewer) -> ColumnElement[bool]:
        """`tenancy.visible` in SQL: own models, and those with a target (or, none named, any) or an entry in a
        public workspace."""
        if viewer.name is None:
            return true()
        public = sorted(viewer.public)
        if not public:
            return ModelRow.owner_name == viewer.name
        if self.engine.dialect.name == "postgresql":
            no_targets = or_(ModelRow.targets.is_(None), func.jsonb_typeof(ModelRow.targets) == "null")
            targets = ModelRow.targets.op("?|")(array(public))
        else:
            no_targets = or_(ModelRow.targets.is_(None), func.json_type(ModelRow.targets) == "null")
            named = func.json_each(ModelRow.targets).table_valued("value")
            targets = select(literal(1)).select_from(named).where(named.c.value.in_(public)).exists()
        return or_(ModelRow.owner_name == viewer.name, no_targets, targets,
                   ModelRow.paths.any(LocalPathRow.workspace.in_(public)))
