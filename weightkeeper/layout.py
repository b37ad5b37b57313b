"""Pure rules for sources, directory names and model paths (no I/O)."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass

from weightkeeper.errors import InvalidInputError

SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
COMMIT = re.compile(r"[0-9a-f]{40}")
COPY = re.compile(r"[0-9a-f]{40}(\.[0-9a-f]{16})?")  # a shared or staged copy: the commit [.the file selection]
MODEL_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
DEFAULT_REVISION = "main"
ARTIFACTS_DIR = "_artifacts"
MAX_SUBPATH = 255  # characters, as the API takes
ARTIFACTS = re.compile(r"_artifacts(\.[1-9][0-9]{0,9})?")  # the service's shared copies, or one job owner's
ALWAYS_DOWNLOAD, REUSE_IF_EXISTS = "always-download", "reuse-if-exists"
DOWNLOAD_POLICIES = (ALWAYS_DOWNLOAD, REUSE_IF_EXISTS)


@dataclass(frozen=True)
class HfSource:
    """A Hugging Face model repository at a revision (`hf://owner/name[@revision]`)."""

    repo_id: str
    revision: str = DEFAULT_REVISION

    @property
    def uri(self) -> str:
        return f"hf://{self.repo_id}@{self.revision}"

    @property
    def pinned_commit(self) -> str | None:
        """The revision itself when it is a full commit sha: then no lookup is needed."""
        return self.revision if COMMIT.fullmatch(self.revision) else None


@dataclass(frozen=True)
class S3Source:
    """A snapshot that is already in S3 (`s3://bucket/prefix/`): filled from, never deleted by us.

    Its last prefix segment names the model directory, as `owner--name` does for the Hub.
    """

    bucket: str
    prefix: str  # without a leading '/', ending with '/'
    revision: str = ""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def repo_id(self) -> str:
        return self.prefix.rstrip("/").rsplit("/", 1)[-1]


def validate_model_name(name: str) -> str:
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
        raise InvalidInputError(
            f"invalid model name {name!r}: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def _validate_repo_segment(segment: str, repo_id: str) -> None:
    if (
        not SEGMENT.fullmatch(segment)
        or "--" in segment
        or ".." in segment
        or segment[0] in "-."
        or segment[-1] in "-."
        or len(segment) > 96
    ):
        raise InvalidInputError(
            f"invalid Hugging Face repository {repo_id!r}: each part must be letters, digits, '.', '_' or '-', "
            "must not start or end with '-' or '.', and must not contain '--' or '..'"
        )


def parse_s3_uri(uri: str) -> S3Source:
    """`s3://bucket/prefix[/]` with plain segments; the prefix is returned with a trailing '/'."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    segments = key.rstrip("/").split("/") if key.strip("/") else []
    if not BUCKET.fullmatch(bucket) or not segments or any(
            not SEGMENT.fullmatch(s) or s in (".", "..") for s in segments):
        raise InvalidInputError(f"invalid S3 source {uri!r}: use s3://bucket/prefix/ with a valid bucket name and "
                                "plain prefix segments (letters, digits, '.', '_', '-')")
    if is_artifacts_dir(segments[-1]) or segments[-1][0] in "-.":
        raise InvalidInputError(f"invalid S3 source {uri!r}: its last segment {segments[-1]!r} names the model "
                                "directory and must start with a letter or digit")
    return S3Source(bucket, "/".join(segments) + "/")


