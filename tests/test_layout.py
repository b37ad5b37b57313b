"""Pure rules: sources, directory names, model paths, planning and file selection."""

import pytest

from weightkeeper.config import Workspace
from weightkeeper.errors import DownloadError, InvalidInputError
from weightkeeper.layout import S3Source, model_path, parse_source, repo_dir_name, staging_uri, validate_model_name
from weightkeeper.planning import path_decision, plan_paths, select_files

pytestmark = pytest.mark.without_prefect_server


@pytest.mark.parametrize("source, repo, revision", [
    ("hf://Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B", "main"),
    ("hf://Qwen/Qwen2.5-0.5B@v1.0", "Qwen/Qwen2.5-0.5B", "v1.0"),
    ("hf://gpt2", "gpt2", "main"),
    ("meta-llama/Llama-3.1-8B@refs/pr/1", "meta-llama/Llama-3.1-8B", "refs/pr/1"),
    ("hf://a/b@" + "0" * 40, "a/b", "0" * 40),
])
def test_parse_source(source, repo, revision):
    parsed = parse_source(source)
    assert (parsed.repo_id, parsed.revision) == (repo, revision)


def test_full_commit_is_pinned_and_branch_is_not():
    assert parse_source("hf://a/b@" + "ab" * 20).pinned_commit == "ab" * 20
    assert parse_source("hf://a/b@main").pinned_commit is None
    assert parse_source("hf://a/b@" + "AB" * 20).pinned_commit is None


@pytest.mark.parametrize("source", [
    "", "   ", "gs://bucket/x", "hf://", "hf://a/b/c", "hf://a//b", "hf://a--x/b", "hf://a/b..c",
    "hf://-a/b", "hf://a/b-", "hf://a/.b", "hf://a/b@", "hf://a/b@ main", "hf://a/b@../x", "hf://a b/c",
    "hf://ä/b", "hf://a/b\u2010c", "hf://" + "x" * 97 + "/b",
])
def test_parse_source_refuses(source):
    with pytest.raises(InvalidInputError):
        parse_source(source)


@pytest.mark.parametrize("name", ["", "A", "a_b", "-a", "a-", "a" * 64, "a.b", "a/b", "ü"])
def test_model_name_refuses(name):
    with pytest.raises(InvalidInputError):
        validate_model_name(name)


def test_dir_names_never_collide():
    assert repo_dir_name("a-b/c") == "a-b--c"
    assert repo_dir_name("a/b-c") == "a--b-c"
    assert repo_dir_name("gpt2") == "gpt2"


@pytest.mark.parametrize("subpath, expected", [
    (None, "/v/models/o--n"),
    ("team", "/v/team/models/o--n"),
    ("team/models", "/v/team/models/o--n"),
    ("models/x", "/v/models/x/o--n"),
    ("a/b", "/v/a/b/models/o--n"),
])
def test_model_path_layout(subpath, expected):
    assert model_path("/v", "o/n", subpath) == expected


def test_model_path_custom_models_dir():
    assert model_path("/v", "o/n", None, "weights") == "/v/weights/o--n"
    assert model_path("/v", "o/n", "x/weights", "weights") == "/v/x/weights/o--n"


@pytest.mark.parametrize("subpath", ["/abs", "../x", "a/../b", "a//b", "a/", "./a", "a b", "é", ".cache",
                                     "models/x/.cache", ".locks/m", "team/.hidden"])
def test_subpath_refused(subpath):
    with pytest.raises(InvalidInputError):
        model_path("/v", "o/n", subpath)


WORKSPACES = [
    Workspace("pub-a", "/mnt/a", cluster="c1"),
    Workspace("pub-a2", "/mnt/a", cluster="c1"),
    Workspace("pub-b", "/mnt/a", cluster="c2"),
    Workspace("priv", "/mnt/p", public=False, owner="alice"),
    Workspace("priv-novol", None, public=False, owner="alice"),
]


def test_plan_all_public_dedups_per_cluster_and_path():
    plan = plan_paths(WORKSPACES, "o/n", "bob")
    assert [(p.workspace, p.cluster, p.path) for p in plan.paths] == [
        ("pub-a", "c1", "/mnt/a/models/o--n"), ("pub-b", "c2", "/mnt/a/models/o--n")]


def test_plan_private_workspace_rules():
    assert [p.path for p in plan_paths(WORKSPACES, "o/n", "alice", ["priv"]).paths] == ["/mnt/p/models/o--n"]
    with pytest.raises(InvalidInputError) as private:  # another's private workspace answers as one that is not
        plan_paths(WORKSPACES, "o/n", "bob", ["priv"])
    with pytest.raises(InvalidInputError) as unknown:
        plan_paths(WORKSPACES, "o/n", "bob", ["nope"])
    assert str(private.value).replace("'priv'", "'nope'") == str(unknown.value)
    assert "alice" not in str(private.value) and "priv" not in str(private.value).split("theirs: ")[1]
    plan = plan_paths(WORKSPACES, "o/n", "alice", ["priv-novol"])
    assert plan.paths == () and "no volume" in plan.skipped[0]
    with pytest.raises(InvalidInputError, match="no workspace 'nope' that 'alice' may use; theirs: pub-a, pub-a2, pub-b, priv, priv-novol"):
        plan_paths(WORKSPACES, "o/n", "alice", ["nope"])


def test_select_files_patterns():
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json",
             "tokenizer.json", "tokenizer.model", "vocab.txt", "chat_template.jinja", "modeling.py", "x.tiktoken",
             "pytorch_model.bin", "tf_model.h5", "README.md", ".gitattributes", "original/consolidated.00.pth",
             "original/params.json", "sub/model.safetensors"]
    assert select_files(files) == sorted([
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json", "tokenizer.json",
        "tokenizer.model", "vocab.txt", "chat_template.jinja", "modeling.py", "x.tiktoken", "sub/model.safetensors"])


