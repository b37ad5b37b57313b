"""The `weightkeeper` command line, run as users run it (a subprocess per command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import expected_size, tiny_files
from test_lifecycle import wait_until


def cli(wk, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    wk.registry  # made here, so that no command's output says it made it
    env = {**os.environ, "WEIGHTKEEPER_CONFIG": str(wk.config), "COLUMNS": "200", **env}
    proc = subprocess.run([sys.executable, "-m", "weightkeeper.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def test_workspace_list(wk):
    rows = json.loads(cli(wk, "workspace", "list", "--json").stdout)
    assert [r["name"] for r in rows] == ["team-a", "team-b", "private"]
    assert rows[2] == {"name": "private", "cluster": "local", "volume": str(wk.volumes["private"]),
                       "public": False, "owner": "alice", "modelsDir": "models", "capacityBytes": None, "storedBytes": 0,
                       "withoutSharingBytes": 0}
    assert "…" not in cli(wk, "workspace", "list", COLUMNS="80").stdout  # into a pipe or a narrow terminal: whole


def test_create_list_get_delete(wk, hub):
    files = tiny_files("cli")
    hub.add_repo("acme/cli", files)
    out = cli(wk, "model", "create", "cli-model", "--source", "hf://acme/cli", "--workspace", "team-a", "--wait",
              COLUMNS="60")  # piped, a line is whole however narrow the terminal
    assert "Ready" in out.stdout
    listed = json.loads(cli(wk, "model", "list", "--json").stdout)
    assert [m["name"] for m in listed] == ["cli-model"]
    model = json.loads(cli(wk, "model", "get", "cli-model", "--json").stdout)
    assert model["phase"] == "Ready" and model["isDeleted"] is False and model["deletionTime"] is None
    (path,) = model["localPaths"]
    assert path["workspace"] == "team-a" and path["status"] == "Ready"
    assert path["sizeBytes"] == expected_size(files)
    assert path["path"] == str(wk.volumes["team-a"] / "models" / "acme--cli")
    assert "cli-model" in cli(wk, "model", "get", "cli-model").stdout
    where = f"team-a:{path['path']}"  # piped, progress is whole lines: a path's, each time its status changes
    assert f"{where}: Ready: {path['sizeBytes']} bytes" in out.stderr.splitlines() and "…" not in out.stderr
    assert f"{where}: released" in cli(wk, "model", "delete", "cli-model", "--wait", COLUMNS="60").stderr.splitlines()
    assert not Path(path["path"]).exists()
    assert json.loads(cli(wk, "model", "list", "--include-deleting", "--json").stdout) == []


@pytest.mark.without_prefect_server
def test_progress_into_a_pipe_is_a_line_when_a_status_changes_and_messages_at_most_each_interval(monkeypatch):
    from weightkeeper import cli as cli_module

    lines = []
    monkeypatch.setattr(cli_module.err_console, "print", lambda text, **_: lines.append(text))
    at = lambda status, message, done=0: SimpleNamespace(local_paths=[SimpleNamespace(  # noqa: E731
        id=1, workspace="ws", path="/v/models/m", status=status, message=message, bytes_done=done, bytes_total=100)])
    for interval, said in ((3600, 3), (0, 4)):
        lines.clear()
        monkeypatch.setattr(cli_module, "LINE_SECONDS", interval)
        with cli_module._lines() as show:
            for model in (at("Downloading", "1 of 2 files", 10), at("Downloading", "1 of 2 files", 20),
                          at("Downloading", "2 of 2 files", 60), at("Ready", "100 bytes", 100), None, None):
                show(model)
        assert lines[0] == "ws:/v/models/m: Downloading (10 of 100 bytes): 1 of 2 files" and len(lines) == said, lines
        assert lines[-2:] == ["ws:/v/models/m: Ready: 100 bytes", "ws:/v/models/m: released"], lines


def test_background_delete_and_include_deleting(wk, hub, immutable):
    hub.add_repo("acme/bg", tiny_files("bg"))
    cli(wk, "model", "create", "bg", "--source", "hf://acme/bg", "--workspace", "team-b", "--wait")
    path = Path(json.loads(cli(wk, "model", "get", "bg", "--json").stdout)["localPaths"][0]["path"])
    with immutable(path):
        out = cli(wk, "model", "delete", "bg")
        assert "background" in out.stdout
        assert json.loads(cli(wk, "model", "list", "--json").stdout) == []
        wait_until(lambda: wk.registry.get_model("bg").cleanup_attempts >= 1, what="a failed cleanup")
        (deleting,) = json.loads(cli(wk, "model", "list", "--include-deleting", "--json").stdout)
        assert deleting["isDeleted"] is True and deleting["deletionTime"]
        assert deleting["localPaths"][0]["sizeBytes"] == expected_size(tiny_files("bg"))
        assert "cleanup of" in deleting["message"]
    wait_until(lambda: wk.registry.find_model("bg") is None, timeout=120, what="release after the retry")
    assert not path.exists()


def test_bad_input_gets_one_line_errors(wk, tmp_path):
    cases = [
        (["model", "create", "Bad_Name", "--source", "hf://a/b"], "invalid model name"),
        (["model", "create", "ok", "--source", "gs://x/y"], "unsupported source scheme"),
        (["model", "create", "ok", "--source", "s3://x"], "invalid S3 source"),
        (["model", "create", "ok", "--source", "s3://bucket/acme--m/"], "S3 is not configured"),
        (["model", "create", "ok", "--source", "hf://a--b/c"], "invalid Hugging Face repository"),
        (["model", "create", "ok", "--source", "hf://a/b", "--workspace", "nope"], "no workspace 'nope'"),
        (["model", "create", "ok", "--source", "hf://a/b", "--subpath", "../x"], "invalid subpath"),
        (["model", "create", "ok", "--source", "hf://a/b", "--subpath", "a" * 300], "longer than 255 characters"),
        (["model", "create", "ok", "--source", "hf://a/b", "--workspace", ""], "no workspace ''"),
        (["model", "get", "missing"], "does not exist"),
        (["model", "delete", "missing"], "does not exist"),
        (["--config", str(tmp_path / "nope.toml"), "model", "list"], "does not exist"),
        (["model", "create", "ok"], "the following arguments are required: --source; see `weightkeeper model create "
                                    "--help`"),
        (["model", "list", "--limit", "0"], "'0' is not a whole number of at least 1"),
        (["model", "frobnicate"], "invalid choice: 'frobnicate'"),
        (["model", "retry", "missing"], "does not exist"),
    ]
    for args, message in cases:
        proc = cli(wk, *args, check=False)
        assert proc.returncode != 0, args
        assert message in proc.stderr and "Traceback" not in proc.stderr + proc.stdout, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[workspaces]]\nname = "x"\nvolume = "relative"\n')
    proc = cli(wk, "--config", str(bad), "workspace", "list", check=False)
    assert proc.returncode == 2 and "must be an absolute, clean path" in proc.stderr
    for url, code, message in [("bogus://x", 2, "registry_url bogus://x: Can't load plugin"),
                               ("postgresql+psycopg://wk:secret@127.0.0.1:1/x", 1,
                                "the registry at postgresql+psycopg://wk:***@127.0.0.1:1/x cannot be used"),
                               ("postgresql+psycopg://wk@127.0.0.1:1/x?password=secret", 1,
                                "the registry at postgresql+psycopg://wk@127.0.0.1:1/x?... cannot be used"),
                               ("postgresql://wk:secret@127.0.0.1:port/x", 2, "registry_url 'postgresql://...': "),
                               ("postgresql+psycopg://wk:p@secret@127.0.0.1:1/x", 2,
                                "registry_url 'postgresql+psycopg://...': its user name or password holds an '@'"),
                               ("postgresql+psycopg://wk:p@secret/x@127.0.0.1:1/x", 2,
                                "registry_url 'postgresql+psycopg://...': its user name or password holds an '@'"),
                               ("mysql://wk:secret@127.0.0.1/x", 2,
                                "registry_url mysql://wk:***@127.0.0.1/x: its database driver is not installed")]:
        bad.write_text(f'registry_url = "{url}"\n')
        proc = cli(wk, "--config", str(bad), "model", "list", check=False)
        assert proc.returncode == code and message in proc.stderr and "secret" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    proc = cli(wk, "reconcile", "--every", "0", check=False)
    assert proc.returncode == 2 and "'0' is not a whole number of at least 1" in proc.stderr


def test_config_flag_reaches_the_flows(wk, hub, monkeypatch):
    hub.add_repo("acme/flag", tiny_files("flag"))
    monkeypatch.delenv("WEIGHTKEEPER_CONFIG")
    env = {k: v for k, v in os.environ.items() if k != "WEIGHTKEEPER_CONFIG"}
    for args in (["model", "create", "flag", "--source", "hf://acme/flag", "--workspace", "team-a", "--wait"],
                 ["model", "delete", "flag", "--wait"]):
        proc = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "--config", str(wk.config), *args], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert wk.registry.find_model("flag") is None
    assert not (wk.volumes["team-a"] / "models" / "acme--flag").exists()


def one_line(proc: subprocess.CompletedProcess, code: int, message: str) -> str:
    assert proc.returncode == code and message in proc.stderr, (proc.returncode, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_a_reader_that_leaves_stops_the_listing_quietly(wk):
    wk.declare("piped", "hf://acme/piped", workspaces=["team-a"])
    for args in (["model", "list"], ["model", "list", "--json"], ["model", "get", "piped", "--json"]):
        read, write = os.pipe()
        os.close(read)  # `| head` that has already had enough
        proc = subprocess.run([sys.executable, "-m", "weightkeeper.cli", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300, env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config)))
        os.close(write)
        assert proc.returncode == 141 and proc.stderr == "", (args, proc.returncode, proc.stderr)


def test_messages_and_paths_are_printed_as_they_are_never_as_markup(wk):
    from sqlalchemy import update

    from weightkeeper.registry.schema import LocalPathRow

    model = wk.declare("markup", "hf://acme/markup", workspaces=["team-a"])
    with wk.registry.engine.begin() as conn:  # a message quoting a repository's file name
        conn.execute(update(LocalPathRow).where(LocalPathRow.id == model.local_paths[0].id)
                     .values(message="file [/] or [link=http://x]y[/link] :warning:"))
    out = cli(wk, "model", "get", "markup", COLUMNS="400").stdout
    assert "file [/] or [link=http://x]y[/link] :warning:" in out


def test_failures_outside_the_registry_get_one_line_without_credentials(wk, tmp_path):
    wk.declare("where", "hf://acme/where", workspaces=["team-a"])
    err = one_line(cli(wk, "model", "ensure", "where", "--wait", check=False,
                       PREFECT_API_URL="http://wk:hunter2@127.0.0.1:1/api"), 1, "http://127.0.0.1:1/api")
    assert "hunter2" not in err
    (tmp_path / "home-is-a-file").write_text("")
    config = tmp_path / "home-file.toml"
    config.write_text(wk.config.read_text().replace(f'home = "{wk.root}"', f'home = "{tmp_path / "home-is-a-file"}"'))
    one_line(cli(wk, "--config", str(config), "model", "ensure", "where", check=False), 1,
             "ensure-model not started for where: cannot write its log")


def test_an_error_line_never_shows_a_urls_credentials(capsys):
    """Whatever made the message: the CLI's error line drops every URL's user info and query."""
    from weightkeeper.cli import _error

    assert _error("cannot reach http://wk:hunter2@127.0.0.1:1/api?token=s3cret: refused", 1) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach http://127.0.0.1:1/api") and "hunter2" not in err and "s3cret" not in err


def test_a_failed_wait_ends_with_the_models_message(wk):
    proc = cli(wk, "model", "create", "gone", "--source", "hf://acme/does-not-exist", "--workspace", "team-a", "--wait",
               check=False, COLUMNS="60")  # one line however narrow the terminal: a log reader's unit
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("model gone is Failed: repository acme/does-not-exist was "
                                                           "not found"), proc.stderr


def test_a_run_that_stops_early_says_what_stopped_it(wk, monkeypatch, capsys):
    from weightkeeper import cli as wkcli

    def stops(flow: str, name: str):
        raise RuntimeError(f"lost the registry at https://u:hunter2@db.example/x?token=s3cret\nsecond line of {name}")

    monkeypatch.setattr(wkcli, "_run_flow", stops)
    assert wkcli.main(["--config", str(wk.config), "model", "create", "stops", "--source", "hf://acme/stops",
                       "--workspace", "team-a", "--wait"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("error: ensure-model of stops stopped: RuntimeError: lost the registry at"), err
    assert "hunter2" not in "".join(err) and "s3cret" not in "".join(err) and "second line" not in "".join(err)
    assert err[-1].startswith("model stops is Pending"), err


def test_the_terminal_shows_a_runs_log_lines_but_no_traceback():
    import logging

    from weightkeeper.cli import _shown_on_terminal

    def record(level: int, exc_info=None) -> logging.LogRecord:
        return logging.LogRecord("prefect.task_runs", level, __file__, 1, "run failed", (), exc_info)

    try:
        raise OSError("cut")
    except OSError:
        failed = sys.exc_info()
    assert _shown_on_terminal(record(logging.INFO)) and _shown_on_terminal(record(logging.ERROR))
    assert not _shown_on_terminal(record(logging.ERROR, failed))  # retries exhausted: the model's message says why
    quieted = subprocess.run([sys.executable, "-c", (  # before the flow is imported, which sets up Prefect's logging
        "import logging\nfrom weightkeeper.cli import _quiet_prefect_console, _shown_on_terminal\n"
        "_quiet_prefect_console()\nimport weightkeeper.flows.ensure_model\n"
        "print([_shown_on_terminal in h.filters for h in logging.getLogger().handlers])")],
        capture_output=True, text=True, timeout=120)
    assert quieted.stdout.strip() == "[True]", quieted.stderr


def test_a_registry_failing_mid_command_gets_one_line(wk, monkeypatch, capsys):
    from sqlalchemy.exc import OperationalError

    from weightkeeper import cli as wkcli
    from weightkeeper.registry import Registry

    def down(*_, **__):
        raise OperationalError("SELECT secret", {"p": "hunter2"}, Exception("server closed the connection"))

    monkeypatch.setattr(Registry, "list_page", down)
    assert wkcli.main(["--config", str(wk.config), "model", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the registry failed: server closed the connection; retry") and "hunter2" not in err


def test_an_interrupt_says_what_resumes_it():
    def said(**args) -> str:
        from weightkeeper.cli import _interrupted

        return _interrupted(Namespace(**args))

    assert said(action="list", wait=False) == "interrupted"
    assert said(action="delete", name="m", wait=True) == ("interrupted: model m stays Deleting; "
                                                         "`weightkeeper model delete m` resumes")
    assert said(action="ensure", name="m", wait=True).endswith("`weightkeeper model ensure m` resumes")


def test_a_bad_phase_names_the_phases_as_typed(capsys):
    import pytest

    from weightkeeper.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["model", "list", "--phase", "ready"])
    assert "(choose from 'Pending', 'Staging', 'Downloading', 'Ready', 'Failed', 'Deleting')" in capsys.readouterr().err


def test_a_registry_url_naming_no_registry_yet_says_it_made_one(wk, tmp_path):
    """A typo in registry_url gives an empty registry, which lists no model: the command says it made one, once."""
    url = f"sqlite:///{tmp_path / 'typo' / 'registy.db'}?timeout=5"
    first = cli(wk, "model", "list", WEIGHTKEEPER_REGISTRY_URL=url)
    assert f"made a new, empty registry at {tmp_path / 'typo' / 'registy.db'}" in first.stderr
    assert "made a new" not in cli(wk, "model", "list", WEIGHTKEEPER_REGISTRY_URL=url).stderr


def test_an_interrupted_wait_exits_at_once_and_a_rerun_resumes_to_ready(wk, hub):
    """Ctrl-C during `--wait`: the command ends now (its download threads with it, not holding the model's lease
    against a Prefect server already stopped), and `model ensure` resumes on the next run."""
    import signal

    hub.add_repo("acme/sigint", files := tiny_files("sigint", shard_size=2 << 20))
    env = {**os.environ, "WEIGHTKEEPER_CONFIG": str(wk.config)}
    with hub.throttled(64 * 1024, repo_id="acme/sigint"):  # a minute or more to go when interrupted
        proc = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "model", "create", "sigint", "--source",
                                 "hf://acme/sigint", "--workspace", "team-a", "--wait"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_until(lambda: any(p.bytes_done for p in (wk.registry.find_model("sigint") or
                                                          SimpleNamespace(local_paths=[])).local_paths),
                       timeout=120, what="bytes on their way")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=20)
        finally:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == ("interrupted: the partial files of model sigint are kept; "
                                            "`weightkeeper model ensure sigint` resumes"), err
    cli(wk, "model", "ensure", "sigint", "--wait")
    (path,) = wk.registry.get_model("sigint").local_paths
    assert path.status == "Ready" and path.size_bytes == expected_size(files)


def test_retry_makes_a_failed_model_pending_and_runs_it_again(wk, hub):
    """`model retry`, which messages name (a repair left to the owner), as the API's retry."""
    failed = cli(wk, "model", "create", "later", "--source", "hf://acme/later", "--workspace", "team-a", "--wait",
                 check=False)
    assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1].startswith("model later is Failed")
    hub.add_repo("acme/later", files := tiny_files("later"))
    cli(wk, "model", "retry", "later", "--wait")
    (path,) = wk.registry.get_model("later").local_paths
    assert path.status == "Ready" and path.size_bytes == expected_size(files)
    one_line(cli(wk, "model", "retry", "later", check=False), 2, "model 'later' is Ready; only a Failed model can be "
                                                                 "retried")


