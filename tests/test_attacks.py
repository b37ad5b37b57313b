"""The hostile workspace user: plain filesystem operations against the real flows, Prefect server and Hub server.

Each test plants or swaps something the way a user who can write to part of a volume can, then asserts
the safe outcome: nothing written or removed outside the model's own anchored tree, the model Failed or
refused with a message, and a delete that still releases it. The anchored file layer's own guarantees
(`weightkeeper.anchored`) come first, at unit level.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

import pytest
from conftest import tiny_files
from test_lifecycle import fetched_files, wait_until

from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile
from weightkeeper import download
from weightkeeper.anchored import Dir
from weightkeeper.download import PARTIAL_DIR
from weightkeeper.errors import InvalidInputError, NotOursError, UnsafePathError

SHARD = "model-00001-of-00002.safetensors"
ONE_SHARD = "model-00001-of-00001.safetensors"
FETCHED = sorted(["config.json", "tokenizer.json", "tokenizer_config.json", SHARD, "model-00002-of-00002.safetensors"])
RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): each always names something."""
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def tree(path: Path) -> dict[str, object]:
    """Everything below `path`, links not followed: relative name -> content, link target or 'dir'."""
    found: dict[str, object] = {}
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(folder, name)
            rel = str(p.relative_to(path))
            found[rel] = (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes())
    return found


def outside_dir(tmp_path: Path, fill: dict[str, bytes] | None = None) -> Path:
    """A directory outside every volume standing for /etc (or another user's home)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for rel, data in (fill or {}).items():
        (outside / rel).parent.mkdir(parents=True, exist_ok=True)
        (outside / rel).write_bytes(data)
    return outside


class Swapper:
    """The attacker's race driver: swaps `real` (a directory) with a symlink to `outside` again and again,
    atomically, until stopped, after `limit` swaps or `seconds`; leaving puts the directory back. `dwell` is how
    long each state lasts: (the directory, the link)."""

    def __init__(self, real: Path, outside: Path, limit: int = 20_000, seconds: float = 15,
                 dwell: tuple[float, float] = (0.0003, 0.0003)):
        self.real, self.decoy = real, real.with_name(real.name + ".decoy")
        self.decoy.symlink_to(outside, target_is_directory=True)
        self.limit, self.seconds, self.dwell = limit, seconds, dwell
        self.swaps, self.swapped, self.error = 0, False, None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="attacker-swaps", daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.seconds
        try:
            while not self.done.is_set() and self.swaps < self.limit and time.monotonic() < deadline:
                exchange(self.real, self.decoy)
                self.swapped = not self.swapped
                self.swaps += 1
                time.sleep(self.dwell[self.swapped])
        except OSError as e:
            self.error = e

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        if self.swapped:
            exchange(self.real, self.decoy)
        self.decoy.unlink()
        assert self.error is None, self.error
        assert self.real.is_dir() and not self.real.is_symlink()


@contextlib.contextmanager
def warnings_logged():
    """The warnings weightkeeper's flows and tasks log (the model is released before a test can read it)."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("prefect")
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


# -- other users, for real: their processes run as their uid ------------------------------------------------------

ATTACKER, VICTIM = 4343, 5555  # a shelf owner of a Kubernetes workspace, and another user of its volume
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter may sit where these users cannot enter


def as_user(uid: int, code: str) -> subprocess.CompletedProcess:
    """Run python `code` as `uid` (no groups): the kernel checks what it may do as that user's."""
    return subprocess.run([SYSTEM_PYTHON, "-I", "-c", code], capture_output=True, text=True, timeout=30, cwd="/",
                          user=uid, group=uid, extra_groups=[])


@pytest.fixture
def users_volume(wk, hub):
    """A Kubernetes workspace `gpu` (its jobs run as their model's owner; the service, root here, repairs their
    copies) on a volume other users' processes may enter, outside pytest's private directories; removed after the
    test with all it holds (setuid files too)."""
    from test_kube import _kube_workspace

    top = Path(tempfile.mkdtemp(prefix="wk-users-"))
    os.chmod(top, 0o755)
    try:
        yield _kube_workspace(wk, hub, top)
    finally:
        shutil.rmtree(top)


def rewrite_users_volume(wk, hub, **settings) -> None:
    """The config again with `settings`, the workspace `gpu` of `users_volume` kept."""
    wk.rewrite(hf_endpoint=hub.url, **settings)
    with wk.config.open("a") as config:
        config.write('[workspaces.kubernetes]\nnamespace = "gpu"\nimage = "registry.local/weightkeeper:0.1"\n'
                     'volume_claim = "models"\n')


def owned_by(top: Path, uid: int) -> None:
    """`top` and all below it as the job of `uid` made them."""
    for made in (top, *top.rglob("*")):
        os.chown(made, uid, uid, follow_symlinks=False)


def victim_file(volume: Path, data: bytes, mode: int, uid: int = VICTIM) -> Path:
    """A file of `uid`'s in a team directory anyone may write (not sticky): the attacker may rename it, not write it."""
    team = volume / "team"
    team.mkdir(exist_ok=True)
    os.chmod(team, 0o777)
    f = team / "victims.bin"
    f.write_bytes(data)
    os.chown(f, uid, uid)
    os.chmod(f, mode)
    assert "PermissionError" in as_user(ATTACKER, f"open({str(f)!r}, 'r+b')").stderr
    return f


def shelf_copy(wk, hub, monkeypatch, volume: Path, repo: str, files: dict[str, bytes], name: str = "mine",
               revision: str = "") -> Path:
    """`repo` (with `files`) as the attacker's model `name` (a sharing one) has it: a shared copy their job made on
    their shelf, which they own and may write."""
    from test_kube import as_the_job_of

    commit = hub.add_repo(repo, files)
    wk.declare(name, f"hf://{repo}{revision}", workspaces=["gpu"], download_policy="reuse-if-exists",
               owner_uid=ATTACKER, subpath=f"models/{name}")
    with as_the_job_of(monkeypatch, ATTACKER):
        assert ensure_model(name) == "Ready"
    shelf = volume / "models" / f"_artifacts.{ATTACKER}"
    owned_by(shelf, ATTACKER)
    return shelf / repo.replace("/", "--") / commit


# -- the anchored file layer ---------------------------------------------------------------------------------------


def test_descend_refuses_a_link_and_makes_nothing_through_it(tmp_path):
    outside = outside_dir(tmp_path)
    (tmp_path / "vol" / "a").mkdir(parents=True)
    (tmp_path / "vol" / "a" / "models").symlink_to(outside)
    with Dir.root(tmp_path / "vol") as root:
        for relative in ("a/models", "a/models/x", "a/models/x/y"):
            for create in (False, True):
                with pytest.raises(UnsafePathError, match="symlink"):
                    root.descend(relative, create=create)
        with pytest.raises(UnsafePathError):
            root.descend("a/../a/models")
    assert tree(outside) == {}


