"""The cleanup guard, exhaustively: what may be removed and everything that must not be."""

import os

import pytest

from weightkeeper.errors import CleanupError, LinkInTheWayError, NotOursError, UnsafePathError
from weightkeeper.anchored import Dir, PathOpener
from weightkeeper.fsops import directory_size, remove_model_path
from weightkeeper.guard import VolumeRule, check_removable, check_staged_prefix

pytestmark = pytest.mark.without_prefect_server

VOLUMES = [VolumeRule("/mnt/vol"), VolumeRule("/mnt/other", "weights"), VolumeRule("/data/nested/vol")]


@pytest.mark.parametrize("path", [
    "/mnt/vol/models/o--n",
    "/mnt/vol/models/gpt2",
    "/mnt/vol/team/models/o--n",
    "/mnt/vol/models/sub/o--n",
    "/mnt/other/weights/o--n",
    "/data/nested/vol/models/x",
])
def test_safe_paths_allowed(path):
    assert check_removable(path, VOLUMES)


UNSAFE = [
    None, 42, "", "relative/models/x", "models/x", "./mnt/vol/models/x",
    "/mnt/vol/models/../models/x", "/mnt/vol/models/x/..", "/mnt/vol/models/./x", "/mnt/vol/models//x",
    "//mnt/vol/models/x", "/mnt/vol/models/x/", "/mnt/vol/../vol/models/x",
    "/mnt/vol", "/mnt/vol/", "/mnt/other", "/", "/data/nested/vol",
    "/mnt/vol/models", "/mnt/vol/team/models", "/mnt/other/weights", "/mnt/other/models/x",
    "/mnt/vol/x", "/mnt/vol/modelsx/y", "/mnt/vol/Models/x", "/mnt/vol/model/x",
    "/etc/models/x", "/mnt/volume/models/x", "/mnt/vo/models/x", "/tmp/models/x", "/mnt/models/x",
    "/mnt/vol/m\u043edels/x",  # Cyrillic o
    "/mnt/vol/models/x\u2215y",  # division slash
    "/mnt/vol/models/\uff0e\uff0e",  # fullwidth dots
    "/mnt/vol/models/x\u200b",  # zero-width space
    "/mnt/vol/models/caf\u00e9",
    "/mnt/vol/models/a b", "/mnt/vol/models/x\x00", "/mnt/vol/models/x\n", "/mnt/vol/models/*",
    "/mnt/vol/models/~", "/mnt/vol/models/$HOME",
]


@pytest.mark.parametrize("path", UNSAFE)
def test_unsafe_paths_refused(path):
    with pytest.raises(UnsafePathError):
        check_removable(path, VOLUMES)


def test_at_least_thirty_unsafe_cases():
    assert len(UNSAFE) >= 30


def test_no_volumes_means_nothing_is_removable():
    with pytest.raises(UnsafePathError, match="not inside any declared workspace volume"):
        check_removable("/mnt/vol/models/x", [])


def test_a_volume_root_nested_below_another_volumes_models_dir_is_refused():
    rules = [VolumeRule("/mnt/vol"), VolumeRule("/mnt/vol/models/inner")]
    with pytest.raises(UnsafePathError, match="volume root"):
        check_removable("/mnt/vol/models/inner", rules)


def test_innermost_volume_rules_apply():
    rules = [VolumeRule("/mnt"), VolumeRule("/mnt/inner", "weights")]
    with pytest.raises(UnsafePathError):
        check_removable("/mnt/inner/models/x", rules)
    assert check_removable("/mnt/inner/weights/x", rules).root == "/mnt/inner"


def test_workspaces_of_one_volume_each_remove_below_their_own_models_dir():
    """Two workspaces may share a volume with models dirs of their own: each one's paths and shared copies are
    removable below its own, and nothing else is."""
    rules = [VolumeRule("/mnt/vol"), VolumeRule("/mnt/vol", "weights")]
    assert check_removable("/mnt/vol/models/x", rules).models_dir == "models"
    assert check_removable("/mnt/vol/weights/x", rules).models_dir == "weights"
    assert check_removable(f"/mnt/vol/weights/_artifacts/a--b/{'0' * 40}", rules, artifact=True).models_dir == "weights"
    for path, why in [("/mnt/vol/other/x", "not below a 'models'"), ("/mnt/vol/weights", "not below a 'weights'"),
                      ("/mnt/vol/weights/_artifacts/a--b/c", "inside _artifacts"), ("/mnt/vol/weights/a b", "segment")]:
        with pytest.raises(UnsafePathError, match=why):
            check_removable(path, rules)


