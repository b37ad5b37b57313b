"""The `weightkeeper` command line."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import getpass
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table
from sqlalchemy.exc import DBAPIError

from weightkeeper.config import MAX_SECONDS, Settings, http_url, load_settings
from weightkeeper.context import use
from weightkeeper.errors import (ConfigError, ConflictError, InvalidInputError, NotFoundError, WeightkeeperError,
                                 redact_urls)
from weightkeeper.phase import Phase
from weightkeeper import EXIT_WITH_PARENT_ENV
from weightkeeper.prefectserver import prefect_api
from weightkeeper.kube import REGISTRY_ENV
from weightkeeper.layout import MODEL_NAME
from weightkeeper.registry import Model, Registry, registry_for
from weightkeeper.registry.common import DELETING, READY
from weightkeeper.registry.listing import DEFAULT_LIMIT, SORTS, ListQuery, Viewer
from weightkeeper.service import declare_model, move_model, switch_revision


def _console(stderr: bool = False) -> Console:
    """What is printed quotes paths, messages and file names as they are (no markup). Into a file or another
    program, a line of text is printed whole, never wrapped or cut at 80 columns (a table still fits 80)."""
    made = Console(stderr=stderr, markup=False, emoji=False)
    made.soft_wrap = not made.is_terminal
    return made


console, err_console = _console(), _console(stderr=True)
LINE_SECONDS = 10.0  # where progress is written as lines: at most this often per path while its status stays


def _shown_on_terminal(record: logging.LogRecord) -> bool:
    """A run's log line without a traceback: a run's failure is the model's message, printed at the end."""
    return not record.exc_info


def _quiet_prefect_console() -> None:
    """Keep the tracebacks of Prefect's run logs off the terminal while a progress display runs (they still reach
    the API); the lines stay, saying what a run waits for."""
    from prefect.logging.configuration import ensure_logging_setup

    ensure_logging_setup()  # else Prefect adds its console handler when the flow is imported, after this
    for handler in logging.getLogger().handlers:
        if type(handler).__name__ == "PrefectConsoleHandler":
            handler.addFilter(_shown_on_terminal)


def paths_table(model: Model) -> Table:
    table = Table(title=f"{model.name}: {model.phase}", title_justify="left")
    for column in ("workspace", "path", "status", "sizeBytes", "message"):
        table.add_column(column, overflow="fold")
    for p in model.local_paths:
        table.add_row(p.workspace, p.path, p.status, "" if p.size_bytes is None else str(p.size_bytes), p.message)
    return table