def test_remove_never_leaves_the_tree_when_a_subdirectory_is_swapped_for_a_link(tmp_path, monkeypatch):
    outside = outside_dir(tmp_path, {"precious": b"keep", "sub/inner": b"keep too"})
    before = tree(outside)
    victim = tmp_path / "vol" / "victim"
    (victim / "sub" / "deeper").mkdir(parents=True)
    (victim / "sub" / "f").write_bytes(b"ours")
    (victim / "sub" / "deeper" / "g").write_bytes(b"ours")
    (victim / "planted").symlink_to(outside)  # planted from the start: only the link goes
    real_descend = Dir.descend

    def swap_first(self, relative, create=False, mode=0o755):  # the check (lstat) saw a directory; then the swap
        if relative == "sub" and not (victim / "sub").is_symlink():
            os.rename(victim / "sub", tmp_path / "moved-away")
            (victim / "sub").symlink_to(outside)
        return real_descend(self, relative, create, mode)

    monkeypatch.setattr(Dir, "descend", swap_first)
    with Dir.root(tmp_path / "vol") as root:
        assert root.remove("victim")
    monkeypatch.undo()
    assert not victim.exists() and tree(outside) == before
    assert tree(tmp_path / "moved-away") == {"f": b"ours", "deeper": "dir", "deeper/g": b"ours"}

    # swapped after weightkeeper entered it: the descriptor it holds is the directory it entered
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "f").write_bytes(b"ours")
    real_clear = Dir.clear

    def swap_inside(self):
        if self.where.endswith("/sub") and not (victim / "sub").is_symlink():
            os.rename(victim / "sub", tmp_path / "moved-later")
            (victim / "sub").symlink_to(outside)
        return real_clear(self)

    monkeypatch.setattr(Dir, "clear", swap_inside)
    with Dir.root(tmp_path / "vol") as root:
        with contextlib.suppress(OSError):  # rmdir meets the link: that attempt fails, the next one ends it
            root.remove("victim")
        monkeypatch.undo()
        assert tree(outside) == before
        root.remove("victim")
    assert not victim.exists() and tree(outside) == before


def test_write_atomic_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    outside = outside_dir(tmp_path, {"passwd": b"root:x:0:0\n"})
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "ready").symlink_to(outside / "passwd")
    with Dir.root(tmp_path / "d") as d:
        d.write_atomic("ready", b"mine\n")
        assert d.read_small("ready") == b"mine\n"
    assert not (tmp_path / "d" / "ready").is_symlink() and (outside / "passwd").read_bytes() == b"root:x:0:0\n"
    assert os.listdir(tmp_path / "d") == ["ready"]  # no temporary file left


def test_symlink_creates_or_swaps_a_link_and_leaves_anything_else_alone(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "file").write_bytes(b"the user's")
    os.mkfifo(tmp_path / "d" / "fifo")
    (tmp_path / "d" / "old").symlink_to("elsewhere")
    with Dir.root(tmp_path / "d") as d:
        d.symlink("copy-a", "new")  # nothing there: created
        d.symlink("copy-a", "old")  # a link: swapped
        for name in ("file", "fifo"):
            with pytest.raises(NotOursError, match="is not a link"):
                d.symlink("copy-a", name)
        # the race: a link when checked, a user's file when swapped (the swap is undone)
        os.unlink(tmp_path / "d" / "new")
        (tmp_path / "d" / "new").write_bytes(b"planted after the check")
        monkeypatch.setattr(Dir, "is_link", lambda self, name: name == "new" or Dir.lstat(self, name) is not None
                            and stat.S_ISLNK(Dir.lstat(self, name).st_mode))
        with pytest.raises(NotOursError, match="is not a link"):
            d.symlink("copy-b", "new")
    assert os.readlink(tmp_path / "d" / "old") == "copy-a"
    assert (tmp_path / "d" / "file").read_bytes() == b"the user's"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "d" / "fifo").st_mode)
    assert (tmp_path / "d" / "new").read_bytes() == b"planted after the check"
    assert sorted(os.listdir(tmp_path / "d")) == ["fifo", "file", "new", "old"]  # no temporary link left


