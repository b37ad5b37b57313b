"""A model's own file patterns (`--include`, `--exclude`): the pure rule, and downloads on the real client."""

from __future__ import annotations

import json
import os
import random

import pytest

from conftest import tiny_files
from test_cli import cli
from test_lifecycle import fetched_files
from test_tenancy import USERS, Api
from conftest import tenants
from weightkeeper.errors import DownloadError, InvalidInputError, UnsafePathError
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.guard import VolumeRule, check_removable
from weightkeeper.layout import copy_name, validate_patterns
from weightkeeper.planning import select_files

COMMIT = "a" * 40
GGUF = {f"llama-7b.{q}.gguf": random.Random(q).randbytes(8192) for q in ("Q4_K_M", "Q5_K_M", "Q8_0")}
GGUF["README.md"] = b"# quantizations\n"


def test_include_fetches_exactly_what_it_matches_and_exclude_never():
    files = list(tiny_files("p"))
    assert select_files(files, include=["*.safetensors", "config.json"]) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert select_files(files, include=["*.safetensors"], exclude=["model-00002-*"]) == [
        "model-00001-of-00002.safetensors"]
    assert select_files(files, include=["original/*"]) == ["original/consolidated.00.pth"]  # asked for: fetched
    assert "tokenizer.json" not in select_files(files, exclude=["tokenizer*"])  # exclude narrows the default set
    assert select_files(files) == select_files(files, include=None, exclude=None)


def test_gguf_is_a_weight_type_chosen_by_include():
    assert select_files(GGUF, include=["*Q4_K_M.gguf"]) == ["llama-7b.Q4_K_M.gguf"]
    with pytest.raises(DownloadError, match=r"--include, e.g. '\*Q4_K_M.gguf'.*'llama-7b.Q8_0.gguf'") as e:
        select_files(GGUF)  # the default set stays the default: no safetensors or bin here
    assert e.value.permanent


def test_a_pattern_set_matching_no_weight_lists_what_the_repository_has():
    with pytest.raises(DownloadError) as e:
        select_files(GGUF, include=["*Q2_K.gguf", "README.md"])
    assert "match no weight file" in str(e.value) and e.value.permanent
    assert "the repository has 4 files: 'README.md', 'llama-7b.Q4_K_M.gguf'" in str(e.value)
    with pytest.raises(DownloadError, match="or excluded"):
        select_files(tiny_files("x"), exclude=["*.safetensors", "*.bin"])
    many = [f"f{i:03d}.txt" for i in range(50)]
    with pytest.raises(DownloadError, match=r"has 50 files: .*'f019.txt', \.\.\.$") as e:
        select_files(many, include=["*.txt"])
    assert "f020" not in str(e.value)


@pytest.mark.parametrize("bad", ["/etc/*", "../x/*.gguf", "a/../../b", "", "x\ny", "x" * 256])
def test_patterns_are_refused_outside_the_repository(bad):
    with pytest.raises(InvalidInputError, match="--include"):
        validate_patterns([bad], "--include")


def test_pattern_lists_are_bounded_and_deduplicated():
    with pytest.raises(InvalidInputError, match="1 to 32"):
        validate_patterns([f"*{i}" for i in range(33)], "--exclude")
    with pytest.raises(InvalidInputError):
        validate_patterns("*.gguf", "--include")  # a string is not a list
    with pytest.raises(InvalidInputError, match="1 to 32"):
        validate_patterns([], "--include")  # it would match nothing
    assert validate_patterns(["*.gguf", "*.gguf", "a/*.json"], "--include") == ["*.gguf", "a/*.json"]
    assert validate_patterns(None, "--include") is None
    assert validate_patterns(["*" + "?" * 14 + "[ab].gguf"], "--include")  # 16 wildcards
    with pytest.raises(InvalidInputError, match=r"at most 16 wildcards \(\*, \?, \[\) per pattern"):
        validate_patterns(["*" + "?" * 250 + "Z"], "--exclude")