def follow(registry: Registry, name: str, work: Callable[[], object]) -> tuple[Model | None, Exception | None]:
    """Run `work` (a flow) in a thread and show each path's progress from the registry until it ends; the model
    then, and what the flow raised (None when it returned)."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome.append(e)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name=f"flow-{name}", daemon=True)
    _quiet_prefect_console()
    thread.start()
    with (_bars if err_console.is_terminal else _lines)() as show:
        while True:
            alive = thread.is_alive()
            show(registry.find_model(name))
            if not alive:
                break
            time.sleep(0.5)
    if outcome and not isinstance(outcome[0], Exception):
        raise outcome[0]
    return registry.find_model(name), outcome[0] if outcome else None


Show = Callable[[Model | None], None]  # shows the model's paths (None: the model is gone, its paths released)


@contextlib.contextmanager
def _run_logs_through(shown: Console) -> Iterator[None]:
    """Print the runs' log lines through the console that draws the bars, which puts each above them: written to the
    terminal beside them, each line would leave a stale copy of every bar behind."""
    handlers = [h for h in logging.getLogger().handlers if type(h).__name__ == "PrefectConsoleHandler"]
    own = [h.console for h in handlers]
    for handler in handlers:
        handler.console = shown
    try:
        yield
    finally:
        for handler, console in zip(handlers, own):
            handler.console = console


@contextlib.contextmanager
def _bars() -> Iterator[Show]:
    """Progress on a terminal: a bar per path, with its status and message."""
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TextColumn("{task.fields[status]}", markup=False), console=err_console,
                  transient=False) as progress, _run_logs_through(progress.console):
        bars: dict[int, int] = {}

        def show(model: Model | None) -> None:
            for p in model.local_paths if model else []:
                if p.id not in bars:
                    bars[p.id] = progress.add_task(f"{p.workspace}:{p.path}", total=None, status="")
                progress.update(bars[p.id], completed=p.bytes_done, total=p.bytes_total or None,
                                status=f"{p.status} {p.message}"[:80])
            for bar in bars.values() if model is None else []:
                progress.update(bar, status="released")

        yield show


@contextlib.contextmanager
def _lines() -> Iterator[Show]:
    """Progress into a file or another program (a log, CI): a whole line for a path when its status changes, and
    when its message does, at most every LINE_SECONDS while its status stays."""
    said: dict[int, tuple[str, str, str, float]] = {}  # path id -> where, status, message, when said

    def say(key: int, where: str, status: str, message: str, count: str = "") -> None:
        said[key] = where, status, message, time.monotonic()
        err_console.print(f"{where}: {status}{count}" + (f": {message}" if message else ""), highlight=False)

    def show(model: Model | None) -> None:
        for key, (where, status, _, _) in list(said.items()) if model is None else []:
            if status != "released":
                say(key, where, "released", "")
        for p in model.local_paths if model else []:
            _, status, message, at = said.get(p.id, ("", "", "", 0.0))
            if (p.status, p.message) != (status, message) and \
                    (p.status != status or time.monotonic() - at >= LINE_SECONDS):
                done = f" ({p.bytes_done} of {p.bytes_total} bytes)" if p.bytes_done < (p.bytes_total or 0) else ""
                say(p.id, f"{p.workspace}:{p.path}", p.status, p.message, done)

    yield show


def start_in_background(settings: Settings, flow: str, name: str) -> str:
    """Run a flow in a detached process; its output goes to a log file under the data directory."""
    log_path = settings.home / "logs" / f"{flow}-{name}.log"
    env = dict(os.environ)
    if settings.config_path:
        env["WEIGHTKEEPER_CONFIG"] = str(settings.config_path)
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - closed below, once the process has it
    except OSError as e:
        raise WeightkeeperError(f"{flow} not started for {name}: cannot write its log {log_path}: {e.strerror}; "
                                f"make {settings.home} a writable directory, or run it here with --wait") from None
    with log:
        subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "run", flow, name], stdout=log,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    return str(log_path)


def _run_flow(flow: str, name: str):
    from weightkeeper.runs import run_here

    if flow == "ensure-model":
        from weightkeeper.flows.ensure_model import ensure_model as run
    else:
        from weightkeeper.flows.delete_model import delete_model as run
    return run_here(run, name, wait_for_lease=True)  # a live run holding the model: wait, saying whose


def _launch(args, settings: Settings, registry: Registry, flow: str, name: str) -> int:
    if not args.wait:
        log = start_in_background(settings, flow, name)
        console.print(f"{flow} started for {name} in the background (log: {log}); "
                      f"follow it with `weightkeeper model get {name}`")
        return 0
    with prefect_api(settings.home):
        model, failure = follow(registry, name, lambda: _run_flow(flow, name))
    if model is None:
        console.print(f"model {name} released: every file it put down is gone")
        return 0
    console.print(paths_table(model))
    if failure is not None:  # the run ended early: what stopped it, then where the model was left
        said = (str(failure).strip().splitlines() or [""])[0][:300]
        _error(f"{flow} of {name} stopped: {type(failure).__name__}{': ' + said if said else ''}", 1)
    if model.phase != READY or failure is not None:
        err_console.print(f"model {name} is {model.phase}: {model.message}", soft_wrap=True, highlight=False)
        return 1
    return 0


def cmd_workspace_list(args, settings: Settings) -> int:
    registry = registry_for(settings)
    usage = registry.workspace_usage(settings.workspaces)
    rows = [{"name": w.name, "cluster": w.cluster, "volume": w.volume, "public": w.public, "owner": w.owner,
             "modelsDir": w.models_dir, "capacityBytes": w.capacity_bytes, **usage[w.name]}
            for w in settings.workspaces]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table()
    for column in ("name", "cluster", "volume", "public", "owner", "modelsDir", "capacityBytes", "storedBytes",
                   "withoutSharingBytes"):
        table.add_column(column, overflow="fold")  # a path or a number is shown whole, on several lines if need be
    for r in rows:
        table.add_row(*("" if r[c] is None else str(r[c]) for c in r))
    console.print(table)
    return 0


def cmd_model_create(args, settings: Settings) -> int:
    registry = registry_for(settings)
    model = declare_model(settings, registry, name=args.name, source=args.source, owner_name=getpass.getuser(),
                          owner_uid=os.getuid(), workspaces=args.workspace, subpath=args.subpath,
                          token_block=args.token_block, download_policy=args.download_policy,
                          keep_files=args.keep_files, include=args.include, exclude=args.exclude,
                          track=args.track)
    console.print(f"model {model.name} declared: {model.source} -> "
                  + (", ".join(p.path for p in model.local_paths) or "no path"))
    return _launch(args, settings, registry, "ensure-model", model.name)


def cmd_model_ensure(args, settings: Settings) -> int:
    registry = registry_for(settings)
    model = registry.get_model(args.name)
    if model.phase == DELETING:
        raise ConflictError(f"model {args.name!r} is being deleted", "ResourceProcessing")
    return _launch(args, settings, registry, "ensure-model", model.name)


def cmd_model_retry(args, settings: Settings) -> int:
    """A Failed model Pending again, its failed paths too, and ensure-model run (the API's `retry`)."""
    registry = registry_for(settings)
    model = registry.retry_model(args.name)
    return _launch(args, settings, registry, "ensure-model", model.name)


def cmd_model_update(args, settings: Settings) -> int:
    registry = registry_for(settings)
    if args.revision is not None:
        if args.subpath is not None or args.download_policy is not None:
            raise InvalidInputError("--revision switches the model in place; move it (--subpath, --download-policy) "
                                    "in another update")
        model = switch_revision(registry, args.name, args.revision)
        console.print(f"model {model.name} switches from {model.commit} to {args.revision}", markup=False)
        code = _launch(args, settings, registry, "ensure-model", model.name)
        after = registry.get_model(args.name)
        if code == 0 and args.wait and after.next_revision:  # still asked for: the switch did not happen
            err_console.print(f"model {args.name} stays on {after.commit}: {after.message}", soft_wrap=True)
            return 1
        return code
    model = move_model(settings, registry, args.name, subpath=args.subpath, download_policy=args.download_policy)
    console.print(f"model {model.name} now targets "
                  + ", ".join(p.path for p in model.local_paths if not p.retired)
                  + "".join(f"; {p.path} is cleaned once the new paths are Ready" for p in model.local_paths
                            if p.retired))
    return _launch(args, settings, registry, "ensure-model", model.name)


def listed(registry: Registry, query: ListQuery, limit: int | None = None) -> Iterator[Model]:
    """The models of `query` (the first `limit` of them), fetched a page at a time as they are consumed."""
    cursor, left = None, limit
    while left is None or left > 0:
        page = registry.list_page(query, Viewer(None), DEFAULT_LIMIT if left is None else min(left, DEFAULT_LIMIT),
                                  cursor)
        yield from page.items
        left = None if left is None else left - len(page.items)
        if (cursor := page.next_cursor) is None:
            return


def cmd_model_list(args, settings: Settings) -> int:
    """Print each model as its page arrives (a JSON array with --json), never holding the whole list."""
    query = ListQuery(workspace=args.workspace, phase=args.phase, owner=args.owner, search=args.search,
                      sort=args.sort, include_deleting=args.include_deleting)
    models = listed(registry_for(settings), query, args.limit)
    row = "{:<32} {:<11} {:>14} {:>5} {:<25} {}"
    print("[" if args.json else row.format("name", "phase", "sizeBytes", "paths", "deleting", "source"), end="")
    for i, m in enumerate(models):
        if args.json:
            print(("\n" if i == 0 else ",\n") + json.dumps(m.to_json(), indent=2), end="", flush=True)
        else:
            print("\n" + row.format(m.name, m.phase, "" if m.files is None else m.size_bytes, len(m.local_paths),
                                    m.deletion_time.isoformat(timespec="seconds") if m.deletion_time else "",
                                    m.source), end="", flush=True)
    print("\n]" if args.json else "")
    return 0


def _positive(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return int(value)


def _seconds(value: str) -> int:
    """An interval: a whole number of seconds, at most MAX_SECONDS (more overflows Prefect's schedule)."""
    if _positive(value) > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{value!r} is more than {MAX_SECONDS} seconds (ten years)")
    return int(value)


def _port(value: str) -> int:
    """A TCP port to listen on: found wrong before anything is started, not by the server at the end."""
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port (1 to 65535)")
    return int(value)


def _api_url(value: str) -> str:
    """The Prefect API URL a worker in the cluster is given: http(s), a host, no credentials (those come from
    the auth secret), no query, no spaces."""
    if not http_url(value):
        shown = f"{value!r} is" if "@" not in value else "a URL with a user or password in it is"
        raise argparse.ArgumentTypeError(f"{shown} not a Prefect API URL such as http://prefect.svc:4200/api "
                                         "(credentials go in the auth secret, not the URL)")
    return value


def cmd_model_get(args, settings: Settings) -> int:
    registry = registry_for(settings)
    model = registry.get_model(args.name)
    shared = {a.id: a.to_json() for a in (registry.get_artifact(i) for i in {p.artifact_id for p in model.local_paths
                                                                           if p.artifact_id}) if a}
    if args.json:
        print(json.dumps(model.to_json(shared), indent=2))
        return 0
    console.print(f"source: {model.source}  commit: {model.commit or '-'}  owner: {model.owner_name}"
                  + ("  (tracked)" if model.track else ""), markup=False)
    if model.pending_commit:
        progress = [f"{p.workspace} {p.bytes_done}/{p.bytes_total} bytes" for p in model.local_paths if p.bytes_total]
        console.print(f"switching to: {model.pending_commit} ({', '.join(progress) or 'starting'})", markup=False)
    if model.switched_at:
        console.print(f"last switch: {model.switched_at.isoformat(timespec='seconds')}")
    if model.include is not None or model.exclude is not None:
        console.print(f"files: include {model.include or 'the default set'}, exclude {model.exclude or []}",
                      markup=False)
    if model.staging_uri:
        console.print(f"S3: {model.staging_uri} ({'staged by weightkeeper' if model.staging_owned else 'source'})")
    if model.message:
        console.print(f"message: {model.message}", markup=False)  # it may quote a repository's file names
    console.print(paths_table(model))
    for copy in shared.values():
        console.print(f"shared copy {copy['path']} ({copy['state']}) used by {', '.join(copy['models'])}")
    return 0


def cmd_model_delete(args, settings: Settings) -> int:
    registry = registry_for(settings)
    registry.mark_deleting(args.name)
    console.print(f"model {args.name} marked for deletion")
    return _launch(args, settings, registry, "delete-model", args.name)


def cmd_run(args, settings: Settings) -> int:
    """Run one flow in this process (used by background launches)."""
    with prefect_api(settings.home):
        _run_flow(args.flow, args.name)
    return 0


SECRET_BYTES = 64 << 10


def _block_name(value: str) -> str:
    if not MODEL_NAME.fullmatch(value):  # what a model may name as its token block
        raise argparse.ArgumentTypeError(f"{value!r} is not a token block's name (up to 63 lowercase letters, digits "
                                         "and dashes, a letter or digit first and last, e.g. hf-token)")
    return value


def _read_secret(name: str) -> str:
    """The secret, without the spaces and line ends around it: typed at a prompt that does not echo it, or piped."""
    if sys.stdin.isatty():
        value = getpass.getpass(f"value of the Secret block {name!r} (not shown): ")
    else:
        try:
            value = sys.stdin.read(SECRET_BYTES + 1)
        except UnicodeDecodeError:  # not shown: a token with a wrong byte is still most of a token
            raise InvalidInputError(f"the value given is not UTF-8 text: not a token (`weightkeeper secret set "
                                    f"{name} < token-file`, the file holding the token alone)") from None
        if len(value) > SECRET_BYTES:
            raise InvalidInputError(f"the value on stdin is longer than {SECRET_BYTES} characters: not a token")
    if not _utf8(value):  # bytes a C locale's stdin decoded as surrogates
        raise InvalidInputError(f"the value given is not UTF-8 text: not a token (`weightkeeper secret set {name} "
                                "< token-file`, the file holding the token alone)")
    value = value.strip()
    if not value or len(value.split()) > 1:
        raise InvalidInputError("give the token as one line without spaces on stdin (e.g. `weightkeeper secret set "
                                f"{name} < token-file`), or type it at the prompt")
    return value


def cmd_secret_set(args, settings: Settings) -> int:
    """Save a Hugging Face token as a Prefect Secret block on the Prefect server this weightkeeper uses (without
    PREFECT_API_URL, the one it starts under its home, where `prefect block create` run by hand would not reach)."""
    import httpx
    from prefect.blocks.system import Secret

    if args.value is not None:
        raise InvalidInputError("the token is never an argument (it would stay in the shell's history and the process "
                                f"list): `weightkeeper secret set {args.name} < token-file`, or type it at the prompt")
    value = _read_secret(args.name)
    with prefect_api(settings.home) as url:
        try:
            Secret(value=value).save(args.name, overwrite=True)
        except httpx.HTTPError as e:  # not its message: a 422's body quotes the request, the token with it
            status = getattr(getattr(e, "response", None), "status_code", None)
            raise WeightkeeperError(f"the Prefect server at {url} did not save the Secret block {args.name!r} "
                                    f"({f'HTTP {status}' if status else type(e).__name__}); check its log and "
                                    "PREFECT_API_AUTH_STRING, then run this again") from None
    console.print(f"saved the Prefect Secret block {args.name!r}; models name it with --token-block {args.name} "
                  "(the API's tokenBlock)")
    return 0


def cmd_reconcile(args, settings: Settings) -> int:
    """One reconcile pass here, or (with --every) a Prefect deployment served on that interval."""
    from weightkeeper.flows.reconcile import reconcile
    from weightkeeper.runs import run_here

    with prefect_api(settings.home):
        if args.every:
            if settings.config_path:  # Prefect's runner starts each run in a process of its own, from this environment
                os.environ["WEIGHTKEEPER_CONFIG"] = str(settings.config_path)
            # ...which ends with this one, as a serve worker's runs do: killed (SIGKILL, SIGHUP), this command would
            # leave a pass running on its own, verifying and repairing with no one to report to
            os.environ[EXIT_WITH_PARENT_ENV] = str(os.getpid())
            reconcile.serve(name="reconcile", interval=args.every, limit=1)  # passes never overlap
            return 0
        outcomes = run_here(reconcile)
    for path, outcome in sorted(outcomes.items()):
        console.print(f"{outcome:>14}  {path}")
    return 0


def cmd_serve(args, settings: Settings) -> int:
    from weightkeeper.serve import serve

    return serve(settings, args.prefect_port, args.api_host, None if args.no_api else args.api_port,
                 args.prefect_host)


def cmd_worker_manifests(args, settings: Settings) -> int:
    """The manifests of a Kubernetes workspace's worker, as YAML for `kubectl apply -f -`."""
    import yaml

    from weightkeeper.kube import worker_manifests

    ws = settings.workspace(args.workspace)
    if ws is None or ws.kubernetes is None:
        raise InvalidInputError(f"workspace {args.workspace!r} has no [workspaces.kubernetes] table in "
                                f"{settings.config_path or 'the config'}")
    print(yaml.safe_dump_all(worker_manifests(ws.work_pool, ws.kubernetes.namespace, args.api_url,
                                              args.image or ws.kubernetes.image, ws.kubernetes.prefect_auth_secret),
                             sort_keys=False), end="")
    return 0


def cmd_demo(args) -> int:
    """On a config of its own (`demo.demo_settings`): the user's, and the registry it names, are never read."""
    from weightkeeper.demo import run_demo

    if args.offline and args.source:  # the demo would go to the Hub for it all the same
        raise InvalidInputError("--offline demonstrates the model shipped with weightkeeper; it takes no --source")
    return run_demo(source=args.source, offline=args.offline)


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one line, as any other bad input: what is wrong, and where the usage is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="weightkeeper", description=__doc__)
    parser.add_argument("--config", help="TOML config file (default $WEIGHTKEEPER_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    ws = sub.add_parser("workspace", help="declared workspaces").add_subparsers(dest="action", required=True)
    p = ws.add_parser("list", help="list workspaces")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_workspace_list)

    model = sub.add_parser("model", help="declare, inspect and delete models").add_subparsers(
        dest="action", required=True)
    p = model.add_parser("create", help="declare a model and download it into its workspaces")
    p.add_argument("name")
    p.add_argument("--source", required=True, help="hf://owner/name[@revision]")
    p.add_argument("--workspace", action="append", help="target workspace (repeat; default: all public)")
    p.add_argument("--subpath", help="directory below the volume root")
    p.add_argument("--token-block", help="Prefect Secret block holding the Hugging Face token")
    p.add_argument("--download-policy", choices=["always-download", "reuse-if-exists"],
                   help="reuse-if-exists: link to one shared copy per volume instead of a copy per model "
                        "(default: always-download; reuse-if-exists with --track)")
    p.add_argument("--keep-files", action="store_true", help="on deletion keep the files (or the link) in place")
    p.add_argument("--include", action="append", metavar="PATTERN",
                   help="fetch only files matching it (repeat; e.g. '*Q4_K_M.gguf'; default: weights and configs)")
    p.add_argument("--exclude", action="append", metavar="PATTERN", help="never fetch files matching it (repeat)")
    p.add_argument("--track", action="store_true",
                   help="follow the branch or tag: download each new commit beside the current one, then switch")
    p.add_argument("--wait", action="store_true", help="run here and show progress until Ready or Failed")
    p.set_defaults(func=cmd_model_create)
    p = model.add_parser("ensure", help="run ensure-model again (idempotent: only what is missing is fetched)")
    p.add_argument("name")
    p.add_argument("--wait", action="store_true")
    p.set_defaults(func=cmd_model_ensure)
    p = model.add_parser("retry", help="make a Failed model Pending again and run ensure-model")
    p.add_argument("name")
    p.add_argument("--wait", action="store_true")
    p.set_defaults(func=cmd_model_retry)
    p = model.add_parser("update", help="move a model to a new subpath and/or download policy, or switch it to "
                                        "another revision")
    p.add_argument("name")
    p.add_argument("--revision", help="switch the model's paths to this branch, tag or commit once (download it "
                                      "beside the current one, then switch)")
    p.add_argument("--subpath", help="new directory below the volume root (omit for the default layout)")
    p.add_argument("--download-policy", choices=["always-download", "reuse-if-exists"])
    p.add_argument("--wait", action="store_true")
    p.set_defaults(func=cmd_model_update)
    p = model.add_parser("list", help="list models, page by page")
    p.add_argument("--include-deleting", action="store_true", help="also models still being deleted")
    p.add_argument("--phase", choices=[phase.value for phase in Phase])
    p.add_argument("--workspace", help="only models with an entry in this workspace")
    p.add_argument("--owner", help="only this user's models")
    p.add_argument("--search", help="only names or sources containing this text (any case)")
    p.add_argument("--sort", choices=SORTS, default="name", help="order (default name; --sort=-size: descending)")
    p.add_argument("--limit", type=_positive, help="stop after this many models")
    p.add_argument("--json", action="store_true", help="a JSON array")
    p.set_defaults(func=cmd_model_list)
    p = model.add_parser("get", help="show one model")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_model_get)
    p = model.add_parser("delete", help="stop downloads, remove every path, release the model")
    p.add_argument("name")
    p.add_argument("--wait", action="store_true", help="run here until the model is released")
    p.set_defaults(func=cmd_model_delete)

    secret = sub.add_parser("secret", help="Hugging Face tokens, as Prefect Secret blocks").add_subparsers(
        dest="action", required=True)
    p = secret.add_parser("set", help="save a token as a Secret block (read from stdin, or typed at a prompt that "
                                      "does not show it); replaces one of that name")
    p.add_argument("name", type=_block_name)
    p.add_argument("value", nargs="?", help=argparse.SUPPRESS)  # refused, without being shown
    p.set_defaults(func=cmd_secret_set)

    p = sub.add_parser("reconcile", help="verify every copy, repair damage, collect unused shared copies")
    p.add_argument("--every", type=_seconds, metavar="SECONDS", help="serve it as a scheduled deployment instead")
    p.set_defaults(func=cmd_reconcile)

    p = sub.add_parser("serve", help="serve every deployment, their work pools' workers and the REST API")
    p.add_argument("--prefect-port", type=_port, default=4200, help="port of the Prefect server started when "
                   "PREFECT_API_URL is not set (default 4200)")
    p.add_argument("--prefect-host", help="address that Prefect server listens on (default 127.0.0.1); it requires "
                   "the credential in $WEIGHTKEEPER_HOME/prefect-auth or $PREFECT_API_AUTH_STRING")
    p.add_argument("--api-host", default="127.0.0.1")
    p.add_argument("--api-port", type=_port, default=8470)
    p.add_argument("--no-api", action="store_true", help="serve the deployments only")
    p.set_defaults(func=cmd_serve)

    kube = sub.add_parser("kubernetes", help="Kubernetes workspaces").add_subparsers(dest="action", required=True)
    p = kube.add_parser("worker-manifests", help="print a workspace pool's worker, its RBAC and service accounts")
    p.add_argument("workspace")
    p.add_argument("--api-url", required=True, type=_api_url, help="the Prefect API URL as the cluster reaches it")
    p.add_argument("--image", help="the worker image (default: the workspace's job image)")
    p.set_defaults(func=cmd_worker_manifests)

    p = sub.add_parser("run", help=argparse.SUPPRESS)
    p.add_argument("flow", choices=["ensure-model", "delete-model"])
    p.add_argument("name")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="create a model, wait for Ready, show it, delete it, show the files gone")
    p.add_argument("--source", help="model to use (default: a tiny public model, or the shipped one offline)")
    p.add_argument("--offline", action="store_true", help="do not try the Hugging Face Hub")
    p.set_defaults(func=cmd_demo)
    return parser