@pytest.mark.timeout(30)
def test_read_small_never_blocks_follows_or_reads_much(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "small").write_bytes(b'{"size": 1}')
    os.mkfifo(d / "fifo")
    os.mkfifo(d / "fifo-held")
    writer = os.open(d / "fifo-held", os.O_RDWR | os.O_NONBLOCK)  # the attacker keeps it open, writes nothing
    (d / "zero-link").symlink_to("/dev/zero")
    os.mknod(d / "zero-device", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero itself (root in tests)
    with open(d / "huge", "wb") as f:
        f.truncate(100 << 20)
    try:
        with Dir.root(d) as root:
            assert root.read_small("small") == b'{"size": 1}'
            for name in ("fifo", "fifo-held", "zero-link", "zero-device", "huge", "missing"):
                assert root.read_small(name) is None, name
    finally:
        os.close(writer)


def test_open_regular_replaces_what_is_not_a_plain_file_of_its_own(tmp_path):
    outside = outside_dir(tmp_path, {"secret": b"keep"})
    d = tmp_path / "d"
    d.mkdir()
    os.link(outside / "secret", d / "hard")
    (d / "soft").symlink_to(outside / "secret")
    os.mkfifo(d / "fifo")
    with Dir.root(d) as root:
        for name in ("hard", "soft", "fifo"):
            fd = root.open_regular(name, os.O_RDWR | os.O_CREAT)
            try:
                os.write(fd, b"written")
            finally:
                os.close(fd)
            assert (d / name).read_bytes() == b"written" and (d / name).stat().st_nlink == 1
    assert (outside / "secret").read_bytes() == b"keep" and (outside / "secret").stat().st_nlink == 1


def test_open_regular_never_removes_a_directory_planted_at_its_name(tmp_path, monkeypatch):
    """A lock or `.part` name sits in a directory its owner may write (a Kubernetes job's owner, where the service
    works as root). They move there a directory holding another user's files: it is refused, never removed, also
    when it takes the place of a FIFO between the open and the unlink."""
    from weightkeeper.errors import LinkInTheWayError

    d = tmp_path / "d"
    (d / "x.lock").mkdir(parents=True)
    (d / "x.lock" / "theirs").write_bytes(b"another user's")
    os.chown(d / "x.lock" / "theirs", 2000, 2000)
    os.mkfifo(d / "y.part")
    before = tree(d / "x.lock")
    real_open = Dir.open

    def fifo_then_directory(self, name, flags, mode=0o644):
        try:
            return real_open(self, name, flags, mode)
        except OSError:  # the FIFO looked at and refused: the directory takes its place before it is unlinked
            if name == "y.part" and stat.S_ISFIFO(os.lstat(d / "y.part").st_mode):
                os.unlink(d / "y.part")
                shutil.copytree(d / "x.lock", d / "y.part")
            raise

    with Dir.root(d) as root:
        with pytest.raises(LinkInTheWayError, match=f"refusing {d}/x.lock: a directory stands where"):
            root.open_regular("x.lock", os.O_RDWR | os.O_CREAT, 0o600)
        monkeypatch.setattr(Dir, "open", fifo_then_directory)
        with pytest.raises(LinkInTheWayError, match=f"refusing {d}/y.part: a directory stands where"):
            root.open_regular("y.part", os.O_RDWR | os.O_CREAT)
    assert tree(d / "x.lock") == tree(d / "y.part") == before


def test_removal_never_enters_a_directory_another_user_owns(tmp_path):
    """A tree the service empties is its owner's to write (a shared copy on `_artifacts.1000`). The owner moves into
    it a directory open to all that holds another user's read-only subtree, which they could not remove themselves.
    Removal takes what is the owner's and leaves that subtree, refusing and naming it; a repair's `discard` neither
    enters nor removes it either. Once it is moved out, the rest goes."""
    from weightkeeper.errors import LinkInTheWayError
    from weightkeeper.sharing import discard

    copy = tmp_path / "vol" / "copy"
    (copy / "sub").mkdir(parents=True)
    (copy / "sub" / "weights.bin").write_bytes(b"the owner's")
    theirs = copy / "planted" / "theirs"
    (theirs / "deeper").mkdir(parents=True)
    (theirs / "deeper" / "data").write_bytes(b"another user's")
    (theirs / "notes").write_bytes(b"another user's too")
    for p in (copy, copy / "sub", copy / "sub" / "weights.bin", copy / "planted"):
        os.chown(p, 1000, 1000)
    (copy / "planted").chmod(0o777)
    for p in (theirs, *theirs.rglob("*")):
        os.chown(p, 2000, 2000)
    before = tree(theirs)
    refused = rf"{theirs} \(owner uid 2000\) is not owned as"
    with Dir.root(copy) as d:
        for damaged in ("planted/theirs/notes", "planted/theirs/deeper/data"):
            with pytest.raises(LinkInTheWayError, match=refused):
                discard(d, damaged)
        for remove in (lambda: discard(d, "planted"), lambda: d.remove("planted"), d.clear):
            with pytest.raises(LinkInTheWayError, match=refused):
                remove()
            assert tree(theirs) == before
        os.rename(theirs, tmp_path / "theirs")
        d.clear()
        assert d.entries() == []
    assert tree(tmp_path / "theirs") == before


def test_a_directory_made_again_at_its_inode_by_another_user_is_never_weightkeepers(tmp_path, monkeypatch):
    """ext4 hands a freed inode out again at once. A user who may write the models directory removes the empty
    directory weightkeeper made for a model and makes their own, which gets its inode: it is not weightkeeper's (the
    owner recorded with the inode differs), so it is never emptied or written; emptied, it is replaced by one
    weightkeeper makes. A record kept before owners were (`dev:inode`) compares the inode, and gets the owner."""
    from weightkeeper.errors import DownloadError
    from weightkeeper.fsops import made_here, own_directory, remove_model_path
    from weightkeeper.guard import VolumeRule

    volume, name = tmp_path / "vol", "acme--reused"
    models, path = volume / "models", volume / "models" / name
    models.mkdir(parents=True)
    with Dir.root(models) as parent:
        made = own_directory(parent, name, str(path), None)[1]
    inode = path.stat().st_ino
    path.rmdir()
    path.mkdir()  # the attacker's
    os.chown(path, 4242, 4242)
    (path / "theirs.safetensors").write_bytes(b"their bytes")
    if path.stat().st_ino != inode:  # a file system that did not reuse it: the reuse is played
        identity = Dir.identity
        monkeypatch.setattr(Dir, "identity", lambda self: identity(self).rpartition(":")[0] + f":{inode}")
    with Dir.root(path) as d:
        assert not made_here(d, made) and made_here(d, made.partition("@")[2])
    with pytest.raises(NotOursError, match="is not the directory weightkeeper made there"):
        remove_model_path(str(path), [VolumeRule(str(volume))], made)
    with Dir.root(models) as parent, pytest.raises(DownloadError, match="holds files weightkeeper did not write"):
        own_directory(parent, name, str(path), made)
    assert (path / "theirs.safetensors").read_bytes() == b"their bytes"
    (path / "theirs.safetensors").unlink()
    with Dir.root(models) as parent:
        d, again = own_directory(parent, name, str(path), made)
        d.close()
        assert path.stat().st_uid == os.geteuid() and again.startswith(f"{os.geteuid()}@")
        d, upgraded = own_directory(parent, name, str(path), again.partition("@")[2])
        d.close()
        assert upgraded == again


def test_walk_holds_a_bounded_number_of_descriptors_however_wide_or_deep_the_tree(tmp_path):
    """A user makes 1,500 directories side by side and a chain 300 deep below the models root (a service's limit is
    often 1,024 open files). The walk sees every entry with at most one directory open per level, of its deepest
    `WALK_OPEN` levels. A level closed on the way down and replaced meanwhile fails the walk: never read as another."""
    import weightkeeper.anchored as anchored

    root = tmp_path / "models"
    for i in range(1500):
        (root / "wide" / f"d{i:04}").mkdir(parents=True)
    (root / "wide" / "d0042" / "f").write_bytes(b"")
    chain = "/".join(["n"] * 300)
    (root / "deep" / chain).mkdir(parents=True)
    (root / "deep" / chain / "leaf").write_bytes(b"")
    for depth in range(300):  # a sibling beside each level: the walk comes back to each for it
        (root / "deep" / chain[:2 * depth] / "s").mkdir()
    base, most, found = len(os.listdir("/proc/self/fd")), 0, []
    with Dir.root(root) as d:
        for current, names in d.walk():
            most = max(most, len(os.listdir("/proc/self/fd")))
            found += [current.path(n) for n in names]
    assert sorted(found) == [f"{root}/deep/{chain}/leaf", f"{root}/wide/d0042/f"]
    assert most - base <= anchored.WALK_OPEN + 10, most - base
    with Dir.root(root) as d, pytest.raises(UnsafePathError, match=f"{root}/deep/n.* was replaced while"):
        for current, _ in d.walk():
            if current.where.endswith("/".join(["n"] * 100)) and not (root / "moved").exists():
                os.rename(root / "deep", root / "moved")
                (root / "deep" / chain).mkdir(parents=True)

def test_removal_empties_a_tree_however_deep_within_bounded_descriptors(tmp_path):
    """A Kubernetes job's owner leaves a chain of directories 3,000 deep, a file at each level, in their model
    directory, which the service removes (as root). The removal neither overflows Python's stack nor runs out of
    descriptors (it runs here with an open-file limit a few above `WALK_OPEN`), and all of it goes."""
    import weightkeeper.anchored as anchored

    (tmp_path / "model").mkdir()
    fd = os.open(tmp_path / "model", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # by descriptor: the path is far longer than PATH_MAX
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
        os.mkdir("n", dir_fd=fd)
        fd, parent = os.open("n", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), "
              "resource.getrlimit(resource.RLIMIT_NOFILE)[1])); from weightkeeper.anchored import Dir; "
              "Dir.root(sys.argv[1]).remove('model')")
    try:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(anchored.WALK_OPEN + 24)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-600:]
        assert not (tmp_path / "model").exists()
    finally:  # pytest's own clean-up of tmp_path recurses, and fails on what a failed removal left
        subprocess.run(["rm", "-rf", str(tmp_path / "model")], check=True)


# -- 1. writes through a swapped link ------------------------------------------------------------------------------


def test_a_model_whose_parent_is_swapped_for_a_link_fails_and_writes_nothing_outside(wk, hub, tmp_path):
    hub.add_repo("acme/swapped", tiny_files("swapped"))
    model = wk.declare("swapped", "hf://acme/swapped", workspaces=["team-a"], subpath="alice")
    alice = wk.volumes["team-a"] / "alice"
    assert model.local_paths[0].path == str(alice / "models" / "acme--swapped")
    (alice / "models").mkdir(parents=True)  # the user's own directory
    outside = outside_dir(tmp_path)
    os.rename(alice / "models", alice / "models.away")
    (alice / "models").symlink_to(outside)
    assert ensure_model("swapped") == "Failed"
    model = wk.registry.get_model("swapped")
    assert "symlink" in model.message and str(alice / "models") in model.message
    assert tree(outside) == {}
    assert delete_model("swapped") == "Released"  # nothing was ever written: nothing to remove
    assert tree(outside) == {} and (alice / "models").is_symlink()


