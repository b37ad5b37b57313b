"""File-system attacks on deletion, verification/repair and garbage collection: what a workspace user plants or
races in the directories weightkeeper owns or walks. The tests act as that user (one uid; races are emulated at the
exact moment between a check and its use)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from conftest import tiny_files
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
    entries, rmdir, wrote = Dir.entries, Dir.rmdir, []

    def user_writes() -> None:  # once, between the check that it is empty (if any) and its removal
        if not wrote:
            wrote.append(True)
            (path / "thesis.tex").write_bytes(b"mine")
            (path / "notes").mkdir()

    def listed(self):
        names = entries(self)
        if self.where == str(path):
            user_writes()
        return names

    def removed(self, name):
        if self.path(name) == str(path):
            user_writes()
        return rmdir(self, name)

    monkeypatch.setattr(Dir, "entries", listed)
    monkeypatch.setattr(Dir, "rmdir", removed)
    with pytest.raises(NotOursError):
        remove_model_path(str(path), rules, made=None)
    assert (path / "thesis.tex").read_bytes() == b"mine" and (path / "notes").is_dir()
    monkeypatch.undo()
    (path / "thesis.tex").unlink()
    (path / "notes").rmdir()
    assert remove_model_path(str(path), rules, made=None) and not path.exists()  # an empty one still goes


@pytest.mark.without_prefect_server
def test_whatever_is_planted_in_a_model_directory_only_its_names_go(tmp_path):
    """Its owner plants, in the model directory weightkeeper made: a hard link to a file of theirs outside, a FIFO, a
    socket, a link to a directory outside, a directory shut (mode 000), a name with a newline, a huge sparse file.
    The delete removes the names and the directory, never reads, opens, truncates or follows any: the file outside
    keeps its bytes and its inode, the directory outside all it holds."""
    import socket

    from weightkeeper.anchored import Dir
    from weightkeeper.fsops import remove_model_path

    volume, rules = _models(tmp_path)
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "f").write_bytes(b"keep")
    (outside / "theirs.bin").write_bytes(b"theirs")
    path = volume / "models" / "acme--zoo"
    path.mkdir()
    with Dir.root(path) as d:
        made = d.identity()
    (path / "model.safetensors").hardlink_to(outside / "theirs.bin")
    os.mkfifo(path / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path / "sock"))
    (path / "to-outside").symlink_to(outside, target_is_directory=True)
    (path / "shut").mkdir()
    (path / "shut" / "inside").write_bytes(b"x")
    os.chmod(path / "shut", 0)
    (path / "new\nline").write_bytes(b"n")
    with open(path / "sparse", "wb") as f:
        f.truncate(1 << 40)
    assert remove_model_path(str(path), rules, made=made) and not path.exists()
    assert (outside / "theirs.bin").read_bytes() == b"theirs" and os.stat(outside / "theirs.bin").st_nlink == 1
    assert (outside / "keep" / "f").read_bytes() == b"keep"


def _unreadable_to_the_service(monkeypatch, locked: Path) -> int:
    """`locked` (that inode, whatever its name) cannot be opened for reading by the service, as a file whose owner
    made it mode 000 is to a service that is not root (or root squashed on NFS), or one under a FUSE mount of theirs
    without allow_other: EACCES. The tests run as root, which no mode stops, so the refusal is emulated. Returns a
    descriptor of it for the test to close at its end: held open, its inode number is never reused by the file a
    repair puts in its place (which would then be refused as well)."""
    from weightkeeper.anchored import Dir

    held = os.open(locked, os.O_RDONLY)
    inode, real = os.fstat(held).st_ino, Dir.open

    def denied(self, name, flags, mode=0o644):
        st = self.lstat(name)
        if st is not None and st.st_ino == inode and not flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), self.path(name))
        return real(self, name, flags, mode)

    monkeypatch.setattr(Dir, "open", denied)
    return held


@pytest.mark.parametrize("sharing", [False, True])
def test_a_file_the_service_may_not_read_is_a_problem_of_the_copy_repaired_never_a_crash(wk, hub, monkeypatch,
                                                                                          sharing):
    """The owner of a copy makes one of its files unreadable to the service. Its full hash raised PermissionError out
    of the copy's verify task on every pass (a traceback), and the model stayed Ready with a file no one could check.
    Now the file is a problem of the copy ("cannot be read"): repaired as any damaged file (a new file of
    weightkeeper's in its place), the model Ready again."""
    from test_sharing import SHARD, shared_dir

    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.flows.reconcile import reconcile

    files = tiny_files(f"unreadable-{sharing}")
    commit = hub.add_repo(f"acme/unreadable-{sharing}", files)
    wk.declare("unreadable", f"hf://acme/unreadable-{sharing}", workspaces=["team-a"],
               download_policy="reuse-if-exists" if sharing else "always-download")
    assert ensure_model("unreadable") == "Ready"
    path = Path(wk.registry.get_model("unreadable").local_paths[0].path)
    copy = shared_dir(wk, f"acme--unreadable-{sharing}", commit) if sharing else path
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=0)  # every pass hashes
    held = _unreadable_to_the_service(monkeypatch, copy / SHARD)
    try:
        assert reconcile()[str(copy)] == "repaired"
        assert (copy / SHARD).read_bytes() == files[SHARD] and wk.registry.get_model("unreadable").phase == "Ready"
        assert reconcile()[str(copy)] == "verified"
    finally:
        os.close(held)