def test_select_files_falls_back_to_bin_and_refuses_no_weights():
    assert select_files(["pytorch_model.bin", "config.json", "original/x.pt"]) == ["config.json", "pytorch_model.bin"]
    with pytest.raises(DownloadError, match="no weights") as e:
        select_files(["config.json", "tf_model.h5", "original/x.safetensors"])
    assert e.value.permanent


def test_path_decision():
    assert path_decision([]) == ("free", None)
    assert path_decision([("a", True)]) == ("wait", "a")
    assert path_decision([("a", True), ("b", False)]) == ("taken", "b")


def test_shared_copy_layout_and_relative_links():
    from weightkeeper.layout import artifact_path, link_target, sharing_problem

    c = "ab" * 20
    assert artifact_path("/v", "o/n", c) == f"/v/models/_artifacts/o--n/{c}"
    assert link_target("/v/models/o--n", f"/v/models/_artifacts/o--n/{c}") == f"_artifacts/o--n/{c}"
    assert link_target("/v/models/t/o--n", f"/v/models/_artifacts/o--n/{c}") == f"../_artifacts/o--n/{c}"
    assert sharing_problem("/v/models/o--n", "/v") is None
    assert sharing_problem("/v/models/sub/o--n", "/v") is None
    assert "outside the models root" in sharing_problem("/v/team/models/o--n", "/v")
    assert "holds shared copies" in sharing_problem("/v/models/_artifacts/o--n", "/v")
    assert "holds shared copies" in sharing_problem("/v/models/_artifacts.4242/o--n", "/v")
    assert artifact_path("/v", "o/n", c, maker_uid=4242) == f"/v/models/_artifacts.4242/o--n/{c}"
    for uid in (0, -1):
        with pytest.raises(InvalidInputError, match="cannot be made by uid"):
            artifact_path("/v", "o/n", c, maker_uid=uid)
    for repo in ("_artifacts", "_artifacts.4242"):
        with pytest.raises(InvalidInputError, match="shared copies"):
            model_path("/v", repo)
    assert model_path("/v", "_artifacts.042") == "/v/models/_artifacts.042"  # no uid is written so: not one


@pytest.mark.parametrize(("name", "shelf"), [("_artifacts", True), ("_artifacts.1", True), ("_artifacts.4294967295", True),
                                            ("_artifacts.0", False), ("_artifacts.01", False), ("_artifacts.", False),
                                            ("_artifacts.x", False), ("_artifacts.12345678901", False),
                                            ("artifacts", False), ("_artifacts-1", False)])
def test_directories_of_shared_copies_are_named_exactly(name, shelf):
    from weightkeeper.layout import is_artifacts_dir

    assert is_artifacts_dir(name) is shelf


def test_workspace_usage_counts_a_shared_copy_once():
    from weightkeeper.planning import workspace_usage

    ws = [Workspace("a", "/v", cluster="c"), Workspace("b", "/w", cluster="c")]
    usage = workspace_usage(ws, [("a", "/v/models/x", 10, 1), ("a", "/v/models/y", 10, 1), ("a", "/v/models/z", 5, None),
                                 ("b", "/w/models/z", 5, None), ("b", "/w/models/z", 5, None)],
                            [("c", "/v", 10)])
    assert usage == {"a": {"storedBytes": 15, "withoutSharingBytes": 25},
                     "b": {"storedBytes": 5, "withoutSharingBytes": 10}}


@pytest.mark.parametrize("subpath", ["_artifacts", "models/_artifacts", "team/_artifacts/x", "_artifacts.4242",
                                     "team/_artifacts.1/x"])
def test_subpath_never_enters_the_shared_copies(subpath):
    with pytest.raises(InvalidInputError, match="shared copies"):
        model_path("/v", "o/n", subpath)


@pytest.mark.parametrize(("source", "bucket", "prefix", "directory"), [
    ("s3://weights/team/Qwen--Qwen2.5-0.5B/", "weights", "team/Qwen--Qwen2.5-0.5B/", "Qwen--Qwen2.5-0.5B"),
    ("s3://weights/team/Qwen--Qwen2.5-0.5B", "weights", "team/Qwen--Qwen2.5-0.5B/", "Qwen--Qwen2.5-0.5B"),
    ("s3://my.bucket-1/tiny", "my.bucket-1", "tiny/", "tiny"),
])
def test_s3_source_names_its_directory_by_the_last_segment(source, bucket, prefix, directory):
    parsed = parse_source(source)
    assert isinstance(parsed, S3Source)
    assert (parsed.bucket, parsed.prefix, parsed.repo_id, parsed.uri) == (bucket, prefix, directory,
                                                                           f"s3://{bucket}/{prefix}")
    assert model_path("/v", parsed.repo_id) == f"/v/models/{directory}"


@pytest.mark.parametrize("source", [
    "s3://", "s3://weights", "s3://weights/", "s3://Weights/x", "s3://ab/x", "s3://weights//x", "s3://weights/a/../x",
    "s3://weights/./x", "s3://weights/a b", "s3://weights/x/_artifacts/", "s3://weights/_artifacts.7", "s3://weights/-x", "s3://weights/.x",
    "s3://weights/mod\u0435l", "s3:///x",
])
def test_s3_source_refuses(source):
    with pytest.raises(InvalidInputError):
        parse_source(source)


def test_staging_uri_ends_with_a_slash_so_prefixes_never_overlap():
    a = staging_uri("b", "p", "acme/a", "c" * 40)
    ab = staging_uri("b", "p", "acme/a-b", "c" * 40)
    assert a == f"s3://b/p/acme--a/{'c' * 40}/" and not ab.startswith(a)
