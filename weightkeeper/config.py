"""Configuration: workspaces and settings from a TOML file, overridable from the environment, parsed and
validated by pydantic. A wrong key, type or value is one `ConfigError` line naming the key and the file.

Environment (documented defaults):
- `WEIGHTKEEPER_CONFIG`: path of the TOML file (default `<home>/config.toml`, optional).
- `WEIGHTKEEPER_HOME`: data directory (default `~/.local/share/weightkeeper`).
- `WEIGHTKEEPER_REGISTRY_URL`: SQLAlchemy URL of the registry (default SQLite `<home>/registry.db`;
  `postgresql+psycopg://user@host/db` for several hosts).
- `WEIGHTKEEPER_<SETTING>` overrides any other top-level scalar setting too (`WEIGHTKEEPER_LEASE_SECONDS=5`).
- `HF_ENDPOINT`: Hugging Face endpoint, unless `hf_endpoint` is set.
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
    hub_api_requests_per_5min = 1000     # the Hub request budget of every worker together, per endpoint
    hub_resolve_requests_per_5min = 5000 #   and token: API calls and file resolves per 5 minutes
    metrics_token_sha256 = "<hex>"       # sha256 of a token that reads /metrics and nothing else (or an admin's)
    worker_run_limit = 8                 # each of `weightkeeper serve`'s workers runs at most this many flow
                                         #   runs at once; more wait in its work queue
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
    max_models = 200                     # models the user may hold at once, Deleting ones too (default: no limit)
    [s3]                                 # optional: stage each snapshot once, fill workspaces from it
    bucket = "weights"
    prefix = "weightkeeper"              # staged at s3://<bucket>/<prefix>/<owner>--<name>/<commit>/
    endpoint_url = "http://minio:9000"   # default: AWS (or $AWS_ENDPOINT_URL_S3)
    region = "us-east-1"
    credentials_block = "s3-creds"       # a prefect-aws AwsCredentials block
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from weightkeeper.errors import ConfigError
from weightkeeper.guard import VolumeRule
from weightkeeper.kube import JOB_MARK, REGISTRY_ENV, KubernetesTarget
from weightkeeper import layout
from weightkeeper.layout import BUCKET, MODEL_NAME, SEGMENT

DOWNLOAD_LIMIT_NAME = "weightkeeper-downloads"
MAX_DOWNLOAD_SLOTS = 10_000  # max_concurrent_downloads at most
MAX_SECONDS = 10 * 365 * 86400  # any duration setting at most (ten years; more overflows dates and timeouts)
MAX_CONFIG_BYTES = 16 << 20  # the config file at most
DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
REDIRECT_HOST = re.compile(r"([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?")
LOCAL_POOL = "weightkeeper-local"
ENV_PREFIX = "WEIGHTKEEPER_"
# Flow names. The lifecycle flows deploy as `<flow>/<flow>`, the per-path jobs as `<flow>/<work pool>`.
ENSURE_FLOW, DELETE_FLOW, RECONCILE_FLOW = "ensure-model", "delete-model", "reconcile"
DOWNLOAD_FLOW, CLEAN_FLOW = "download-to-path", "clean-path"


def deployment_name(flow: str, pool: str | None = None) -> str:
    return f"{flow}/{pool or flow}"


def job_run_name(flow: str, model: str, workspace: str) -> str:
    """The name of a per-path job run: `download-<model>-<workspace>` or `clean-<model>-<workspace>`."""
    return f"{flow.split('-')[0]}-{model}-{workspace}"


def _checked(test, what: str, when=AfterValidator, secret: bool = False):
    """A validator refusing a value for which `test` is false: "<value> must be <what>" (a `secret` value, which may
    be a token pasted where its digest goes, is never shown)."""
    def check(value):
        if not test(value):
            raise ValueError(f"must be {what} (the value given is not shown)" if secret else f"{value!r} must be {what}")
        return value
    return when(check)


def _required(value: Any) -> Any:
    if value is None:  # a key the table lacks
        raise ValueError("is required")
    return value


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _clean_path(value: str) -> bool:
    return value.startswith("/") and posixpath.normpath(value) == value and "\0" not in value


def http_url(url: str) -> bool:
    """An http(s) URL of a plain host (letters, digits, `.-_`, or a bracketed IPv6 address) and a port that is one,
    with no user, query or fragment: read alike by `urlsplit` and by urllib3 (which sends it)."""
    if not re.fullmatch(r"(?i:https?)://(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{0,5})?(/[^?#\s]*)?", url):
        return False
    try:
        urlsplit(url).port  # raises for 99999, and for a bracketed IPv4 address
    except ValueError:
        return False
    return True


def _plain(segment: str) -> bool:
    return bool(SEGMENT.fullmatch(segment)) and segment not in (".", "..")


def _s3_prefix(uri: str) -> str:
    """`s3://bucket/prefix/` with plain segments, always ending in '/' (matched by segment)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    segments = key.removesuffix("/").split("/") if key else []
    if not (uri.startswith("s3://") and BUCKET.fullmatch(bucket) and all(_plain(s) for s in segments)):
        raise ValueError(f"{uri!r} must be a prefix like s3://bucket/prefix/ (plain segments)")
    return "/".join(["s3:/", bucket, *segments, ""])


