"""Who may see and declare what through the API (pure rules, no I/O).

A user sees their own models and those with a public workspace; admins see every model. Fields that name
secrets or storage (token block, staged or S3 source prefix, local paths) and messages (which quote
paths and URLs) are shown only to the owner and admins. A user names only their own `token_blocks` and
reads only their own `s3_sources`; admins may name any.
"""

from __future__ import annotations

from weightkeeper.config import Settings, User
from weightkeeper.layout import S3Source, parse_source
from weightkeeper.registry import Model
from weightkeeper.registry.listing import Viewer

OWNER_FIELDS = ("tokenBlock", "stagingUri", "message", "subpath")
OWNER_PATH_FIELDS = ("path", "message", "sharedCopy")


def _public(settings: Settings) -> set[str]:
    return {w.name for w in settings.workspaces if w.public}


def visible(model: Model, user: User, settings: Settings) -> bool:
    """Whether `user` may see the model at all (otherwise it answers as if it did not exist)."""
    if user.admin or model.owner_name == user.name:
        return True
    public = _public(settings)
    targets = public if model.targets is None else set(model.targets)
    return bool(public & (targets | {p.workspace for p in model.local_paths}))


def viewer(user: User, settings: Settings) -> Viewer:
    """Whose list the registry pages through for `user` (the rule of `visible`, applied in SQL)."""
    return Viewer(None if user.admin else user.name, frozenset(_public(settings)))


def redact(model_json: dict, user: User, settings: Settings) -> dict:
    """The model as `user` may see it: others get no secrets, storage locations or messages, and only the
    targets and entries of public workspaces."""
    if user.admin or model_json["owner"]["name"] == user.name:
        return model_json
    public = _public(settings)
    out = {**model_json, **dict.fromkeys(OWNER_FIELDS)}
    if out["targets"] is not None:
        out["targets"] = [t for t in out["targets"] if t in public]
    if out["source"].startswith("s3://"):
        out["source"] = None
    out["localPaths"] = [{k: v for k, v in p.items() if k not in OWNER_PATH_FIELDS}
                         for p in model_json["localPaths"] if p["workspace"] in public]
    return out


def refusal(user: User, source: str, token_block: str | None) -> str | None:
    """Why `user` may not declare a model from `source` with `token_block` (None: allowed)."""
    if user.admin:
        return None
    if token_block is not None and token_block not in user.token_blocks:
        return (f"user {user.name!r} may not use token block {token_block!r}: it is not in their token_blocks; "
                "ask an admin to add it to their [[users]] entry")
    parsed = parse_source(source)
    if isinstance(parsed, S3Source) and not any(parsed.uri.startswith(p) for p in user.s3_sources):
        return (f"user {user.name!r} may not read {parsed.uri}: it is outside their s3_sources; ask an admin to "
                "add its prefix to their [[users]] entry")
    return None
