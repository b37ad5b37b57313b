"""Configuration: workspaces and settings from a TOML file, overridable from the environment.

Environment (documented defaults):
- `WEIGHTKEEPER_CONFIG`: path of the TOML file (default `<home>/config.toml`, optional).
- `WEIGHTKEEPER_HOME`: data directory (default `~/.local/share/weightkeeper`).
- `WEIGHTKEEPER_REGISTRY_URL`: SQLAlchemy URL of the registry (default SQLite `<home>/registry.db`;
  `postgresql+psycopg://user@host/db` for several hosts).
- `HF_ENDPOINT`: Hugging Face endpoint, unless `hf_endpoint` is set in the file.
- `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (or any boto3 credential source) for `[s3]`, unless the
  table names a `credentials_block`; `AWS_ENDPOINT_URL_S3` when `endpoint_url` is not set.

The file:

    max_concurrent_downloads = 4        # negative = unlimited
    download_timeout_seconds = 10800
    free_space_margin_bytes = 1073741824 # a download must leave this much free on its volume (0: none)
    max_file_bytes = 2199023255552       # a source may list files of at most this size (2 TiB)
    max_manifest_files = 100000          # a Hub repository or S3 prefix may list at most this many files
    min_download_bytes_per_second = 1024 # a download that gets less than this over stall_seconds fails
    stall_seconds = 60                   #   and its next attempt resumes it (0 bytes/s: no minimum)
    hub_redirect_hosts = ["cdn.example.com", "10.1.2.3:8443"] # where the Hub may redirect a download besides
                                         #   https hosts with public addresses and the endpoint's own origin
    [[workspaces]]
    name = "team-a"
    cluster = "local"
    volume = "/mnt/team-a"              # absolute mount path of the workspace volume
    public = true                        # private workspaces name an `owner`
    models_dir = "models"
    work_pool = "weightkeeper-local"    # where its download/clean jobs run (default: top-level `work_pool`)
    [[users]]                            # API users: a bearer token maps to a user (never stored in clear)
    name = "alice"
    uid = 1000
    token_env = "WK_TOKEN_ALICE"         # or token_sha256 = "<hex sha256 of the token>"
    admin = false
    token_blocks = ["alice-hf"]          # Prefect Secret blocks the user may name (admins: any)
    s3_sources = ["s3://data/alice/"]    # S3 prefixes the user may declare models from (admins: any)
    [s3]                                 # optional: stage each snapshot once, fill workspaces from it
    bucket = "weights"
    prefix = "weightkeeper"              # staged at s3://<bucket>/<prefix>/<owner>--<name>/<commit>/
    endpoint_url = "http://minio:9000"   # default: AWS (or $AWS_ENDPOINT_URL_S3)
    region = "us-east-1"
    credentials_block = "s3-creds"       # a Prefect Secret block {"aws_access_key_id": ..., ...}
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from weightkeeper.errors import ConfigError
from weightkeeper.guard import VolumeRule
from weightkeeper.kube import KubernetesTarget
from weightkeeper.layout import BUCKET, MODEL_NAME, SEGMENT

DOWNLOAD_LIMIT_NAME = "weightkeeper-downloads"
DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
LOCAL_POOL = "weightkeeper-local"
# Flow names. The lifecycle flows deploy as `<flow>/<flow>`, the per-path jobs as `<flow>/<work pool>`.
ENSURE_FLOW, DELETE_FLOW, RECONCILE_FLOW = "ensure-model", "delete-model", "reconcile"
DOWNLOAD_FLOW, CLEAN_FLOW = "download-to-path", "clean-path"


def deployment_name(flow: str, pool: str | None = None) -> str:
    return f"{flow}/{pool or flow}"


def job_run_name(flow: str, model: str, workspace: str) -> str:
    """The name of a per-path job run: `download-<model>-<workspace>` or `clean-<model>-<workspace>`."""
    return f"{flow.split('-')[0]}-{model}-{workspace}"


@dataclass(frozen=True)
class Workspace:
    name: str
    volume: str | None
    cluster: str = "local"
    public: bool = True
    owner: str | None = None
    models_dir: str = "models"
    work_pool: str | None = None
    kubernetes: KubernetesTarget | None = None  # its jobs run in this cluster namespace (a Kubernetes pool)

    @property
    def rule(self) -> VolumeRule:
        return VolumeRule(root=self.volume or "", models_dir=self.models_dir)

    def usable_by(self, owner: str) -> bool:
        return self.public or self.owner == owner


@dataclass(frozen=True)
class S3Settings:
    """Where snapshots are staged: `s3://<bucket>/<prefix>/<owner>--<name>/<commit>/`."""

    bucket: str
    prefix: str = "weightkeeper"
    endpoint_url: str | None = None
    region: str | None = None
    credentials_block: str | None = None
    enabled: bool = True


@dataclass(frozen=True)
class User:
    """An API user; only the sha256 of the token is kept. Admins may name any token block and S3 source."""

    name: str
    uid: int
    token_sha256: str | None = field(repr=False)  # None: its token_env is not set here (cannot log in)
    admin: bool = False
    token_blocks: tuple[str, ...] = ()  # Prefect Secret blocks the user may name as `tokenBlock`
    s3_sources: tuple[str, ...] = ()  # `s3://bucket/prefix/` prefixes the user may use as sources


@dataclass(frozen=True)
class Settings:
    home: Path
    registry_url: str
    workspaces: tuple[Workspace, ...] = ()
    max_concurrent_downloads: int = 4
    download_timeout_seconds: int = 10800
    hf_endpoint: str | None = None
    lease_seconds: int = 60
    cleanup_retry_seconds: float = 30
    cleanup_retry_max_seconds: float = 600
    stop_timeout_seconds: float = 600
    verify_interval_seconds: float = 86400
    hub_unreachable_seconds: float = 1800
    verify_workers: int = 4
    free_space_margin_bytes: int = 1 << 30  # a download must leave this much free on its volume
    max_file_bytes: int = 2 << 40  # the largest file a source may list
    max_manifest_files: int = 100_000  # the most files a Hub repository or S3 prefix may list
    min_download_bytes_per_second: int = 1024  # a download slower than this over stall_seconds fails (0: never)
    stall_seconds: int = 60
    hub_redirect_hosts: tuple[str, ...] = ()  # `host` or `host:port` a Hub download may be redirected to
    s3: S3Settings | None = None
    work_pool: str = LOCAL_POOL
    reconcile_interval_seconds: float = 60
    users: tuple[User, ...] = field(default=(), repr=False)
    config_path: Path | None = field(default=None, compare=False)

    def workspace(self, name: str) -> Workspace | None:
        return next((w for w in self.workspaces if w.name == name), None)

    def pool_for(self, workspace: str) -> str:
        ws = self.workspace(workspace)
        return (ws.work_pool if ws else None) or self.work_pool

    @property
    def pools(self) -> list[str]:
        return sorted({self.work_pool, *(w.work_pool for w in self.workspaces if w.work_pool)})

    @property
    def kubernetes_pools(self) -> set[str]:
        """Pools of workspaces that run their jobs in a Kubernetes cluster (their workers run there too)."""
        return {w.work_pool for w in self.workspaces if w.kubernetes}

    @property
    def volume_rules(self) -> list[VolumeRule]:
        return [w.rule for w in self.workspaces if w.volume]

    @property
    def staging(self) -> bool:
        """Snapshots from the Hub are staged in S3 and workspaces filled from there."""
        return self.s3 is not None and self.s3.enabled

    @property
    def downloads_limited(self) -> bool:
        return self.max_concurrent_downloads >= 0


def _workspace(raw: dict, where: str) -> Workspace:
    unknown = set(raw) - {"name", "volume", "cluster", "public", "owner", "models_dir", "work_pool", "kubernetes"}
    if unknown:
        raise ConfigError(f"{where}: unknown workspace keys {sorted(unknown)}")
    name = raw.get("name")
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
        raise ConfigError(f"{where}: workspace name {name!r} must be lowercase letters, digits and '-'")
    volume = raw.get("volume")
    if volume is not None:
        if not isinstance(volume, str) or not volume.startswith("/") or posixpath.normpath(volume) != volume:
            raise ConfigError(f"{where}: workspace {name!r} volume {volume!r} must be an absolute, clean path")
        if volume == "/" or volume.startswith("//"):
            raise ConfigError(f"{where}: workspace {name!r} volume {volume!r} cannot be the filesystem root")
    models_dir = raw.get("models_dir", "models")
    if not isinstance(models_dir, str) or not SEGMENT.fullmatch(models_dir) or models_dir in (".", ".."):
        raise ConfigError(f"{where}: workspace {name!r} models_dir {models_dir!r} must be one plain segment")
    public = raw.get("public", True)
    owner = raw.get("owner")
    if not isinstance(public, bool):
        raise ConfigError(f"{where}: workspace {name!r} public must be true or false")
    if not public and not owner:
        raise ConfigError(f"{where}: private workspace {name!r} needs an owner")
    if public and volume is None:
        raise ConfigError(f"{where}: public workspace {name!r} needs a volume")
    return Workspace(
        name=name, volume=volume, cluster=str(raw.get("cluster", "local")), public=public,
        owner=owner, models_dir=models_dir, work_pool=_pool(raw.get("work_pool"), f"{where}: workspace {name!r}"),
        kubernetes=_kubernetes(raw.get("kubernetes"), f"{where}: workspace {name!r} kubernetes", volume),
    )


def _kubernetes(raw: object, where: str, volume: str | None) -> KubernetesTarget | None:
    """`[workspaces.kubernetes]`: namespace, image, and the volume as `volume_claim` or `host_path`."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    keys = {f.name for f in fields(KubernetesTarget)}
    if set(raw) - keys:
        raise ConfigError(f"{where}: unknown keys {sorted(set(raw) - keys)}")
    for key, value in raw.items():
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: {key} must be a non-empty string")
    for key in ("namespace", "volume_claim", "service_account", "token_secret", "config_map",
                "prefect_auth_secret"):
        if key in raw and not DNS_LABEL.fullmatch(raw[key]):
            raise ConfigError(f"{where}: {key} {raw[key]!r} must be a Kubernetes name (lowercase letters, digits, '-')")
    if "namespace" not in raw or "image" not in raw:
        raise ConfigError(f"{where} needs a namespace and an image")
    if ("volume_claim" in raw) == ("host_path" in raw):
        raise ConfigError(f"{where} needs exactly one of volume_claim (a PVC) or host_path for the workspace volume")
    if "host_path" in raw and (not raw["host_path"].startswith("/") or posixpath.normpath(raw["host_path"]) != raw["host_path"]):
        raise ConfigError(f"{where}: host_path {raw['host_path']!r} must be an absolute, clean path")
    if volume is None:
        raise ConfigError(f"{where}: a workspace without a volume has nothing to mount")
    return KubernetesTarget(**raw)


