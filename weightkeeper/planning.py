"""Pure planning: which workspaces and paths a model targets, which files it needs (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from huggingface_hub.utils import filter_repo_objects

from weightkeeper.config import Workspace
from weightkeeper.errors import DownloadError, InvalidInputError
from weightkeeper.layout import model_path

ALLOW_PATTERNS = ("*.safetensors", "*.json", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.py", "*.jinja")
FALLBACK_WEIGHTS = ("*.bin", "*.pth", "*.pt")
IGNORE_PATTERNS = ("original/*",)
TURNS = 32  # a tracked model's head is asked at one of this many turns spread over the interval, by its id


@dataclass(frozen=True)
class PlannedPath:
    workspace: str
    cluster: str
    path: str


@dataclass(frozen=True)
class Plan:
    paths: tuple[PlannedPath, ...]
    skipped: tuple[str, ...]  # why a requested workspace gets no path


def plan_paths(
    workspaces: Sequence[Workspace], repo_id: str, owner: str,
    targets: Iterable[str] | None = None, subpath: str | None = None,
) -> Plan:
    """Resolve targets (named, or every public workspace) to one path per (cluster, path)."""
    by_name = {w.name: w for w in workspaces}
    if targets is None:
        chosen = [w for w in workspaces if w.public]
    else:
        names = list(dict.fromkeys(targets))
        usable = [w.name for w in workspaces if w.usable_by(owner)]
        if (refused := next((n for n in names if n not in usable), None)) is not None:  # another's private: unnamed
            raise InvalidInputError(f"no workspace {refused!r} that {owner!r} may use; theirs: "
                                    f"{', '.join(usable) or 'none'}")
        chosen = [by_name[n] for n in names]
    paths: dict[tuple[str, str], PlannedPath] = {}
    skipped = []
    for w in chosen:
        if not w.volume:
            skipped.append(f"workspace {w.name!r} is private and has no volume, so it gets no download target")
            continue
        path = model_path(w.volume, repo_id, subpath, w.models_dir)
        paths.setdefault((w.cluster, path), PlannedPath(w.name, w.cluster, path))
    return Plan(tuple(paths.values()), tuple(skipped))


WEIGHTS = ("*.safetensors", *FALLBACK_WEIGHTS, "*.gguf")
LISTED = 20  # repository files a message names at most
MATCH_BUDGET = 4 * 10**9  # `matching_cost` of a user's patterns at most: about 2 s of matching here (64 patterns of
#                           a dozen characters against a real listing of 100,000 files cost 3.1e9)


def _weights(files: Iterable[str]) -> list[str]:
    return list(filter_repo_objects(list(files), allow_patterns=list(WEIGHTS)))


def _what_it_has(files: list[str]) -> str:
    shown = ", ".join(repr(f[:120]) for f in files[:LISTED])
    return f"the repository has {len(files)} files: {shown}" + (", ..." if len(files) > LISTED else "")


def matching_cost(files: Sequence[str], patterns: Iterable[str]) -> int:
    """A bound of what matching `patterns` against `files` costs: `fnmatch` tries what follows a `*` (literal
    characters as much as wildcards) at each position of a name, so the names' characters times the patterns'."""
    return sum(map(len, files)) * sum(1 + len(p) for p in patterns)


def select_files(repo_files: Iterable[str], include: Sequence[str] | None = None,
                 exclude: Sequence[str] | None = None) -> list[str]:
    """The files to fetch. Without `include`: what loading needs, `*.bin`/`*.pth`/`*.pt` only when there are no
    safetensors, nothing under original/. With `include`: exactly the files it matches. Never a file `exclude`
    matches. The selection must hold a weight file (`WEIGHTS`); if not, the error lists what the repository has.
    The user's patterns are refused before any matching when matching them would cost more than MATCH_BUDGET
    (long names the listing holds, many long patterns); the built-in ones are bounded with the listing."""
    files = sorted(repo_files)
    ignore = list(exclude or [])
    given = [*(include or ()), *ignore]
    if matching_cost(files, given) > MATCH_BUDGET:
        raise DownloadError(f"matching the {len(given)} file patterns given against the {len(files)} files the "
                            f"repository lists ({sum(map(len, files))} characters of names) costs too much: give "
                            "fewer or shorter patterns", permanent=True)
    if include is not None:
        chosen = list(filter_repo_objects(files, allow_patterns=list(include), ignore_patterns=ignore))
        if not _weights(chosen):
            raise DownloadError(f"the patterns (include {list(include)}, exclude {ignore}) match no weight file "
                                f"({', '.join(WEIGHTS)}); {_what_it_has(files)}", permanent=True)
        return chosen
    ignore += IGNORE_PATTERNS
    chosen = list(filter_repo_objects(files, allow_patterns=list(ALLOW_PATTERNS), ignore_patterns=ignore))
    weights = [f for f in chosen if f.endswith(".safetensors")]
    if not weights:
        weights = list(filter_repo_objects(files, allow_patterns=list(FALLBACK_WEIGHTS), ignore_patterns=ignore))
        chosen = sorted(set(chosen) | set(weights))
    if not weights:
        hint = " (choose GGUF files with --include, e.g. '*Q4_K_M.gguf')" if any(
            f.endswith(".gguf") for f in files) else ""
        raise DownloadError(
            "the repository has no weights to load (no *.safetensors, *.bin, *.pth or *.pt outside original/"
            f"{', or excluded' if exclude else ''}){hint}; {_what_it_has(files)}", permanent=True)
    return chosen


def digest_key(f: dict) -> tuple[str, str, int] | None:
    """What identifies a recorded file's content: its sha256 (LFS), else its MD5 (S3), else its git blob sha1,
    with its size; None when it has none."""
    for kind, key in (("sha256", "sha256"), ("md5", "md5"), ("blob", "blobId")):
        if isinstance(value := f.get(key), str) and value:
            return kind, value, f.get("size")
    return None


def reuse_plan(missing: Iterable[dict], sources: Iterable[tuple[str, Iterable[dict]]],
               skip: str | None = None) -> dict[str, tuple[str, str]]:
    """For each missing file (a recorded entry: path, size, digests), a verified copy with the same digest and
    size: {path: (source directory, path there)}, from the first source (directory, its files) that has one,
    never from `skip` (the directory being filled)."""
    found: dict[tuple[str, str, int], tuple[str, str]] = {}
    for where, files in sources:
        if where == skip:
            continue
        for f in files:
            if (key := digest_key(f)) is not None:
                found.setdefault(key, (where, f["path"]))
    return {f["path"]: found[key] for f in missing if (key := digest_key(f)) is not None and key in found}


def changed_bytes(old: Iterable[dict], new: Iterable[dict]) -> int:
    """Bytes of the `new` files whose content (`digest_key`) is not among the `old` ones: what a switch adds."""
    have = {digest_key(f) for f in old}
    return sum(f["size"] for f in new if (key := digest_key(f)) is None or key not in have)


def path_decision(holders: Iterable[tuple[str, bool]]) -> tuple[str, str | None]:
    """Given other models at a path as (name, is_deleting): ('free'|'wait'|'taken', holder)."""
    holders = list(holders)
    live = [n for n, deleting in holders if not deleting]
    if live:
        return "taken", live[0]
    if holders:
        return "wait", holders[0][0]
    return "free", None


def workspace_usage(workspaces: Sequence[Workspace], paths: Iterable[tuple[str, str, int | None, int | None]],
                    copies: Iterable[tuple[str, str, int | None]]) -> dict[str, dict[str, int]]:
    """Bytes each workspace stores, and would store without sharing.

    `paths` are (workspace, path, size, shared copy id or None) of live entries; `copies` are
    (cluster, volume, size) of shared copies. An own copy counts once per path; a shared copy
    once per volume; without sharing every entry is a copy of its own.
    """
    usage = {w.name: {"storedBytes": 0, "withoutSharingBytes": 0} for w in workspaces}
    seen: set[tuple[str, str]] = set()
    for workspace, path, size, shared in paths:
        if workspace not in usage:
            continue
        usage[workspace]["withoutSharingBytes"] += size or 0
        if shared is None and (workspace, path) not in seen:
            seen.add((workspace, path))
            usage[workspace]["storedBytes"] += size or 0
    for cluster, volume, size in copies:
        for w in workspaces:
            if w.cluster == cluster and w.volume == volume:
                usage[w.name]["storedBytes"] += size or 0
                break
    return usage


def capacity_problem(workspace: str, capacity: int, stored: int, adding: int) -> str | None:
    """Why `adding` more bytes do not fit a workspace storing `stored` of its `capacity` bytes (None: they fit,
    up to exactly the capacity)."""
    if stored + adding <= capacity:
        return None
    return (f"workspace {workspace!r} stores {stored} of its capacity_bytes = {capacity} bytes, and this model "
            f"needs {adding} bytes ({stored + adding - capacity} too many)")


def bytes_to_fetch(files: Iterable[tuple[int, int]]) -> int:
    """Bytes a download still writes, from each file's (size, bytes already present: in place or partial)."""
    return sum(max(size - present, 0) for size, present in files)