# Strict types: a wrong type is refused, never converted (`true` is not 1, "30" is not 30); an int is a number.
Number = Annotated[float, Strict()]
# A duration: a finite number of seconds, 0 to MAX_SECONDS (inf, nan, a negative or a huge one fail only later,
# in a timedelta or a timeout, as a traceback).
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
IntSeconds = Annotated[StrictInt, Field(gt=0, le=MAX_SECONDS)]
Text = Annotated[StrictStr, AfterValidator(_non_empty)]
Name = Annotated[StrictStr, _checked(MODEL_NAME.fullmatch, "lowercase letters, digits and '-'")]
CleanPath = Annotated[StrictStr, _checked(_clean_path, "an absolute, clean path")]
Digest = Annotated[StrictStr, AfterValidator(str.lower), _checked(re.compile("[0-9a-f]{64}").fullmatch,
                                                                  "64 hex digits", secret=True)]
S3Prefix = Annotated[StrictStr, AfterValidator(_s3_prefix)]
Items = Strict(False)  # a TOML list is read as a tuple (each item keeps its strict type)
TABLE = ConfigDict(extra="forbid")  # unknown keys are refused


@dataclass(frozen=True, config=TABLE)
class Workspace:
    """A volume where models are placed, and where the jobs that place them run."""

    name: Name
    volume: Annotated[CleanPath, _checked(lambda v: v != "/" and not v.startswith("//"),
                                          "below the filesystem root")] | None = None  # private ones may have none
    cluster: StrictStr = "local"
    public: StrictBool = True
    owner: Text | None = None
    models_dir: Annotated[StrictStr, _checked(_plain, "one plain segment")] = "models"
    work_pool: Name | None = None
    kubernetes: KubernetesTarget | None = None  # its jobs run in this cluster namespace (a Kubernetes pool)
    capacity_bytes: Annotated[StrictInt, Field(ge=0)] | None = None  # models past it are refused (None: no limit)

    @property
    def rule(self) -> VolumeRule:
        return VolumeRule(root=self.volume or "", models_dir=self.models_dir)

    def copy_paths(self, repo_id: str, copy: str, owner_uid: int) -> set[str]:
        """Where a model's shared copy `copy` may be on this volume (`layout.copy_paths`): on the service's shelf,
        and in a Kubernetes workspace, whose jobs run as the model's owner, on that owner's."""
        return layout.copy_paths(self.volume, repo_id, copy, self.models_dir,
                                 owner_uid if self.kubernetes is not None else None)

    def usable_by(self, owner: str) -> bool:
        return self.public or self.owner == owner

    @field_validator("kubernetes", mode="before")
    @classmethod
    def _kubernetes_needs(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and not {"namespace", "image"} <= raw.keys():
            raise ValueError("needs a namespace and an image")
        return raw

    @field_validator("kubernetes")
    @classmethod
    def _kubernetes_names(cls, target: KubernetesTarget | None) -> KubernetesTarget | None:
        """`[workspaces.kubernetes]`: namespace, image, and the volume as `volume_claim` or `host_path`."""
        if target is None:
            return None
        for key, value in dataclasses.asdict(target).items():
            if value is not None and not value.strip():
                raise ValueError(f"{key} must be a non-empty string")
            if key in ("namespace", "volume_claim", "service_account", "token_secret", "config_map",
                       "prefect_auth_secret", "registry_secret") and value is not None \
                    and not DNS_LABEL.fullmatch(value):
                raise ValueError(f"{key} {value!r} must be a Kubernetes name (lowercase letters, digits, '-')")
        if (target.volume_claim is None) == (target.host_path is None):
            raise ValueError("needs exactly one of volume_claim (a PVC) or host_path for the workspace volume")
        if target.host_path is not None and not _clean_path(target.host_path):
            raise ValueError(f"host_path {target.host_path!r} must be an absolute, clean path")
        return target


@dataclass(frozen=True, config=TABLE)
class S3Settings:
    """Where snapshots are staged: `s3://<bucket>/<prefix>/<owner>--<name>/<commit>/`. `enabled = false` keeps
    its endpoint and credentials (to remove staged copies and read s3:// sources) but stages nothing: new
    downloads take the direct path."""

    bucket: Annotated[str, _checked(lambda v: isinstance(v, str) and BUCKET.fullmatch(v), "a valid S3 bucket name",
                                    BeforeValidator), BeforeValidator(_required)] = Field(None, validate_default=True)
    prefix: Annotated[StrictStr, _checked(lambda v: all(_plain(p) for p in v.split("/")),
                                          "one or more plain segments like 'weightkeeper' or 'team/models' "
                                          "(no leading or trailing '/')")] = "weightkeeper"
    endpoint_url: Annotated[Text, _checked(http_url,
                                           "an http:// or https:// URL such as http://minio:9000, without user "
                                           "or password")] | None = None
    region: Text | None = None
    credentials_block: Text | None = None  # a prefect-aws AwsCredentials block (or, deprecated, a Secret of JSON)
    enabled: StrictBool = True


@dataclass(frozen=True, config=TABLE)
class User:
    """An API user; only the sha256 of the token is kept. Admins may name any token block and S3 source."""

    name: Annotated[Text, _checked(lambda v: v.isprintable() and len(v.split()) == 1,
                                   "one word of printable characters")]  # messages and logs quote it
    uid: Annotated[StrictInt, Field(ge=0, lt=2**32 - 1)]  # a uid of the kernel (2**32 - 1 means none)
    token_sha256: Digest | None = Field(repr=False)  # None: its token_env is not set here (cannot log in)
    admin: StrictBool = False
    token_blocks: Annotated[tuple[Name, ...], Items] = ()  # Prefect Secret blocks it may name as `tokenBlock`
    s3_sources: Annotated[tuple[S3Prefix, ...], Items] = ()  # `s3://bucket/prefix/` it may use as sources
    max_models: Annotated[StrictInt, Field(ge=0)] | None = None  # models it may hold at once (None: no limit)

    @model_validator(mode="before")
    @classmethod
    def _token(cls, raw: Any) -> Any:
        """`token_env` names the variable holding the token (unset where only flows run, as on workers: the
        user just cannot log in there); only its sha256 is kept."""
        if not isinstance(raw, dict):
            return raw
        if "token_env" in raw and "token_sha256" in raw:
            raise ValueError("needs token_env or token_sha256, not both")
        if "token_env" in raw:
            raw = dict(raw)
            variable = raw.pop("token_env")
            if not isinstance(variable, str) or not variable:
                raise ValueError(f"token_env {variable!r} must name an environment variable")
            token = os.environ.get(variable)
            raw["token_sha256"] = hashlib.sha256(token.encode()).hexdigest() if token else None
        elif "token_sha256" not in raw:
            raise ValueError("needs token_env or token_sha256 (64 hex digits)")
        return raw


def _default_home() -> Path:
    return Path(os.environ.get(f"{ENV_PREFIX}HOME") or Path.home() / ".local/share/weightkeeper")


class _Environment(EnvSettingsSource):
    """`WEIGHTKEEPER_<SETTING>` for a top-level scalar setting, its text read as the setting's type."""

    def prepare_field_value(self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool) -> Any:
        if value is None or self.field_is_complex(field):
            return None  # tables and lists come from the file only
        try:
            return TypeAdapter(field.annotation).validate_python(value)
        except ValidationError:
            return value  # refused with the setting's own message


class Settings(BaseSettings):
    """The settings of this process: the file's, or the environment's for its top-level scalars, or defaults."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="forbid", frozen=True)

    home: Path = Field(default_factory=_default_home)
    registry_url: Text = Field(default_factory=lambda data: f"sqlite:///{data.get('home', _default_home())}"
                                                            "/registry.db")
    workspaces: Annotated[tuple[Workspace, ...], Items] = ()
    max_concurrent_downloads: StrictInt = 4  # negative: unlimited
    download_timeout_seconds: IntSeconds = 10800
    hf_endpoint: Text | None = Field(default_factory=lambda: os.environ.get("HF_ENDPOINT") or None)
    lease_seconds: IntSeconds = 60
    cleanup_retry_seconds: Seconds = 30
    cleanup_retry_max_seconds: Seconds = 600
    stop_timeout_seconds: Seconds = 600
    verify_interval_seconds: Seconds = 86400
    check_interval_seconds: Seconds = 300  # a copy's cheap (size) check in reconcile, at most this far apart
    hub_unreachable_seconds: Seconds = 1800
    track_interval_seconds: Seconds = 3600  # a tracked model's branch head, asked this often
    track_grace_seconds: Seconds = 600  # a switched-from revision's copy is kept this long
    verify_workers: Annotated[StrictInt, Field(ge=1)] = 4
    free_space_margin_bytes: Annotated[StrictInt, Field(ge=0)] = 1 << 30  # a download leaves this much free
    max_file_bytes: Annotated[StrictInt, Field(ge=0)] = 2 << 40  # the largest file a source may list
    max_manifest_files: Annotated[StrictInt, Field(gt=0)] = 100_000  # the most files a repo or prefix may list
    min_download_bytes_per_second: Annotated[StrictInt, Field(ge=0)] = 1024  # slower over stall_seconds fails
    stall_seconds: IntSeconds = 60
    # `host` or `host:port` a Hub download may be redirected to
    hub_redirect_hosts: Annotated[tuple[StrictStr, ...], Items] = ()
    # the Hub request budget shared by every worker, per endpoint and token (defaults: a free token's)
    hub_api_requests_per_5min: Annotated[StrictInt, Field(gt=0)] = 1000  # /api/... calls
    hub_resolve_requests_per_5min: Annotated[StrictInt, Field(gt=0)] = 5000  # /resolve/ requests
    hub_budget_window_seconds: Annotated[Seconds, Field(gt=0)] = 300  # advanced: the Hub's window (tests)
    s3: S3Settings | None = None
    work_pool: Name = LOCAL_POOL
    worker_run_limit: Annotated[StrictInt, Field(gt=0)] = 8  # runs each of serve's workers executes at once
    reconcile_interval_seconds: Annotated[Seconds, Field(gt=0)] = 60
    users: Annotated[tuple[User, ...], Items] = Field((), repr=False)
    metrics_token_sha256: Digest | None = Field(None, repr=False)  # a token that may read /metrics, nothing else
    _config_path: Path | None = PrivateAttr(None)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return _Environment(settings_cls), init_settings  # the environment overrides the file; no .env files

    @field_validator("max_concurrent_downloads")
    @classmethod
    def _some_downloads(cls, limit: int) -> int:
        if limit == 0:
            raise ValueError("0 would block every download; use a positive limit or a negative one for unlimited")
        if limit > MAX_DOWNLOAD_SLOTS:
            raise ValueError(f"must be at most {MAX_DOWNLOAD_SLOTS}, got {limit}; a negative limit means unlimited")
        return limit

    @field_validator("home")
    @classmethod
    def _home(cls, home: Path) -> Path:
        """Runs of the deployed flows start in directories of their own: a relative home would be another one there."""
        if not home.is_absolute() or "\0" in str(home):
            raise ValueError(f"(here or in $WEIGHTKEEPER_HOME) must be an absolute path, got {str(home)!r}")
        return home

    @field_validator("registry_url")
    @classmethod
    def _registry_file(cls, url: str) -> str:
        """A SQLite registry is one file every process opens: never one in memory, nor one relative to where a process
        starts (flow runs start in directories of their own, and would each make an empty registry there)."""
        if not url.lower().startswith("sqlite"):
            return url
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            database = make_url(url).database
        except (ArgumentError, ValueError):
            return url  # refused, naming the URL, where the registry is opened
        if not database or database == ":memory:" or not database.startswith("/") or "\0" in database:
            raise ValueError("must name its SQLite file by an absolute path, like sqlite:////var/lib/weightkeeper/"
                             "registry.db (a relative one, or one in memory, is another registry in each process)")
        return url

    @field_validator("hf_endpoint")
    @classmethod
    def _endpoint(cls, url: str | None) -> str | None:
        if url is not None and not http_url(url):
            shown = f", got {url!r}" if "@" not in url else " without user or token in it"
            raise ValueError(f"(here or in $HF_ENDPOINT) must be an http:// or https:// URL such as "
                             f"https://huggingface.co{shown}")
        return url

    @field_validator("hub_redirect_hosts")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for host in hosts:
            if not REDIRECT_HOST.fullmatch(host):
                raise ValueError(f"must be a list of lowercase `host` or `host:port` (`[ipv6]:port`), not {host!r}")
        return hosts

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        workspaces = self.workspaces
        if len({w.name for w in workspaces}) != len(workspaces):
            twice = sorted({w.name for w in workspaces if [o.name for o in workspaces].count(w.name) > 1})
            raise ValueError(f"workspace names must be unique: {', '.join(map(repr, twice))} is named more than once")
        digests = [d for d in (*(u.token_sha256 for u in self.users), self.metrics_token_sha256) if d]
        names = [u.name for u in self.users]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"user names must be unique: {', '.join(map(repr, twice))} is named more than once")
        if len(set(digests)) != len(digests):  # which tokens is not said: a message never hints at one
            raise ValueError("user tokens must be unique: two users, or a user and metrics_token_sha256, have one token")
        for w in workspaces:
            if not w.public and not w.owner:
                raise ValueError(f"private workspace {w.name!r} needs an owner")
            if w.public and w.volume is None:
                raise ValueError(f"public workspace {w.name!r} needs a volume")
            if w.kubernetes and w.volume is None:
                raise ValueError(f"workspace {w.name!r} has no volume for its kubernetes jobs to mount")
            if w.kubernetes and not w.work_pool:
                raise ValueError(f"workspace {w.name!r} runs its jobs in Kubernetes and needs a work_pool of its own")
            mixed = [o.name for o in workspaces if o.work_pool == w.work_pool
                     and (bool(o.kubernetes) != bool(w.kubernetes) or o.cluster != w.cluster)]
            if w.kubernetes and mixed:
                raise ValueError(f"work pool {w.work_pool!r} of Kubernetes workspace {w.name!r} is also used by "
                                 f"{mixed}; a Kubernetes pool serves workspaces of one cluster only")
        if os.environ.get(JOB_MARK) and self.registry_url.startswith("sqlite"):
            named = " or ".join(sorted({f"{w.kubernetes.registry_secret!r} in namespace {w.kubernetes.namespace!r}"
                                        for w in workspaces if w.kubernetes})) or "that registry_secret names"
            raise ValueError(f"registry_url names a SQLite file, which this Kubernetes job would make anew in its pod: "
                             f"create the Secret {named} with key {REGISTRY_ENV} holding the shared PostgreSQL's URL")
        roots = sorted(w.volume for w in workspaces if w.volume)
        for outer, inner in zip(roots, roots[1:]):
            if inner.startswith(outer + "/"):
                raise ValueError(f"volume {inner} lies inside volume {outer}; volumes must not nest")
        return self

    @property
    def registry_named(self) -> bool:
        """`registry_url` was given (in the file or the environment), not the default under home."""
        return "registry_url" in self.model_fields_set

    @property
    def config_path(self) -> Path | None:
        """The file these settings were read from (None: there was none)."""
        return self._config_path

    def workspace(self, name: str) -> Workspace | None:
        return next((w for w in self.workspaces if w.name == name), None)

    def pool_for(self, workspace: str) -> str:
        ws = self.workspace(workspace)
        return (ws.work_pool if ws else None) or self.work_pool

    def jobs_inline(self, workspace: str) -> bool:
        """True when the workspace's path jobs belong in the control pool, a process pool: the deployed lifecycle
        run that needs them runs them itself, as subflows, rather than as deployment runs of that same pool."""
        pool = self.pool_for(workspace)
        return pool == self.work_pool and pool not in self.kubernetes_pools

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


# What a value of the wrong type must be, by the first word of pydantic's error type.
EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
            "tuple": "a list", "list": "a list", "dict": "a table", "dataclass": "a table", "model": "a table",
            "path": "a path"}
ENTRIES = {"workspaces": "workspace", "users": "user"}


def _label(loc: tuple, raw: dict) -> str:
    """Where in the file `loc` points: `cleanup_retry_seconds`, `[s3] bucket`, `workspace 'gpu' kubernetes`."""
    words: list[str] = []
    node: Any = raw
    for part in loc:
        if isinstance(node, dict):
            node = node.get(part)
        else:
            node = node[part] if isinstance(node, list) and isinstance(part, int) and part < len(node) else None
        if isinstance(part, int) and words and words[-1] in ENTRIES and isinstance(node, dict) \
                and isinstance(node.get("name"), str):
            words[-1] = f"{ENTRIES[words[-1]]} {node['name']!r}"
        elif isinstance(part, int) and words:
            words[-1] += f"[{part}]"
        else:
            words.append("[s3]" if not words and part == "s3" else str(part))
    return " ".join(words)


def _one_line(error: ValidationError, raw: dict, path: Path) -> str:
    """The first problem of `error`, as `<file>: <key> <what is wrong>` (the variable instead of the file for
    a value from the environment). Unknown keys of one table are named together."""
    errors = error.errors()
    first = errors[0]
    loc, kind, value = first["loc"], first["type"], first.get("input")
    label = _label(loc, raw)
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        keys = sorted(str(e["loc"][-1]) for e in errors if e["type"] == kind and e["loc"][:-1] == loc[:-1])
        label, problem = _label(loc[:-1], raw), f"unknown keys {keys}"
        label = label and f"{label}:"
    elif kind == "value_error":
        problem = str(first["ctx"]["error"])
    elif kind == "missing":
        problem = "is required"
    elif kind in ("greater_than", "greater_than_equal"):
        problem = "must be positive" if kind == "greater_than" else f"must be {first['ctx']['ge']:g} or more"
        problem += f", got {value!r}"
    elif kind in ("less_than", "less_than_equal"):
        bound = first["ctx"]["lt"] if kind == "less_than" else first["ctx"]["le"]
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        problem = f"must be {'less than' if kind == 'less_than' else 'at most'} {bound}, got {value!r}"
    elif kind == "finite_number":
        problem = f"must be a finite number, got {value!r}"
    elif kind == "string_too_short":
        problem = "must be a non-empty string"
    elif expected := EXPECTED.get(kind.split("_")[0]):
        problem = f"must be {expected}, got {value!r}"
    else:
        problem = first["msg"]
    variable = f"{ENV_PREFIX}{loc[0]}".upper() if len(loc) == 1 else ""
    where = f"${variable}" if variable and os.environ.get(variable) else str(path)
    return f"{where}: {' '.join(filter(None, [label, problem]))}"


def load_settings(path: str | os.PathLike | None = None) -> Settings:
    """Read settings from `path`, `$WEIGHTKEEPER_CONFIG` or `<home>/config.toml`."""
    explicit = path or os.environ.get(f"{ENV_PREFIX}CONFIG")
    # absolute: the flow runs it is handed to start in directories of their own
    config_path = (Path(explicit) if explicit else _default_home() / "config.toml").absolute()
    raw: dict = {}
    found = False
    try:
        with open(config_path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        found = True
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"cannot read config {config_path}: larger than {MAX_CONFIG_BYTES} bytes")
        raw = tomllib.loads(data.decode("utf-8-sig"))  # an editor's byte order mark is no TOML
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {config_path} does not exist") from None
    except OSError as e:  # a directory, unreadable, a loop of links, a name too long, ...
        raise ConfigError(f"cannot read config {config_path}: {e.strerror or type(e).__name__}") from None
    except ValueError as e:  # not UTF-8 (UnicodeDecodeError), not TOML (TOMLDecodeError), a NUL in the path
        raise ConfigError(f"cannot read config {config_path}: {e}") from None
    if private := sorted(key for key in raw if key.startswith("_")):  # BaseSettings' own arguments
        raise ConfigError(f"{config_path}: unknown keys {private}")
    try:
        settings = Settings(**raw)
    except ValidationError as e:
        raise ConfigError(_one_line(e, raw, config_path)) from None
    settings._config_path = config_path if found else None
    return settings