def test_a_repair_never_writes_through_a_parent_swapped_for_a_link(wk, hub, tmp_path):
    files = tiny_files("repair-swap")
    hub.add_repo("acme/repair-swap", files)
    wk.declare("fixme", "hf://acme/repair-swap", workspaces=["team-a"], subpath="alice")
    assert ensure_model("fixme") == "Ready"
    alice = wk.volumes["team-a"] / "alice"
    path = Path(wk.registry.get_model("fixme").local_paths[0].path)
    os.truncate(path / SHARD, 10)  # damaged: the next reconcile repairs it
    outside = tmp_path / "outside"
    shutil.copytree(alice / "models", outside, symlinks=True)  # a look-alike of the models dir, damaged shard too
    before = tree(outside)
    os.rename(alice / "models", alice / "models.away")
    (alice / "models").symlink_to(outside)
    hub.reset_stats()
    assert reconcile()[str(path)] == "postponed"
    assert tree(outside) == before
    entry = wk.registry.get_model("fixme").local_paths[0]
    assert entry.status == "Failed" and "symlink" in entry.message

    (alice / "models").unlink()  # the user puts things back: the repair goes through
    os.rename(alice / "models.away", alice / "models")
    assert reconcile()[str(path)] == "repaired"
    assert (path / SHARD).read_bytes() == files[SHARD] and wk.registry.get_model("fixme").phase == "Ready"
    assert tree(outside) == before


# -- 2. a race driver swapping the parent during a download and a delete -------------------------------------------


def test_a_download_raced_by_a_swapping_parent_never_writes_outside(wk, hub, tmp_path):
    files = tiny_files("race", shard_size=256 * 1024)
    hub.add_repo("acme/race", files)
    wk.declare("race", "hf://acme/race", workspaces=["team-a"], subpath="alice")
    models = wk.volumes["team-a"] / "alice" / "models"
    models.mkdir(parents=True)
    outside = outside_dir(tmp_path)
    # about 2.5 s of download; the directory is mostly there, so the download goes on between the swaps
    with hub.throttled(100 * 1024, repo_id="acme/race"), Swapper(models, outside, dwell=(0.002, 0.0003)) as attacker:
        phase = ensure_model("race")
    assert attacker.swaps > 50
    assert tree(outside) == {}, f"written outside after {attacker.swaps} swaps (phase {phase})"
    model = wk.registry.get_model("race")
    assert phase in ("Ready", "Failed") and (phase == "Ready" or "symlink" in model.message), (phase, model.message)
    assert ensure_model("race") == "Ready"
    path = models / "acme--race"
    assert fetched_files(str(path)) == FETCHED and (path / SHARD).read_bytes() == files[SHARD]
    assert tree(outside) == {}


def test_a_parent_link_swapped_back_while_the_room_is_measured_is_no_error(wk, hub, tmp_path, monkeypatch):
    """The user turns the models directory into a link just as the room for a new model is asked of it, and back
    into the directory while the mount point is looked up (between realpath's lstat and its readlink): the look-up
    is only for a message, never an error (it failed the model with EINVAL); the download goes on in the directory,
    nothing is written through the link."""
    hub.add_repo("acme/roomy", tiny_files("roomy"))
    wk.declare("roomy", "hf://acme/roomy", workspaces=["team-a"], subpath="alice")
    models = wk.volumes["team-a"] / "alice" / "models"
    models.mkdir(parents=True)
    outside = outside_dir(tmp_path)
    decoy = models.with_name("models.decoy")
    decoy.symlink_to(outside, target_is_directory=True)
    statvfs, readlink, moves = os.statvfs, os.readlink, []

    def link_in(path, *args, **kwargs):
        if str(path).startswith(str(models)) and not moves:
            exchange(models, decoy)
            moves.append("link in")
        return statvfs(path, *args, **kwargs)

    def directory_back(path, *args, **kwargs):
        if str(path) == str(models) and moves == ["link in"]:
            exchange(models, decoy)
            moves.append("directory back")
        return readlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "statvfs", link_in)
    monkeypatch.setattr(os, "readlink", directory_back)
    assert ensure_model("roomy") == "Ready", wk.registry.get_model("roomy").message
    assert moves == ["link in", "directory back"]
    assert not models.is_symlink() and fetched_files(str(models / "acme--roomy")) == FETCHED
    assert tree(outside) == {}


def test_a_parent_swapped_just_before_the_size_is_measured_fails_the_model(wk, hub, tmp_path, monkeypatch):
    """The one walk after the download (measuring the path) meets the link: the path is Failed with a message,
    never left Downloading behind its lease."""
    import weightkeeper.tasks.download

    hub.add_repo("acme/measured", tiny_files("measured"))
    wk.declare("measured", "hf://acme/measured", workspaces=["team-a"], subpath="alice")
    models = wk.volumes["team-a"] / "alice" / "models"
    outside = outside_dir(tmp_path, {"acme--measured/config.json": b"{}"})
    measure = weightkeeper.tasks.download.path_size

    def swap_then_measure(path, volumes, made):
        os.rename(models, models.with_name("models.away"))
        models.symlink_to(outside)
        return measure(path, volumes, made)

    monkeypatch.setattr(weightkeeper.tasks.download, "path_size", swap_then_measure)
    assert ensure_model("measured") == "Failed"
    model = wk.registry.get_model("measured")
    assert "cannot measure" in model.message and "symlink" in model.message
    assert model.local_paths[0].status == "Failed" and model.local_paths[0].lease is None
    monkeypatch.setattr(weightkeeper.tasks.download, "path_size", measure)
    models.unlink()
    os.rename(models.with_name("models.away"), models)
    assert ensure_model("measured") == "Ready"
    assert tree(outside) == {"acme--measured": "dir", "acme--measured/config.json": b"{}"}


def test_an_empty_directory_swapped_in_before_the_size_is_measured_is_never_recorded(wk, hub, monkeypatch):
    """The user owns the parent: just before the download's size is recorded they move the model directory away
    and put an empty one in its place, so that the model would count 0 bytes against the workspace's capacity
    while its files stay on the volume. Only the directory weightkeeper made is measured: the path fails."""
    import weightkeeper.tasks.download

    hub.add_repo("acme/weightless", tiny_files("weightless"))
    wk.declare("weightless", "hf://acme/weightless", workspaces=["team-a"], subpath="alice")
    path = Path(wk.registry.get_model("weightless").local_paths[0].path)
    measure = weightkeeper.tasks.download.path_size

    def swap_then_measure(where, volumes, made):
        os.rename(path, path.with_name("kept-away"))
        path.mkdir()
        return measure(where, volumes, made)

    monkeypatch.setattr(weightkeeper.tasks.download, "path_size", swap_then_measure)
    assert ensure_model("weightless") == "Failed"
    entry = wk.registry.get_model("weightless").local_paths[0]
    assert entry.status == "Failed" and entry.size_bytes in (None, 0) and entry.lease is None
    assert "cannot measure" in entry.message and "not the directory weightkeeper made there" in entry.message