@pytest.mark.parametrize("step", ["resolve", "download"])
def test_a_transient_failure_left_after_the_retries_says_what_retries_it(wk, hub, monkeypatch, step):
    """The Hub is down for every try of a resolve (or of a download): the record says what the error said and what
    retries it now, never Prefect's words around it nor a `will retry` that nothing does; `model retry` does."""
    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.tasks.download import download_snapshot
    from weightkeeper.tasks.snapshot import resolve_revision

    for task in (resolve_revision, download_snapshot):
        monkeypatch.setattr(task, "retry_delay_seconds", [0, 0])
    name = f"down-{step}"
    hub.add_repo(f"acme/{name}", tiny_files(name))
    wk.declare(name, f"hf://acme/{name}", workspaces=["team-a"])
    hub.set_offline(step == "resolve")
    if step == "download":
        hub.fail_next(1000, 500, repo_id=f"acme/{name}", path_contains="/resolve/")
    assert ensure_model(name) == "Failed"
    model = wk.registry.get_model(name)
    said = model.message if step == "resolve" else model.local_paths[0].message
    assert said.endswith(f"; `weightkeeper model retry {name}` tries again"), said
    assert "will retry" not in said and "Task run" not in said and "\n" not in said
    assert said.startswith(f"cannot resolve hf://acme/{name}@main: ") if step == "resolve" else "answered HTTP 500" in said
    hub.set_offline(False)
    hub.clear_faults()
    cli(wk, "model", "retry", name, "--wait")
    assert wk.registry.get_model(name).phase == "Ready"


