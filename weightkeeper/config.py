"""Configuration: workspaces and settings from a TOML file, overridable from the environment.

Environment (documented defaults):
- `WEIGHTKEEPER_CONFIG`: path of the TOML file (default `<home>/config.toml`, optional).
- `WEIGHTKEEPER_HOME`: data directory (default `~/.local/share/weightkeeper`).
- `WEIGHTKEEPER_REGISTRY_URL`: SQLAlchemy URL of the registry (default SQLite `<home>/registry.db`;
  `postgresql+psycopg://user@host/db` for several hosts).
- `HF_ENDPOINT`: Hugging Face endpoint, unless `hf_endpoint` is set in the file.

The file:

    max_concurrent_downloads = 4        # negative = unlimited
    download_timeout_seconds = 10800
    [[workspaces]]
    name = "team-a"
    cluster = "local"
    volume = "/mnt/team-a"              # absolute mount path of the workspace volume
    public = true                        # private workspaces name an `owner`
    models_dir = "models"
"""

from __future__ import annotations

import os
import posixpath
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from weightkeeper.errors import ConfigError
from weightkeeper.guard import VolumeRule
from weightkeeper.layout import MODEL_NAME, SEGMENT

DOWNLOAD_LIMIT_NAME = "weightkeeper-downloads"


@dataclass(frozen=True)
class Workspace:
    name: str
    volume: str | None
    cluster: str = "local"
    public: bool = True
    owner: str | None = None
    models_dir: str = "models"

    @property
    def rule(self) -> VolumeRule:
        return VolumeRule(root=self.volume or "", models_dir=self.models_dir)

    def usable_by(self, owner: str) -> bool:
        return self.public or self.owner == owner


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
    config_path: Path | None = field(default=None, compare=False)

    def workspace(self, name: str) -> Workspace | None:
        return next((w for w in self.workspaces if w.name == name), None)

    @property
    def volume_rules(self) -> list[VolumeRule]:
        return [w.rule for w in self.workspaces if w.volume]

    @property
    def downloads_limited(self) -> bool:
        return self.max_concurrent_downloads >= 0


def _workspace(raw: dict, where: str) -> Workspace:
    unknown = set(raw) - {"name", "volume", "cluster", "public", "owner", "models_dir"}
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
        owner=owner, models_dir=models_dir,
    )


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
             "verify_interval_seconds", "hub_unreachable_seconds", "verify_workers"}
    if set(raw) - known:
        raise ConfigError(f"{where}: unknown settings {sorted(set(raw) - known)}")
    home = Path(raw.get("home", home))
    workspaces = tuple(_workspace(w, where) for w in raw.get("workspaces", []))
    names = [w.name for w in workspaces]
    if len(names) != len(set(names)):
        raise ConfigError(f"{where}: workspace names must be unique")
    roots = sorted(w.volume for w in workspaces if w.volume)
    for outer, inner in zip(roots, roots[1:]):
        if inner.startswith(outer + "/"):
            raise ConfigError(f"{where}: volume {inner} lies inside volume {outer}; volumes must not nest")
    if _int(raw, "max_concurrent_downloads", 4, where) == 0:
        raise ConfigError(f"{where}: max_concurrent_downloads = 0 would block every download; "
                          "use a positive limit or a negative one for unlimited")
    if _int(raw, "lease_seconds", 60, where) <= 0:
        raise ConfigError(f"{where}: lease_seconds must be positive")
    timeout = _int(raw, "download_timeout_seconds", 10800, where)
    if timeout <= 0:
        raise ConfigError(f"{where}: download_timeout_seconds must be positive")
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
        config_path=config_path if config_path.exists() else None,
    )
