"""The paginated model list: cursor walks, filters, sorts, limits, and who sees what, through the API in process
(and the CLI's `model list`). The registry is SQLite or, with WK_TEST_DB=postgresql, the real PostgreSQL."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from conftest import Env, tenants
from fastapi.testclient import TestClient
from sqlalchemy import text, update

pytestmark = pytest.mark.without_prefect_server
TOKENS = {"alice": "alice-token", "bob": "bob-token", "root": "root-token"}


class Listing:
    """An API over a registry with one public workspace (team-a) and a private one each for alice and bob."""

    def __init__(self, env: Env):
        from weightkeeper.api import create_app

        self.env, self.settings, self.registry = env, env.settings, env.registry
        self.client = TestClient(create_app(self.settings, self.registry), raise_server_exceptions=False)

    def add(self, name: str, owner: str = "alice", spaces: tuple[str, ...] = ("team-a",),
            targets: list[str] | None = None, source: str | None = None):
        """A model with an entry in each of `spaces` (targets: the spaces unless given; None: every public one)."""
        from weightkeeper.planning import Plan, PlannedPath
        from weightkeeper.registry import ModelSpec

        paths = tuple(PlannedPath(ws, "local", f"{self.env.volumes[ws]}/models/{name}") for ws in spaces)
        spec = ModelSpec(name, owner, 1000, source or f"hf://acme/{name}", f"acme/{name}", "main",
                         targets=list(spaces) if targets is None and spaces else targets)
        return self.registry.create_model(spec, Plan(paths, ()))

    def remove(self, name: str) -> None:
        self.registry.mark_deleting(name)
        for p in self.registry.get_model(name).local_paths:
            self.registry.remove_path(name, p.id)
        assert self.registry.release_model(name)

    def get(self, user: str = "alice", **params):
        return self.client.get("/api/v1/models", params=params, headers={"Authorization": f"Bearer {TOKENS[user]}"})

    def names(self, user: str = "alice", **params) -> list[str]:
        """Every name of the list, page by page."""
        names, cursor = [], None
        while True:
            r = self.get(user, **params, **({"cursor": cursor} if cursor else {}))
            assert r.status_code == 200, r.text
            names += [m["name"] for m in r.json()["items"]]
            if (cursor := r.json()["nextCursor"]) is None:
                return names


@pytest.fixture
def listing(tmp_path, registry_base_url):
    return Listing(tenants(tmp_path, registry_base_url, {user: "admin = true\n" if user == "root" else ""
                                                          for user in TOKENS}))


def _tie(listing: Listing) -> None:
    """Give the models only three creation times and three sizes, so the sort key alone does not order them."""
    from weightkeeper.registry.common import utcnow
    from weightkeeper.registry.schema import ModelRow

    base = utcnow() - timedelta(days=1)
    with listing.registry.engine.begin() as conn:
        for k in range(3):
            conn.execute(update(ModelRow).where(ModelRow.id % 3 == k)
                         .values(created_at=base + timedelta(seconds=k), size_bytes=k << 20))


@pytest.mark.parametrize("sort", ["name", "-name", "created", "-created", "size", "-size"])
def test_a_cursor_walk_sees_each_model_once_while_models_are_created_and_deleted(listing, sort):
    for i in range(40):
        listing.add(f"m-{i:02d}", owner="alice" if i % 2 else "bob")
    _tie(listing)
    staying = {f"m-{i:02d}" for i in range(40)} - {f"m-{i:02d}" for i in range(0, 40, 5)}
    going, seen, cursor, page = [f"m-{i:02d}" for i in range(0, 40, 5)], [], None, 0
    while True:
        r = listing.get("bob", sort=sort, limit=6, **({"cursor": cursor} if cursor else {}))
        assert r.status_code == 200, r.text
        seen += [m["name"] for m in r.json()["items"]]
        if (cursor := r.json()["nextCursor"]) is None:
            break
        assert len(r.json()["items"]) == 6  # a page that is not the last is full
        page += 1
        for n in (f"n-{page:02d}", f"a-{page:02d}"):  # new models land before and after the cursor
            listing.add(n)
        if going:
            listing.remove(going.pop())  # some seen already, some not yet
        if going:
            listing.registry.mark_deleting(going.pop())  # deleting: out of the list too
    assert len(seen) == len(set(seen)), f"listed twice: {sorted(n for n in seen if seen.count(n) > 1)}"
    assert staying <= set(seen), f"never listed: {sorted(staying - set(seen))}"


def test_sort_orders(listing):
    for i in range(12):
        listing.add(f"m-{(i * 5) % 12:02d}")
    _tie(listing)
    models = listing.registry.list_models()
    name = sorted(m.name for m in models)
    created = [m.name for m in sorted(models, key=lambda m: (m.created_at, m.name))]
    size = [m.name for m in sorted(models, key=lambda m: (m.size_bytes, m.name))]
    for sort, expected in (("name", name), ("created", created), ("size", size)):
        assert listing.names(sort=sort, limit=5) == expected, sort
        assert listing.names(sort=f"-{sort}", limit=5) == expected[::-1], sort
    assert listing.names(limit=1) == name and listing.get(limit=1000).json()["nextCursor"] is None


def test_sizes_come_from_the_snapshot(listing):
    listing.add("small")
    listing.add("big")
    listing.add("unpinned")
    listing.registry.set_snapshot("small", "a" * 40, [{"path": "x", "size": 5}, {"path": "y", "size": 7}])
    listing.registry.set_snapshot("big", "b" * 40, [{"path": "x", "size": 1 << 40}])
    items = listing.get(sort="-size").json()["items"]
    assert [(m["name"], m["sizeBytes"]) for m in items] == [("big", 1 << 40), ("small", 12), ("unpinned", None)]


def test_filters(listing):
    listing.add("alpha", owner="alice", source="hf://acme/x_y")
    listing.add("beta", owner="bob", spaces=("team-a", "bob-ws"), source="hf://ACME/xzy")
    listing.add("gamma", owner="alice", spaces=("alice-ws",))
    listing.add("delta", owner="bob", spaces=("bob-ws",))
    listing.registry.set_phase("beta", "Ready")
    listing.registry.mark_deleting("delta")
    assert listing.names("root") == ["alpha", "beta", "gamma"]
    assert listing.names("root", includeDeleting="true") == ["alpha", "beta", "delta", "gamma"]
    assert listing.names("root", phase="Ready") == ["beta"]
    assert listing.names("root", phase="Deleting", includeDeleting="true") == ["delta"]
    assert listing.names("root", owner="alice") == ["alpha", "gamma"]
    assert listing.names("root", workspace="bob-ws") == ["beta"]
    assert listing.names("root", workspace="bob-ws", includeDeleting="true") == ["beta", "delta"]
    assert listing.names("root", search="ETA") == ["beta"]  # a substring of the name, in any case
    assert listing.names("root", search="acme/x") == ["alpha", "beta"]  # or of the source
    assert listing.names("root", search="x_y") == ["alpha"]  # LIKE's wildcards are plain characters
    assert listing.names("root", search="%") == [] and listing.names("root", search="\\") == []
    assert listing.names("root", owner="bob", search="acme", workspace="team-a", phase="Ready") == ["beta"]
    assert listing.get("root", phase="Gone").status_code == 422


def test_visibility_in_sql_is_the_rule_and_pages_stay_full(listing):
    from weightkeeper.tenancy import visible

    for i in range(30):  # a third of alice's models are private to her
        listing.add(f"m-{i:02d}", spaces=("alice-ws",) if i % 3 == 0 else ("team-a",))
    listing.add("by-target", spaces=(), targets=["team-a"])  # seen through a public target without an entry
    listing.add("by-default", spaces=(), targets=None)  # no target named: every public workspace
    listing.add("hidden-target", spaces=(), targets=["alice-ws"])
    listing.add("moved", spaces=("team-a",), targets=["alice-ws"])  # seen through a public entry
    listing.add("bobs", owner="bob", spaces=("bob-ws",))
    everything = listing.registry.list_models()
    for user in listing.settings.users:
        expected = sorted(m.name for m in everything if visible(m, user, listing.settings))
        assert listing.names(user.name, limit=4) == expected, user.name
    bob = listing.names("bob", limit=4)
    assert "hidden-target" not in bob and "m-00" not in bob and {"by-target", "by-default", "moved", "bobs"} <= set(bob)
    first = listing.get("bob", limit=4).json()
    assert len(first["items"]) == 4 and first["nextCursor"]


def test_the_workspace_filter_counts_only_the_entries_the_caller_sees(listing):
    listing.add("both", spaces=("team-a", "alice-ws"))
    assert listing.names("bob") == ["both"]
    assert listing.names("bob", workspace="alice-ws") == []
    assert listing.names("alice", workspace="alice-ws") == listing.names("root", workspace="alice-ws") == ["both"]


def test_search_reaches_only_the_sources_the_caller_is_shown(listing):
    listing.env.declare("alice-s3", "s3://data-src/alice/secret-thing/", workspaces=["team-a"])
    listing.add("bobs", owner="bob", source="hf://acme/secret-thing")
    assert listing.get("bob").json()["items"][0]["source"] is None  # redacted: an S3 prefix is storage
    assert listing.names("bob", search="secret-thing") == ["bobs"]
    for user in ("alice", "root"):
        assert listing.names(user, search="secret-thing") == ["alice-s3", "bobs"]


def _cursor(raw: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")


def test_limits_and_bad_cursors_answer_422_in_one_line(listing):
    for i in range(3):
        listing.add(f"m-{i}")
    by_name = listing.get(limit=1).json()["nextCursor"]
    in_team = listing.get(limit=1, workspace="team-a").json()["nextCursor"]
    assert listing.get(limit=1, cursor=by_name).json()["items"][0]["name"] == "m-1"
    for params, why in (
            ({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"limit": -1}, "limit"), ({"limit": "x"}, "limit"),
            ({"sort": "owner"}, "sort"), ({"cursor": "!!"}, "cursor"), ({"cursor": "abc"}, "cursor"),
            ({"cursor": _cursor({"s": "name", "f": "x", "k": [1]})}, "not a cursor of this list"),
            ({"cursor": _cursor({"s": "created", "k": ["yesterday", 1]})}, "not a cursor of this list"),
            ({"cursor": _cursor(["name"])}, "not a cursor of this list"),
            ({"cursor": _cursor({"s": "name", "f": "x", "k": "m"})}, "not a cursor of this list"),
            ({"cursor": by_name, "sort": "size"}, "another sort or other filters"),
            ({"cursor": by_name, "sort": "-name"}, "another sort or other filters"),
            ({"cursor": in_team}, "another sort or other filters"),
            ({"cursor": by_name, "search": "m"}, "another sort or other filters")):
        r = listing.get(**params)
        assert r.status_code == 422 and r.json()["code"] == "Invalid", params
        assert why in r.json()["message"] and "\n" not in r.json()["message"], r.json()
    assert len(listing.get(limit=1000).json()["items"]) == 3


@pytest.mark.parametrize("sort, key", [("size", [10 ** 30, "m"]), ("size", [-(10 ** 25), "m"]),
                                       ("-size", [2 ** 63, "m"]), ("created", ["2026-12-05T00:00:00+00:00", "m\x00"]),
                                       ("name", ["m\x00"]), ("name", ["\ud800"]), ("size", [0, "\ud800"]),
                                       ("created", ["2026-12-05T00:00:00+00:00", 7]), ("-size", [0, 1])])
def test_a_forged_cursor_that_no_column_could_hold_answers_422(listing, sort, key):
    """A cursor of this very list (its sort and filters) whose key no column holds: 422, not a database error."""
    for i in range(2):
        listing.add(f"m-{i}")
    real = listing.get(limit=1, sort=sort).json()["nextCursor"]
    raw = json.loads(base64.urlsafe_b64decode(real + "=" * (-len(real) % 4)))
    r = listing.get(limit=1, sort=sort, cursor=_cursor({**raw, "k": key}))
    assert r.status_code == 422 and "not a cursor of this list" in r.json()["message"], r.text


def test_a_page_or_a_models_answer_never_reads_the_manifests(listing):
    """A page, or a GET of one model, shows no manifest, so it fetches none: the API never decodes a model's file
    entries (up to `max_manifest_files` of them) to answer."""
    from sqlalchemy import event

    listing.add("m-0")
    listing.registry.set_snapshot("m-0", "a" * 40, [{"path": "x.safetensors", "size": 3, "blobId": "0" * 40}], None)
    alice = {"Authorization": f"Bearer {TOKENS['alice']}"}
    for answer in (lambda: listing.get().json()["items"][0],
                   lambda: listing.client.get("/api/v1/models/m-0", headers=alice).json()):
        statements: list[str] = []
        listen = lambda conn, cursor, sql, *rest: statements.append(sql)  # noqa: E731
        event.listen(listing.registry.engine, "before_cursor_execute", listen)
        try:
            item = answer()
        finally:
            event.remove(listing.registry.engine, "before_cursor_execute", listen)
        assert item["name"] == "m-0" and item["sizeBytes"] == 3, item
        columns = [{c.strip() for c in sql.split(" FROM ")[0].removeprefix("SELECT ").split(",")}
                   for sql in statements if "FROM models" in sql]  # a function of a column reads its first token only
        assert columns and not any({"models.files", "models.pending_files"} & read for read in columns), columns


def test_the_index_migration_backfills_sizes(tmp_path, pg_url_or_sqlite):
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    from weightkeeper.registry.store import MIGRATIONS

    engine = create_engine(pg_url_or_sqlite)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0006")
        for i, files in enumerate(('[{"path": "a", "size": 3}, {"path": "b", "size": 4}]', "null")):
            conn.execute(text("INSERT INTO models (name, owner_name, owner_uid, source, repo_id, revision, files, "
                              "targets, phase, message, created_at, updated_at, cleanup_attempts, download_policy, "
                              "keep_files, staging_owned) VALUES (:n, 'u', 1, 's', 'r', 'main', :f, 'null', 'Ready', "
                              "'', :t, :t, 0, 'always-download', false, false)"),
                         {"n": f"m{i}", "f": files, "t": "2026-01-01 00:00:00"})
        command.upgrade(config, "0007")
        assert conn.execute(text("SELECT name, size_bytes FROM models ORDER BY name")).all() == [("m0", 7), ("m1", 0)]
    engine.dispose()


def test_targets_keep_their_meaning_across_the_jsonb_migration(pg_url_or_sqlite):
    """Targets unset (SQL NULL or JSON null: every public workspace), naming a public workspace, or only a
    private one: the visibility rule reads each the same before and after 0011 (JSONB on PostgreSQL), and
    after a downgrade and an upgrade again."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    from weightkeeper.registry import open_registry
    from weightkeeper.registry.listing import ListQuery, Viewer
    from weightkeeper.registry.store import MIGRATIONS

    engine = create_engine(pg_url_or_sqlite)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0010")
        for name, targets in (("sql-null", None), ("json-null", "null"), ("public", '["team-a"]'),
                              ("private", '["bob-own"]')):
            conn.execute(text("INSERT INTO models (name, owner_name, owner_uid, source, repo_id, revision, targets, "
                              "phase, message, created_at, updated_at, cleanup_attempts, download_policy, keep_files, "
                              "staging_owned, size_bytes) VALUES (:n, 'bob', 1, 's', 'r', 'main', :g, 'Ready', '', "
                              ":t, :t, 0, 'always-download', false, false, 0)"),
                         {"n": name, "g": targets, "t": "2026-01-01 00:00:00"})
    viewer = Viewer("alice", frozenset({"team-a"}))

    def seen() -> list[str]:
        return [m.name for m in open_registry(pg_url_or_sqlite).list_page(ListQuery(), viewer).items]

    assert seen() == ["json-null", "public", "sql-null"]  # opening migrates to the head
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0010")
        command.upgrade(config, "head")
    assert seen() == ["json-null", "public", "sql-null"]
    engine.dispose()


