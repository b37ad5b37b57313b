"""Tenancy and input limits of the REST API, each test acting as the hostile user (bob) against alice.

The API runs in process (no workers: runs are only started); the registry is SQLite or, with
WK_TEST_DB=postgresql, the real PostgreSQL, where over-long or NUL input used to answer 500.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import Env, tenants, write_config
from fastapi.testclient import TestClient
from sqlalchemy import text

TOKENS = {"alice": "alice-token", "bob": "bob-token", "root": "root-token"}
STAGING = "s3://wk-staging/staging/"
SIGNED = "https://cdn.example/x/model.safetensors?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIAEXAMPLE"
USERS = {
    "alice": 'token_blocks = ["alice-hf"]\ns3_sources = ["s3://data-src/alice/"]\n',
    "bob": 'token_blocks = ["bob-hf"]\ns3_sources = ["s3://data-src/team", "s3://wk-staging/"]\n',
    "root": "admin = true\n",
}


class Api:
    def __init__(self, env: Env):
        from weightkeeper.api import create_app

        self.env = env
        self.registry = env.registry
        self.client = TestClient(create_app(env.settings, self.registry), raise_server_exceptions=False)

    def call(self, method: str, url: str, user: str = "alice", **kw):
        headers = {"Authorization": f"Bearer {TOKENS[user]}", **kw.pop("headers", {})}
        return self.client.request(method, url, headers=headers, **kw)

    def create(self, name: str, source: str, user: str = "alice", headers: dict | None = None, **body):
        return self.call("POST", "/api/v1/models", user, json={"name": name, "source": source, **body},
                         headers=headers or {})

    def names(self, user: str, **params) -> list[str]:
        return [m["name"] for m in self.call("GET", "/api/v1/models", user, params=params).json()["items"]]

    def state(self) -> list[dict]:
        """Everything the registry holds about models (to show that a refused request wrote nothing)."""
        from sqlalchemy import text

        with self.registry.engine.connect() as conn:
            runs = conn.execute(text("SELECT kind, key, holder FROM leases ORDER BY kind, key")).all()
        return [m.to_json() for m in self.registry.list_models(include_deleting=True)] + [list(map(str, runs))]


@pytest.fixture
def api(tmp_path, registry_base_url):
    return Api(tenants(tmp_path, registry_base_url, USERS))


def test_others_see_only_public_models_without_secrets_paths_or_messages(api):
    assert api.create("alice-private", "hf://acme/secret", workspaces=["alice-ws"], tokenBlock="alice-hf").status_code == 201
    assert api.create("alice-public", "hf://acme/open", workspaces=["team-a"], tokenBlock="alice-hf").status_code == 201
    assert api.create("alice-s3", "s3://data-src/alice/acme--m/", workspaces=["team-a", "alice-ws"],
                      subpath="secret-proj/models").status_code == 201
    for name in ("alice-private", "alice-public", "alice-s3"):
        api.registry.set_phase(name, "Failed", f"cannot fetch {name}: 403 Forbidden")
        entry = api.registry.get_model(name).local_paths[0]
        api.registry.set_path_message(name, entry.id, "Failed", f"{entry.path}: 403 Forbidden")

    assert api.names("bob") == ["alice-public", "alice-s3"]
    assert api.names("bob", workspace="alice-ws") == []
    for listed in api.call("GET", "/api/v1/models", "bob").json()["items"]:
        got = api.call("GET", f"/api/v1/models/{listed['name']}", "bob").json()
        assert got == listed
        assert got["tokenBlock"] is None and got["stagingUri"] is None and got["message"] is None
        assert [p["workspace"] for p in got["localPaths"]] == ["team-a"]  # alice-ws entries are not shown
        assert all(p.keys().isdisjoint({"path", "message", "sharedCopy"}) for p in got["localPaths"])
        assert str(api.env.root) not in str(got) and "Forbidden" not in str(got)  # "403" may be in a timestamp
    assert api.call("GET", "/api/v1/models/alice-s3", "bob").json()["source"] is None  # an S3 prefix is storage
    got = api.call("GET", "/api/v1/models/alice-s3", "bob").json()
    assert got["targets"] == ["team-a"] and got["subpath"] is None  # no private workspace, no storage location

    # bob probes: alice's private workspace answers as one that does not exist, and nesting into her paths names
    # no model of hers
    probes = [api.create("probe", "hf://acme/p", "bob", workspaces=[w]).json()["message"] for w in ("alice-ws", "nope")]
    assert probes[0].replace("alice-ws", "nope") == probes[1] and "alice" not in probes[0].replace("alice-ws", "")
    path = api.registry.get_model("alice-public").local_paths[0].path
    within = path.removeprefix(str(api.env.volumes["team-a"]) + "/") + "/models"
    r = api.create("probe", "hf://acme/p", "bob", workspaces=["team-a"], subpath=within)
    assert r.status_code == 422 and "nests with another user's model's path" in r.json()["message"], r.text
    assert "alice" not in r.json()["message"].replace(path, "")
    r = api.create("probe", "hf://acme/p", "root", workspaces=["team-a"], subpath=within)
    assert "nests with model 'alice-public'" in r.json()["message"]  # an admin is told which

    hidden = api.call("GET", "/api/v1/models/alice-private", "bob")
    missing = api.call("GET", "/api/v1/models/no-such-model", "bob")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json() == {"code": "NotFound", "message": "model 'alice-private' does not exist"}
    assert api.call("DELETE", "/api/v1/models/alice-private", "bob").status_code == 404
    assert api.call("POST", "/api/v1/models/alice-private/retry", "bob").status_code == 404
    assert api.call("DELETE", "/api/v1/models/alice-public", "bob").status_code == 403  # seen, not owned

    for user in ("alice", "root"):  # the owner and admins see everything
        assert api.names(user) == ["alice-private", "alice-public", "alice-s3"]
        got = api.call("GET", "/api/v1/models/alice-private", user).json()
        assert got["tokenBlock"] == "alice-hf" and got["message"] == "cannot fetch alice-private: 403 Forbidden"
        assert got["localPaths"][0]["path"].startswith(str(api.env.volumes["alice-ws"]))
        assert api.call("GET", "/api/v1/models/alice-s3", user).json()["source"] == "s3://data-src/alice/acme--m/"

    shared = dict(workspaces=["team-a"], downloadPolicy="reuse-if-exists")
    assert api.create("alice-shared", "hf://acme/shared", **shared).status_code == 201
    with api.registry.engine.begin() as conn:  # as her download's claim leaves it
        conn.execute(text("UPDATE local_paths SET owned = :t WHERE path LIKE '%acme--shared'"), {"t": True})
    r = api.create("probe", "hf://acme/shared", "bob", include=["*.json"], **shared)  # her path, other files
    assert r.status_code == 409 and r.json()["message"].startswith("another user's model already owns"), r.text


def test_a_user_names_only_their_own_token_blocks(api):
    before = api.state()
    r = api.create("stolen", "hf://acme/gated", user="bob", tokenBlock="alice-hf")
    assert r.status_code == 403 and r.json()["code"] == "Forbidden" and "\n" not in r.json()["message"]
    assert "token_blocks" in r.json()["message"]
    assert api.state() == before
    assert api.create("bobs", "hf://acme/gated", user="bob", tokenBlock="bob-hf").status_code == 201
    assert api.create("roots", "hf://acme/gated", user="root", tokenBlock="alice-hf").status_code == 201  # admin


def test_s3_sources_are_limited_per_user_and_the_staging_prefix_to_nobody(api):
    before = api.state()
    for source in ("s3://data-src/alice/acme--m/", "s3://data-src/team-evil/acme--m/", "s3://other/team/acme--m/"):
        r = api.create("s3-model", source, user="bob")
        assert r.status_code == 403 and "s3_sources" in r.json()["message"], source
    assert api.create("s3-model", f"{STAGING}alice--m/{'0' * 40}/", user="alice").status_code == 403
    for user in ("bob", "root"):  # allowed the staging bucket, or an admin: its staging prefix is still refused
        r = api.create("s3-model", f"{STAGING}alice--m/{'0' * 40}/", user=user)
        assert r.status_code == 422 and "staging prefix" in r.json()["message"]
    assert api.state() == before
    assert api.create("team-model", "s3://data-src/team/acme--m/", user="bob").status_code == 201
    assert api.create("beside", "s3://wk-staging/staging-other/acme--m/", user="bob").status_code == 201

    proc = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "model", "create", "cli-model", "--source",
                           f"{STAGING}alice--m/{'0' * 40}/"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(api.env.config)))
    assert proc.returncode == 2 and "staging prefix" in proc.stderr, proc.stderr
    write_config(api.env, s3={"bucket": "wk-staging", "prefix": "staging/inner"})  # a source holding it
    from weightkeeper.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="staging prefix"):
        api.env.declare("holder", "s3://wk-staging/staging/")
    assert [m.name for m in api.registry.list_models()] == ["beside", "team-model"]


def test_url_queries_and_control_characters_never_reach_messages(api):
    assert api.create("signed", "hf://acme/signed", workspaces=["team-a"]).status_code == 201
    reg = api.registry
    path_id = reg.get_model("signed").local_paths[0].id
    reg.set_path_message("signed", path_id, "Downloading", f"fetching {SIGNED}")
    reg.path_failed("signed", path_id, None, f"403 Forbidden for url '{SIGNED}'\nretry later")
    reg.set_phase("signed", "Failed", f"cannot download: GET {SIGNED} answered 403 \x00 " + "x" * 5000)
    artifact = reg.artifact_for("acme/signed", "0" * 40, "local", "/v", "/v/models/_artifacts/acme--signed/0", [])
    reg.set_artifact(artifact.id, None, "Failed", "GET https://user:pass@cdn.example/y?sig=1 failed")

    model = api.call("GET", "/api/v1/models/signed").json()
    assert model["message"].startswith("cannot download: GET https://cdn.example/x/model.safetensors?… answered 403")
    assert "\x00" not in model["message"] and len(model["message"]) <= 2000
    assert model["localPaths"][0]["message"] == ("403 Forbidden for url 'https://cdn.example/x/model.safetensors?…'"
                                                 "\nretry later")
    stored = str([reg.get_model("signed"), reg.list_artifacts()])
    assert "X-Amz" not in stored and "AKIA" not in stored and "sig=1" not in stored and "pass@" not in stored


def bad_requests():
    ok = {"name": "fine", "source": "hf://acme/fine"}
    yield "long-idempotency-key", ok, {"Idempotency-Key": "k" * 129}
    yield "non-ascii-idempotency-key", ok, {"Idempotency-Key": "k\xe9y".encode("latin-1")}
    yield "long-token-block", {**ok, "tokenBlock": "a" * 300}, {}
    yield "token-block-not-a-block-name", {**ok, "tokenBlock": "Alice_HF"}, {}
    yield "nul-token-block", {**ok, "tokenBlock": "alice-hf\x00"}, {}
    yield "long-revision", {**ok, "source": "hf://acme/fine@" + "r" * 256}, {}
    yield "control-in-revision", {**ok, "source": "hf://acme/fine@ma\x01in"}, {}
    yield "nul-in-source", {**ok, "source": "hf://acme/fi\x00ne"}, {}
    yield "long-source", {**ok, "source": "s3://data-src/alice/" + "a" * 500 + "/"}, {}
    yield "long-s3-directory", {**ok, "source": "s3://data-src/alice/" + "a" * 300 + "/"}, {}
    yield "long-name", {**ok, "name": "a" * 64}, {}
    yield "nul-name", {**ok, "name": "fi\x00ne"}, {}
    yield "long-subpath", {**ok, "subpath": "s" * 256}, {}
    yield "nul-subpath", {**ok, "subpath": "s\x00"}, {}
    yield "too-many-workspaces", {**ok, "workspaces": ["team-a"] * 65}, {}
    yield "no-workspace", {**ok, "workspaces": []}, {}  # not "every public one": that is leaving it out
    yield "long-workspace", {**ok, "workspaces": ["w" * 64]}, {}
    yield "nul-workspace", {**ok, "workspaces": ["team-a\x00"]}, {}


@pytest.mark.parametrize("case", list(bad_requests()), ids=lambda c: c[0])
def test_over_long_or_control_input_answers_422_and_writes_nothing(api, case):
    _, body, headers = case
    before = api.state()
    r = api.call("POST", "/api/v1/models", "alice", json=body, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "Invalid" and "\n" not in r.json()["message"] and "\x00" not in r.text
    assert api.state() == before


def test_an_invalid_request_is_told_where_and_why_in_one_short_line_never_echoing_what_it_sent(api):
    """Bob's body makes up keys: a plain one, one holding a newline and a URL with credentials, and thousands more
    within 64 KiB. The 422 names the plain key, shows the other as `<key>`, counts the rest, in one short line."""
    evil = "x\nhttps://bob:s3cret@cdn.example/m?X-Amz-Signature=deadbeef"
    body = {"name": "fine", "source": "hf://acme/fine", "owner": "alice", evil: 1, **{f"k{i}": 0 for i in range(5000)}}
    before = api.state()
    r = api.call("POST", "/api/v1/models", "bob", json=body)
    assert r.status_code == 422 and r.json()["code"] == "Invalid", r.text[:300]
    message = r.json()["message"]
    assert message.startswith("body.owner: Extra inputs are not permitted; body.<key>: Extra inputs are not permitted")
    assert message.endswith("; and 4997 more") and len(message) < 500, message
    assert "s3cret" not in r.text and "X-Amz" not in r.text and "\n" not in message
    assert api.state() == before


def test_reads_refuse_control_characters_with_422(api):
    assert api.call("GET", "/api/v1/models", params={"workspace": "team-a\x00"}).status_code == 422
    assert api.call("GET", "/api/v1/models", params={"phase": "Ready\x00"}).status_code == 422
    assert api.call("GET", "/api/v1/models/bad%00name").status_code == 422
    assert api.call("DELETE", "/api/v1/models/" + "a" * 64).status_code == 422
    r = api.create("fine", "hf://acme/fine", headers={"Idempotency-Key": "k" * 128})  # the limits themselves pass
    assert r.status_code == 201, r.text


def test_a_path_claim_names_no_model_of_another_user(api):
    """Alice's model holds the directory bob's models want (live, then deleting): bob reads that his path is
    taken, then that it waits, and never her model's name; a model of alice's own is told which of hers it is."""
    from test_lifecycle import in_thread, wait_until

    from weightkeeper.errors import DownloadCancelled, DownloadError
    from weightkeeper.registry import Holder
    from weightkeeper.tasks.download import _claim

    for name, user in (("alice-hidden", "alice"), ("alice-too", "alice"), ("bob-late", "bob"), ("bob-wait", "bob")):
        assert api.create(name, "hf://acme/claimed", user, workspaces=["team-a"]).status_code == 201, name
    reg = api.registry
    entry = {m.name: m.local_paths[0] for m in reg.list_models()}
    assert reg.claim_download("alice-hidden", entry["alice-hidden"].id, Holder.here("alice-run"), 60).ok

    def path_message(name: str, user: str) -> str:
        message = api.call("GET", f"/api/v1/models/{name}", user).json()["localPaths"][0]["message"]
        return message.replace(entry[name].path, "<path>")

    for name in ("bob-late", "alice-too"):
        with pytest.raises(DownloadError):
            _claim(reg, name, entry[name], Holder.here(f"{name}-run"), 60)
    taken = "<path> is already owned by {}; this entry is not downloaded"
    assert path_message("bob-late", "bob") == taken.format("another user's model")
    assert path_message("alice-too", "alice") == taken.format("model 'alice-hidden'")

    reg.mark_deleting("alice-hidden")
    waiting = in_thread(_claim, reg, "bob-wait", entry["bob-wait"], Holder.here("bob-wait-run"), 60)
    try:
        message = wait_until(lambda: (m := path_message("bob-wait", "bob")).startswith("Waiting") and m, 30,
                             "bob's claim to wait")
        assert message == "Waiting for deleted another user's model to finish cleaning up <path>"
    finally:
        reg.mark_deleting("bob-wait")  # its claim stops at its next poll
        waiting.join(30)
    assert isinstance(waiting.result.get("error"), DownloadCancelled)


def test_a_create_repeated_with_its_key_answers_with_its_model_and_no_other_does(api):
    """A client that lost the answer sends its create again with the same `Idempotency-Key`: it gets its model (201),
    once. Another key, another body or another caller with that key is a new request and conflicts (409)."""
    body = {"workspaces": ["team-a"], "subpath": "proj"}
    key = {"Idempotency-Key": "create-once"}
    first = api.create("idem", "hf://acme/idem", headers=key, **body)
    assert first.status_code == 201, first.text
    again = api.create("idem", "hf://acme/idem", headers=key, **body)
    assert again.status_code == 201, again.text
    assert {k: v for k, v in again.json().items() if k != "run"} == {k: v for k, v in first.json().items() if k != "run"}
    assert again.json()["run"] == {"flowRunId": None, "message": "a repeat of the request that declared the model"}
    assert len(api.registry.list_models()) == 1
    for user, headers, changed in (("alice", {"Idempotency-Key": "another"}, body),
                                   ("alice", {}, body),
                                   ("alice", key, {**body, "subpath": "other"}),
                                   ("bob", key, body)):
        r = api.create("idem", "hf://acme/idem", user, headers=headers, **changed)
        assert r.status_code == 409 and r.json()["code"] == "AlreadyExists", (user, headers, r.text)
    api.registry.mark_deleting("idem")
    r = api.create("idem", "hf://acme/idem", headers=key, **body)  # no answer with a model being deleted
    assert r.status_code == 409 and r.json()["code"] == "ResourceProcessing", r.text


@pytest.fixture
def runs_started(monkeypatch) -> list[dict]:
    """Prefect accepts every run `start_deployment` starts (a worker runs it later, by its parameters)."""
    import uuid
    from types import SimpleNamespace

    import weightkeeper.runs

    started: list[dict] = []

    def run_deployment(name, parameters, **_):
        started.append(parameters)
        return SimpleNamespace(id=uuid.uuid4())

    monkeypatch.setattr(weightkeeper.runs, "run_deployment", run_deployment)
    return started


def _release_and_declare_hers(api, runs_started: list[dict]) -> None:
    """Bob's model `swap` is released (as its delete run's release_model does) and alice declares `swap`: Failed,
    with no run working on it (hers started none)."""
    with api.registry.engine.begin() as conn:
        conn.execute(text("DELETE FROM leases"))
        conn.execute(text("DELETE FROM local_paths WHERE model_id IN (SELECT id FROM models WHERE name = 'swap')"))
        conn.execute(text("DELETE FROM models WHERE name = 'swap'"))
    assert api.create("swap", "hf://acme/alices", workspaces=["team-a"]).status_code == 201
    with api.registry.engine.begin() as conn:
        conn.execute(text("DELETE FROM leases"))
    runs_started.clear()
    api.registry.set_phase("swap", "Failed", "hers")


def _untouched(api) -> None:
    from weightkeeper.registry.leases import Kind

    model = api.registry.get_model("swap")
    assert (model.owner_name, model.phase, model.message) == ("alice", "Failed", "hers")
    assert api.registry.lease_of(Kind.RUN, model.id) is None


REQUESTS = {"delete": ("DELETE", "/api/v1/models/swap", 202), "retry": ("POST", "/api/v1/models/swap/retry", 202),
            "create": ("POST", "/api/v1/models", 201)}


@pytest.mark.parametrize("action, when", [("delete", "act"), ("retry", "act")] + [
    (action, when) for when in ("start", "reserve") for action in ("delete", "retry", "create")])
def test_a_delete_or_retry_never_lands_on_the_model_declared_under_its_name_since(api, monkeypatch, runs_started,
                                                                                  action, when):
    """Bob's request passes the owner check for his model `swap` (or declares it); before it acts, or after it
    acted and before it starts its run (or reserves it), his model is released and alice declares `swap`. Before
    the act: 404; after: no run starts (the answer says his model was released). Either way her model is
    untouched: no run reserved on it, none started."""
    if action != "create":
        assert api.create("swap", "hf://acme/bobs", "bob", workspaces=["team-a"]).status_code == 201
        api.registry.set_phase("swap", "Failed", "as a failed download leaves it")
    import weightkeeper.api

    owner, name = {"act": (type(api.registry), "mark_deleting" if action == "delete" else "retry_model"),
                   "start": (weightkeeper.api, "start_deployment"), "reserve": (type(api.registry), "claim_run")}[when]
    real = getattr(owner, name)

    def swapped(*args, **kw):
        monkeypatch.setattr(owner, name, real)
        _release_and_declare_hers(api, runs_started)
        return real(*args, **kw)

    monkeypatch.setattr(owner, name, swapped)
    method, url, code = REQUESTS[action]
    body = {"json": {"name": "swap", "source": "hf://acme/bobs", "workspaces": ["team-a"]}} if action == "create" else {}
    r = api.call(method, url, "bob", **body)
    if when == "act":
        assert r.status_code == 404 and r.json() == {"code": "NotFound", "message": "model 'swap' does not exist"}, r.text
    else:
        flow = "delete-model" if action == "delete" else "ensure-model"
        assert r.status_code == code and r.json()["run"] == {
            "flowRunId": None, "message": f"model 'swap' was released meanwhile; no {flow} run started"}, r.text
    assert runs_started == []
    _untouched(api)


@pytest.mark.parametrize("action", ["delete", "create"])
def test_a_run_started_for_a_model_leaves_the_one_declared_under_its_name_since_alone(api, runs_started, action):
    """Bob's request starts a run for his model `swap`; before a worker runs it, his model is released (another
    delete run's work) and alice declares `swap`. The run, as a worker runs it, returns Released and leaves her model
    alone: not marked Deleting, no path cleaned, no lease taken, nothing ensured."""
    from weightkeeper.context import use
    from weightkeeper.flows.delete_model import delete_model
    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.runs import run_here

    assert api.create("swap", "hf://acme/bobs", "bob", workspaces=["team-a"]).status_code == 201
    if action == "delete":
        assert api.call("DELETE", "/api/v1/models/swap", "bob").status_code == 202
    bobs = runs_started[-1]
    assert bobs["name"] == "swap" and bobs["bound"]
    _release_and_declare_hers(api, runs_started)
    use(api.env.settings)
    assert run_here(delete_model if action == "delete" else ensure_model, bobs["name"], bobs["bound"]) == "Released"
    _untouched(api)
    hers = api.registry.get_model("swap")
    assert [(p.status, p.owned) for p in hers.local_paths] == [("Pending", False)]


def test_a_run_is_bound_to_its_model_whatever_time_zone_the_registry_answers_in():
    """PostgreSQL answers a creation time in its session's zone: the same instant binds the same model."""
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    from weightkeeper.runs import bound_to

    utc = datetime(2026, 12, 5, 23, 0, tzinfo=timezone.utc)
    elsewhere = utc.astimezone(timezone(timedelta(hours=2)))
    assert bound_to(SimpleNamespace(id=7, created_at=utc)) == bound_to(SimpleNamespace(id=7, created_at=elsewhere))