@pytest.fixture
def volume(tmp_path):
    root = tmp_path / "vol"
    (root / "models").mkdir(parents=True)
    return root


def test_remove_directory_and_report_missing(volume):
    d = volume / "models" / "o--n"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "w.safetensors").write_bytes(b"x" * 10)
    assert remove_model_path(str(d), [VolumeRule(str(volume))]) is True
    assert not d.exists() and (volume / "models").is_dir()
    assert remove_model_path(str(d), [VolumeRule(str(volume))]) is False


def test_symlink_inside_model_dir_is_unlinked_not_followed(volume, tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    d = volume / "models" / "o--n"
    d.mkdir()
    (d / "escape").symlink_to(outside)
    (d / "file-link").symlink_to(outside / "keep.txt")
    remove_model_path(str(d), [VolumeRule(str(volume))])
    assert (outside / "keep.txt").read_text() == "keep"


def test_symlink_at_model_path_removes_only_the_link(volume, tmp_path):
    """A link naming a shared copy (weightkeeper's) goes, never what it names; any other link stays in place."""
    copy = volume / "models" / "_artifacts" / "o--n" / ("c" * 40)
    copy.mkdir(parents=True)
    (copy / "w.bin").write_bytes(b"1")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = volume / "models" / "o--n"
    for made in ("legacy", "link"):
        link.symlink_to(f"_artifacts/o--n/{'c' * 40}")
        remove_model_path(str(link), [VolumeRule(str(volume))], made)
        assert not os.path.lexists(link) and (copy / "w.bin").exists()
        link.symlink_to(outside)
        with pytest.raises(NotOursError, match="not what weightkeeper made there"):
            remove_model_path(str(link), [VolumeRule(str(volume))], made)
        assert os.readlink(link) == str(outside)
        link.unlink()


def test_symlinked_parent_inside_volume_is_refused(volume, tmp_path):
    outside = tmp_path / "outside-models"
    (outside / "o--n").mkdir(parents=True)
    (volume / "team").mkdir()
    (volume / "team" / "models").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="symlink"):
        remove_model_path(str(volume / "team" / "models" / "o--n"), [VolumeRule(str(volume))])
    assert (outside / "o--n").is_dir()


def test_opening_paths_in_a_row_never_follows_a_link_planted_at_one(volume, tmp_path):
    """The bulk check opens sibling paths from one parent: a path the attacker swapped for a link to a
    look-alike outside is refused, never opened, and its sibling still opens."""
    outside = tmp_path / "look-alike"
    outside.mkdir()
    (outside / "w.bin").write_bytes(b"1")
    (volume / "models" / "a").mkdir()
    (volume / "models" / "b").symlink_to(outside)
    with PathOpener([VolumeRule(str(volume))]) as opener:
        with opener.open(str(volume / "models" / "a")) as a:
            assert a.where.endswith("/models/a")
        with pytest.raises(LinkInTheWayError, match="symlink"):
            opener.open(str(volume / "models" / "b"))


def test_symlinked_volume_root_is_allowed(tmp_path):
    real = tmp_path / "real"
    (real / "models" / "x").mkdir(parents=True)
    (tmp_path / "mnt").symlink_to(real)
    assert remove_model_path(str(tmp_path / "mnt" / "models" / "x"), [VolumeRule(str(tmp_path / "mnt"))])
    assert not (real / "models" / "x").exists()


def test_removal_failure_is_a_cleanup_error(volume, immutable):
    d = volume / "models" / "o--n"
    d.mkdir()
    (d / "w.bin").write_bytes(b"1")
    with immutable(d):
        with pytest.raises(CleanupError, match="cannot remove"):
            remove_model_path(str(d), [VolumeRule(str(volume))])
    assert (d / "w.bin").exists()


def test_directory_size_excludes_cache_and_links(volume, tmp_path):
    d = volume / "models" / "o--n"
    (d / ".cache" / "weightkeeper").mkdir(parents=True)
    (d / ".cache" / "weightkeeper" / "x.part").write_bytes(b"p" * 100)
    (d / "a.bin").write_bytes(b"a" * 7)
    (d / "sub").mkdir()
    (d / "sub" / "b.json").write_bytes(b"b" * 5)
    (tmp_path / "big").write_bytes(b"z" * 1000)
    (d / "link").symlink_to(tmp_path / "big")
    with Dir.root(d) as opened:
        assert directory_size(opened) == 12


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("shelf", ["_artifacts", "_artifacts.4242"])
def test_shared_copies_are_removable_only_by_garbage_collection(shelf):
    copy = f"/mnt/vol/models/{shelf}/o--n/{COMMIT}"
    with pytest.raises(UnsafePathError, match="only garbage collection"):
        check_removable(copy, VOLUMES)
    assert check_removable(copy, VOLUMES, artifact=True)