def _utf8(text: str) -> bool:
    """Whether `text` is text: an argument's bytes that are not UTF-8 come as surrogates, which no database, JSON or
    Prefect block takes."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _not_text(args) -> str | None:
    """The first argument (but --config, a file's name: any bytes) whose bytes are not UTF-8, as an error line."""
    for key, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if key != "config" and isinstance(item, str) and not _utf8(item):
                return f"{key.replace('_', '-')} {item!r} is not UTF-8 text: give it as typed, in a UTF-8 locale"
    return None


def _error(message: str, code: int) -> int:
    """One line on stderr, URLs without their user info or query (a PREFECT_API_URL may carry a password)."""
    err_console.print(f"error: {redact_urls(message)}", highlight=False, soft_wrap=True)
    return code


def _interrupted(args) -> str:
    name = getattr(args, "name", None)
    if not getattr(args, "wait", False) or name is None:
        return "interrupted"
    if args.action == "delete":
        return f"interrupted: model {name} stays Deleting; `weightkeeper model delete {name}` resumes"
    return f"interrupted: the partial files of model {name} are kept; `weightkeeper model ensure {name}` resumes"


def _reader_left() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll says POLLERR)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):  # stdout closed, or not a file
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if problem := _not_text(args):
        return _error(problem, 2)
    try:
        if args.func is cmd_demo:
            return cmd_demo(args)
        settings = use(load_settings(args.config)).settings  # flows run here read it from the context
        return args.func(args, settings)
    except (ConfigError, InvalidInputError, ConflictError, NotFoundError) as e:
        return _error(str(e), 2)
    except WeightkeeperError as e:
        return _error(str(e), 1)
    except DBAPIError as e:  # the statement and its values are not shown
        why = (str(e.orig).strip().splitlines() or [type(e.orig).__name__])[0]
        where = f"${REGISTRY_ENV}" if os.environ.get(REGISTRY_ENV) else \
            f"registry_url in {args.config or '$WEIGHTKEEPER_CONFIG'}"
        return _error(f"the registry failed: {why}; retry, or check {where}", 1)
    except BrokenPipeError as e:
        if not _reader_left():  # a socket's (the registry's, Prefect's): an error like any other
            return _error(str(e), 1)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor fail flushing stdout at exit
        return 141  # the reader left (`| head`): stop quietly, as a pipeline expects
    except OSError as e:
        return _error(str(e), 1)
    except KeyboardInterrupt:
        err_console.print(_interrupted(args), soft_wrap=True)
        _exit_now(130)


def _exit_now(code: int) -> NoReturn:
    """Exit without waiting for this process's threads: a flow run here goes on in them (the interpreter would wait
    for its download threads, with its Prefect server gone, while they hold the model's lease). As for a killed
    worker, its partial files are kept and the next run on this host takes over at once."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