def test_the_demo_keeps_to_its_own_config_whatever_the_environment_says(tmp_path, monkeypatch):
    """`WEIGHTKEEPER_*` name the user's registry and home: the demo neither writes there nor reads them."""
    from weightkeeper.demo import demo_settings

    monkeypatch.setenv("WEIGHTKEEPER_REGISTRY_URL", "postgresql+psycopg://wk@db.example/production")
    monkeypatch.setenv("WEIGHTKEEPER_HOME", str(tmp_path / "users-home"))
    monkeypatch.setenv("WEIGHTKEEPER_MAX_CONCURRENT_DOWNLOADS", "0")  # refused, were it read
    settings = demo_settings(tmp_path / "demo", None)
    assert settings.home == tmp_path / "demo" and settings.registry_url == f"sqlite:///{tmp_path / 'demo'}/registry.db"
    assert os.environ["WEIGHTKEEPER_HOME"] == str(tmp_path / "users-home")  # put back for the rest of the process


@pytest.mark.without_prefect_server
def test_run_log_lines_go_through_the_console_that_draws_the_bars():
    """On a terminal a log line written beside the bars would leave a stale copy of every bar behind."""
    import logging

    from rich.console import Console

    from weightkeeper.cli import _bars, err_console

    handler = type("PrefectConsoleHandler", (logging.Handler,), {})()
    handler.console = own = Console()
    logging.getLogger().addHandler(handler)
    try:
        with _bars():
            assert handler.console is err_console  # the bars' console
        assert handler.console is own
    finally:
        logging.getLogger().removeHandler(handler)


