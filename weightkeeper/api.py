"""REST API (`/api/v1`, OpenAPI at `/docs` and `/openapi.json`): declare, list, delete and retry models.

Bearer tokens map to the users of the config file; the owner of a model is the authenticated user.
Creating, deleting and retrying start the matching deployment at once (one run per request).
A user sees their own models and those with a public workspace (admins: all); token blocks, storage
locations and messages only of their own. Over-long input or control characters answer 422, before anything
is written; a body over 64 KiB answers 413 before it is parsed or its sender checked. `/metrics` answers in the
Prometheus text format (`weightkeeper.metrics`).
"""

import gc
import hashlib
import hmac
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Literal

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from weightkeeper.config import DELETE_FLOW, ENSURE_FLOW, Settings, User
from weightkeeper.errors import ConflictError, InvalidInputError, NotFoundError, UnavailableError
from weightkeeper.layout import MODEL_NAME
from weightkeeper.metrics import metrics_registry
from weightkeeper.phase import Phase
from weightkeeper.registry import Model, Registry, registry_for
from weightkeeper.registry.common import utcnow
from weightkeeper.registry.listing import DEFAULT_LIMIT, MAX_LIMIT, ListQuery, Sort
from weightkeeper.runs import NoDeployment, start_deployment
from weightkeeper.service import declare_model
from weightkeeper.tenancy import redact, refusal, viewer, visible

PLAIN = r"^[^\x00-\x1f\x7f]*$"  # no NUL or other control character
NAME = f"^{MODEL_NAME.pattern}$"
Plain = Annotated[str, Field(max_length=63, pattern=PLAIN)]
KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a field, parameter or header name: shown as is
SHOWN_ERRORS = 5  # a body of 64 KiB holds thousands of made-up keys, each an error


def where_and_why(errors: list[dict]) -> str:
    """Invalid input as one short line: where and why, for the first few errors. The input itself is never echoed
    (it may be a secret or hold control characters): a key the request made up is `<key>` unless a plain name."""

    def where(loc: tuple) -> str:
        return ".".join(str(p) if isinstance(p, int) or KEY.fullmatch(p) else "<key>" for p in loc)

    said = "; ".join(f"{where(e['loc'])}: {e['msg']}" for e in errors[:SHOWN_ERRORS])
    return said + (f"; and {len(errors) - SHOWN_ERRORS} more" if len(errors) > SHOWN_ERRORS else "")


class ModelCreate(BaseModel):
    """A model to declare; its owner is the caller."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=63, pattern=PLAIN, description="lowercase letters, digits and '-'")
    source: str = Field(max_length=512, pattern=PLAIN, description="hf://owner/name[@revision] or s3://bucket/prefix/")
    workspaces: list[Plain] | None = Field(default=None, min_length=1, max_length=64,
                                           description="target workspaces, at least one (left out: every public one)")
    subpath: str | None = Field(default=None, max_length=255, pattern=PLAIN)
    tokenBlock: str | None = Field(default=None, pattern=NAME,
                                   description="name of a Prefect Secret block with the HF token (one of yours)")
    downloadPolicy: Literal["always-download", "reuse-if-exists"] | None = None
    keepFiles: StrictBool = False
    include: list[Annotated[str, Field(max_length=255, pattern=PLAIN)]] | None = Field(
        default=None, max_length=32, description="fetch only the files these patterns match (default: the weights "
                                                 "and the files loading needs)")
    exclude: list[Annotated[str, Field(max_length=255, pattern=PLAIN)]] | None = Field(
        default=None, max_length=32, description="never fetch the files these patterns match")
    track: StrictBool = Field(default=False, description="follow the branch or tag: switch to each new commit")


MAX_BODY_BYTES = 64 * 1024  # a model's declaration is a few hundred bytes


class BodyLimit:
    """ASGI middleware: a request body over MAX_BODY_BYTES answers 413 before anything parses it or checks who
    sent it (FastAPI reads and parses a body before it checks the bearer token). The body is read here, bounded,
    whatever Content-Length says, and handed on as read."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        body, too_big = b"", declared.isdigit() and (len(declared) > 12 or int(declared) > MAX_BODY_BYTES)
        more = not too_big
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None
            body += message.get("body", b"")
            too_big = len(body) > MAX_BODY_BYTES
            more = message.get("more_body", False) and not too_big
        if too_big:
            return await JSONResponse({"code": "TooLarge", "message": f"the request body is over {MAX_BODY_BYTES} "
                                       "bytes"}, status_code=413, headers={"Connection": "close"})(scope, receive, send)
        handed = False

        async def replay() -> dict:
            nonlocal handed
            if handed:
                return await receive()
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


