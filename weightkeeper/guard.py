"""The cleanup guard: which paths may ever be removed (pure; the I/O half is in `fsops`).

A path may be removed only when it is an absolute, clean path inside a declared workspace
volume, not the volume root, with a segment below that volume's models directory, and every
segment below the volume made of safe ASCII characters (so look-alikes never match).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

from weightkeeper.errors import UnsafePathError
from weightkeeper.layout import ARTIFACTS_DIR, COPY, SEGMENT, is_artifacts_dir


@dataclass(frozen=True)
class VolumeRule:
    """A workspace volume root and the name of its models directory."""

    root: str
    models_dir: str = "models"


def _refuse(path: object, why: str) -> UnsafePathError:
    return UnsafePathError(f"refusing to remove {path!r}: {why}")


def check_removable(path: object, volumes: Iterable[VolumeRule], artifact: bool = False) -> VolumeRule:
    """Return the volume that contains `path`, or raise `UnsafePathError` saying why not.

    Shared copies (`<models>/_artifacts/<dir>/<commit>[.<selection>]`) are removable only with `artifact=True`
    (garbage collection), and then nothing else is.
    """
    if not isinstance(path, str) or not path:
        raise _refuse(path, "not a path")
    if "\x00" in path:
        raise _refuse(path, "contains a NUL byte")
    if not path.startswith("/"):
        raise _refuse(path, "not absolute")
    if path.startswith("//") or posixpath.normpath(path) != path:
        raise _refuse(path, "not a clean path ('//', '.', '..' or a trailing '/')")
    volumes = sorted(volumes, key=lambda v: len(v.root), reverse=True)
    if any(path == v.root.rstrip("/") for v in volumes):
        raise _refuse(path, "it is a workspace volume root")
    root = next((r for v in volumes if (r := v.root.rstrip("/")) and path.startswith(r + "/")), None)
    if root is None:
        raise _refuse(path, "not inside any declared workspace volume")
    segments, refused = path[len(root) + 1:].split("/"), None
    # workspaces sharing a volume each have their models dir: a rule whose dir the path is in says why it refuses
    for volume in sorted((v for v in volumes if v.root.rstrip("/") == root), key=lambda v: v.models_dir not in segments):
        try:
            return _below_models_dir(path, segments, volume, artifact)
        except UnsafePathError as e:
            refused = refused or e
    raise refused


def _below_models_dir(path: str, segments: list[str], volume: VolumeRule, artifact: bool) -> VolumeRule:
    """`volume` when `path` (its `segments` below the volume root) is below its models dir, as `check_removable` says."""
    bad = [s for s in segments if not SEGMENT.fullmatch(s)]
    if bad:
        raise _refuse(path, f"segment {bad[0]!r} has characters outside [A-Za-z0-9._-]")
    below = segments.index(volume.models_dir) if volume.models_dir in segments else -1
    if below < 0 or below == len(segments) - 1:
        raise _refuse(path, f"not below a {volume.models_dir!r} directory of volume {volume.root}")
    exact = (len(segments) == 4 and segments[0] == volume.models_dir and is_artifacts_dir(segments[1])
             and COPY.fullmatch(segments[3]))
    if artifact and not exact:
        raise _refuse(path, f"not a shared copy <{volume.models_dir}>/{ARTIFACTS_DIR}[.<uid>]/<repo>/<commit>")
    if not artifact and (inside := next(filter(is_artifacts_dir, segments), None)):
        raise _refuse(path, f"it is inside {inside}; only garbage collection removes shared copies")
    return volume


def check_staged_prefix(uri: object, bucket: str, prefix: str) -> tuple[str, str]:
    """(bucket, key prefix) of a staged snapshot that may be deleted, or `UnsafePathError`.

    Only `s3://<bucket>/<prefix>/<dir>/<40-hex commit>[.<16-hex selection>]/` under the configured staging bucket and
    prefix qualifies: never the bucket, the staging prefix itself, a source prefix, or a look-alike.
    """
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise _refuse(uri, "not an s3:// prefix")
    their_bucket, _, key = uri[len("s3://"):].partition("/")
    if their_bucket != bucket:
        raise _refuse(uri, f"not in the staging bucket {bucket!r}")
    if not key.startswith(prefix + "/") or not key.endswith("/"):
        raise _refuse(uri, f"not a prefix ending in '/' below the staging prefix {prefix + '/'!r}")
    rest = key[len(prefix) + 1 : -1].split("/")
    if len(rest) != 2 or not SEGMENT.fullmatch(rest[0]) or rest[0] in (".", "..") or not COPY.fullmatch(rest[1]):
        raise _refuse(uri, "not <staging prefix>/<model dir>/<commit>/")
    return bucket, key