def test_a_delete_raced_by_a_swapping_parent_removes_only_the_model(wk, hub, tmp_path):
    files = tiny_files("race-delete")
    hub.add_repo("acme/race-delete", files)
    wk.declare("race-delete", "hf://acme/race-delete", workspaces=["team-a"], subpath="alice")
    assert ensure_model("race-delete") == "Ready"
    models = wk.volumes["team-a"] / "alice" / "models"
    look_alike = {f"acme--race-delete/{name}": b"precious " + name.encode() for name in FETCHED}
    look_alike["acme--race-delete/.cache/weightkeeper/ready"] = b"precious marker"
    outside = outside_dir(tmp_path, {"precious": b"keep", **look_alike})
    before = tree(outside)
    with Swapper(models, outside) as attacker:
        time.sleep(0.05)
        state = delete_model("race-delete", return_state=True)
    assert tree(outside) == before, f"changed after {attacker.swaps} swaps"
    if not (state.is_completed() and state.result() == "Released"):
        assert wk.registry.get_model("race-delete").phase == "Deleting"  # refused this time: kept, retried
        assert delete_model("race-delete") == "Released"
    assert wk.registry.find_model("race-delete") is None
    assert not os.path.lexists(models / "acme--race-delete") and models.is_dir()
    assert tree(outside) == before


def test_a_delete_that_meets_a_swapped_link_retries_and_releases_once_it_is_gone(wk, hub, tmp_path):
    """The link is in the way when the delete starts and for a while after: the cleanup is refused each time
    (nothing outside is touched) and retried, and the same delete releases the model once the user restores."""
    hub.add_repo("acme/link-wait", tiny_files("link-wait"))
    wk.declare("link-wait", "hf://acme/link-wait", workspaces=["team-a"], subpath="alice")
    assert ensure_model("link-wait") == "Ready"
    models = wk.volumes["team-a"] / "alice" / "models"
    outside = outside_dir(tmp_path, {"acme--link-wait/config.json": b"precious"})
    moved = models.with_name("models.moved")
    models.rename(moved)
    models.symlink_to(outside, target_is_directory=True)

    refused = []

    def restore() -> None:  # once the delete has met the link and been refused, not after a fixed while
        try:
            refused.append(wait_until(lambda: wk.registry.get_model("link-wait").cleanup_attempts >= 1,
                                      what="the delete to meet the link"))
        finally:
            models.unlink()
            moved.rename(models)

    restorer = threading.Thread(target=restore)
    restorer.start()
    try:
        assert delete_model("link-wait") == "Released"
    finally:
        restorer.join()
    assert refused  # refused while the link was there, retried and released once it was gone
    assert (outside / "acme--link-wait" / "config.json").read_bytes() == b"precious"
    assert not os.path.lexists(models / "acme--link-wait")


# -- 3. a removal through a planted .cache link --------------------------------------------------------------------


def test_a_cache_swapped_for_a_link_is_never_written_or_emptied(wk, hub, tmp_path):
    files = tiny_files("cache-link")
    hub.add_repo("acme/cache-link", files)
    wk.declare("cache-link", "hf://acme/cache-link", workspaces=["team-a"])
    assert ensure_model("cache-link") == "Ready"
    path = Path(wk.registry.get_model("cache-link").local_paths[0].path)
    outside = outside_dir(tmp_path, {"weightkeeper/registry.db": b"SQLite format 3\0 not yours",
                                     f"weightkeeper/{SHARD}.part": b"keep", "weightkeeper/ready": b"keep"})
    before = tree(outside)
    shutil.rmtree(path / ".cache")  # needs write access to the model dir: done as root here
    (path / ".cache").symlink_to(outside)
    os.truncate(path / SHARD, 10)
    assert reconcile()[str(path)] == "postponed"  # the repair would write its partial file below .cache: refused
    assert tree(outside) == before
    assert "symlink" in wk.registry.get_model("cache-link").local_paths[0].message
    assert delete_model("cache-link") == "Released"
    assert not os.path.lexists(path) and tree(outside) == before


@pytest.mark.parametrize("planted", ["file", "directory"])
def test_a_path_filled_while_its_shared_copy_downloads_is_left_to_the_user(wk, hub, monkeypatch, planted):
    """The path was free when checked; while the shared copy downloads (hours, for a big model) the user puts a
    file there, or files in the empty directory: the link never replaces them. Moved away, the path links."""
    import weightkeeper.tasks.download

    hub.add_repo("acme/raced-link", tiny_files("raced-link"))
    wk.declare("raced-link", "hf://acme/raced-link", workspaces=["team-a"], download_policy="reuse-if-exists")
    path = Path(wk.registry.get_model("raced-link").local_paths[0].path)
    fill = weightkeeper.tasks.download._fill_shared_copy

    def fill_while_the_user_writes(*args, **kwargs):
        if planted == "file":
            path.write_bytes(b"the user's notes")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "notes.txt").write_bytes(b"the user's notes")
        return fill(*args, **kwargs)

    monkeypatch.setattr(weightkeeper.tasks.download, "_fill_shared_copy", fill_while_the_user_writes)
    assert ensure_model("raced-link") == "Failed"
    message = wk.registry.get_model("raced-link").local_paths[0].message
    assert ("is not a link" if planted == "file" else "is no longer empty") in message and "move it away" in message
    notes = path if planted == "file" else path / "notes.txt"
    assert notes.read_bytes() == b"the user's notes" and not path.is_symlink()
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".link")] == []
    monkeypatch.setattr(weightkeeper.tasks.download, "_fill_shared_copy", fill)
    os.rename(path, path.with_name("moved-away"))
    assert ensure_model("raced-link") == "Ready" and path.is_symlink()


# -- 4. adoption and a replaced directory --------------------------------------------------------------------------


def _rename_full_dir_onto(prepared: str, path: str, stop) -> None:
    """The attacker's process: again and again, rename a directory full of their files onto the model path
    whenever it is free (renameat2 RENAME_NOREPLACE), as a user who can write the parent can."""
    a, b = os.fsencode(prepared), os.fsencode(path)
    while not stop.is_set():
        _libc.renameat2(-100, a, -100, b, 1)


def test_a_directory_renamed_onto_the_path_while_it_is_made_is_never_adopted(tmp_path):
    """weightkeeper replaces an empty directory someone left at the path by one of its own; meanwhile the user
    renames a full directory there. Before, 103 tries in 300 adopted the user's directory as weightkeeper's."""
    import multiprocessing

    from weightkeeper.anchored import open_parent
    from weightkeeper.errors import DownloadError
    from weightkeeper.fsops import own_directory
    from weightkeeper.guard import VolumeRule

    volume = tmp_path / "vol"
    (volume / "alice" / "models").mkdir(parents=True)
    path, prepared = volume / "alice" / "models" / "acme--m", volume / "alice" / "prepared"
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    attacker = None
    adopted = made = refused = 0
    try:
        for _ in range(200):
            for p in (prepared, path):  # the attacker's first: else it is renamed onto the free path
                shutil.rmtree(p, ignore_errors=True)
            path.mkdir()  # the empty directory weightkeeper replaces
            staging = prepared.with_name("prepared.tmp")
            staging.mkdir()
            (staging / "thesis.tex").write_text("the user's")
            staging.rename(prepared)
            if attacker is None:
                attacker = context.Process(target=_rename_full_dir_onto, args=(str(prepared), str(path), stop))
                attacker.start()
            parent, leaf = open_parent(str(path), [VolumeRule(str(volume))], create=True)
            with parent:
                try:
                    d, _ = own_directory(parent, leaf, str(path), None)
                except DownloadError as e:
                    assert "someone else" in str(e) or "already holds files" in str(e), e
                    refused += 1
                    continue
                with d:
                    adopted += "thesis.tex" in d.entries()
                    made += not d.entries()
    finally:
        stop.set()
        if attacker is not None:
            attacker.join()
    assert adopted == 0 and made + refused == 200
    assert [n for n in os.listdir(path.parent) if n.endswith(".new")] == []  # no directory left half-made


