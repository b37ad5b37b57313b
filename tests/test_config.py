"""The config file and its environment overrides: every wrong key, type or value is one line naming it and
where it came from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from weightkeeper.config import load_settings
from weightkeeper.errors import ConfigError

pytestmark = pytest.mark.without_prefect_server


@pytest.fixture
def config(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("WEIGHTKEEPER_") or k == "HF_ENDPOINT"]:
        monkeypatch.delenv(key)
    return tmp_path / "config.toml"


def refused(config, text: str) -> str:
    config.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_settings(config)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{config}: ")
    return message.removeprefix(f"{config}: ")


@pytest.mark.parametrize(("text", "error"), [
    ('cleanup_retry_seconds = "soon"', "cleanup_retry_seconds must be a number, got 'soon'"),
    ("stop_timeout_seconds = true", "stop_timeout_seconds must be a number, got True"),
    ('lease_seconds = "60"', "lease_seconds must be an integer, got '60'"),
    ("verify_workers = 2.5", "verify_workers must be an integer, got 2.5"),
    ('[s3]\nbucket = "ok-bucket"\nenabled = "yes"', "[s3] enabled must be true or false, got 'yes'"),
    ('[[workspaces]]\nname = "w"\nvolume = "/mnt/w"\npublic = 1', "workspace 'w' public must be true or false, got 1"),
    ('registry_url = ["sqlite:///a.db"]', "registry_url must be a string, got ['sqlite:///a.db']"),
    ('[[workspaces]]\nname = "w"\nvolume = ["/mnt/w"]', "workspace 'w' volume must be a string, got ['/mnt/w']"),
    ('hub_redirect_hosts = "cdn.example.com"', "hub_redirect_hosts must be a list, got 'cdn.example.com'"),
    ('[[users]]\nname = "u"\nuid = 1\ntoken_env = "T"\ntoken_blocks = [1]',
     "user 'u' token_blocks[0] must be a string, got 1"),
    ("s3 = 5", "[s3] must be a table, got 5"),
    ("[s3]\nregion = \"us-east-1\"", "[s3] bucket is required"),
    ('hf_endpoint = "not a url"', "hf_endpoint (here or in $HF_ENDPOINT) must be an http:// or https:// URL such as "
                                  "https://huggingface.co, got 'not a url'"),
    ('hf_endpoint = "http://[fe80::1%25eth0]:8080"', "hf_endpoint (here or in $HF_ENDPOINT) must be an http:// or "
     "https:// URL such as https://huggingface.co, got 'http://[fe80::1%25eth0]:8080'"),
    ('hf_endpoint = "http://hub:99999/"', "hf_endpoint (here or in $HF_ENDPOINT) must be an http:// or https:// URL "
                                         "such as https://huggingface.co, got 'http://hub:99999/'"),
    ('hf_endpoint = "http://[::1]]/"', "hf_endpoint (here or in $HF_ENDPOINT) must be an http:// or https:// URL "
                                      "such as https://huggingface.co, got 'http://[::1]]/'"),
    ('hf_endpoint = "http://hub.ex%61mple"', "hf_endpoint (here or in $HF_ENDPOINT) must be an http:// or https:// URL "
                                            "such as https://huggingface.co, got 'http://hub.ex%61mple'"),
    ("max_concurrent_downloads = 99999999", "max_concurrent_downloads must be at most 10000, got 99999999; a negative "
                                            "limit means unlimited"),
    ('[[users]]\nname = "u"\nuid = 99999999999999999999\ntoken_env = "T"',
     "user 'u' uid must be less than 4294967295, got 99999999999999999999"),
    ('[[workspaces]]\nname = "w"\nvolume = "/w"\n[workspaces.kubernetes]\nnamespace = "a"\nimage = 1\n'
     'volume_claim = "v"', "workspace 'w' kubernetes image must be a string, got 1"),
])
def test_a_wrong_type_is_one_line_naming_the_key_and_the_file(config, text, error):
    assert refused(config, text) == error


@pytest.mark.parametrize("text", ['metrics_token_sha256 = "wk-secret-token"',
                                  '[[users]]\nname = "u"\nuid = 1\ntoken_sha256 = "wk-secret-token"'])
def test_a_token_pasted_where_its_digest_goes_is_never_shown(config, text):
    message = refused(config, text)
    assert "must be 64 hex digits (the value given is not shown)" in message and "wk-secret-token" not in message


def test_the_registry_url_of_the_environment_overrides_the_files(config, monkeypatch):
    """A Kubernetes workspace job reads config.toml from a ConfigMap and WEIGHTKEEPER_REGISTRY_URL from the
    registry Secret: the variable (with the password) wins over the file's registry_url; an empty one is none."""
    config.write_text('registry_url = "postgresql+psycopg://wk@db/wk"\n')
    monkeypatch.setenv("WEIGHTKEEPER_REGISTRY_URL", "")
    assert load_settings(config).registry_url == "postgresql+psycopg://wk@db/wk"
    monkeypatch.setenv("WEIGHTKEEPER_REGISTRY_URL", "postgresql+psycopg://wk:fromTheSecret@db/wk")
    assert load_settings(config).registry_url == "postgresql+psycopg://wk:fromTheSecret@db/wk"