def test_patterns_a_listing_of_long_names_makes_costly_are_refused_before_any_matching():
    """A user's patterns, each within its bounds, against what a repository (or S3 prefix) of theirs lists: names of
    1,000 characters. Matched, 1,000 such names took 12 s of CPU against 64 patterns of 250 wildcards, and as long
    against patterns of literal characters after a `*` (tried at each position of a name), per declaration and per
    head check, with the API or a worker busy meanwhile. The selection is refused at once, saying why and what to
    do; 64 patterns of a dozen characters against a real listing of the most files (100,000) are still matched."""
    from weightkeeper.planning import MATCH_BUDGET, matching_cost

    names = [f"{'x' * 250}/{'y' * 250}/{'z' * 250}/{'w' * 230}{i:05d}.safetensors" for i in range(1000)]
    costly = [f"*{'x' * 60}{i}*" for i in range(32)]
    with pytest.raises(DownloadError, match="matching the 64 file patterns given against the 1000 files the "
                                            "repository lists .* costs too much: give fewer or shorter patterns") as e:
        select_files(names, costly, costly)
    assert e.value.permanent
    real = [f"layer_{i // 100}/model-{i:05d}-of-99999.{('safetensors', 'json', 'bin')[i % 3]}" for i in range(100_000)]
    many = [f"*{i}*.safe*" for i in range(32)], [f"layer_{i}*/*.bin" for i in range(32)]
    assert matching_cost(real, [*many[0], *many[1]]) < MATCH_BUDGET
    assert len(select_files(real, *many)) > 0 and select_files(real)


def test_each_selection_of_a_commit_has_its_own_copy_name():
    assert copy_name(COMMIT, None, None) == COMMIT
    one = copy_name(COMMIT, ["*.gguf", "README.md"], None)
    assert one == copy_name(COMMIT, ["README.md", "*.gguf"], None) and one.startswith(COMMIT + ".")
    assert len({one, copy_name(COMMIT, ["*.gguf"], None), copy_name(COMMIT, None, ["*.gguf"]), COMMIT}) == 4


def test_the_guard_takes_a_selection_copy_and_nothing_like_it():
    volume = VolumeRule("/vol")
    ok = f"/vol/models/_artifacts/acme--m/{copy_name(COMMIT, ['*.gguf'], None)}"
    assert check_removable(ok, [volume], artifact=True) == volume
    for bad in (f"/vol/models/_artifacts/acme--m/{COMMIT}.{'0' * 15}", f"/vol/models/_artifacts/acme--m/{COMMIT}.x",
                f"/vol/models/_artifacts/acme--m/{COMMIT}.{'0' * 16}.{'0' * 16}", f"{ok}/sub"):
        with pytest.raises(UnsafePathError):
            check_removable(bad, [volume], artifact=True)


def test_a_gguf_repository_downloads_only_the_quantization_asked_for(wk, hub):
    hub.add_repo("acme/llama-gguf", GGUF)
    hub.reset_stats()
    wk.declare("q4", "hf://acme/llama-gguf", workspaces=["team-a"], include=["*Q4_K_M.gguf"])
    assert ensure_model("q4") == "Ready"
    model = wk.registry.get_model("q4")
    assert fetched_files(model.local_paths[0].path) == ["llama-7b.Q4_K_M.gguf"]
    assert hub.get_count("acme/llama-gguf", "llama-7b.Q8_0.gguf") == 0
    assert model.to_json()["include"] == ["*Q4_K_M.gguf"] and model.size_bytes == 8192

    wk.declare("all", "hf://acme/llama-gguf", workspaces=["team-b"])
    assert ensure_model("all") == "Failed"
    message = wk.registry.get_model("all").message
    assert "choose GGUF files with --include" in message and "'llama-7b.Q5_K_M.gguf'" in message


def test_a_pattern_matching_nothing_fails_the_model_naming_the_files(wk, hub):
    hub.add_repo("acme/nothing", tiny_files("nothing"))
    wk.declare("none", "hf://acme/nothing", workspaces=["team-a"], include=["*.gguf"], exclude=["*.bin"])
    assert ensure_model("none") == "Failed"
    model = wk.registry.get_model("none")
    assert "acme/nothing" in model.message and "match no weight file" in model.message
    assert "'model-00001-of-00002.safetensors'" in model.message
    assert not os.path.lexists(model.local_paths[0].path)  # nothing written


def test_a_repository_listing_names_too_long_to_match_fails_the_model_saying_why(wk, hub):
    """A Hub repository of the user's lists 2,000 files with names of 600 characters: matching the model's patterns
    against it would cost too much, so the model fails at once, saying why and what to do, and nothing is written."""
    files = {f"{'d' * 200}/{'e' * 200}/{'f' * 180}-{i:05d}.safetensors": b"x" for i in range(2000)}
    hub.add_repo("acme/long-names", files)
    costly = [f"*{'d' * 60}{i}*" for i in range(32)]  # literal characters after a `*`: tried at each position
    wk.declare("long-names", "hf://acme/long-names", workspaces=["team-a"], include=costly,
               exclude=[p + "x" for p in costly])
    assert ensure_model("long-names") == "Failed"
    model = wk.registry.get_model("long-names")
    assert "files the repository lists" in model.message and "costs too much" in model.message, model.message
    assert not os.path.lexists(model.local_paths[0].path)