def _pool(value: object, where: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not MODEL_NAME.fullmatch(value)):
        raise ConfigError(f"{where}: work_pool {value!r} must be lowercase letters, digits and '-'")
    return value


def _user(raw: dict, where: str) -> User:
    unknown = set(raw) - {"name", "uid", "token_env", "token_sha256", "admin", "token_blocks", "s3_sources"}
    if unknown:
        raise ConfigError(f"{where}: unknown user keys {sorted(unknown)}")
    name, uid, admin = raw.get("name"), raw.get("uid"), raw.get("admin", False)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: a user needs a name")
    if not isinstance(uid, int) or isinstance(uid, bool) or uid < 0:
        raise ConfigError(f"{where}: user {name!r} needs a uid (a non-negative integer)")
    digest = raw.get("token_sha256")
    if "token_env" in raw:  # unset where only flows run (workers): the user just cannot log in there
        token = os.environ.get(str(raw["token_env"]))
        digest = hashlib.sha256(token.encode()).hexdigest() if token else None
    elif not isinstance(digest, str) or len(digest) != 64:
        raise ConfigError(f"{where}: user {name!r} needs token_env or token_sha256 (64 hex digits)")
    if not isinstance(admin, bool):
        raise ConfigError(f"{where}: user {name!r} admin must be true or false")
    blocks, prefixes = raw.get("token_blocks", []), raw.get("s3_sources", [])
    if not isinstance(blocks, list) or not all(isinstance(b, str) and MODEL_NAME.fullmatch(b) for b in blocks):
        raise ConfigError(f"{where}: user {name!r} token_blocks must be a list of Prefect block names "
                          "(lowercase letters, digits and '-')")
    if not isinstance(prefixes, list):
        raise ConfigError(f"{where}: user {name!r} s3_sources must be a list of prefixes like s3://bucket/prefix/")
    sources = []
    for uri in prefixes:
        bucket, _, key = uri.removeprefix("s3://").partition("/") if isinstance(uri, str) else ("", "", "")
        segments = key.removesuffix("/").split("/") if key else []
        if not (isinstance(uri, str) and uri.startswith("s3://") and BUCKET.fullmatch(bucket)
                and all(SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments)):
            raise ConfigError(f"{where}: user {name!r} s3_sources must list prefixes like s3://bucket/prefix/ "
                              f"(plain segments), not {uri!r}")
        sources.append("/".join(["s3:/", bucket, *segments, ""]))  # always ending in '/': matched by segment
    return User(name=name, uid=uid, token_sha256=digest and digest.lower(), admin=admin,
                token_blocks=tuple(blocks), s3_sources=tuple(sources))


