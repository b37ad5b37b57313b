"""`weightkeeper demo`: the whole lifecycle on the embedded default (SQLite, a Prefect server of its own).

Starts a Prefect server (`weightkeeper.prefectserver`, unless `PREFECT_API_URL` names one), creates two
workspace volumes under a scratch directory, declares a model, waits for Ready,
shows its paths and sizes, deletes it, and shows that every file it put down is gone. Without
a reachable Hugging Face Hub it serves the tiny model shipped in `weightkeeper/demo_model`
through the project's own Hub test server, and says so.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

import httpx
from rich.text import Text

from weightkeeper.cli import paths_table, console, follow
from weightkeeper.config import ENV_PREFIX, Settings, load_settings
from weightkeeper.context import use
from weightkeeper.hubserver import HubServer
from weightkeeper.prefectserver import prefect_api
from weightkeeper.service import declare_model

ONLINE_SOURCE = "hf://hf-internal-testing/tiny-random-gpt2"
SHIPPED_REPO = "weightkeeper/tiny-demo"
SHIPPED_MODEL = Path(__file__).parent / "demo_model"


def hub_reachable(endpoint: str = "https://huggingface.co") -> bool:
    try:
        return httpx.get(f"{endpoint}/api/models/gpt2", timeout=3.0).status_code == 200
    except httpx.HTTPError:
        return False


def demo_settings(scratch: Path, endpoint: str | None) -> Settings:
    """The settings of the demo's own config under `scratch`, whatever `WEIGHTKEEPER_*` says: those variables name the
    user's registry (a shared PostgreSQL), home and limits, which the demo must neither write to nor depend on."""
    path = _write_config(scratch, endpoint)
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith(ENV_PREFIX)}
    try:
        return load_settings(path)
    finally:
        os.environ.update(saved)


def _write_config(scratch: Path, endpoint: str | None) -> Path:
    volumes = {name: scratch / "volumes" / name for name in ("team-a", "team-b")}
    for v in volumes.values():
        v.mkdir(parents=True, exist_ok=True)
    lines = [f'home = "{scratch}"', "max_concurrent_downloads = 2"]
    if endpoint:
        lines.append(f'hf_endpoint = "{endpoint}"')
    for name, volume in volumes.items():
        lines += ["[[workspaces]]", f'name = "{name}"', f'volume = "{volume}"', ""]
    path = scratch / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _step(title: str, rest: str) -> Text:
    """A step's line: its title in bold (the console prints no markup: sources and paths are shown as they are)."""
    return Text.assemble((title, "bold"), rest)


def run_demo(source: str | None = None, offline: bool = False) -> int:
    from weightkeeper.flows.delete_model import delete_model
    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.runs import run_here

    scratch = Path(tempfile.mkdtemp(prefix="weightkeeper-demo-"))
    server = None
    if source is None and (offline or not hub_reachable()):
        server = HubServer(scratch / "hub").start()
        server.add_repo(SHIPPED_REPO, {str(p.relative_to(SHIPPED_MODEL)): p for p in SHIPPED_MODEL.rglob("*")
                                       if p.is_file()})
        source = f"hf://{SHIPPED_REPO}"
        console.print(f"offline: the Hugging Face Hub is not reachable, so the tiny model shipped with weightkeeper "
                      f"is served by the project's own Hub test server at {server.url}")
    source = source or ONLINE_SOURCE
    try:
        settings, registry = use(demo_settings(scratch, server.url if server else None))
        console.print(_step("1. declare", f" model demo from {source} into every public workspace"))
        declare_model(settings, registry, name="demo", source=source, owner_name=getpass.getuser(),
                      owner_uid=os.getuid())
        with prefect_api(settings.home) as api:
            console.print(_step("2. ensure-model", f" (a Prefect flow; its runs show in the Prefect UI at "
                                                   f"{api.removesuffix('/api')})"))
            model, failure = follow(registry, "demo", lambda: run_here(ensure_model, "demo"))
            console.print(paths_table(model))
            if failure is not None or model.phase != "Ready":
                console.print(f"demo failed: {failure or model.message}")
                return 1
            for p in model.local_paths:
                files = sorted(str(f.relative_to(p.path)) for f in Path(p.path).rglob("*")
                               if f.is_file() and ".cache" not in f.parts)
                console.print(f"   {p.path}: {p.size_bytes} bytes in {', '.join(files)}")
            console.print(_step("3. delete-model", ": stop downloads, clean each path, release"))
            _, failure = follow(registry, "demo", lambda: run_here(delete_model, "demo"))
            if failure is not None:
                console.print(f"   delete-model stopped: {failure}")
            for p in model.local_paths:
                console.print(f"   {p.path}: {'still there!' if os.path.lexists(p.path) else 'gone'}")
            left = registry.list_models(include_deleting=True)
            console.print(f"   registry: {len(left)} model(s) left")
            ok = not left and not any(os.path.lexists(p.path) for p in model.local_paths)
            console.print("demo complete" if ok else "demo FAILED: something was left behind")
        return 0 if ok else 1
    finally:
        if server:
            server.stop()
