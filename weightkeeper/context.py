"""The settings and the registry of this process: built once, passed to flows and tasks through `current()`.

The CLI sets them from `--config` (`use`); elsewhere (a worker's flow run, the API server) the first call
reads `$WEIGHTKEEPER_CONFIG` or `<home>/config.toml`. The file is parsed again only when it changes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import NamedTuple

from weightkeeper.config import Settings, load_settings
from weightkeeper.registry import Registry, registry_for


class Context(NamedTuple):
    settings: Settings
    registry: Registry


_lock = threading.Lock()
_explicit: Context | None = None
_loaded: tuple[tuple, Context] | None = None  # (what it was read from, the context)


def use(settings: Settings) -> Context:
    """Make `settings` (and their registry) this process's context."""
    global _explicit
    with _lock:
        _explicit = Context(settings, registry_for(settings))
        return _explicit


def _source() -> tuple:
    """What the settings are read from: the file (and its version) and the environment that overrides it."""
    home = os.environ.get("WEIGHTKEEPER_HOME") or Path.home() / ".local/share/weightkeeper"
    path = Path(os.environ.get("WEIGHTKEEPER_CONFIG") or Path(home) / "config.toml")
    try:
        st = path.stat()
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        version = None
    return str(path), version, hash(frozenset(os.environ.items()))  # users' token_env names any variable


def current() -> Context:
    """This process's context: the one `use` set, else the configuration, read once per version."""
    global _loaded
    if _explicit is not None:
        return _explicit
    source = _source()
    with _lock:
        if _loaded is None or _loaded[0] != source:
            settings = load_settings()
            _loaded = (source, Context(settings, registry_for(settings)))
        return _loaded[1]