def test_a_workspace_job_without_the_registry_secret_names_it(config, monkeypatch):
    """A job whose namespace lacks the registry Secret (or holds it empty) would make a SQLite registry of its own in
    the pod and find no model there: its settings are refused, naming the Secret."""
    monkeypatch.setenv("WEIGHTKEEPER_TOKEN_ENV", "HF_TOKEN")  # set in every job by the pool's template
    monkeypatch.setenv("WEIGHTKEEPER_REGISTRY_URL", "")
    assert "create the Secret that registry_secret names with key WEIGHTKEEPER_REGISTRY_URL" in refused(config, "")
    kubernetes = ('[[workspaces]]\nname = "gpu"\nvolume = "/mnt/gpu"\nwork_pool = "kube"\n[workspaces.kubernetes]\n'
                  'namespace = "team-a"\nimage = "img:1"\nvolume_claim = "gpu"\nregistry_secret = "wk-db"\n')
    assert "create the Secret 'wk-db' in namespace 'team-a' with key WEIGHTKEEPER_REGISTRY_URL" in \
        refused(config, kubernetes)
    monkeypatch.setenv("WEIGHTKEEPER_REGISTRY_URL", "postgresql+psycopg://wk:fromTheSecret@db/wk")
    assert load_settings(config).registry_url.startswith("postgresql")


def test_unknown_keys_are_refused_together(config):
    assert refused(config, "lease_second = 5\nverify_worker = 2") == "unknown keys ['lease_second', 'verify_worker']"
    assert refused(config, '[[workspaces]]\nname = "w"\nvolume = "/w"\nowners = "x"') == \
        "workspace 'w': unknown keys ['owners']"
    assert refused(config, '[[users]]\nname = "u"\nuid = 1\ntoken_env = "T"\nrole = "x"') == \
        "user 'u': unknown keys ['role']"
    assert refused(config, "_cli_parse_args = true") == "unknown keys ['_cli_parse_args']"  # never BaseSettings' own


def test_the_environment_overrides_scalar_settings(config, monkeypatch):
    config.write_text(f'home = "{config.parent}"\nlease_seconds = 7\nhf_endpoint = "http://file"\n'
                      f'[[workspaces]]\nname = "w"\nvolume = "/w"\n')
    settings = load_settings(config)
    assert (settings.lease_seconds, settings.hf_endpoint, settings.config_path) == (7, "http://file", config)
    assert settings.registry_url == f"sqlite:///{config.parent}/registry.db"
    monkeypatch.setenv("WEIGHTKEEPER_LEASE_SECONDS", "5")
    monkeypatch.setenv("WEIGHTKEEPER_STOP_TIMEOUT_SECONDS", "2.5")
    monkeypatch.setenv("WEIGHTKEEPER_MAX_CONCURRENT_DOWNLOADS", "-1")
    monkeypatch.setenv("WEIGHTKEEPER_REGISTRY_URL", "postgresql+psycopg://wk@db/wk")
    monkeypatch.setenv("WEIGHTKEEPER_WORKSPACES", "[]")  # tables and lists come from the file only
    monkeypatch.setenv("WEIGHTKEEPER_TOKEN_ENV", "HF_TOKEN")  # not a setting: ignored
    monkeypatch.setenv("HF_ENDPOINT", "http://env")  # the file's hf_endpoint wins over HF_ENDPOINT
    settings = load_settings(config)
    assert (settings.lease_seconds, settings.stop_timeout_seconds, settings.downloads_limited) == (5, 2.5, False)
    assert settings.registry_url == "postgresql+psycopg://wk@db/wk" and settings.hf_endpoint == "http://file"
    assert [w.name for w in settings.workspaces] == ["w"]
    config.write_text("")
    assert load_settings(config).hf_endpoint == "http://env"
    monkeypatch.setenv("WEIGHTKEEPER_LEASE_SECONDS", "soon")
    with pytest.raises(ConfigError, match=r"^\$WEIGHTKEEPER_LEASE_SECONDS: lease_seconds must be an integer, got "
                                          r"'soon'$"):
        load_settings(config)


def test_settings_are_frozen_and_hashable(config):
    config.write_text('[[workspaces]]\nname = "w"\nvolume = "/w"\n[[users]]\nname = "u"\nuid = 1\ntoken_env = "T"\n')
    settings = load_settings(config)
    assert hash(settings) == hash(load_settings(config)) and settings == load_settings(config)
    with pytest.raises(Exception):
        settings.lease_seconds = 1
    with pytest.raises(Exception):
        settings.workspaces[0].volume = "/elsewhere"


def test_the_cli_answers_a_wrong_type_with_one_line_and_exit_2(config):
    config.write_text('cleanup_retry_seconds = "soon"\n')
    proc = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "--config", str(config), "model", "list"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"error: {config}: cleanup_retry_seconds must be a number, got 'soon'"