def test_make_dir_refuses_a_taken_name_and_a_swapped_directory(tmp_path, monkeypatch):
    import weightkeeper.anchored as anchored
    from weightkeeper.fsops import made_here

    (tmp_path / "d" / "taken").mkdir(parents=True)
    with Dir.root(tmp_path / "d") as d:
        with pytest.raises(FileExistsError):
            d.make_dir("taken")
        mkdir = os.mkdir

        def made_then_swapped(name, mode=0o777, *, dir_fd=None):  # the attacker swaps in their own, owned by them
            mkdir(name, mode, dir_fd=dir_fd)
            os.rmdir(name, dir_fd=dir_fd)
            mkdir(name, mode, dir_fd=dir_fd)
            os.chown(name, 4242, 4242, dir_fd=dir_fd)

        monkeypatch.setattr(anchored.os, "mkdir", made_then_swapped)
        with pytest.raises(FileExistsError):
            d.make_dir("new")
        monkeypatch.undo()
        monkeypatch.setattr(os, "geteuid", lambda: 4242)  # owners mapped by the file system: no euid is compared
        with d.make_dir("mine") as mine:
            assert mine.entries() == []
            assert made_here(mine, mine.identity()) and made_here(mine, f"999:{os.fstat(mine.fd).st_ino}")  # remounted
            assert not made_here(mine, None) and not made_here(mine, f"{os.fstat(mine.fd).st_dev}:1")
    left = sorted(os.listdir(tmp_path / "d"))
    assert left[:1] == [n for n in left if n.endswith(".new")] and left[1:] == ["mine", "taken"]  # theirs is kept


@pytest.mark.parametrize("planted", ["same-names-and-sizes", "partial-files"])
def test_files_planted_after_declaration_are_never_adopted(wk, hub, planted):
    files = tiny_files(f"adopt-{planted}")
    hub.add_repo("acme/adopt", files)
    model = wk.declare("adopt", "hf://acme/adopt", workspaces=["team-a"])
    path = Path(model.local_paths[0].path)
    fake = {name: b"\0" * len(files[name]) for name in FETCHED}  # equal in size only
    if planted == "partial-files":  # a resumable download of the attacker's bytes, in a subdirectory
        fake = {f"{PARTIAL_DIR}/{name}.part": data for name, data in fake.items()}
    for rel, data in fake.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    before = tree(path)
    assert ensure_model("adopt") == "Failed"
    model = wk.registry.get_model("adopt")
    assert model.phase == "Failed" and model.local_paths[0].status == "Failed"
    message = model.local_paths[0].message
    assert "already holds files weightkeeper did not write" in message
    assert (SHARD if planted == "same-names-and-sizes" else ".cache") in message
    assert tree(path) == before
    assert delete_model("adopt") == "Released"
    assert tree(path) == before


def test_a_replaced_model_directory_is_left_to_its_owner_and_the_model_released(wk, hub):
    hub.add_repo("acme/replaced", tiny_files("replaced"))
    wk.declare("replaced", "hf://acme/replaced", workspaces=["team-a"], subpath="alice")
    assert ensure_model("replaced") == "Ready"
    alice = wk.volumes["team-a"] / "alice"
    path = Path(wk.registry.get_model("replaced").local_paths[0].path)
    os.rename(alice / "models", alice / "old")  # the user's own directory: they may rename it
    path.mkdir(parents=True)
    for name in FETCHED + ["my-thesis.tex"]:
        (path / name).write_bytes(b"the user's own " + name.encode())
    before = tree(alice / "models")
    with warnings_logged() as warnings:
        assert delete_model("replaced") == "Released"
    assert tree(alice / "models") == before
    assert any("is not the directory weightkeeper made there" in w and str(path) in w for w in warnings), warnings
    assert fetched_files(str(alice / "old" / "acme--replaced")) == FETCHED  # moved away: no longer at a model path


@pytest.mark.parametrize("victim", ["the user's own", "the user's empty", "another model's"])
def test_a_directory_exchanged_for_the_model_after_its_check_is_never_emptied(wk, hub, monkeypatch, victim):
    """The user owns the model's parent. Once cleanup has checked the model directory (it is the one weightkeeper
    made, with no mount inside), the user exchanges it with another directory of that parent: their own files, or
    another model's directory there. Cleanup empties the directory it checked, wherever it now is, and never the
    one exchanged to its name: that is left in place and the model released."""
    from weightkeeper import anchored

    hub.add_repo("acme/exchanged", tiny_files("exchanged"))
    wk.declare("exchanged", "hf://acme/exchanged", workspaces=["team-a"], subpath="alice")
    assert ensure_model("exchanged") == "Ready"
    alice = wk.volumes["team-a"] / "alice" / "models"
    path = Path(wk.registry.get_model("exchanged").local_paths[0].path)
    if victim != "another model's":
        other = alice / "thesis"
        other.mkdir()
        if victim == "the user's own":
            (other / "thesis.tex").write_bytes(b"years of work")
    else:
        hub.add_repo("acme/neighbour", tiny_files("neighbour"))
        wk.declare("neighbour", "hf://acme/neighbour", workspaces=["team-a"], subpath="alice")
        assert ensure_model("neighbour") == "Ready"
        other = Path(wk.registry.get_model("neighbour").local_paths[0].path)
    before = tree(other)
    checked = anchored.Dir.mount_inside

    def exchanging(self):  # the attacker acts right after the last check
        found = checked(self)
        if self.where == str(path):
            exchange(path, other)
        return found

    monkeypatch.setattr(anchored.Dir, "mount_inside", exchanging)
    with warnings_logged() as warnings:
        assert delete_model("exchanged") == "Released"
    assert path.is_dir() and tree(path) == before  # what now stands at the model's path: untouched
    assert tree(other) == {}  # weightkeeper's own directory, exchanged to the other name: emptied
    assert any("was replaced while weightkeeper emptied" in w for w in warnings), warnings


def test_a_download_still_writing_after_the_directory_was_emptied_keeps_the_model_until_it_is_gone(wk, hub,
                                                                                                   monkeypatch):
    """A download on another host, cut off from the registry, never learnt of the delete; its lease lapsed, so the
    cleanup went ahead. Right after the cleanup emptied the directory, the download writes a file into it. The
    directory is kept with the model, and the retried cleanup removes it: nothing is left untracked."""
    from weightkeeper import anchored

    wk.rewrite(hf_endpoint=hub.url, cleanup_retry_seconds=0.2, cleanup_retry_max_seconds=0.5)
    hub.add_repo("acme/zombie-writer", tiny_files("zombie-writer"))
    wk.declare("zombie-writer", "hf://acme/zombie-writer", workspaces=["team-a"])
    assert ensure_model("zombie-writer") == "Ready"
    path = Path(wk.registry.get_model("zombie-writer").local_paths[0].path)
    emptied, writes = anchored.Dir.clear, []

    def written_meanwhile(self):
        emptied(self)
        if self.where == str(path) and not writes:
            writes.append((path / "model-00001.safetensors.part").write_bytes(b"late bytes"))

    monkeypatch.setattr(anchored.Dir, "clear", written_meanwhile)
    with warnings_logged() as warnings:
        assert delete_model("zombie-writer") == "Released"
    assert writes and not os.path.lexists(path)
    assert any("holds model-00001.safetensors.part again after it was emptied" in w for w in warnings), warnings
    assert not any("was replaced" in w for w in warnings), warnings


