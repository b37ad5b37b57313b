"""The REST API with real deployments and real process workers on the session's Prefect server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from conftest import expected_size, tiny_files
from served import POOL_B, served_weightkeeper, wait_until


@pytest.fixture(scope="module")
def served(tmp_path_factory, hub, registry_base_url):
    if registry_base_url:
        from conftest import _truncate

        _truncate(registry_base_url)
    with served_weightkeeper(tmp_path_factory.mktemp("served"), hub, registry_base_url) as served:
        yield served


def flow_runs(name: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


def parent_run(run) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.read_task_run(run.parent_task_run_id).flow_run_id)


def events(resource: str) -> list[str]:
    from prefect.settings import PREFECT_API_URL

    since = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    body = {"filter": {"occurred": {"since": since}, "event": {"prefix": ["weightkeeper.model."]},
                       "resource": {"id": [resource]}}, "limit": 50}
    r = httpx.post(f"{PREFECT_API_URL.value()}/events/filter", json=body, timeout=10)
    r.raise_for_status()
    return [e["event"] for e in r.json()["events"]]


def create(served, name: str, source: str, user: str = "alice", **body) -> httpx.Response:
    return served.api.post("/api/v1/models", json={"name": name, "source": source, **body},
                           headers=served.as_user(user))


def test_create_through_the_api_runs_the_deployments_until_ready(served, hub):
    files = tiny_files("api-create")
    hub.add_repo("acme/api-create", files)
    r = create(served, "api-create", "hf://acme/api-create")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["owner"] == {"name": "alice", "uid": 1000} and body["phase"] == "Pending"
    run_id = body["run"]["flowRunId"]
    (run,) = flow_runs("ensure-api-create")  # visible at once, before any worker picks it up
    assert str(run.id) == run_id and run.deployment_id is not None
    model = served.wait_phase("api-create", "Ready")
    assert [(p["workspace"], p["status"], p["sizeBytes"]) for p in model["localPaths"]] == [
        ("team-a", "Ready", expected_size(files)), ("team-b", "Ready", expected_size(files))]
    (in_control,), (in_b,) = flow_runs("download-api-create-team-a"), flow_runs("download-api-create-team-b")
    assert in_b.work_pool_name == POOL_B and in_b.deployment_id is not None  # a run in team-b's pool
    assert in_control.deployment_id is None and in_control.parent_task_run_id is not None  # team-a shares the
    assert parent_run(in_control) == run_id  # control pool: a subflow of the ensure run, no process of its own
    assert wait_until(lambda: "weightkeeper.model.ready" in events("weightkeeper.model.api-create"), 30,
                      "the ready event")
    listed = served.api.get("/api/v1/models", params={"workspace": "team-b", "phase": "Ready"},
                            headers=served.as_user("bob")).json()["items"]
    assert [m["name"] for m in listed] == ["api-create"]
    assert listed[0]["message"] is None and all("path" not in p for p in listed[0]["localPaths"])  # alice's

    r = served.api.delete("/api/v1/models/api-create", headers=served.as_user("alice"))
    assert r.status_code == 202 and r.json()["phase"] == "Deleting"
    again = served.api.delete("/api/v1/models/api-create", headers=served.as_user("alice"))
    assert again.status_code in (202, 404)  # harmless: no second run while one works on it
    served.wait_released("api-create")
    assert not any(Path(p["path"]).exists() for p in model["localPaths"])
    wait_until(lambda: [r.state.name for r in flow_runs("delete-api-create")] == ["Completed"], 30,
               "one completed delete run")
    assert wait_until(lambda: "weightkeeper.model.released" in events("weightkeeper.model.api-create"), 30,
                      "the released event")


def test_a_body_too_big_is_refused_before_it_is_parsed_or_its_sender_checked(served):
    """Anyone who reaches the API, token or not, sends 8 MiB of JSON, declared or chunked: 413 at once, never
    parsed (FastAPI parses a body before it checks the bearer token); a declaration of normal size still works."""
    flood = b"[" + b"1," * (4 << 20) + b"1]"
    for headers in ({}, served.as_user("alice")):
        r = served.api.post("/api/v1/models", content=flood, headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["code"] == "TooLarge", r.text
        r = served.api.post("/api/v1/models", content=iter([flood[i:i + 65536] for i in range(0, len(flood), 65536)]),
                            headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 413, r.text
    assert served.api.post("/api/v1/models", json={"name": "x"}).status_code == 401
    r = served.api.post("/api/v1/models", json={"name": "x"}, headers=served.as_user("alice"))
    assert r.status_code == 422 and "source" in r.json()["message"]


def test_a_content_length_of_thousands_of_digits_answers_413_not_500():
    """Behind a proxy or ASGI server that passes it on (uvicorn's h11 refuses it itself), a Content-Length of 5,000
    digits, past the digits Python converts to an int, is a body too big like any other: 413, never a 500."""
    import asyncio

    from weightkeeper.api import BodyLimit

    sent = []

    async def app(scope, receive, send):
        raise AssertionError("the body was handed on")

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/v1/models", "headers": [(b"content-length", b"9" * 5000)]}
    asyncio.run(BodyLimit(app)(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413


def test_refused_requests(served, hub):
    hub.add_repo("acme/api-auth", tiny_files("api-auth"))
    assert served.api.get("/api/v1/models").status_code == 401
    r = served.api.get("/api/v1/models", headers={"Authorization": "Bearer not-a-token"})
    assert r.status_code == 401 and r.json()["code"] == "Unauthorized" and "not-a-token" not in r.text
    assert create(served, "Bad_Name", "hf://acme/api-auth").status_code == 422
    assert create(served, "badsource", "s3:/nowhere").status_code == 422
    r = create(served, "noworkspace", "hf://acme/api-auth", workspaces=[""])
    assert r.status_code == 422 and "no workspace ''" in r.json()["message"], r.text
    for loose in ({"keepFiles": "yes"}, {"track": "true"}, {"keepFiles": 1}):
        r = create(served, "loose", "hf://acme/api-auth", **loose)
        assert r.status_code == 422 and r.json()["code"] == "Invalid", (loose, r.text)
    r = served.api.get("/api/v1/nowhere", headers=served.as_user("alice"))
    assert r.status_code == 404 and r.json() == {"code": "NotFound", "message": "Not Found"}
    r = served.api.post("/api/v1/models", content=b'{"name": ', headers=served.as_user("alice"))
    assert r.status_code in (400, 422) and set(r.json()) == {"code", "message"}, r.text
    r = create(served, "owned", "hf://acme/api-auth", owner="mallory")  # the owner is never a body field
    assert r.status_code == 422
    assert create(served, "owned", "hf://acme/api-auth", workspaces=["team-a"]).status_code == 201
    r = create(served, "owned", "hf://acme/api-auth")
    assert r.status_code == 409 and r.json()["code"] == "AlreadyExists"
    served.wait_phase("owned", "Ready")
    r = create(served, "same-path", "hf://acme/api-auth", user="bob", workspaces=["team-a"])
    assert r.status_code == 409 and r.json()["code"] == "AlreadyExists"  # live model holds every target path
    r = served.api.delete("/api/v1/models/owned", headers=served.as_user("bob"))
    assert r.status_code == 403 and r.json()["code"] == "Forbidden"
    r = served.api.post("/api/v1/models/owned/retry", headers=served.as_user("alice"))
    assert r.status_code == 409 and r.json()["code"] == "NotFailed"
    assert served.api.get("/api/v1/models/nope", headers=served.as_user("alice")).status_code == 404
    assert served.api.get("/openapi.json").json()["paths"].keys() >= {"/api/v1/models", "/api/v1/models/{name}"}
    assert served.api.delete("/api/v1/models/owned", headers=served.as_user("root")).status_code == 202  # admin
    served.wait_released("owned")


def test_include_deleting_during_a_blocked_cleanup(served, hub, immutable):
    files = tiny_files("api-blocked")
    hub.add_repo("acme/api-blocked", files)
    assert create(served, "blocked", "hf://acme/api-blocked", workspaces=["team-a"]).status_code == 201
    path = Path(served.wait_phase("blocked", "Ready")["localPaths"][0]["path"])
    with immutable(path):
        assert served.api.delete("/api/v1/models/blocked", headers=served.as_user("alice")).status_code == 202
        wait_until(lambda: "cleanup of" in served.env.registry.get_model("blocked").message, 60,
                   "the cleanup to fail and be retried")
        alice = served.as_user("alice")
        assert served.api.get("/api/v1/models", headers=alice).json() == {"items": [], "nextCursor": None}
        (model,) = served.api.get("/api/v1/models", params={"includeDeleting": "true"}, headers=alice).json()["items"]
        assert model["isDeleted"] and model["deletionTime"] and model["phase"] == "Deleting"
        assert [(p["path"], p["sizeBytes"]) for p in model["localPaths"]] == [(str(path), expected_size(files))]
        r = create(served, "successor", "hf://acme/api-blocked", user="bob", workspaces=["team-a"])
        assert r.status_code == 409 and r.json()["code"] == "ResourceProcessing"
    served.wait_released("blocked", timeout=60)
    assert not path.exists()
    assert create(served, "successor", "hf://acme/api-blocked", user="bob", workspaces=["team-a"]).status_code == 201
    served.wait_phase("successor", "Ready")


def test_a_killed_worker_mid_delete_is_finished_by_the_next_reconcile(served, hub, immutable):
    from prefect.deployments import run_deployment

    hub.add_repo("acme/api-killed", tiny_files("api-killed"))
    assert create(served, "killed", "hf://acme/api-killed").status_code == 201
    paths = [Path(p["path"]) for p in served.wait_phase("killed", "Ready")["localPaths"]]
    with immutable(paths[0]):
        assert served.api.delete("/api/v1/models/killed", headers=served.as_user("alice")).status_code == 202
        wait_until(lambda: "cleanup of" in served.env.registry.get_model("killed").message, 60,
                   "the cleanup to be under way")
        served.kill_workers()  # kill -9: the worker and its flow run processes
    (deletion,) = flow_runs("delete-killed")
    assert deletion.state.is_running()  # a SIGKILLed run stays Running in Prefect
    assert served.env.registry.get_model("killed").phase == "Deleting"
    served.start_workers()  # no waiting out its lease: its processes on this host are gone
    run = run_deployment("reconcile/reconcile", timeout=180, poll_interval=1)
    assert run.state.is_completed(), run.state
    served.wait_released("killed")
    assert not any(p.exists() for p in paths)
    wait_until(lambda: sorted(r.state.name for r in flow_runs("delete-killed")) == ["Completed", "Crashed"], 60,
               "the killed delete run Crashed, the one reconcile started Completed")


def test_an_idempotency_key_never_answers_with_another_users_or_an_earlier_models_run(served):
    """Alice declares `api-idem` with Idempotency-Key K, then deletes it; bob declares `api-idem` with K: he gets a
    run of his own, not alice's old one. A request repeated with its key (same caller, same model) gets its run."""
    key = "the-same-key"

    def send(method: str, url: str, user: str, idem: str, **kw) -> dict:
        r = served.api.request(method, url, headers={**served.as_user(user), "Idempotency-Key": idem}, **kw)
        assert r.status_code in (201, 202), r.text
        return r.json()["run"]

    def finished(run_id: str) -> None:
        wait_until(lambda: any(str(r.id) == run_id and r.state.is_final() for r in flow_runs("ensure-api-idem")),
                   60, f"run {run_id} to end")

    body = {"name": "api-idem", "source": "hf://acme/api-idem-missing", "workspaces": ["team-a"]}
    alices = send("POST", "/api/v1/models", "alice", key, json=body)["flowRunId"]
    finished(alices)
    retried = send("POST", "/api/v1/models/api-idem/retry", "alice", "retry-key")["flowRunId"]
    finished(retried)
    served.wait_phase("api-idem", "Failed")
    assert send("POST", "/api/v1/models/api-idem/retry", "alice", "retry-key")["flowRunId"] == retried  # repeated
    assert len(flow_runs("ensure-api-idem")) == 2
    send("DELETE", "/api/v1/models/api-idem", "alice", key)
    served.wait_released("api-idem")

    bobs = send("POST", "/api/v1/models", "bob", key, json=body)
    assert bobs["flowRunId"] not in (None, alices, retried) and bobs["message"] == "ensure-model run started"
    assert len(flow_runs("ensure-api-idem")) == 3
    finished(bobs["flowRunId"])
    send("DELETE", "/api/v1/models/api-idem", "bob", key)
    served.wait_released("api-idem")