def test_create_refuses_a_name_taken_by_a_model_the_caller_cannot_see_without_saying_its_phase(api):
    """Names are global, so bob's create of a name alice's private model holds is refused; the refusal says only that
    the name is taken (one answer whether her model is live or being deleted), as a GET of it answers 404."""
    assert api.create("alice-secret", "hf://acme/secret", workspaces=["alice-ws"]).status_code == 201
    taken = {"code": "AlreadyExists", "message": "the name 'alice-secret' is taken; choose another"}
    assert api.call("GET", "/api/v1/models/alice-secret", "bob").status_code == 404
    for phase in ("Pending", "Deleting"):
        if phase == "Deleting":
            api.registry.mark_deleting("alice-secret")
        r = api.create("alice-secret", "hf://acme/anything", "bob", workspaces=["team-a"])
        assert (r.status_code, r.json()) == (409, taken), (phase, r.text)
        # the owner and an admin are told what it is, as before
        r = api.create("alice-secret", "hf://acme/anything", "alice", workspaces=["alice-ws"])
        assert r.status_code == 409 and r.json()["code"] == {"Pending": "AlreadyExists",
                                                             "Deleting": "ResourceProcessing"}[phase], r.text
        r = api.create("alice-secret", "hf://acme/anything", "root", workspaces=["team-a"])
        assert r.json()["message"] != taken["message"], r.text
    assert api.create("alice-public", "hf://acme/open", workspaces=["team-a"]).status_code == 201
    r = api.create("alice-public", "hf://acme/anything", "bob", workspaces=["team-a"])  # one bob sees: said as is
    assert (r.status_code, r.json()) == (409, {"code": "AlreadyExists", "message": "model 'alice-public' already "
                                               "exists; choose another name, or delete that model first"})