def test_a_model_directory_replaced_after_it_was_made_fails_the_model_at_the_next_pass(wk, hub):
    """Whoever can write the model path's parent moves the Ready copy away and puts their own directory there, with
    the same bytes (so sizes and hashes pass) and a file of their own: the next pass sees it is not the directory
    weightkeeper made, fails the model and leaves it in place; the delete leaves it too."""
    files = tiny_files("replaced-own")
    hub.add_repo("acme/replaced-own", files)
    wk.declare("mine", "hf://acme/replaced-own", workspaces=["team-a"], subpath="alice")
    assert ensure_model("mine") == "Ready"
    path = Path(wk.registry.get_model("mine").local_paths[0].path)
    os.rename(path, path.with_name("theirs-now"))
    shutil.copytree(path.with_name("theirs-now"), path)
    (path / "my-thesis.tex").write_text("the user's")
    before = tree(path)
    outcome = reconcile()[str(path)]
    model = wk.registry.get_model("mine")
    assert model.phase == "Failed", (outcome, model.message)
    assert "replaced: not the directory weightkeeper made there" in model.message
    assert "already holds files weightkeeper did not write" in model.local_paths[0].message and tree(path) == before
    with warnings_logged() as warnings:
        assert delete_model("mine") == "Released"
    assert tree(path) == before
    assert any("is not the directory weightkeeper made there" in w for w in warnings), warnings


def test_a_shared_copy_planted_before_any_model_is_never_adopted_trusted_or_removed(wk, hub):
    """The user, who can write `<volume>/models`, makes the shared copy's directory first: right names and sizes,
    poisoned bytes, the ready marker, and a file of their own. weightkeeper never fills, links or trusts it."""
    files = tiny_files("planted-copy")
    commit = hub.add_repo("acme/planted-copy", files)
    copy = wk.volumes["team-a"] / "models" / "_artifacts" / "acme--planted-copy" / commit
    (copy / ".cache" / "weightkeeper").mkdir(parents=True)
    for name, data in files.items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes(b"E" * len(data))
    (copy / ".cache" / "weightkeeper" / "ready").write_text(commit + "\n")
    (copy / "my-thesis.tex").write_text("the user's")
    before = tree(copy)
    wk.declare("victim", "hf://acme/planted-copy", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("victim") == "Failed"
    model = wk.registry.get_model("victim")
    assert "already holds files weightkeeper did not write" in model.message and "move it away" in model.message
    assert tree(copy) == before and not os.path.lexists(model.local_paths[0].path)
    os.rename(copy, copy.with_name("moved-away"))
    assert ensure_model("victim") == "Ready"
    assert Path(model.local_paths[0].path, SHARD).read_bytes() == files[SHARD]


def test_a_shared_copy_replaced_after_it_was_made_fails_its_models_and_is_left_in_place(wk, hub):
    """The user renames the Ready shared copy away and puts their own directory there, with the same bytes (so
    sizes and hashes pass) and a file of their own: a pass sees it is not the copy weightkeeper made, fails its
    models, and once they are deleted forgets it without removing anything."""
    files = tiny_files("replaced-copy")
    commit = hub.add_repo("acme/replaced-copy", files)
    wk.declare("sharer", "hf://acme/replaced-copy", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("sharer") == "Ready"
    copy = wk.volumes["team-a"] / "models" / "_artifacts" / "acme--replaced-copy" / commit
    os.rename(copy, copy.with_name("theirs-now"))
    shutil.copytree(copy.with_name("theirs-now"), copy)
    (copy / "my-thesis.tex").write_text("the user's")
    before = tree(copy)
    assert reconcile()[str(copy)] == "failed"
    model = wk.registry.get_model("sharer")
    assert model.phase == "Failed" and "already holds files weightkeeper did not write" in model.message
    with warnings_logged() as warnings:
        assert delete_model("sharer") == "Released"  # its last user gone, the copy is collected: only forgotten
    assert tree(copy) == before and wk.registry.list_artifacts() == []
    assert any("is not the shared copy weightkeeper made there" in w for w in warnings), warnings


# -- 5. nesting ----------------------------------------------------------------------------------------------------


def test_a_model_inside_or_around_another_is_refused_at_declaration(wk):
    from weightkeeper.service import move_model

    wk.declare("outer", "hf://acme/outer", workspaces=["team-a"])
    with pytest.raises(InvalidInputError, match="nests with model 'outer'"):
        wk.declare("inner", "hf://acme/inner", workspaces=["team-a"], subpath="models/acme--outer")
    wk.declare("deep", "hf://acme/deep", workspaces=["team-a"], subpath="models/x")
    with pytest.raises(InvalidInputError, match="nests with model 'deep'"):
        wk.declare("wrapper", "hf://x", workspaces=["team-a"])  # <vol>/models/x holds deep's path
    with pytest.raises(InvalidInputError, match="nests with model 'outer'"):
        move_model(wk.settings, wk.registry, "deep", subpath="models/acme--outer", download_policy=None)
    for subpath in ("alice/.cache", ".cache/models", "models/acme--outer/.cache"):
        with pytest.raises(InvalidInputError, match="starting with '.'"):
            wk.declare("dotted", "hf://acme/dotted", workspaces=["team-a"], subpath=subpath)
    assert sorted(m.name for m in wk.registry.list_models()) == ["deep", "outer"]


@pytest.mark.parametrize("subpath, expected", [("models/acme--outer", "nests with model 'outer'"),
                                               ("alice/.cache", "starting with '.'")])
def test_the_cli_refuses_nesting_and_dot_segments_in_one_line(wk, subpath, expected):
    wk.declare("outer", "hf://acme/outer", workspaces=["team-a"])
    proc = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "model", "create", "intruder", "--source",
                           "hf://acme/intruder", "--workspace", "team-a", "--subpath", subpath],
                          env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config), COLUMNS="80"),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert [m.name for m in wk.registry.list_models()] == ["outer"]


# -- 6. and 7. planted partial-file companions ----------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("planted", ["fifo", "fifo-held-open", "link-to-dev-zero", "100-mib-file",
                                     "claims-unwritten-bytes"])