def parse_source(source: str) -> HfSource | S3Source:
    """Parse `hf://owner/name[@revision]` (or a bare `owner/name[@revision]`) or `s3://bucket/prefix/`."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidInputError("a model source is required, e.g. hf://Qwen/Qwen2.5-0.5B-Instruct@main")
    text = source.strip()
    if text.startswith("s3://"):
        parsed = parse_s3_uri(text)
        if len(parsed.repo_id) > 255:
            raise InvalidInputError(f"invalid S3 source {text[:80]!r}...: its last segment names a directory and "
                                    "must be at most 255 characters")
        return parsed
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme != "hf":
            raise InvalidInputError(f"unsupported source scheme {scheme!r} in {source!r}: use hf://owner/name[@revision] "
                                    "or s3://bucket/prefix/")
    repo_id, at, revision = text.partition("@")
    if at and (not revision or len(revision) > 255 or not revision.isprintable() or any(c.isspace() for c in revision)
               or ".." in revision or revision.startswith("/")):
        raise InvalidInputError(f"invalid revision {revision[:80]!r} in {source[:120]!r}: use a branch, tag or "
                                "commit of at most 255 printable characters, without spaces or '..'")
    parts = repo_id.split("/")
    if not 1 <= len(parts) <= 2:
        raise InvalidInputError(f"invalid Hugging Face repository {repo_id!r}: expected owner/name")
    for part in parts:
        _validate_repo_segment(part, repo_id)
    return HfSource(repo_id=repo_id, revision=revision or DEFAULT_REVISION)


def repo_dir_name(repo_id: str) -> str:
    """`owner/name` -> `owner--name`; a single-segment repository keeps its name.

    Hugging Face forbids `--` inside a segment, so two repositories never share a directory.
    """
    return "--".join(repo_id.split("/"))


def validate_subpath(subpath: str | None) -> str | None:
    """A relative, clean path of safe segments, or None."""
    if subpath is None or subpath == "":
        return None
    if len(subpath) > MAX_SUBPATH:
        raise InvalidInputError(f"invalid subpath {subpath[:40]!r}...: longer than {MAX_SUBPATH} characters")
    segments = subpath.split("/")
    if subpath.startswith("/") or any(s in ("", ".", "..") or not SEGMENT.fullmatch(s) for s in segments):
        raise InvalidInputError(
            f"invalid subpath {subpath!r}: use a relative path of letters, digits, '.', '_' and '-' segments "
            "(no '..', no leading or double '/')"
        )
    if any(map(is_artifacts_dir, segments)):
        raise InvalidInputError(f"invalid subpath {subpath!r}: {ARTIFACTS_DIR!r} directories hold the shared copies")
    if any(s.startswith(".") for s in segments):
        raise InvalidInputError(f"invalid subpath {subpath!r}: a segment starting with '.' (such as .cache) is "
                                "where weightkeeper and other tools keep their own files")
    return subpath


def model_path(volume: str, repo_id: str, subpath: str | None = None, models_dir: str = "models") -> str:
    """`<volume>/[subpath/]models/<dir>`; a subpath that already has a models segment is the parent as is."""
    subpath = validate_subpath(subpath)
    parent = volume
    if subpath:
        parent = posixpath.join(parent, subpath)
    if not subpath or models_dir not in subpath.split("/"):
        parent = posixpath.join(parent, models_dir)
    if is_artifacts_dir(repo_dir_name(repo_id)):
        raise InvalidInputError(f"repository {repo_id!r} maps to {repo_dir_name(repo_id)!r}, a directory of shared "
                                "copies")
    return posixpath.join(parent, repo_dir_name(repo_id))


def validate_policy(policy: str | None) -> str:
    policy = policy or ALWAYS_DOWNLOAD
    if policy not in DOWNLOAD_POLICIES:
        raise InvalidInputError(f"invalid download policy {policy!r}: use {' or '.join(DOWNLOAD_POLICIES)}")
    return policy


MAX_PATTERNS = 32
MAX_WILDCARDS = 16  # per pattern


def validate_patterns(patterns: object, flag: str) -> list[str] | None:
    """File patterns (`fnmatch`, matched against repository paths) as given, or None for none given: 1 to
    MAX_PATTERNS relative, printable patterns without `..` segments, of at most 255 characters each."""
    if patterns is None:
        return None
    if not isinstance(patterns, (list, tuple)) or not patterns or len(patterns) > MAX_PATTERNS:
        raise InvalidInputError(f"invalid {flag}: give a list of 1 to {MAX_PATTERNS} patterns")
    out = []
    for p in patterns:
        if not isinstance(p, str) or not p or len(p) > 255 or not p.isprintable():
            raise InvalidInputError(f"invalid {flag} pattern {str(p)[:80]!r}: use 1-255 printable characters, "
                                    "e.g. '*Q4_K_M.gguf'")
        if sum(map(p.count, "*?[")) > MAX_WILDCARDS:
            raise InvalidInputError(f"invalid {flag} pattern {p[:80]!r}: at most {MAX_WILDCARDS} wildcards (*, ?, [) "
                                    "per pattern")
        if p.startswith("/") or ".." in p.split("/"):
            raise InvalidInputError(f"invalid {flag} pattern {p[:80]!r}: patterns are relative to the repository "
                                    "(no leading '/', no '..')")
        out.append(p)
    return list(dict.fromkeys(out))


def copy_name(commit: str, include: list[str] | None, exclude: list[str] | None) -> str:
    """The directory (and staged prefix) name of a snapshot's copy: its commit, followed for a model with its
    own file patterns by a digest of them, so that copies of different selections of a commit never mix."""
    if include is None and exclude is None:
        return commit
    chosen = json.dumps([sorted(include) if include is not None else None, sorted(exclude or [])])
    return f"{commit}.{hashlib.sha256(chosen.encode()).hexdigest()[:16]}"


def models_root(volume: str, models_dir: str = "models") -> str:
    return posixpath.join(volume, models_dir)


def is_artifacts_dir(segment: str) -> bool:
    """A models root's directory of shared copies: `_artifacts`, or `_artifacts.<uid>` (see `artifact_path`)."""
    return bool(ARTIFACTS.fullmatch(segment))