def test_a_run_key_is_bound_to_the_model_declared_even_where_its_id_is_reused(api):
    """SQLite gives a model declared again after a release the id of the one before: a key repeated for it still
    starts a run of its own, never answering with the earlier model's run."""
    from weightkeeper.api import run_key

    alice = next(u for u in api.env.settings.users if u.name == "alice")
    assert api.create("again", "hf://acme/again", workspaces=["team-a"]).status_code == 201
    first = api.registry.get_model("again")
    with api.registry.engine.begin() as conn:
        conn.execute(text("DELETE FROM local_paths WHERE model_id = :id"), {"id": first.id})
        conn.execute(text("DELETE FROM models WHERE id = :id"), {"id": first.id})
    assert api.create("again", "hf://acme/again", workspaces=["team-a"]).status_code == 201
    second = api.registry.get_model("again")
    assert second.id == first.id or api.env.settings.registry_url.startswith("postgresql")
    assert run_key("ensure-model", first, alice, "k") != run_key("ensure-model", second, alice, "k")
    assert run_key("ensure-model", second, alice, "k") == run_key("ensure-model", second, alice, "k")


def test_a_registry_or_prefect_out_of_reach_answers_503_or_records_the_request_for_reconcile(api, monkeypatch):
    """Faults injected at the boundary (no registry or Prefect server can be made to vanish mid-request here): a
    registry that cannot be reached answers 503 naming no statement; Prefect out of reach leaves the request
    recorded (the model declared, deleting) with no run, which the next reconcile pass starts."""
    import httpx
    from sqlalchemy.exc import OperationalError

    import weightkeeper.api

    def unreachable(*_a, **_kw):
        raise httpx.ConnectError("All connection attempts failed")

    monkeypatch.setattr(weightkeeper.api, "start_deployment", unreachable)
    r = api.create("offline", "hf://acme/offline", workspaces=["team-a"])
    assert r.status_code == 201 and r.json()["run"]["flowRunId"] is None, r.text
    assert "Prefect could not start the ensure-model run now (ConnectError)" in r.json()["run"]["message"]
    r = api.call("DELETE", "/api/v1/models/offline")
    assert r.status_code == 202 and api.registry.get_model("offline").phase == "Deleting", r.text

    def down(*_a, **_kw):
        raise OperationalError("SELECT models.name FROM models WHERE name = ?", ("offline",),
                               Exception("connection to server at 127.0.0.1, port 5432 failed"))

    monkeypatch.setattr(type(api.registry), "shown_model", down)
    r = api.call("GET", "/api/v1/models/offline")
    assert r.status_code == 503, r.text
    assert r.json() == {"code": "Unavailable", "message": "the registry cannot be reached now; retry later"}