def _s3(raw: object, where: str) -> S3Settings | None:
    """The `[s3]` table (None when absent). `enabled = false` keeps its endpoint and credentials (to remove
    staged copies and read s3:// sources) but stages nothing: new downloads take the direct path."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [s3] must be a table")
    unknown = set(raw) - {"bucket", "prefix", "endpoint_url", "region", "credentials_block", "enabled"}
    if unknown:
        raise ConfigError(f"{where}: unknown [s3] keys {sorted(unknown)}")
    if not isinstance(raw.get("enabled", True), bool):
        raise ConfigError(f"{where}: [s3] enabled must be true or false")
    bucket, prefix = raw.get("bucket"), raw.get("prefix", "weightkeeper")
    if not isinstance(bucket, str) or not BUCKET.fullmatch(bucket):
        raise ConfigError(f"{where}: [s3] bucket {bucket!r} must be a valid S3 bucket name")
    if not isinstance(prefix, str) or not prefix or any(not SEGMENT.fullmatch(p) or p in (".", "..")
                                                        for p in prefix.split("/")):
        raise ConfigError(f"{where}: [s3] prefix {prefix!r} must be one or more plain segments like "
                          "'weightkeeper' or 'team/models' (no leading or trailing '/')")
    for key in ("endpoint_url", "region", "credentials_block"):
        if raw.get(key) is not None and not (isinstance(raw[key], str) and raw[key].strip()):
            raise ConfigError(f"{where}: [s3] {key} must be a non-empty string")
    return S3Settings(bucket=bucket, prefix=prefix, endpoint_url=raw.get("endpoint_url"), region=raw.get("region"),
                      credentials_block=raw.get("credentials_block"), enabled=raw.get("enabled", True))


def _int(raw: dict, key: str, default: int, where: str) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def load_settings(path: str | os.PathLike | None = None) -> Settings:
    """Read settings from `path`, `$WEIGHTKEEPER_CONFIG` or `<home>/config.toml`."""
    home = Path(os.environ.get("WEIGHTKEEPER_HOME") or Path.home() / ".local/share/weightkeeper")
    explicit = path or os.environ.get("WEIGHTKEEPER_CONFIG")
    config_path = Path(explicit) if explicit else home / "config.toml"
    raw: dict = {}
    if config_path.exists():
        try:
            raw = tomllib.loads(config_path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config {config_path}: {e}") from None
    elif explicit:
        raise ConfigError(f"config file {config_path} does not exist")
    where = str(config_path)
    known = {"workspaces", "max_concurrent_downloads", "download_timeout_seconds", "hf_endpoint", "registry_url",
             "home", "lease_seconds", "cleanup_retry_seconds", "cleanup_retry_max_seconds", "stop_timeout_seconds",
             "verify_interval_seconds", "hub_unreachable_seconds", "verify_workers", "free_space_margin_bytes", "s3",
             "work_pool", "reconcile_interval_seconds", "users", "max_file_bytes", "max_manifest_files",
             "min_download_bytes_per_second", "stall_seconds", "hub_redirect_hosts"}
    if set(raw) - known:
        raise ConfigError(f"{where}: unknown settings {sorted(set(raw) - known)}")
    home = Path(raw.get("home", home))
    workspaces = tuple(_workspace(w, where) for w in raw.get("workspaces", []))
    names = [w.name for w in workspaces]
    if len(names) != len(set(names)):
        raise ConfigError(f"{where}: workspace names must be unique")
    users = tuple(_user(u, where) for u in raw.get("users", []))
    digests = [u.token_sha256 for u in users if u.token_sha256]
    if len({u.name for u in users}) != len(users) or len(set(digests)) != len(digests):
        raise ConfigError(f"{where}: user names and tokens must be unique")
    for w in workspaces:
        if w.kubernetes and not w.work_pool:
            raise ConfigError(f"{where}: workspace {w.name!r} runs its jobs in Kubernetes and needs a work_pool of its own")
        mixed = [o.name for o in workspaces if o.work_pool == w.work_pool and (bool(o.kubernetes) != bool(w.kubernetes)
                                                                            or o.cluster != w.cluster)]
        if w.kubernetes and mixed:
            raise ConfigError(f"{where}: work pool {w.work_pool!r} of Kubernetes workspace {w.name!r} is also used by "
                              f"{mixed}; a Kubernetes pool serves workspaces of one cluster only")
    roots = sorted(w.volume for w in workspaces if w.volume)
    for outer, inner in zip(roots, roots[1:]):
        if inner.startswith(outer + "/"):
            raise ConfigError(f"{where}: volume {inner} lies inside volume {outer}; volumes must not nest")
    if _int(raw, "max_concurrent_downloads", 4, where) == 0:
        raise ConfigError(f"{where}: max_concurrent_downloads = 0 would block every download; "
                          "use a positive limit or a negative one for unlimited")
    if _int(raw, "lease_seconds", 60, where) <= 0:
        raise ConfigError(f"{where}: lease_seconds must be positive")
    if _int(raw, "free_space_margin_bytes", 1 << 30, where) < 0:
        raise ConfigError(f"{where}: free_space_margin_bytes must be 0 or more")
    timeout = _int(raw, "download_timeout_seconds", 10800, where)
    if timeout <= 0:
        raise ConfigError(f"{where}: download_timeout_seconds must be positive")
    if _int(raw, "max_file_bytes", 2 << 40, where) < 0:
        raise ConfigError(f"{where}: max_file_bytes must be 0 or more")
    for key, default in (("max_manifest_files", 100_000), ("stall_seconds", 60)):
        if _int(raw, key, default, where) <= 0:
            raise ConfigError(f"{where}: {key} must be positive")
    if _int(raw, "min_download_bytes_per_second", 1024, where) < 0:
        raise ConfigError(f"{where}: min_download_bytes_per_second must be 0 (no minimum) or more")
    redirect_hosts = raw.get("hub_redirect_hosts", [])
    if not isinstance(redirect_hosts, list) or not all(
            isinstance(h, str) and re.fullmatch(r"([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?", h)
            for h in redirect_hosts):
        raise ConfigError(f"{where}: hub_redirect_hosts must be a list of lowercase `host` or `host:port` "
                          f"(`[ipv6]:port`), got {redirect_hosts!r}")
    return Settings(
        home=home,
        registry_url=os.environ.get("WEIGHTKEEPER_REGISTRY_URL") or raw.get("registry_url")
        or f"sqlite:///{home / 'registry.db'}",
        workspaces=workspaces,
        max_concurrent_downloads=_int(raw, "max_concurrent_downloads", 4, where),
        download_timeout_seconds=timeout,
        hf_endpoint=raw.get("hf_endpoint") or os.environ.get("HF_ENDPOINT") or None,
        lease_seconds=_int(raw, "lease_seconds", 60, where),
        cleanup_retry_seconds=float(raw.get("cleanup_retry_seconds", 30)),
        cleanup_retry_max_seconds=float(raw.get("cleanup_retry_max_seconds", 600)),
        stop_timeout_seconds=float(raw.get("stop_timeout_seconds", 600)),
        verify_interval_seconds=float(raw.get("verify_interval_seconds", 86400)),
        hub_unreachable_seconds=float(raw.get("hub_unreachable_seconds", 1800)),
        verify_workers=_int(raw, "verify_workers", 4, where),
        s3=_s3(raw.get("s3"), where),
        free_space_margin_bytes=_int(raw, "free_space_margin_bytes", 1 << 30, where),
        work_pool=_pool(raw.get("work_pool"), where) or LOCAL_POOL,
        reconcile_interval_seconds=float(raw.get("reconcile_interval_seconds", 60)),
        max_file_bytes=_int(raw, "max_file_bytes", 2 << 40, where),
        max_manifest_files=_int(raw, "max_manifest_files", 100_000, where),
        min_download_bytes_per_second=_int(raw, "min_download_bytes_per_second", 1024, where),
        stall_seconds=_int(raw, "stall_seconds", 60, where),
        hub_redirect_hosts=tuple(redirect_hosts),
        users=users,
        config_path=config_path if config_path.exists() else None,
    )