@pytest.mark.parametrize(("text", "error"), [
    ("cleanup_retry_seconds = inf", "cleanup_retry_seconds must be a finite number, got inf"),
    ("verify_interval_seconds = nan", "verify_interval_seconds must be a finite number, got nan"),
    ("stop_timeout_seconds = -1", "stop_timeout_seconds must be 0 or more, got -1"),
    ("check_interval_seconds = 1e300", "check_interval_seconds must be at most 315360000, got 1e+300"),
    ("reconcile_interval_seconds = 0", "reconcile_interval_seconds must be positive, got 0"),
    ("lease_seconds = 99999999999999999999", "lease_seconds must be at most 315360000, got 99999999999999999999"),
    ("download_timeout_seconds = 315360001", "download_timeout_seconds must be at most 315360000, got 315360001"),
    ("stall_seconds = 9223372036854775807", "stall_seconds must be at most 315360000, got 9223372036854775807"),
    ("hub_budget_window_seconds = inf", "hub_budget_window_seconds must be a finite number, got inf"),
    ("verify_workers = 0", "verify_workers must be 1 or more, got 0"),
])
def test_a_duration_is_a_finite_number_of_seconds_within_ten_years(config, text, error):
    """inf, nan, a negative or a huge duration was accepted, and failed later in a timedelta or a Prefect schedule
    (OverflowError, ValueError: a traceback in reconcile or serve), or turned a timeout into an instant failure."""
    assert refused(config, text) == error
    config.write_text("cleanup_retry_seconds = 0\nverify_interval_seconds = 0\nlease_seconds = 315360000\n")
    assert load_settings(config).lease_seconds == 315360000


def test_home_and_a_sqlite_registry_are_absolute_paths(config, monkeypatch):
    """The deployed flows' runs start in temporary directories of their own: a relative home or SQLite file would be
    another, empty one there (models "not found" by every run the API or serve starts)."""
    for home in ("data", "", "~/wk", "/tmp/a\\u0000b"):
        assert "home (here or in $WEIGHTKEEPER_HOME) must be an absolute path" in refused(config, f'home = "{home}"')
    for url in ("sqlite:///registry.db", "sqlite://", "sqlite:///:memory:"):
        assert refused(config, f'registry_url = "{url}"').startswith("registry_url must name its SQLite file by an "
                                                                     "absolute path")
    config.write_text("")
    monkeypatch.setenv("WEIGHTKEEPER_HOME", "relative")
    with pytest.raises(ConfigError, match=r"^\$WEIGHTKEEPER_HOME: home .* must be an absolute path, got 'relative'$"):
        load_settings(config)


def test_the_config_files_path_is_absolute_and_a_file_that_cannot_be_read_is_one_line(config, monkeypatch):
    """A relative --config was handed as it was to the flows (whose runs start elsewhere, finding no file); a name too
    long or a loop of links was an OSError (exit 1, not naming the config), a loop "did not exist"."""
    config.write_text('\ufefflease_seconds = 7\n')  # an editor's byte order mark
    monkeypatch.chdir(config.parent)
    settings = load_settings("config.toml")
    assert settings.config_path == config and settings.config_path.is_absolute() and settings.lease_seconds == 7
    loop = config.parent / "loop.toml"
    loop.symlink_to(loop)
    for path, why in [(config.parent, "Is a directory"), (loop, "Too many levels of symbolic links"),
                      (config.parent / ("x" * 300), "File name too long"),
                      ("/dev/zero", f"larger than {16 << 20} bytes")]:
        with pytest.raises(ConfigError) as e:
            load_settings(path)
        assert str(e.value) == f"cannot read config {path}: {why}"


@pytest.mark.parametrize(("text", "error"), [
    ('[[workspaces]]\nname = "w"\nvolume = "/mnt/a\\u0000b"', "workspace 'w' volume '/mnt/a\\x00b' must be an "
                                                              "absolute, clean path"),
    ('[[workspaces]]\nname = "w"\nvolume = "/a"\n[[workspaces]]\nname = "w"\nvolume = "/b"',
     "workspace names must be unique: 'w' is named more than once"),
    ('[[users]]\nname = "u"\nuid = 1\ntoken_env = "T"\n[[users]]\nname = "u"\nuid = 2\ntoken_env = "S"',
     "user names must be unique: 'u' is named more than once"),
    (f'[[users]]\nname = "u"\nuid = 1\ntoken_env = "T"\ntoken_sha256 = "{"a" * 64}"',
     "user 'u' needs token_env or token_sha256, not both"),
    ('[[users]]\nname = "u v\\n"\nuid = 1\ntoken_env = "T"',
     "user 'u v\\n' name 'u v\\n' must be one word of printable characters"),
    ('[s3]\nbucket = "weights"\nendpoint_url = "minio:9000"',
     "[s3] endpoint_url 'minio:9000' must be an http:// or https:// URL such as http://minio:9000, without user or "
     "password"),
])
def test_values_that_cannot_work_are_refused_by_name(config, text, error):
    """Each was accepted: a NUL in a volume (ValueError at the first os call), a token_env silently winning over a
    token_sha256, a user name that splits a log line, an S3 endpoint boto3 refuses only when a model needs it."""
    assert refused(config, text) == error