@pytest.mark.parametrize("path", [
    "/mnt/vol/models/_artifacts", "/mnt/vol/models/_artifacts/o--n", f"/mnt/vol/models/_artifacts/o--n/{COMMIT}/x",
    "/mnt/vol/models/_artifacts/o--n/main", f"/mnt/vol/team/models/_artifacts/o--n/{COMMIT}",
    "/mnt/vol/models/o--n", f"/mnt/other/models/_artifacts/o--n/{COMMIT}",
    "/mnt/vol/models/_artifacts.4242/o--n", f"/mnt/vol/models/_artifacts.0/o--n/{COMMIT}",
    f"/mnt/vol/models/_artifacts.042/o--n/{COMMIT}", f"/mnt/vol/models/x/_artifacts.1/o--n/{COMMIT}",
])
def test_garbage_collection_removes_nothing_but_a_shared_copy(path):
    with pytest.raises(UnsafePathError):
        check_removable(path, VOLUMES, artifact=True)


@pytest.mark.parametrize("path", ["/mnt/vol/models/_artifacts", "/mnt/vol/models/_artifacts/o--n",
                                  "/mnt/vol/models/x/_artifacts/y", "/mnt/vol/models/_artifacts.4242/o--n",
                                  "/mnt/vol/models/x/_artifacts.1/y"])
def test_model_cleanup_never_enters_the_shared_copies(path):
    with pytest.raises(UnsafePathError):
        check_removable(path, VOLUMES)


def test_discarding_a_damaged_entry_never_follows_a_link(tmp_path):
    from weightkeeper.sharing import discard

    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "x.safetensors").write_text("precious")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "sub").symlink_to(outside)
    with Dir.root(copy) as opened:
        discard(opened, "sub/x.safetensors")
    assert (outside / "x.safetensors").read_text() == "precious" and not os.path.lexists(copy / "sub")


def test_nested_volumes_and_blocking_settings_are_refused(tmp_path):
    from weightkeeper.config import load_settings
    from weightkeeper.errors import ConfigError

    cases = {
        'max_concurrent_downloads = 0\n': "would block every download",
        'lease_seconds = 0\n': "lease_seconds must be positive",
        '[[workspaces]]\nname = "a"\nvolume = "/mnt/a"\n[[workspaces]]\nname = "b"\nvolume = "/mnt/a/models/x"\n':
            "must not nest",
    }
    for text, message in cases.items():
        path = tmp_path / "c.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_settings(path)


COMMIT40 = "0123456789abcdef0123456789abcdef01234567"


def test_staged_prefix_guard_accepts_only_a_commit_prefix_below_the_staging_prefix():
    assert check_staged_prefix(f"s3://wk/stage/acme--m/{COMMIT40}/", "wk", "stage") == ("wk", f"stage/acme--m/{COMMIT40}/")
    assert check_staged_prefix(f"s3://wk/a/b/m/{COMMIT40}/", "wk", "a/b") == ("wk", f"a/b/m/{COMMIT40}/")


@pytest.mark.parametrize("uri", [
    None, "", "stage/acme--m/x/", f"s3://other/stage/acme--m/{COMMIT40}/",  # not s3, another bucket
    "s3://wk/", "s3://wk/stage/", "s3://wk/stage", "s3://wk/stage/acme--m/",  # the bucket, the prefix, a model dir
    f"s3://wk/stage/acme--m/{COMMIT40}",  # no trailing slash: would also match .../<commit>-x
    f"s3://wk/stagex/acme--m/{COMMIT40}/", f"s3://wk/other/acme--m/{COMMIT40}/",  # look-alike and foreign prefixes
    f"s3://wk/stage/acme--m/{COMMIT40}/extra/", f"s3://wk/stage/../acme--m/{COMMIT40}/",
    f"s3://wk/stage/acme--m/{COMMIT40.upper()}/", f"s3://wk/stage/acme--m/{COMMIT40[:39]}/",
    f"s3://wk/stage//{COMMIT40}/", f"s3://wk/stage/../{COMMIT40}/", f"s3://wk/stage/acme\u2010m/{COMMIT40}/",
])
def test_staged_prefix_guard_refuses(uri):
    with pytest.raises(UnsafePathError):
        check_staged_prefix(uri, "wk", "stage")