def test_a_planted_ranges_file_neither_blocks_nor_floods_the_download(wk, hub, monkeypatch, planted):
    monkeypatch.setattr(download, "PART_BYTES", 32 * 1024)  # the shard goes as 8 ranges, with a .ranges file
    files = tiny_files(f"ranges-{planted}", shards=1, shard_size=256 * 1024)
    hub.add_repo("acme/ranges", files)
    wk.declare("ranges", "hf://acme/ranges", workspaces=["team-a"])
    path = wk.made_by_an_earlier_run("ranges")
    ranges = path / PARTIAL_DIR / f"{ONE_SHARD}.part.ranges"
    ranges.parent.mkdir(parents=True)
    writer = None
    if planted.startswith("fifo"):
        os.mkfifo(ranges)
        if planted == "fifo-held-open":  # a blocking read would wait for the attacker forever
            writer = os.open(ranges, os.O_RDWR | os.O_NONBLOCK)
    elif planted == "link-to-dev-zero":
        ranges.symlink_to("/dev/zero")
    elif planted == "claims-unwritten-bytes":  # every range done, the partial file short: nothing to hash
        size = len(files[ONE_SHARD])
        parts = [[p.start, p.end, p.end - p.start] for p in download.plan_parts(size)]
        ranges.write_text(json.dumps({"size": size, "parts": parts}))
        ranges.with_name(f"{ONE_SHARD}.part").write_bytes(b"x" * 1000)
    else:
        with open(ranges, "wb") as f:
            f.truncate(100 << 20)
    started = time.monotonic()
    try:
        assert ensure_model("ranges") == "Ready", wk.registry.get_model("ranges").message
    finally:
        if writer is not None:
            os.close(writer)
    assert time.monotonic() - started < 30
    assert (path / ONE_SHARD).read_bytes() == files[ONE_SHARD]
    assert not os.path.lexists(ranges) and os.path.exists("/dev/zero")


@pytest.mark.parametrize("how", ["hard-link", "symlink"])
def test_a_link_planted_as_the_partial_file_never_changes_its_target(wk, hub, tmp_path, how):
    files = tiny_files(f"part-{how}")
    hub.add_repo("acme/part-link", files)
    wk.declare("part-link", "hf://acme/part-link", workspaces=["team-a"])
    path = wk.made_by_an_earlier_run("part-link")
    outside = outside_dir(tmp_path, {"shadow": b"root:$6$hash:19000:0:99999:7:::\n" * 40})
    before = tree(outside)
    part = path / PARTIAL_DIR / f"{SHARD}.part"
    part.parent.mkdir(parents=True)
    if how == "hard-link":
        os.link(outside / "shadow", part)
    else:
        part.symlink_to(outside / "shadow")
    hub.reset_stats()
    assert ensure_model("part-link") == "Ready"
    assert (path / SHARD).read_bytes() == files[SHARD]
    assert hub.get_count("acme/part-link", SHARD) == 1  # nothing resumed from the planted file: one clean fetch
    assert tree(outside) == before and (outside / "shadow").stat().st_nlink == 1


@pytest.mark.without_prefect_server
@pytest.mark.parametrize("planted", ["fifo", "directory"])
def test_a_file_swapped_after_its_stat_is_a_problem_of_the_copy_never_an_error(tmp_path, planted):
    """Its owner swaps a checked file for a FIFO (or a directory) between its stat and its open: the check names that
    file as not a regular file instead of failing the whole copy with an error."""
    import hashlib

    from weightkeeper.anchored import Dir
    from weightkeeper.download import RemoteFile
    from weightkeeper.verify import _check_entry

    data = b"weights" * 100
    (tmp_path / "model.safetensors").write_bytes(data)
    regular = os.lstat(tmp_path / "model.safetensors")
    os.unlink(tmp_path / "model.safetensors")
    os.mkfifo(tmp_path / "model.safetensors") if planted == "fifo" else os.mkdir(tmp_path / "model.safetensors")
    remote = RemoteFile("model.safetensors", len(data), "0" * 40, sha256=hashlib.sha256(data).hexdigest())
    d = Dir.root(tmp_path)
    try:
        d.lstat = lambda name: regular  # what its stat saw, before the swap
        problem = _check_entry(d, "model.safetensors", "model.safetensors", len(data), remote)
    finally:
        d.close()
    assert problem is not None and problem.reason == "not a regular file"


def test_a_repair_never_writes_another_users_file_moved_in_as_a_partial_file(wk, hub, users_volume, monkeypatch):
    """The shelf owner (a process of uid ATTACKER) removes a shard of their copy and moves in, at its partial file's
    name, another user's setuid program, which they may not write. The service's repair (root) would have resumed
    it, writing the attacker's bytes into that inode, its owner and setuid bit kept. It never writes a partial file
    not its own: it makes a new one, so the shard is root's new file without setuid and the program is unchanged."""
    from weightkeeper.tasks.verify import verify_shared_copy

    files = tiny_files("partial-write")  # the attacker's repository: they choose the shard's bytes
    copy = shelf_copy(wk, hub, monkeypatch, users_volume, "acme/partial-write", files)
    program = b"#!/bin/sh\necho victim\n" + b"x" * (len(files[SHARD]) + 100)
    victims = victim_file(users_volume, program, 0o4755)
    held = os.open(victims, os.O_RDONLY)  # the victim's inode, whatever name it gets
    try:
        moved = as_user(ATTACKER, f"import os; os.unlink({str(copy / SHARD)!r}); "
                                  f"os.rename({str(victims)!r}, {str(copy / PARTIAL_DIR / SHARD)!r} + '.part')")
        assert moved.returncode == 0, moved.stderr
        assert verify_shared_copy(wk.registry.get_model("mine").local_paths[0].artifact_id) == "repaired"
        shard, theirs = os.stat(copy / SHARD), os.fstat(held)
        assert (copy / SHARD).read_bytes() == files[SHARD]
        assert shard.st_ino != theirs.st_ino and shard.st_uid == os.geteuid() and not shard.st_mode & stat.S_ISUID
        assert (theirs.st_uid, stat.S_IMODE(theirs.st_mode), os.pread(held, len(program) + 1, 0)) == (
            VICTIM, 0o4755, program)
    finally:
        os.close(held)


@pytest.mark.parametrize("policy", ["always-download", "reuse-if-exists", "legacy"])
def test_a_link_a_user_put_at_the_path_is_never_removed_by_the_delete(wk, hub, tmp_path, policy):
    """The user who owns the model's parent puts a link of theirs at the path: before the download (an own copy
    refuses it, and makes nothing there), or in place of weightkeeper's link to the shared copy (the pass fails
    the path, naming it; `legacy`: its entry recorded before what was made there was). Neither is what
    weightkeeper made there: the delete leaves it in place and releases."""
    from sqlalchemy import update

    from weightkeeper.registry.schema import LocalPathRow

    hub.add_repo("acme/theirlink", tiny_files(f"theirlink-{policy}"))
    wk.declare("theirlink", "hf://acme/theirlink", workspaces=["team-a"],
               download_policy="always-download" if policy == "always-download" else "reuse-if-exists",
               **({"subpath": "alice"} if policy == "always-download" else {}))  # a shared one: in the models root
    path = Path(wk.registry.get_model("theirlink").local_paths[0].path)
    theirs = outside_dir(tmp_path, {"notes.txt": b"the user's own"})
    if policy == "always-download":
        path.parent.mkdir(parents=True)
        path.symlink_to(theirs)
        assert ensure_model("theirlink") == "Failed"
        assert wk.registry.get_model("theirlink").local_paths[0].made is None  # nothing made there
    else:
        assert ensure_model("theirlink") == "Ready" and path.is_symlink()
        path.unlink()
        path.symlink_to(theirs)
        assert reconcile()[str(path)] == "failed"
        if policy == "legacy":
            with wk.registry._tx() as s:  # as migration 0005 leaves an entry recorded before it
                s.execute(update(LocalPathRow).values(made="legacy"))
    with warnings_logged() as warnings:
        assert delete_model("theirlink") == "Released"
    assert os.readlink(path) == str(theirs) and tree(theirs) == {"notes.txt": b"the user's own"}
    assert any("not what weightkeeper made there" in w and str(path) in w for w in warnings), warnings