def test_a_workspace_named_twice_is_recorded_once(wk, hub):
    model = wk.declare("twice", "hf://acme/twice", workspaces=["team-a", "team-b", "team-a"])
    assert model.targets == ["team-a", "team-b"] and [p.workspace for p in model.local_paths] == ["team-a", "team-b"]


def test_a_token_saved_with_secret_set_downloads_a_private_model_and_is_never_shown(wk, hub):
    """`weightkeeper secret set NAME` reads the token from stdin and saves it as a Prefect Secret block on the Prefect
    server weightkeeper uses (where `prefect block create`, run by hand without PREFECT_API_URL, would not reach): a
    model of a private repository names it and becomes Ready; the token is in no output. A block name Prefect would
    refuse, or no token, gets one line."""
    token = "hf_CLIsecretSET1234567890"
    hub.add_repo("acme/cli-private", tiny_files("cli-private"), private=True, token=token)

    def secret_set(*args: str, given: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "WEIGHTKEEPER_CONFIG": str(wk.config)}
        return subprocess.run([sys.executable, "-m", "weightkeeper.cli", "secret", "set", *args], input=given, env=env,
                              capture_output=True, text=True, timeout=300)

    saved = secret_set("hf-cli-token", given=f"  {token} \n")  # as pasted: the spaces and line end go
    assert saved.returncode == 0 and "--token-block hf-cli-token" in saved.stdout, saved.stderr
    out = cli(wk, "model", "create", "cli-private", "--source", "hf://acme/cli-private", "--workspace", "team-a",
              "--token-block", "hf-cli-token", "--wait")
    assert "Ready" in out.stdout and token not in saved.stdout + saved.stderr + out.stdout + out.stderr
    assert token not in json.dumps(wk.registry.get_model("cli-private").to_json())
    for name, given, message in [("HF_Token", token, "'HF_Token' is not a token block's name"),
                                 ("hf-", token, "'hf-' is not a token block's name"),
                                 ("hf-empty", "\n", "give the token as one line without spaces"),
                                 ("hf-two-lines", f"{token}\nsecond\n", "give the token as one line without spaces"),
                                 ("hf-spaced", f"{token} {token}\n", "give the token as one line without spaces"),
                                 (f"hf-argument {token}", "", "the token is never an argument")]:
        refused = secret_set(*name.split(" "), given=given)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and token not in refused.stderr + refused.stdout