def test_a_user_holds_at_most_their_max_models_counting_those_being_deleted(tmp_path, registry_base_url):
    """carol may hold 2 models (`max_models`): a third is refused with 409 QuotaExceeded, saying how many and what to
    do, and nothing is written; a model of hers being deleted still counts. Others, and admins, are not limited."""
    api = Api(tenants(tmp_path, registry_base_url, {**USERS, "carol": "max_models = 2\n",
                                                    "root": "admin = true\nmax_models = 1\n"}))  # an admin: none
    TOKENS.setdefault("carol", "carol-token")
    for name in ("carol-1", "carol-2"):
        assert api.create(name, f"hf://acme/{name}", "carol", workspaces=["team-a"]).status_code == 201
    before = api.state()
    r = api.create("carol-3", "hf://acme/carol-3", "carol", workspaces=["team-a"])
    assert (r.status_code, r.json()["code"]) == (409, "QuotaExceeded"), r.text
    assert r.json()["message"] == ("user 'carol' holds 2 models, the most they may (2, max_models); delete some first "
                                   "(a model being deleted counts until it is released)")
    assert api.state() == before
    assert api.call("DELETE", "/api/v1/models/carol-1", "carol").status_code == 202
    r = api.create("carol-3", "hf://acme/carol-3", "carol", workspaces=["team-a"])
    assert (r.status_code, r.json()["code"]) == (409, "QuotaExceeded"), r.text
    for user in ("alice", "root"):
        for i in range(3):
            assert api.create(f"{user}-{i}", f"hf://acme/{user}-{i}", user, workspaces=["team-a"]).status_code == 201