class Problem(BaseModel):
    code: str
    message: str


def _run(flow_run_id: str | None, note: str) -> dict:
    return {"flowRunId": flow_run_id, "message": note}


def run_key(flow: str, model: Model, caller: User, key: str | None) -> str:
    """The idempotency key of a run started for `model`: the caller's `Idempotency-Key` (a fresh one without) bound
    to the caller and to this model (its registry id and creation time: SQLite may reuse an id), so the same key
    never answers with another user's run, nor with a run of an earlier model of that name. Hashed: a lease holder
    keeps it (the key has no control character)."""
    made = model.created_at.isoformat() if model.created_at else ""
    mine = hashlib.sha256(f"{caller.name}\0{key or uuid.uuid4()}\0{made}".encode()).hexdigest()
    return f"api/{flow}/{model.name}/{model.id}/{mine}"


def request_key(caller: User, key: str, body: BaseModel) -> str:
    """The digest of a create request: its caller, `Idempotency-Key` and body (a repeat matches it exactly)."""
    return hashlib.sha256(f"{caller.name}\0{key}\0{body.model_dump_json()}".encode()).hexdigest()


@asynccontextmanager
async def _frozen_heap(_: FastAPI) -> AsyncIterator[None]:
    """Once serving, leave what start-up made (modules, Prefect, SQLAlchemy: ~200,000 objects) out of the
    garbage collector's full passes, which otherwise scan it every few dozen requests (~100 ms pauses)."""
    gc.freeze()
    yield


