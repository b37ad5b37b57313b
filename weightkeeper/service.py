"""What users ask for, validated once for the CLI and the API: declare a model, ask for deletion."""

from __future__ import annotations

from collections.abc import Callable

from weightkeeper.config import Settings
from weightkeeper.download import Snapshot
from weightkeeper.errors import DownloadError, InvalidInputError, UnavailableError, UnsafePathError
from weightkeeper.guard import check_removable
from weightkeeper.layout import (
    MODEL_NAME,
    REUSE_IF_EXISTS,
    HfSource,
    S3Source,
    parse_source,
    sharing_problem,
    validate_model_name,
    validate_patterns,
    validate_policy,
    validate_subpath,
)
from weightkeeper.planning import Plan, plan_paths
from weightkeeper.registry import Model, ModelSpec, Registry


def _guarded(settings: Settings, plan: Plan) -> Plan:
    """Refuse a plan with any path the cleanup guard would refuse: what cannot be removed is never written."""
    for p in plan.paths:
        try:
            check_removable(p.path, settings.volume_rules)
        except UnsafePathError as e:
            raise InvalidInputError(f"workspace {p.workspace!r} would get an unsafe path: {e}") from None
    return plan


def _check_source_and_token(settings: Settings, parsed: HfSource | S3Source, token_block: str | None) -> None:
    """Refuse weightkeeper's own staging prefix as a source (or a prefix holding it): it holds other models'
    staged copies, which such a model would read and keep from being deleted. Token blocks are block names."""
    if token_block and not MODEL_NAME.fullmatch(token_block):
        raise InvalidInputError(f"invalid token block name {token_block[:80]!r}: a Prefect block name is 1-63 "
                                "lowercase letters, digits and '-'")
    if isinstance(parsed, S3Source) and settings.s3 is not None:
        staging = f"s3://{settings.s3.bucket}/{settings.s3.prefix}/"
        if parsed.uri.startswith(staging) or staging.startswith(parsed.uri):
            raise InvalidInputError(f"source {parsed.uri} overlaps weightkeeper's staging prefix {staging}, which "
                                    "holds the staged copies of other models; use a prefix outside it")


def declare_model(settings: Settings, registry: Registry, *, name: str, source: str, owner_name: str,
                  owner_uid: int, workspaces: list[str] | None = None, subpath: str | None = None,
                  token_block: str | None = None, download_policy: str | None = None,
                  keep_files: bool = False, include: list[str] | None = None,
                  exclude: list[str] | None = None, track: bool = False, names_others: bool = True,
                  request_key: str | None = None, sees: Callable[[Model], bool] | None = None,
                  max_models: int | None = None) -> Model:
    """Validate a declaration, plan its paths and record it Pending (`names_others`: a refusal may name another
    owner's model, as it may to an admin; `request_key`: the API request's digest, whose repeat answers with the
    model it declared; `sees`: which models the declarer may see, None: all; `max_models`: how many its owner may
    hold, None: no limit)."""
    validate_model_name(name)
    parsed = parse_source(source)
    if isinstance(parsed, S3Source):
        if settings.s3 is None:
            raise InvalidInputError(f"source {parsed.uri} is in S3, but S3 is not configured: add an [s3] table "
                                    f"to {settings.config_path or '$WEIGHTKEEPER_CONFIG'}")
        if token_block:
            raise InvalidInputError("--token-block is for Hugging Face sources; S3 sources use the [s3] credentials")
    subpath = validate_subpath(subpath)
    include, exclude = validate_patterns(include, "--include"), validate_patterns(exclude, "--exclude")
    download_policy = _tracked_policy(parsed, download_policy) if track else validate_policy(download_policy)
    if token_block is not None and not token_block.strip():
        raise InvalidInputError("--token-block needs the name of a Prefect Secret block")
    _check_source_and_token(settings, parsed, token_block)
    if not settings.workspaces:
        where = settings.config_path or "$WEIGHTKEEPER_CONFIG"
        raise InvalidInputError(f"no workspaces are declared; add [[workspaces]] to {where}")
    plan = _guarded(settings, plan_paths(settings.workspaces, parsed.repo_id, owner_name, workspaces or None, subpath))
    for p in plan.paths if track else ():
        ws = settings.workspace(p.workspace)
        if problem := sharing_problem(p.path, ws.volume, ws.models_dir):
            raise InvalidInputError(f"a tracked model links its paths to shared copies: {problem}")
    limited = {w.name for w in settings.workspaces if w.capacity_bytes is not None}
    snapshot = _size(settings, registry, name, parsed, token_block, include, exclude) if limited & {
        p.workspace for p in plan.paths} else None
    spec = ModelSpec(name=name, owner_name=owner_name, owner_uid=owner_uid, source=parsed.uri,
                     repo_id=parsed.repo_id, revision=parsed.revision, token_block=token_block,
                     targets=list(dict.fromkeys(workspaces)) if workspaces else None, subpath=subpath,
                     download_policy=download_policy, keep_files=keep_files, include=include, exclude=exclude,
                     track=track,
                     commit=snapshot and snapshot.commit, files=snapshot and [f.to_json() for f in snapshot.files],
                     source_uri=parsed.uri if snapshot and isinstance(parsed, S3Source) else None,
                     request_key=request_key)
    return registry.create_model(spec, plan, settings.workspaces, names_others, sees, max_models)


