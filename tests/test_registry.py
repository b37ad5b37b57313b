"""Registry semantics and concurrent writers, on SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from sqlalchemy import text

from weightkeeper.errors import ConflictError, InvalidInputError, NotFoundError
from weightkeeper.planning import Plan, PlannedPath
from weightkeeper.registry import Claim, Holder, ModelSpec, open_registry


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request, tmp_path):
    if request.param == "sqlite":
        return open_registry(f"sqlite:///{tmp_path / 'registry.db'}")
    return open_registry(request.getfixturevalue("pg_url"))


def spec(name: str) -> ModelSpec:
    return ModelSpec(name=name, owner_name="alice", owner_uid=1000, source="hf://o/n@main", repo_id="o/n",
                     revision="main")


def plan(*paths: str) -> Plan:
    return Plan(tuple(PlannedPath(f"ws{i}", "local", p) for i, p in enumerate(paths)), ())


def holder(i: int) -> Holder:
    return Holder(f"run-{i}", "host", 100 + i, 1.0)


def parallel(n: int, fn) -> list:
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_migrations_are_idempotent_and_at_head(registry):
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from weightkeeper.registry.store import HEAD, MIGRATIONS, _migrate

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head == HEAD and head >= "0009"  # the head the registry checks without alembic is alembic's
    with registry.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head

    _migrate(registry.engine)


def test_a_registry_behind_is_migrated_and_one_at_head_opens_without_alembic(tmp_path):
    from weightkeeper.registry.store import HEAD, _engine

    url = f"sqlite:///{tmp_path / 'old.db'}"
    subprocess.run([sys.executable, "-c", "from alembic import command; from alembic.config import Config; "
                    "from sqlalchemy import create_engine; from weightkeeper.registry.store import MIGRATIONS; "
                    "c = Config(); c.set_main_option('script_location', str(MIGRATIONS)); "
                    f"e = create_engine({url!r}); conn = e.connect(); c.attributes['connection'] = conn; "
                    "command.upgrade(c, '0006'); conn.commit()"], check=True)
    with _engine(url, announce_new=False).connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
    opened = subprocess.run([sys.executable, "-c", "import sys; from weightkeeper.registry import open_registry; "
                             f"open_registry({url!r}).list_models(); print('alembic' in sys.modules)"],
                            check=True, capture_output=True, text=True)
    assert opened.stdout.strip() == "False"


def test_create_get_list_and_name_conflicts(registry):
    model = registry.create_model(spec("m"), plan("/v/models/o--n"))
    assert model.phase == "Pending" and model.local_paths[0].status == "Pending"
    assert registry.get_model("m").local_paths[0].path == "/v/models/o--n"
    with pytest.raises(ConflictError) as e:
        registry.create_model(spec("m"), plan("/w/models/o--n"))
    assert e.value.code == "AlreadyExists"
    with pytest.raises(NotFoundError):
        registry.get_model("nope")
    registry.mark_deleting("m")
    assert registry.list_models() == []
    deleting = registry.list_models(include_deleting=True)
    assert [m.name for m in deleting] == ["m"] and deleting[0].is_deleted
    with pytest.raises(ConflictError) as e:
        registry.create_model(spec("m"), plan("/w/models/o--n"))
    assert e.value.code == "ResourceProcessing"


def test_release_only_without_paths(registry):
    model = registry.create_model(spec("m"), plan("/v/models/o--n"))
    with pytest.raises(ConflictError):
        registry.release_model("m")  # not deleting
    with pytest.raises(ConflictError):
        registry.remove_path("m", model.local_paths[0].id)  # not deleting
    registry.mark_deleting("m")
    assert registry.release_model("m") is False
    registry.remove_path("m", model.local_paths[0].id)
    assert registry.release_model("m") is True
    assert registry.find_model("m") is None


def test_one_claim_wins_among_concurrent_workers(registry):
    path_id = registry.create_model(spec("m"), plan("/v/models/o--n")).local_paths[0].id
    outcomes = parallel(8, lambda i: registry.claim_download("m", path_id, holder(i), 60).outcome)
    assert sorted(outcomes) == ["busy"] * 7 + ["claimed"]


def test_two_models_never_both_own_one_directory(registry):
    a = registry.create_model(spec("a"), plan("/v/models/o--n")).local_paths[0].id
    b = registry.create_model(spec("b"), plan("/v/models/o--n")).local_paths[0].id
    outcomes = parallel(2, lambda i: registry.claim_download(["a", "b"][i], [a, b][i], holder(i), 60).outcome)
    assert sorted(outcomes) == ["claimed", "taken"]


def test_stale_lease_can_be_taken_over(registry):
    path_id = registry.create_model(spec("m"), plan("/v/models/o--n")).local_paths[0].id
    assert registry.claim_download("m", path_id, holder(1), 60).ok
    busy = registry.claim_download("m", path_id, holder(2), 60)
    assert busy.outcome == "busy" and "run run-1 on host host (pid 101)" in busy.other and "lapses in" in busy.other
    assert registry.renew_leases([("path", path_id, holder(1), 0)]) == (set(), set())  # renewed for 0 s: lapsed
    assert registry.claim_download("m", path_id, holder(2), 60).ok
    assert registry.path_progressed("m", path_id, holder(1), 5) is False  # taken over: it must stop
    assert registry.renew_leases([("path", path_id, holder(1), 60)]) == ({("path", path_id)}, set())
    assert registry.path_progressed("m", path_id, holder(2), 5) is True
    registry.mark_deleting("m")
    assert registry.path_progressed("m", path_id, holder(2), 6) is False  # deleting: the download must stop
    assert registry.renew_leases([("path", path_id, holder(2), 60)]) == (set(), {("path", path_id)})
    assert registry.get_model("m").local_paths[0].lease.holder.run == "run-2"  # renewed until it lets go


def test_no_lost_updates_under_concurrent_writers(registry):
    path_id = registry.create_model(spec("m"), plan("/v/models/o--n")).local_paths[0].id
    parallel(8, lambda i: [registry.fail_over("m", path_id, f"ws{i}", 1000) for _ in range(10)])
    assert registry.get_model("m").local_paths[0].failover_attempts == 80  # each increment on a locked row
    parallel(8, lambda i: [registry.cleanup_failed("m", 10 * i + k + 1, f"w{i}") for k in range(10)])
    assert registry.get_model("m").cleanup_attempts == 80
    registry.cleanup_failed("m", 81, "again")
    registry.cleanup_failed("m", 81, "again")  # the same failure recorded twice (a retried call) counts once
    assert registry.get_model("m").cleanup_attempts == 81


def test_create_refused_while_deleting_model_owns_the_path(registry):
    path_id = registry.create_model(spec("old"), plan("/v/models/o--n")).local_paths[0].id
    assert registry.claim_download("old", path_id, holder(1), 60).ok
    registry.path_downloaded("old", path_id, holder(1), 10, "10 bytes")
    with pytest.raises(ConflictError) as e:
        registry.create_model(spec("new"), plan("/v/models/o--n"))
    assert e.value.code == "AlreadyExists"
    assert registry.create_model(spec("partial"), plan("/v/models/o--n", "/w/models/o--n"))
    registry.mark_deleting("old")
    with pytest.raises(ConflictError) as e:
        registry.create_model(spec("new"), plan("/w/models/o--n", "/v/models/o--n"))
    assert e.value.code == "ResourceProcessing" and "still being cleaned up" in str(e.value)


def test_one_writer_per_shared_copy(registry):
    copy = registry.artifact_for("o/n", "c" * 40, "local", "/v", "/v/models/_artifacts/o--n/" + "c" * 40, [])
    assert registry.artifact_for("o/n", "c" * 40, "local", "/v", copy.path, []).id == copy.id
    wins = parallel(8, lambda i: registry.claim_artifact(copy.id, holder(i), 60) is None)
    assert wins.count(True) == 1
    winner = holder(wins.index(True))
    assert registry.renew_leases([("artifact", copy.id, winner, 0)]) == (set(), set())
    assert registry.renew_leases([("artifact", copy.id, holder(99), 60)]) == ({("artifact", copy.id)}, set())
    assert registry.claim_artifact(copy.id, holder(99), 60) is None  # its lease lapsed: taken over
    assert registry.get_artifact(copy.id).lease.holder.run == "run-99"
    assert registry.renew_leases([("artifact", copy.id, winner, 60)]) == ({("artifact", copy.id)}, set())


def test_staging_lease_and_who_holds_a_staged_prefix(registry):
    uri = f"s3://wk/stage/o--n/{'c' * 40}/"
    registry.create_model(spec("a"), plan())
    registry.create_model(spec("b"), plan())
    assert registry.claim_staging("a", uri, holder(1), 60).ok
    a = registry.get_model("a")
    assert (a.phase, a.staging_uri, a.staging_owned, a.staging_lease.holder.run) == ("Staging", uri, True, "run-1")
    assert registry.claim_staging("a", uri, holder(2), 60).outcome == "busy"  # a fresh lease is never shared
    assert registry.staging_progressed("a", holder(1), "half way") and registry.get_model("a").message == "half way"
    assert not registry.staging_progressed("a", holder(2), "not mine")
    assert registry.claim_staging("b", uri, holder(3), 60).ok  # two live models may stage one prefix
    assert registry.staging_in_use_elsewhere("a") == "b"
    registry.release_staging("b", holder(3))

    registry.mark_deleting("a")
    assert not registry.staging_progressed("a", holder(1), "x")  # the staging run stops at its next write
    model_id = registry.get_model("a").id
    assert registry.renew_leases([("staging", model_id, holder(1), 60)]) == (set(), {("staging", model_id)})
    assert registry.claim_staging("a", uri, holder(1), 60).outcome == "deleting"
    assert registry.release_model("a") is False  # no path left, but its staged prefix is not removed yet
    registry.mark_deleting("b")
    assert registry.staging_in_use_elsewhere("a") is None
    registry.create_model(spec("c"), plan())
    assert registry.claim_staging("c", uri, holder(4), 60) == Claim("wait", "a")  # still being removed
    registry.clear_staging("a")
    assert registry.release_model("a") is True
    assert registry.claim_staging("c", uri, holder(4), 60) == Claim("wait", "b")
    registry.clear_staging("b")
    assert registry.claim_staging("c", uri, holder(4), 60).ok


def test_failover_is_remembered_and_capped(registry):
    registry.create_model(spec("f"), plan("/v/models/o--n"))
    (path,) = registry.get_model("f").local_paths
    for attempt, workspace in enumerate(["b", "a", "b"], start=1):
        assert registry.fail_over("f", path.id, workspace, 3)
        moved = registry.get_model("f").local_paths[0]
        assert (moved.workspace, moved.failover_attempts, moved.status) == (workspace, attempt, "Pending")
        assert f"failover {attempt} of 3" in moved.message and moved.path == "/v/models/o--n"
    assert not registry.fail_over("f", path.id, "a", 3)  # three moves at most
    assert registry.get_model("f").local_paths[0].to_json()["failoverAttempts"] == 3
    registry.create_model(spec("g"), plan("/v/models/o--g"))
    registry.mark_deleting("g")
    assert not registry.fail_over("g", registry.get_model("g").local_paths[0].id, "b", 3)


def test_a_call_whose_connection_is_cut_is_retried_and_other_errors_are_not(registry, monkeypatch):
    from sqlalchemy.exc import DBAPIError

    from weightkeeper.registry.store import Registry

    registry.create_model(spec("r"), plan())
    real, calls = Registry._tx, []

    def cut_once(self, *args, invalidated=True, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise DBAPIError("SELECT", {}, Exception("terminating connection"), connection_invalidated=invalidated)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Registry, "_tx", cut_once)
    assert registry.get_model("r").name == "r" and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(Registry, "_tx", lambda self, *a, **kw: cut_once(self, *a, invalidated=False, **kw))
    with pytest.raises(DBAPIError):
        registry.get_model("r")
    assert len(calls) == 1


def test_run_leases_survive_concurrent_claims_and_releases(registry):
    registry.create_model(spec("c"), plan())

    def work(i: int) -> bool:
        for _ in range(15):  # a zero lease is never fresh: every claim takes over while others release
            registry.claim_run("c", "ensure-model", holder(i), 0.0)
            registry.release_run("c", holder(i))
        return True

    assert all(parallel(6, work))


def test_nested_model_paths_are_refused_in_both_directions_and_when_moving(registry):
    """Deleting the outer of two nested paths would remove the inner, live one: never recorded."""
    registry.create_model(spec("outer"), plan("/v/models/o--n"))
    for name, path in [("inside", "/v/models/o--n/models/x--y"), ("cache", "/v/models/o--n/.cache/models/x"),
                       ("around", "/v/models")]:
        with pytest.raises(InvalidInputError, match="nests with model 'outer'"):
            registry.create_model(spec(name), plan(path))
        assert registry.find_model(name) is None
    registry.create_model(spec("beside"), plan("/v/models/o--n-2"))  # a look-alike prefix is not nesting
    registry.create_model(spec("mover"), plan("/v/team/models/o--n"))
    with pytest.raises(InvalidInputError, match="nests with model 'mover'"):  # its own old path is cleaned later
        registry.update_model("mover", plan("/v/team/models/o--n/models/o--n"), None, "always-download")
    with pytest.raises(InvalidInputError, match="nests with model 'outer'"):
        registry.update_model("mover", plan("/v/models/o--n/sub"), None, "always-download")


def test_a_claim_rechecks_nesting(registry):
    """A path that came to nest after declaration (a row written by an older version, say) is refused at claim."""
    registry.create_model(spec("first"), plan("/v/models/a/b"))
    with registry.engine.begin() as conn:
        conn.execute(text("UPDATE local_paths SET path = '/v/models/a' WHERE path = '/v/models/a/b'"))
    registry.create_model(spec("second"), plan("/v/models/c"))
    with registry.engine.begin() as conn:
        conn.execute(text("UPDATE local_paths SET path = '/v/models/a/b/c' WHERE path = '/v/models/c'"))
    path_id = registry.get_model("second").local_paths[0].id
    assert registry.claim_download("second", path_id, holder(1), 60) == Claim("nested", "model 'first'")


def test_a_write_that_is_not_idempotent_is_never_retried(registry, monkeypatch):
    """A connection cut during COMMIT leaves unknown whether the write landed: creating the model again would
    answer AlreadyExists, so create_model is not retried; an idempotent write is."""
    from sqlalchemy.exc import DBAPIError

    from weightkeeper.registry.store import Registry

    registry.create_model(spec("twice"), plan())
    real, calls = Registry._tx, []

    def cut_first(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise DBAPIError("COMMIT", {}, Exception("terminating connection"), connection_invalidated=True)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Registry, "_tx", cut_first)
    with pytest.raises(DBAPIError):
        registry.create_model(spec("once"), plan())
    assert len(calls) == 1
    calls.clear()
    registry.cleanup_failed("twice", 1, "x")
    assert len(calls) == 2 and registry.get_model("twice").cleanup_attempts == 1


def test_a_pass_reads_a_tracked_model_exactly_when_its_turn_makes_it_due(registry):
    """The SQL condition (`updates.update_due`, one per turn) selects the models `desired.update_due` finds due:
    tracked ones, and ones not tracked with a switch left pending, at their turn."""
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import select

    from weightkeeper.desired import update_due
    from weightkeeper.registry.schema import ModelRow
    from weightkeeper.registry.updates import update_due as due_sql

    now = datetime(2026, 12, 5, 12, 0, 7, tzinfo=timezone.utc)
    for i in range(80):
        registry.create_model(spec(f"t{i}"), plan(f"/v/models/t{i}"))
    with registry._tx() as s:
        for i, row in enumerate(s.scalars(select(ModelRow).order_by(ModelRow.id))):
            row.phase, row.track = "Ready", i % 5 != 4  # every fifth not tracked
            row.pending_commit = "b" * 40 if i % 3 == 0 else None  # a switch left pending on every third
            row.head_checked_at = None if i == 0 else now - timedelta(seconds=i * 67)  # up to 1.5 intervals ago
    for interval in (3600, 0):
        with registry._tx() as s:
            rows = s.execute(select(ModelRow.name, ModelRow.id, ModelRow.track, ModelRow.head_checked_at,
                                    ModelRow.pending_commit)).all()
            chosen = set(s.scalars(select(ModelRow.name).where(due_sql(now, interval))))
        due = {name for name, model_id, track, checked, pending in rows if update_due(
            "Ready", track, None, checked if checked is None or checked.tzinfo else checked.replace(tzinfo=timezone.utc),
            now, interval, model_id, pending=pending is not None)}
        assert chosen == due and 0 < len(due) < 80
        untracked = {name for name, _, track, _, pending in rows if not track and pending}
        assert untracked & due and (interval == 0 or untracked - due)  # some at their turn, others not yet