def artifact_path(volume: str, repo_id: str, copy: str, models_dir: str = "models",
                  maker_uid: int | None = None) -> str:
    """Where the one shared copy of a snapshot (`copy`: its `copy_name`) lives on a volume.

    `maker_uid`: the uid that writes it, when that is the model's owner rather than the service (the jobs of a
    Kubernetes workspace run as their model's owner). Such a copy is its owner's to write, so it is shared only
    among that owner's models, in `_artifacts.<uid>`: no model ever reads a copy another user can write."""
    if maker_uid is not None and not _maker(maker_uid):
        raise InvalidInputError(f"a shared copy of {repo_id!r} cannot be made by uid {maker_uid}")
    artifacts = ARTIFACTS_DIR if maker_uid is None else f"{ARTIFACTS_DIR}.{maker_uid}"
    return posixpath.join(models_root(volume, models_dir), artifacts, repo_dir_name(repo_id), copy)


def copy_paths(volume: str, repo_id: str, copy: str, models_dir: str, owner_uid: int | None) -> set[str]:
    """Where a model's copy `copy` may be on a volume: on the service's shelf, and for a model whose jobs run as its
    owner (`owner_uid`: a Kubernetes workspace's) on that owner's (`artifact_path`)."""
    makers = (None, owner_uid) if owner_uid is not None and _maker(owner_uid) else (None,)
    return {artifact_path(volume, repo_id, copy, models_dir, maker) for maker in makers}


def _maker(uid: int) -> bool:
    """A uid that may make shared copies on a shelf of its own: a user's, neither root nor the kernel's "none"."""
    return 0 < uid < 2**32 - 1


def sharing_problem(path: str, volume: str, models_dir: str = "models") -> str | None:
    """Why `path` cannot link to a shared copy (None when it can): it must sit inside the models root."""
    root = models_root(volume, models_dir)
    if not path.startswith(root + "/"):
        return f"{path} is outside the models root {root}; shared models must live inside it"
    if is_artifacts_dir(first := path[len(root) + 1 :].split("/")[0]):
        return f"{path} is inside {root}/{first}, which holds shared copies"
    return None


def staging_uri(bucket: str, prefix: str, repo_id: str, copy: str) -> str:
    """Where a snapshot is staged: `s3://<bucket>/<prefix>/<owner>--<name>/<copy name>/` (always ending in '/',
    so that deleting `.../a/` never touches `.../a-b/`)."""
    return f"s3://{bucket}/{prefix}/{repo_dir_name(repo_id)}/{copy}/"


def link_target(path: str, artifact: str) -> str:
    """The relative symlink target from a model path to its shared copy."""
    return posixpath.relpath(artifact, posixpath.dirname(path))
