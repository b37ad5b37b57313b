"""File-system attacks on deletion, verification/repair and garbage collection: what a workspace user plants or
races in the directories weightkeeper owns or walks. The tests act as that user (one uid; races are emulated at the
exact moment between a check and its use)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weightkeeper.guard import VolumeRule


def _models(tmp_path: Path) -> tuple[Path, list[VolumeRule]]:
    volume = tmp_path / "vol"
    (volume / "models").mkdir(parents=True)
    return volume, [VolumeRule(str(volume))]


def _deep(top: Path, depth: int) -> None:
    """A chain of `depth` directories `d/d/...` below `top` (made through descriptors: no path is that long)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


@pytest.mark.without_prefect_server
def test_a_deep_tree_planted_in_an_adopted_directory_never_crashes_its_cleanup(tmp_path):
    """A model recorded before weightkeeper refused occupied directories (it took away only its listed files) holds a
    user's tree 3000 directories deep. Its cleanup pruned every empty directory by recursion: RecursionError, a
    traceback on each of its retries, the model never released. Now only the directories of the files weightkeeper
    listed are pruned (without recursion): its files go, the user's tree (even empty) is left as it is."""
    from weightkeeper.anchored import Dir
    from weightkeeper.fsops import remove_model_files

    volume, rules = _models(tmp_path)
    path = volume / "models" / "acme--legacy"
    (path / "sub" / "deeper").mkdir(parents=True)
    (path / "a.bin").write_bytes(b"a")
    (path / "sub" / "deeper" / "b.bin").write_bytes(b"b")
    (path / ".cache" / "weightkeeper" / "sub").mkdir(parents=True)
    (path / "theirs").mkdir()
    (path / "theirs" / "thesis.tex").write_bytes(b"mine")
    (path / "theirs" / "c.json").write_bytes(b"c")  # a listed file in a folder of the user's: it goes, not the folder
    (path / "empty-of-theirs").mkdir()
    _deep(path / "theirs", 3000)
    try:
        left = remove_model_files(str(path), ["a.bin", "sub/deeper/b.bin", "theirs/c.json"], rules)
        assert left == 2 and sorted(os.listdir(path)) == ["empty-of-theirs", "theirs"]
        assert (path / "theirs" / "thesis.tex").read_bytes() == b"mine" and (path / "theirs" / "d" / "d").is_dir()
        assert not (path / "theirs" / "c.json").exists()
    finally:
        with Dir.root(path / "theirs") as theirs:
            theirs.clear()  # no recursion: pytest's own cleanup of the tree would recurse


@pytest.mark.without_prefect_server
def test_a_user_writing_into_an_empty_directory_at_a_path_weightkeeper_never_made_keeps_their_files(tmp_path,
                                                                                                      monkeypatch):
    """Nothing was made at the path yet (`made` None: a model deleted before its download made its directory), and an
    empty directory of the user's stands there. The delete checked it empty, then emptied it with all it held: a
    file the user wrote into it right after that check was removed, though weightkeeper never put anything there.
    Now only the empty directory itself is removed; once it holds anything, it is the user's and left in place."""
    from weightkeeper.anchored import Dir
    from weightkeeper.errors import NotOursError
    from weightkeeper.fsops import remove_model_path

    volume, rules = _models(tmp_path)
    path = volume / "models" / "acme--never"
    path.mkdir()
    real = Dir.mount_inside

    def user_writes(self):  # between the check that it is empty and its removal
        (path / "thesis.tex").write_bytes(b"mine")
        (path / "notes").mkdir()
        return real(self)

    monkeypatch.setattr(Dir, "mount_inside", user_writes)
    with pytest.raises(NotOursError):
        remove_model_path(str(path), rules, made=None)
    assert (path / "thesis.tex").read_bytes() == b"mine" and (path / "notes").is_dir()
    monkeypatch.undo()
    (path / "thesis.tex").unlink()
    (path / "notes").rmdir()
    assert remove_model_path(str(path), rules, made=None) and not path.exists()  # an empty one still goes