def create_app(settings: Settings, registry: Registry | None = None) -> FastAPI:
    """The API for these settings (and their registry)."""
    registry = registry or registry_for(settings)
    bearer = HTTPBearer(auto_error=False)
    tokens = {u.token_sha256: u for u in settings.users if u.token_sha256}
    app = FastAPI(title="weightkeeper", version="1", description=__doc__, lifespan=_frozen_heap,
                  responses={401: {"model": Problem}, 403: {"model": Problem}})

    app.add_middleware(BodyLimit)

    def problem(code: int, kind: str, message: str) -> JSONResponse:
        return JSONResponse({"code": kind, "message": message}, status_code=code)

    @app.exception_handler(InvalidInputError)
    def invalid(_: Request, e: InvalidInputError) -> JSONResponse:
        return problem(422, "Invalid", str(e))

    @app.exception_handler(ConflictError)
    def conflict(_: Request, e: ConflictError) -> JSONResponse:
        return problem(409, e.code, str(e))

    @app.exception_handler(UnavailableError)
    def unavailable(_: Request, e: UnavailableError) -> JSONResponse:
        return problem(503, "Unavailable", str(e))

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    def registry_down(_: Request, e: DBAPIError) -> JSONResponse:  # the statement and its values are not shown
        return problem(503, "Unavailable", "the registry cannot be reached now; retry later")

    @app.exception_handler(NotFoundError)
    def not_found(_: Request, e: NotFoundError) -> JSONResponse:
        return problem(404, "NotFound", str(e))

    @app.exception_handler(RequestValidationError)
    def unprocessable(_: Request, e: RequestValidationError) -> JSONResponse:
        return problem(422, "Invalid", where_and_why(list(e.errors())))

    @app.exception_handler(StarletteHTTPException)  # FastAPI's, and the router's own (no such route, bad JSON)
    def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kinds = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed"}
        response = problem(e.status_code, kinds.get(e.status_code, "Error"), str(e.detail))
        response.headers.update(e.headers or {})
        return response

    def digest(credentials: HTTPAuthorizationCredentials | None) -> str:
        return hashlib.sha256(credentials.credentials.encode()).hexdigest() if credentials else ""

    def user(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> User:
        match = next((u for d, u in tokens.items() if hmac.compare_digest(d, digest(credentials))), None)
        if match is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return match

    def seen(name: str, caller: User) -> Model:
        """The model if the caller may see it (as a page shows it: no manifest); otherwise it answers as if it did
        not exist."""
        model = registry.shown_model(name)
        if not visible(model, caller, settings):
            raise NotFoundError(f"model {name!r} does not exist")
        return model

    def owned(name: str, caller: User) -> Model:
        model = seen(name, caller)
        if model.owner_name != caller.name and not caller.admin:
            raise HTTPException(403, f"model {name!r} belongs to {model.owner_name!r}; only its owner or an admin "
                                     "may change it")
        return model

    def start(flow: str, model: Model, caller: User, key: str | None) -> dict:
        """Start `flow` for that very model (one declared since under its name is left alone)."""
        try:
            run_id = start_deployment(registry, settings, flow, model.name, run_key(flow, model, caller, key),
                                      seen=model)
        except NotFoundError:
            return _run(None, f"model {model.name!r} was released meanwhile; no {flow} run started")
        except NoDeployment as e:
            return _run(None, f"{e}; the next reconcile pass starts it")
        except (httpx.HTTPError, OSError) as e:  # recorded all the same: reconcile starts what is due
            return _run(None, f"Prefect could not start the {flow} run now ({type(e).__name__}); the next reconcile "
                              "pass starts it")
        return _run(run_id, f"{flow} run started" if run_id else f"a {flow} run is already working on it")

    def view(model: Model, caller: User) -> dict:
        return redact(model.to_json(), caller, settings)

    Caller = Annotated[User, Depends(user)]
    IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=128, pattern=r"^[ -~]+$",
                                                  description="repeat-safe request id (printable ASCII)")]
    Name = Annotated[str, Path(max_length=63, pattern=NAME)]

    @app.post("/api/v1/models", status_code=status.HTTP_201_CREATED,
              responses={409: {"model": Problem}, 422: {"model": Problem}})
    def create_model(body: ModelCreate, caller: Caller, key: IdempotencyKey = None) -> dict:
        """Declare a model owned by the caller and start ensure-model. The same request repeated with its
        `Idempotency-Key` (same caller, same body) answers with the model it declared, while that model lives.
        403 for a token block or S3 prefix the caller may not use; 409 `ResourceProcessing` while a deleting
        model still holds a target path; 409 `AlreadyExists` when the name is taken (by a model the caller may not
        see: only that it is) or live models hold them all; 409
        `InsufficientCapacity` when its size would take a workspace past its `capacity_bytes` (such a model is
        resolved now to know it: 503 if its source cannot be asked); 409 `QuotaExceeded` when the caller already
        holds their `max_models`."""
        if reason := refusal(caller, body.source, body.tokenBlock):
            raise HTTPException(403, reason)
        received = utcnow()
        model = declare_model(settings, registry, name=body.name, source=body.source, owner_name=caller.name,
                              owner_uid=caller.uid, workspaces=body.workspaces, subpath=body.subpath,
                              token_block=body.tokenBlock, download_policy=body.downloadPolicy,
                              keep_files=body.keepFiles, include=body.include, exclude=body.exclude,
                              track=body.track, names_others=caller.admin,
                              request_key=key and request_key(caller, key, body),
                              sees=lambda m: visible(m, caller, settings),
                              max_models=None if caller.admin else caller.max_models)
        if model.created_at < received:  # this request repeated: its model as it is now, no run started again
            return {**view(model, caller), "run": _run(None, "a repeat of the request that declared the model")}
        return {**view(model, caller), "run": start(ENSURE_FLOW, model, caller, key)}

    @app.get("/api/v1/models", responses={422: {"model": Problem}})
    def list_models(caller: Caller,
                    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
                    cursor: Annotated[str | None, Query(max_length=1024, pattern=r"^[A-Za-z0-9_-]+$")] = None,
                    workspace: Annotated[str | None, Query(max_length=63, pattern=PLAIN)] = None,
                    phase: Phase | None = None,
                    owner: Annotated[str | None, Query(max_length=255, pattern=PLAIN)] = None,
                    search: Annotated[str | None, Query(max_length=255, pattern=PLAIN)] = None,
                    sort: Sort = "name",
                    include_deleting: Annotated[bool, Query(alias="includeDeleting")] = False) -> JSONResponse:
        """One page of the models the caller may see: `{"items": [...], "nextCursor": ...}`; pass `nextCursor`
        back as `cursor` for the next page (null: the last one). Filters: one workspace (by the entries the
        caller sees), phase, owner, `search` (a substring of the name or source, any case); `sort` by name,
        `created` or `size` (`-` first: descending); `includeDeleting=true` adds those still being deleted
        (`isDeleted`, `deletionTime`, and the `localPaths` they still occupy)."""
        query = ListQuery(workspace=workspace, phase=phase, owner=owner, search=search, sort=sort,
                          include_deleting=include_deleting)
        page = registry.list_page(query, viewer(caller, settings), limit, cursor)
        # JSON already: FastAPI's encoder would walk every value of the page again (15 ms of 100 models)
        return JSONResponse({"items": [view(m, caller) for m in page.items], "nextCursor": page.next_cursor})

    @app.get("/api/v1/models/{name}", responses={404: {"model": Problem}})
    def get_model(name: Name, caller: Caller) -> dict:
        return view(seen(name, caller), caller)

    @app.delete("/api/v1/models/{name}", status_code=status.HTTP_202_ACCEPTED, responses={404: {"model": Problem}})
    def delete_model(name: Name, caller: Caller, key: IdempotencyKey = None) -> dict:
        """Mark the model Deleting and start delete-model; cleanup goes on after the answer. Repeating it is
        harmless: no second run starts while one works on the model."""
        model = registry.mark_deleting(name, owned(name, caller))  # that very model: not one declared since
        return {**view(model, caller), "run": start(DELETE_FLOW, model, caller, key)}

    @app.post("/api/v1/models/{name}/retry", status_code=status.HTTP_202_ACCEPTED,
              responses={404: {"model": Problem}, 409: {"model": Problem}})
    def retry_model(name: Name, caller: Caller, key: IdempotencyKey = None) -> dict:
        """Make a Failed model Pending again and start ensure-model (409 `NotFailed` in any other phase)."""
        model = registry.retry_model(name, owned(name, caller))
        return {**view(model, caller), "run": start(ENSURE_FLOW, model, caller, key)}

    collectors = metrics_registry(settings, registry)

    @app.get("/metrics", responses={200: {"content": {CONTENT_TYPE_PLAIN_0_0_4: {}}}})
    def metrics(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Response:
        """Every process's metrics in the Prometheus text format, for an admin's token or the scrape-only one
        (`metrics_token_sha256`): they name workspaces and count their models."""
        scraper = settings.metrics_token_sha256
        if not (scraper and hmac.compare_digest(scraper, digest(credentials))) and not user(credentials).admin:
            raise HTTPException(403, "only an admin's token or the metrics token (metrics_token_sha256) may read "
                                     "/metrics")
        return Response(generate_latest(collectors), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    return app