def test_a_repair_of_an_own_copy_the_volume_refuses_fails_the_path_never_the_task(wk, hub, monkeypatch):
    """The volume answers the repair of an own copy with an error (EIO; EACCES on a directory of the copy its owner
    shut; ENOSPC): the shared copy's repair failed it saying why, an own copy's raised out of its task (a traceback on
    every pass, the path never told why). Now the path is failed, saying why, and the next pass repairs it."""
    from test_sharing import SHARD

    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.flows.reconcile import reconcile
    from weightkeeper.tasks import verify

    files = tiny_files("eio-own")
    hub.add_repo("acme/eio-own", files)
    wk.declare("eio-own", "hf://acme/eio-own", workspaces=["team-a"])
    assert ensure_model("eio-own") == "Ready"
    path = Path(wk.registry.get_model("eio-own").local_paths[0].path)
    os.truncate(path / SHARD, 10)

    def refused(root, relative):
        raise OSError(errno.EIO, os.strerror(errno.EIO), f"{root}/{relative}")

    with monkeypatch.context() as patched:
        patched.setattr(verify, "discard", refused)
        assert reconcile()[str(path)] == "postponed"
    model, entry = wk.registry.get_model("eio-own"), wk.registry.get_model("eio-own").local_paths[0]
    assert model.phase == "Failed" and entry.status == "Failed" and entry.lease is None
    assert "Input/output error" in entry.message, entry.message
    assert reconcile()[str(path)] == "repaired" and (path / SHARD).read_bytes() == files[SHARD]
    assert wk.registry.get_model("eio-own").phase == "Ready"


@pytest.mark.without_prefect_server
def test_a_want_of_descriptors_or_memory_is_raised_never_taken_for_a_damaged_file():
    """Only the copy's faults make a problem of it (repaired by fetching the file again): this process running out
    of descriptors or memory is raised, so that a busy host never refetches files that are whole."""
    from weightkeeper.verify import _unreadable

    for code in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ESTALE):
        with pytest.raises(OSError) as e:
            _unreadable("m/x.bin", OSError(code, os.strerror(code)))
        assert e.value.errno == code
    for code in (errno.EACCES, errno.EIO):
        assert _unreadable("m/x.bin", OSError(code, os.strerror(code))).reason == f"cannot be read: {os.strerror(code)}"


@pytest.mark.without_prefect_server
def test_a_directory_the_service_may_list_but_not_search_is_a_problem_of_the_copy(tmp_path, monkeypatch):
    """`sub` is mode r--r--r-- to the service: it opens, but its entries cannot be looked up (EACCES from the stat):
    a problem of the copy, in the quick check as in the full one, never an error of the whole check."""
    import hashlib

    from weightkeeper.anchored import Dir
    from weightkeeper.download import RemoteFile
    from weightkeeper.verify import verify_copy

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"hello\n")
    remote = RemoteFile("sub/a.bin", 6, "", sha256=hashlib.sha256(b"hello\n").hexdigest())
    real = Dir.lstat

    def lstat(self, name):
        if name == "a.bin":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
        return real(self, name)

    monkeypatch.setattr(Dir, "lstat", lstat)
    with Dir.root(tmp_path) as d:
        for deep in (False, True):
            assert [p.reason for p in verify_copy(d, [remote], deep=deep)] == ["cannot be read: Permission denied"]
