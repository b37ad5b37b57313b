"""What users ask for, validated once for the CLI and the API: declare a model, ask for deletion."""

from __future__ import annotations

from weightkeeper.config import Settings
from weightkeeper.errors import InvalidInputError, UnsafePathError
from weightkeeper.guard import check_removable
from weightkeeper.layout import (
    MODEL_NAME,
    HfSource,
    S3Source,
    parse_source,
    validate_model_name,
    validate_policy,
    validate_subpath,
)
from weightkeeper.planning import Plan, plan_paths
from weightkeeper.registry import Model, ModelSpec, Registry, open_registry


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


def registry_for(settings: Settings) -> Registry:
    return open_registry(settings.registry_url)


def declare_model(settings: Settings, registry: Registry, *, name: str, source: str, owner_name: str,
                  owner_uid: int, workspaces: list[str] | None = None, subpath: str | None = None,
                  token_block: str | None = None, download_policy: str | None = None,
                  keep_files: bool = False) -> Model:
    """Validate a declaration, plan its paths and record it Pending."""
    validate_model_name(name)
    parsed = parse_source(source)
    if isinstance(parsed, S3Source):
        if settings.s3 is None:
            raise InvalidInputError(f"source {parsed.uri} is in S3, but S3 is not configured: add an [s3] table "
                                    f"to {settings.config_path or '$WEIGHTKEEPER_CONFIG'}")
        if token_block:
            raise InvalidInputError("--token-block is for Hugging Face sources; S3 sources use the [s3] credentials")
    subpath = validate_subpath(subpath)
    download_policy = validate_policy(download_policy)
    if token_block is not None and not token_block.strip():
        raise InvalidInputError("--token-block needs the name of a Prefect Secret block")
    _check_source_and_token(settings, parsed, token_block)
    if not settings.workspaces:
        where = settings.config_path or "$WEIGHTKEEPER_CONFIG"
        raise InvalidInputError(f"no workspaces are declared; add [[workspaces]] to {where}")
    plan = _guarded(settings, plan_paths(settings.workspaces, parsed.repo_id, owner_name, workspaces or None, subpath))
    spec = ModelSpec(name=name, owner_name=owner_name, owner_uid=owner_uid, source=parsed.uri,
                     repo_id=parsed.repo_id, revision=parsed.revision, token_block=token_block,
                     targets=list(workspaces) if workspaces else None, subpath=subpath,
                     download_policy=download_policy, keep_files=keep_files)
    return registry.create_model(spec, plan)


def move_model(settings: Settings, registry: Registry, name: str, *, subpath: str | None,
               download_policy: str | None) -> Model:
    """Give a model a new subpath and/or policy: the new paths are filled first, then the old ones cleaned."""
    model = registry.get_model(name)
    subpath = validate_subpath(subpath)
    plan = _guarded(settings, plan_paths(settings.workspaces, model.repo_id, model.owner_name, model.targets, subpath))
    return registry.update_model(name, plan, subpath, validate_policy(download_policy or model.download_policy))