def test_a_secret_the_prefect_server_refuses_is_never_quoted_back(wk, monkeypatch, capsys):
    """Prefect's server answers a request it cannot validate with a 422 whose body quotes the request, the token
    with it, and Prefect's client puts that body in its error: the line printed names the answer's status only."""
    import httpx
    from prefect.blocks.system import Secret

    from weightkeeper.cli import main

    token = "hf_QUOTEDback1234567890"

    def refused(self, name, overwrite=False):
        request = httpx.Request("POST", "http://prefect/api/block_documents/")
        raise httpx.HTTPStatusError(f"Client error '422' Response: {{'request_body': {{'value': '{token}'}}}}",
                                    request=request, response=httpx.Response(422, request=request))

    monkeypatch.setattr(Secret, "save", refused)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(token + "\n"))
    monkeypatch.setenv("WEIGHTKEEPER_CONFIG", str(wk.config))
    assert main(["secret", "set", "hf-refused"]) == 1
    out = capsys.readouterr()
    assert "did not save the Secret block 'hf-refused' (HTTP 422)" in out.err and token not in out.err + out.out


@pytest.mark.without_prefect_server
def test_arguments_that_are_not_text_or_out_of_range_get_one_line_before_anything_starts(tmp_path, monkeypatch,
                                                                                       capsys):
    """An argument's bytes that are not UTF-8 (surrogates in Python) reached the registry's query (UnicodeEncodeError:
    a traceback), a token's reached the Prefect server's request; a port past 65535 or an --every past what a
    schedule holds failed as a traceback only once the server, workers or runner had started."""
    import io

    from weightkeeper.cli import build_parser, main

    config = tmp_path / "config.toml"
    config.write_text(f'home = "{tmp_path}"\n')
    for args in (["model", "get", "\udcff"], ["model", "list", "--search", "a\udcfe"],
                 ["model", "create", "ok", "--source", "hf://a/b", "--include", "\udcff"]):
        assert main(["--config", str(config), *args]) == 2
        err = capsys.readouterr().err
        assert "is not UTF-8 text" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "registry.db").exists()  # refused before the registry was opened

    class Undecodable(io.StringIO):
        def read(self, size=-1):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    for stdin in (Undecodable(), io.StringIO("hf_\udcff\udcfe\n")):
        monkeypatch.setattr("sys.stdin", stdin)
        assert main(["--config", str(config), "secret", "set", "hf"]) == 2
        err = capsys.readouterr().err
        assert "the value given is not UTF-8 text: not a token" in err and len(err.strip().splitlines()) == 1, err
    for args, said in [(["serve", "--api-port", "70000"], "'70000' is not a TCP port (1 to 65535)"),
                       (["serve", "--prefect-port", "-1"], "'-1' is not a TCP port (1 to 65535)"),
                       (["reconcile", "--every", "99999999999999999999"], "is more than 315360000 seconds")]:
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(args)
        err = capsys.readouterr().err
        assert e.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert main(["demo", "--offline", "--source", "hf://acme/tiny"]) == 2  # went to the Hub all the same
    assert "--offline demonstrates the model shipped with weightkeeper" in capsys.readouterr().err