def test_shared_copies_are_kept_apart_by_selection(wk, hub):
    files = tiny_files("apart")
    commit = hub.add_repo("acme/apart", files)
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("full", "hf://acme/apart", **shared)
    wk.declare("one-shard", "hf://acme/apart", subpath="models/one", include=["model-00001-*", "config.json"],
               **shared)
    wk.declare("same-shard", "hf://acme/apart", subpath="models/same", include=["config.json", "model-00001-*"],
               **shared)
    assert [ensure_model(n) for n in ("full", "one-shard", "same-shard")] == ["Ready"] * 3
    full, one, same = (wk.registry.get_model(n).local_paths[0].path for n in ("full", "one-shard", "same-shard"))
    assert os.readlink(full).endswith(f"/{commit}")
    assert os.readlink(one).endswith('/' + copy_name(commit, ['model-00001-*', 'config.json'], None))
    assert os.path.realpath(one) == os.path.realpath(same)  # the same selection shares one copy
    assert fetched_files(one) == ["config.json", "model-00001-of-00002.safetensors"]
    assert len(fetched_files(full)) == 5
    assert sorted(len(a.users) for a in wk.registry.list_artifacts()) == [1, 2]


def test_the_same_selection_in_another_order_shares_the_path(wk, hub):
    hub.add_repo("acme/order", tiny_files("order"))
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("ab", "hf://acme/order", include=["*.safetensors", "*.json"], **shared)
    wk.declare("ba", "hf://acme/order", include=["*.json", "*.safetensors"], **shared)
    assert ensure_model("ab") == "Ready" and ensure_model("ba") == "Ready"
    assert {p.path for n in ("ab", "ba") for p in wk.registry.get_model(n).local_paths} == {
        wk.registry.get_model("ab").local_paths[0].path}


def test_a_path_is_not_shared_between_selections(wk, hub):
    hub.add_repo("acme/overlap", tiny_files("overlap"))
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("a", "hf://acme/overlap", **shared)
    assert ensure_model("a") == "Ready"
    from weightkeeper.errors import ConflictError
    with pytest.raises(ConflictError, match="already owns"):  # same path, another selection: not the same files
        wk.declare("b", "hf://acme/overlap", include=["*.safetensors"], **shared)


def test_the_cli_and_the_api_take_record_and_show_patterns(wk, hub, tmp_path, registry_base_url):
    hub.add_repo("acme/cli-gguf", GGUF)
    cli(wk, "model", "create", "cli-q8", "--source", "hf://acme/cli-gguf", "--workspace", "team-a",
        "--include", "*Q8_0.gguf", "--include", "README.md", "--exclude", "*.md", "--wait")
    got = json.loads(cli(wk, "model", "get", "cli-q8", "--json").stdout)
    assert got["include"] == ["*Q8_0.gguf", "README.md"] and got["exclude"] == ["*.md"] and got["phase"] == "Ready"
    assert "files: include ['*Q8_0.gguf', 'README.md'], exclude ['*.md']" in cli(wk, "model", "get", "cli-q8").stdout
    out = cli(wk, "model", "create", "bad", "--source", "hf://acme/cli-gguf", "--include", "../*", check=False)
    assert out.returncode != 0 and "no '..'" in out.stderr and "Traceback" not in out.stderr

    api = Api(tenants(tmp_path / "api", registry_base_url, USERS))
    r = api.create("api-q4", "hf://acme/cli-gguf", workspaces=["team-a"], include=["*Q4_K_M.gguf"], exclude=["x"])
    assert r.status_code == 201 and r.json()["include"] == ["*Q4_K_M.gguf"] and r.json()["exclude"] == ["x"]
    assert api.call("GET", "/api/v1/models/api-q4", "bob").json()["include"] == ["*Q4_K_M.gguf"]
    before = api.state()
    for bad in ({"include": ["/abs/*"]}, {"exclude": ["a/../b"]}, {"include": "*.gguf"},
                {"include": ["x"] * 33}, {"include": ["a\x00b"]}):
        r = api.create("api-bad", "hf://acme/cli-gguf", workspaces=["team-a"], **bad)
        assert r.status_code == 422 and r.json()["code"] == "Invalid", bad
    assert api.state() == before