def _tracked_policy(parsed: HfSource | S3Source, policy: str | None) -> str:
    """A tracked model follows a branch or tag of a Hub repository, and its paths link to shared copies (a switch
    renames one link over another)."""
    if not isinstance(parsed, HfSource) or parsed.pinned_commit:
        raise InvalidInputError("--track follows a branch or tag: give hf://owner/name@<branch or tag>, not "
                                f"{parsed.uri}")
    if validate_policy(policy or REUSE_IF_EXISTS) != REUSE_IF_EXISTS:
        raise InvalidInputError("a tracked model's path is a link to its commit's shared copy, switched by a "
                                "rename: use --download-policy reuse-if-exists (the default with --track)")
    return REUSE_IF_EXISTS


def switch_revision(registry: Registry, name: str, revision: str) -> Model:
    """Ask a Ready model to switch its paths to another revision once (`ensure-model` does it)."""
    model = registry.get_model(name)
    parsed = parse_source(model.source)
    if not isinstance(parsed, HfSource):
        raise InvalidInputError(f"model {name!r} has an S3 source; only Hugging Face models switch revision")
    wanted = parse_source(f"hf://{model.repo_id}@{revision}")
    if model.download_policy != REUSE_IF_EXISTS:
        raise InvalidInputError(f"model {name!r} keeps its own copy, which cannot switch in place; declare a model "
                                f"for hf://{model.repo_id}@{revision} (its unchanged files are taken from this one)")
    registry.request_revision(name, wanted.revision)
    return registry.get_model(name)


def _size(settings: Settings, registry: Registry, name: str, parsed: HfSource | S3Source, token_block: str | None,
          include: list[str] | None, exclude: list[str] | None) -> Snapshot:
    """The snapshot of a model bound for a workspace with a capacity, resolved at creation to know its size (and
    pinned, so its run does not resolve it again)."""
    from weightkeeper.sources import resolve  # the Hub and S3 clients, only for such models

    def spent(seconds: float | None) -> None:  # a request waits for no budget: the caller tries again
        if seconds is not None:
            raise UnavailableError(f"model {name!r} cannot be sized for its workspace's capacity now: the Hub "
                                   f"request budget is spent for {seconds:.0f} s; try again then")

    try:
        return resolve(settings, registry, parsed, token_block, include, exclude, spent)
    except DownloadError as e:
        if e.permanent:
            raise InvalidInputError(f"model {name!r} cannot be sized for its workspace's capacity: {e}") from None
        raise UnavailableError(f"model {name!r} cannot be sized for its workspace's capacity now: {e}; "
                               "try again") from None


def move_model(settings: Settings, registry: Registry, name: str, *, subpath: str | None,
               download_policy: str | None) -> Model:
    """Give a model a new subpath and/or policy: the new paths are filled first, then the old ones cleaned."""
    model = registry.get_model(name)
    subpath = validate_subpath(subpath)
    if model.track and download_policy not in (None, REUSE_IF_EXISTS):
        raise InvalidInputError(f"model {name!r} is tracked: its paths are links to shared copies (reuse-if-exists)")
    plan = _guarded(settings, plan_paths(settings.workspaces, model.repo_id, model.owner_name, model.targets, subpath))
    return registry.update_model(name, plan, subpath, validate_policy(download_policy or model.download_policy))
