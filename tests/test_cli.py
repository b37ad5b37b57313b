"""The `weightkeeper` command line, run as users run it (a subprocess per command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import expected_size, tiny_files
from test_lifecycle import wait_until


def cli(wk, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config), COLUMNS="200")
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


def test_create_list_get_delete(wk, hub):
    files = tiny_files("cli")
    hub.add_repo("acme/cli", files)
    out = cli(wk, "model", "create", "cli-model", "--source", "hf://acme/cli", "--workspace", "team-a", "--wait")
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
    cli(wk, "model", "delete", "cli-model", "--wait")
    assert not Path(path["path"]).exists()
    assert json.loads(cli(wk, "model", "list", "--include-deleting", "--json").stdout) == []


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
                                "the registry at postgresql+psycopg://wk:***@127.0.0.1:1/x cannot be used")]:
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