@pytest.fixture
def pg_url_or_sqlite(tmp_path, request):
    import os

    if os.environ.get("WK_TEST_DB") == "postgresql":
        yield request.getfixturevalue("pg_url")
    else:
        yield f"sqlite:///{tmp_path / 'fresh.db'}"


def test_cli_list_streams_page_by_page_and_stops_at_limit(listing, capsys, monkeypatch):
    from weightkeeper import cli
    from weightkeeper.registry import Registry

    for i in range(130):
        listing.add(f"m-{i:03d}", owner="bob" if i % 2 else "alice")
    out, printed_before_each_page = [], []
    page = Registry.list_page

    def printed() -> str:
        out.append(capsys.readouterr().out)
        return "".join(out)

    def recorded(self, query, viewer, limit, cursor):
        printed_before_each_page.append(printed().count('"phase"'))
        return page(self, query, viewer, limit, cursor)

    monkeypatch.setattr(Registry, "list_page", recorded)
    config = ["--config", str(listing.env.config), "model", "list"]
    assert cli.main([*config, "--json"]) == 0
    assert printed_before_each_page == [0, 100]  # the first page was out before the second was asked for
    assert [m["name"] for m in json.loads(printed())] == [f"m-{i:03d}" for i in range(130)]
    out.clear()
    assert cli.main([*config, "--json", "--sort=-name", "--limit", "3"]) == 0
    assert [m["name"] for m in json.loads(printed())] == ["m-129", "m-128", "m-127"]
    out.clear()
    assert cli.main([*config, "--owner", "bob", "--search", "M-12", "--workspace", "team-a"]) == 0
    rows = printed().splitlines()
    assert rows[0].split()[:2] == ["name", "phase"] and [r.split()[0] for r in rows[1:]] == [
        f"m-{i}" for i in range(121, 130, 2)]
    out.clear()
    assert cli.main([*config, "--json", "--phase", "Ready"]) == 0 and json.loads(printed()) == []
    with pytest.raises(SystemExit):
        cli.main([*config, "--limit", "0"])


@pytest.mark.parametrize("sort", ["created", "-created", "size", "-size"])
def test_a_cursor_holds_only_the_users_own_models_so_no_count_of_others_private_ones(listing, sort):
    """Model ids count every model declared: bob, reading ids in the cursors after his own models, would learn how
    many models alice declared (her private ones too) between two of his. A cursor holds the key and the name of
    the last model of his page, nothing else, and walks his list all the same."""
    listing.add("bob-1", owner="bob", spaces=("bob-ws",))
    for i in range(3):
        listing.add(f"alice-hidden-{i}", spaces=("alice-ws",))
    for name in ("bob-2", "bob-3"):
        listing.add(name, owner="bob", spaces=("bob-ws",))
    names, cursor = [], None
    while True:
        r = listing.get("bob", sort=sort, limit=1, **({"cursor": cursor} if cursor else {}))
        assert r.status_code == 200, r.text
        names += [m["name"] for m in r.json()["items"]]
        if (cursor := r.json()["nextCursor"]) is None:
            break
        model = listing.registry.get_model(names[-1])
        value = model.created_at.isoformat() if sort.endswith("created") else model.size_bytes
        assert json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["k"] == [value, names[-1]]
    assert sorted(names) == ["bob-1", "bob-2", "bob-3"], names