def space_problem(needed: int, free: int, margin: int, volume: str) -> str | None:
    """Why `needed` more bytes do not fit on `volume` with `margin` bytes left free, or None if they do."""
    if needed <= 0 or free - needed >= margin:
        return None
    return (f"needs {needed} bytes, {free} free on {volume} "
            f"(a download leaves free_space_margin_bytes = {margin} free)")


MAX_FAILOVERS = 3


def failover_workspace(workspaces: Sequence[Workspace], current: str) -> Workspace | None:
    """Where a crashed job of workspace `current` may run instead: the next workspace (in config order,
    wrapping around) of the same cluster that mounts the same volume root, so the recorded path is the
    same directory, and that shows the path to the same users (public, or private to the same owner): a model
    never moves into sight of users who could not see it, nor out of it. An equal mount path on another cluster
    is another filesystem: never a candidate."""
    names = [w.name for w in workspaces]
    if current not in names:
        return None
    i = names.index(current)
    here = workspaces[i]
    return next((w for w in [*workspaces[i + 1:], *workspaces[:i]]
                 if here.volume and (w.cluster, w.volume, w.public, w.owner) == (here.cluster, here.volume, here.public,
                                                                                 here.owner)), None)


def last_turn(model_id: int, now: datetime, interval: float) -> datetime:
    """When a tracked model's turn to be asked last came, at or before `now`: every `interval` seconds, at an
    offset of its own within it (its id's share of TURNS), so that models asked together go their own ways."""
    offset = model_id % TURNS * interval / TURNS
    return datetime.fromtimestamp(math.floor((now.timestamp() - offset) / interval) * interval + offset, timezone.utc)
