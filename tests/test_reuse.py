"""A new commit of a repository on a volume takes its unchanged files from the verified copies already there."""

from __future__ import annotations

import ctypes
import os
import random
import stat

import pytest

from conftest import tiny_files
from test_attacks import ATTACKER, VICTIM, as_user, shelf_copy, users_volume, victim_file  # noqa: F401 - a fixture
from test_faults import tmpfs
from test_lifecycle import fetched_files
from test_metrics import Scraper, moved
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.planning import reuse_plan

SHARDS = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


def commit_files(tag: str, changed: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Four shards, a config and a tokenizer; the files in `changed` get content of their own."""
    files = {name: random.Random(name).randbytes(96 * 1024) for name in SHARDS}
    files.update({"config.json": b'{"model_type": "tiny"}\n', "tokenizer.json": b'{"version": "1.0"}\n'})
    for name in changed:
        files[name] = random.Random(f"{tag}/{name}").randbytes(len(files[name])) if name in SHARDS else \
            f'{{"revision": "{tag}"}}\n'.encode()
    return files


def two_commits(hub, repo: str) -> tuple[str, str]:
    """Commit A, then B on main: B changes the second shard and config.json."""
    a = hub.add_repo(repo, commit_files("A"))
    b = hub.add_repo(repo, commit_files("B", (SHARDS[1], "config.json")))
    return a, b


def fetched(hub, repo: str) -> list[str]:
    return sorted(r.filename for r in hub.requests if r.method == "GET" and r.repo_id == repo and r.filename
                  and r.status in (200, 206))


def test_the_plan_matches_by_digest_and_size_and_never_the_directory_being_filled():
    a = {"path": "x.safetensors", "size": 3, "blobId": "b" * 40, "sha256": "1" * 64}
    other = {"path": "renamed.safetensors", "size": 3, "blobId": "c" * 40, "sha256": "1" * 64}
    plain = {"path": "config.json", "size": 5, "blobId": "d" * 40, "sha256": None}
    assert reuse_plan([a, plain], [("/v/m/self", [a]), ("/v/m/old", [other, plain])], skip="/v/m/self") == {
        "x.safetensors": ("/v/m/old", "renamed.safetensors"), "config.json": ("/v/m/old", "config.json")}
    assert reuse_plan([a], [("/v/m/old", [{**other, "size": 4}])]) == {}  # same digest, other size: not it
    assert reuse_plan([plain], [("/v/m/old", [{**plain, "blobId": "e" * 40}])]) == {}
    assert reuse_plan([{"path": "s3.bin", "size": 3, "blobId": "", "md5": "f" * 32}],
                      [("/v/m/s3", [{"path": "s3.bin", "size": 3, "blobId": "", "md5": "f" * 32}])]) == {
        "s3.bin": ("/v/m/s3", "s3.bin")}


def test_a_new_commit_of_a_model_on_the_volume_fetches_only_what_changed(wk, hub, download_limit):
    a, b = two_commits(hub, "acme/evolve")
    scraper = Scraper(wk)
    wk.declare("v-a", f"hf://acme/evolve@{a}", workspaces=["team-a"])
    assert ensure_model("v-a") == "Ready"
    before, old = scraper.samples(), wk.registry.get_model("v-a").local_paths[0].path
    hub.reset_stats()
    wk.declare("v-b", "hf://acme/evolve@main", workspaces=["team-a"], subpath="models/next")
    assert ensure_model("v-b") == "Ready"
    new = wk.registry.get_model("v-b").local_paths[0].path
    assert fetched(hub, "acme/evolve") == ["config.json", SHARDS[1]]  # exactly what B changed
    for name in (SHARDS[0], SHARDS[2], SHARDS[3], "tokenizer.json"):
        assert os.stat(f"{old}/{name}").st_ino == os.stat(f"{new}/{name}").st_ino  # one inode, two trees
    expected = commit_files("B", (SHARDS[1], "config.json"))
    assert {n: open(f"{new}/{n}", "rb").read() for n in fetched_files(new)} == expected
    after = scraper.samples()
    reused = 3 * 96 * 1024 + len(expected["tokenizer.json"])
    assert moved(before, after, "weightkeeper_reused_bytes_total", workspace="team-a", how="hard link") == reused
    assert moved(before, after, "weightkeeper_downloaded_bytes_total", workspace="team-a", source="hub") == (
        96 * 1024 + len(expected["config.json"]))


def test_shared_copies_of_two_commits_share_the_unchanged_files(wk, hub):
    a, b = two_commits(hub, "acme/evolve-shared")
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("s-a", f"hf://acme/evolve-shared@{a}", **shared)
    assert ensure_model("s-a") == "Ready"
    hub.reset_stats()
    wk.declare("s-b", "hf://acme/evolve-shared@main", subpath="models/next", **shared)
    assert ensure_model("s-b") == "Ready"
    assert fetched(hub, "acme/evolve-shared") == ["config.json", SHARDS[1]]
    copies = wk.volumes["team-a"] / "models" / "_artifacts" / "acme--evolve-shared"
    assert os.stat(copies / a / SHARDS[0]).st_ino == os.stat(copies / b / SHARDS[0]).st_ino
    assert [a.state for a in wk.registry.list_artifacts()] == ["Ready", "Ready"]


def test_a_copy_changed_since_it_was_verified_or_swapped_for_a_link_is_fetched_not_passed_on(wk, hub, tmp_path):
    a, b = two_commits(hub, "acme/evolve-bad")
    wk.declare("bad-a", f"hf://acme/evolve-bad@{a}", workspaces=["team-a"])
    assert ensure_model("bad-a") == "Ready"
    old = wk.registry.get_model("bad-a").local_paths[0].path
    with open(f"{old}/{SHARDS[2]}", "r+b") as f:  # the attacker rewrites bytes of a verified file in place
        f.write(b"\0" * 64)
    outside = tmp_path / "secret"
    outside.write_bytes(commit_files("A")[SHARDS[3]])  # the right bytes, outside every volume
    os.unlink(f"{old}/{SHARDS[3]}")
    os.symlink(outside, f"{old}/{SHARDS[3]}")
    hub.reset_stats()
    wk.declare("bad-b", "hf://acme/evolve-bad@main", workspaces=["team-a"], subpath="models/next")
    assert ensure_model("bad-b") == "Ready"
    new = wk.registry.get_model("bad-b").local_paths[0].path
    assert fetched(hub, "acme/evolve-bad") == sorted(["config.json", SHARDS[1], SHARDS[2], SHARDS[3]])
    assert open(f"{new}/{SHARDS[2]}", "rb").read() == commit_files("B")[SHARDS[2]]
    assert not os.path.islink(f"{new}/{SHARDS[3]}") and os.stat(f"{new}/{SHARDS[3]}").st_ino != outside.stat().st_ino
    assert os.stat(f"{new}/{SHARDS[0]}").st_ino == os.stat(f"{old}/{SHARDS[0]}").st_ino  # the rest still linked
    assert not [p for p in (wk.volumes["team-a"] / "models" / "next").rglob("*.reuse")]  # no scratch left


def test_across_filesystems_a_file_is_copied_not_linked(wk, hub, download_limit):
    a, b = two_commits(hub, "acme/evolve-far")
    scraper = Scraper(wk)
    wk.declare("far-a", f"hf://acme/evolve-far@{a}", workspaces=["team-a"])
    assert ensure_model("far-a") == "Ready"
    old = wk.registry.get_model("far-a").local_paths[0].path
    with tmpfs(wk.volumes["team-a"] / "fast", 2 << 30):  # a limit, not memory taken: free beyond the margin
        before = scraper.samples()
        hub.reset_stats()
        wk.declare("far-b", "hf://acme/evolve-far@main", workspaces=["team-a"], subpath="fast")
        assert ensure_model("far-b") == "Ready"
        new = wk.registry.get_model("far-b").local_paths[0].path
        assert fetched(hub, "acme/evolve-far") == ["config.json", SHARDS[1]]
        assert os.stat(new).st_dev != os.stat(old).st_dev
        assert open(f"{new}/{SHARDS[0]}", "rb").read() == open(f"{old}/{SHARDS[0]}", "rb").read()
        assert moved(before, scraper.samples(), "weightkeeper_reused_bytes_total", workspace="team-a",
                     how="copy") > 3 * 96 * 1024
        from weightkeeper.flows.delete_model import delete_model
        assert delete_model("far-b") == "Released"


def test_a_repair_takes_a_lost_file_from_another_copy_before_fetching(wk, hub, download_limit):
    from weightkeeper.flows.reconcile import reconcile

    a, b = two_commits(hub, "acme/evolve-repair")
    wk.declare("r-a", f"hf://acme/evolve-repair@{a}", workspaces=["team-a"])
    wk.declare("r-b", "hf://acme/evolve-repair@main", workspaces=["team-a"], subpath="models/next")
    assert ensure_model("r-a") == "Ready" and ensure_model("r-b") == "Ready"
    old, new = (wk.registry.get_model(n).local_paths[0].path for n in ("r-a", "r-b"))
    os.unlink(f"{new}/{SHARDS[2]}")  # lost from r-b; r-a (commit A) still has the same bytes
    scraper = Scraper(wk)
    before = scraper.samples()
    hub.reset_stats()
    reconcile()
    assert wk.registry.get_model("r-b").phase == "Ready"
    assert fetched(hub, "acme/evolve-repair") == []
    assert os.stat(f"{new}/{SHARDS[2]}").st_ino == os.stat(f"{old}/{SHARDS[2]}").st_ino
    assert moved(before, scraper.samples(), "weightkeeper_reused_bytes_total", workspace="team-a",
                 how="hard link") == 96 * 1024


def test_a_gated_repositorys_files_never_reach_a_model_without_its_token(wk, hub):
    from prefect.blocks.system import Secret

    token = "hf_GATEDreuse1234567890"
    hub.add_repo("acme/gated-reuse", commit_files("A"), gated=True, token=token)
    Secret(value=token).save("hf-token-gated-reuse", overwrite=True)
    wk.declare("entitled", "hf://acme/gated-reuse", workspaces=["team-a"], token_block="hf-token-gated-reuse")
    wk.declare("entitled-2", "hf://acme/gated-reuse", workspaces=["team-a"], subpath="models/second",
               download_policy="reuse-if-exists", token_block="hf-token-gated-reuse")
    assert ensure_model("entitled") == "Ready" and ensure_model("entitled-2") == "Ready"
    # the gated files are on the volume, as an own copy and a shared copy; the third comes after a failed one
    for i, shared in enumerate((False, True, True)):
        name = f"freeloader-{i}"
        wk.declare(name, "hf://acme/gated-reuse", workspaces=["team-a"], subpath=f"models/{name}",
                   **({"download_policy": "reuse-if-exists"} if shared else {}))
        assert ensure_model(name) == "Failed" and "gated" in wk.registry.get_model(name).message
        path = wk.registry.get_model(name).local_paths[0].path
        assert not os.path.lexists(path) or fetched_files(path) == []
    hub.reset_stats()
    wk.declare("entitled-3", "hf://acme/gated-reuse", workspaces=["team-a"], subpath="models/third",
               token_block="hf-token-gated-reuse")
    assert ensure_model("entitled-3") == "Ready" and fetched(hub, "acme/gated-reuse") == []  # same token: reused


def test_a_planted_file_of_another_size_is_refused_before_any_byte_is_copied(wk, hub, caplog):
    """The user swaps a verified copy's file for a sparse 256 MiB one (in a directory they renamed there): reuse
    refuses it on its size before linking or copying, so it never fills the volume; the file is fetched."""
    a, _ = two_commits(hub, "acme/evolve-sparse")
    wk.declare("sparse-a", f"hf://acme/evolve-sparse@{a}", workspaces=["team-a"])
    assert ensure_model("sparse-a") == "Ready"
    old = wk.registry.get_model("sparse-a").local_paths[0].path
    os.unlink(f"{old}/{SHARDS[0]}")
    with open(f"{old}/{SHARDS[0]}", "wb") as planted:
        planted.truncate(256 << 20)
    hub.reset_stats()
    wk.declare("sparse-b", "hf://acme/evolve-sparse@main", workspaces=["team-a"], subpath="models/next")
    assert ensure_model("sparse-b") == "Ready"
    assert SHARDS[0] in fetched(hub, "acme/evolve-sparse")
    assert f"{256 << 20} bytes, not the {96 * 1024} recorded" in caplog.text
    new = wk.registry.get_model("sparse-b").local_paths[0].path
    assert open(f"{new}/{SHARDS[0]}", "rb").read() == commit_files("A")[SHARDS[0]]


def test_a_file_someone_else_may_write_is_copied_never_linked(wk, hub):
    """A file others may write is copied, never linked; another user's file in weightkeeper's directory (moved there)
    is not taken at all: it is fetched."""
    a, b = two_commits(hub, "acme/evolve-open")
    wk.declare("open-a", f"hf://acme/evolve-open@{a}", workspaces=["team-a"])
    assert ensure_model("open-a") == "Ready"
    old = wk.registry.get_model("open-a").local_paths[0].path
    os.chmod(f"{old}/{SHARDS[0]}", 0o666)  # as a job running as its owner could leave it
    os.chown(f"{old}/{SHARDS[2]}", 4242, 4242)  # another user's file
    hub.reset_stats()
    wk.declare("open-b", "hf://acme/evolve-open@main", workspaces=["team-a"], subpath="models/next")
    assert ensure_model("open-b") == "Ready"
    new = wk.registry.get_model("open-b").local_paths[0].path
    assert fetched(hub, "acme/evolve-open") == sorted(["config.json", SHARDS[1], SHARDS[2]])
    for name in (SHARDS[0], SHARDS[2]):  # a copy of their own: taken, or fetched
        assert os.stat(f"{new}/{name}").st_ino != os.stat(f"{old}/{name}").st_ino
        assert open(f"{new}/{name}", "rb").read() == open(f"{old}/{name}", "rb").read()
        assert stat.S_IMODE(os.stat(f"{new}/{name}").st_mode) == 0o644  # readable, once its digest matched
    assert os.stat(f"{new}/{SHARDS[3]}").st_ino == os.stat(f"{old}/{SHARDS[3]}").st_ino



def test_copies_never_eat_into_the_margin_a_download_leaves_free(wk, hub):
    """The fault: the volume of a new commit's shared copy is nearly full. Its files are taken before the
    download's space check, so reuse keeps the margin itself: a copy that would leave less than
    `free_space_margin_bytes` free is never written, and the model fails on the space check."""
    a, _ = two_commits(hub, "acme/evolve-full")
    wk.declare("full-a", f"hf://acme/evolve-full@{a}", workspaces=["team-a"])
    assert ensure_model("full-a") == "Ready"
    with tmpfs(wk.volumes["team-a"] / "models" / "_artifacts", 1 << 20) as shelf:  # another filesystem: copies
        os.chmod(shelf, 0o755)
        free = os.statvfs(shelf).f_bavail * os.statvfs(shelf).f_frsize
        wk.rewrite(hf_endpoint=hub.url, free_space_margin_bytes=free - 64 * 1024)  # room for the small files
        wk.declare("full-b", "hf://acme/evolve-full@main", workspaces=["team-a"], subpath="models/next",
                   download_policy="reuse-if-exists")
        assert ensure_model("full-b") == "Failed"
        assert "free_space_margin_bytes" in wk.registry.get_model("full-b").message
        assert os.statvfs(shelf).f_bavail * os.statvfs(shelf).f_frsize >= free - 64 * 1024  # nothing copied below
        assert not [p for p in shelf.rglob("*.safetensors*")]


def test_a_fifo_or_device_planted_in_a_copy_is_never_opened(wk, hub):
    """The user swaps two files of a verified copy for a FIFO (a writer of theirs waiting for a reader) and a device
    node: opening either can act (the writer let go, a driver's open), so reuse looks at what stands there first and
    opens neither (inotify sees every open); both files are fetched."""
    a, _ = two_commits(hub, "acme/evolve-nodes")
    wk.declare("nodes-a", f"hf://acme/evolve-nodes@{a}", workspaces=["team-a"])
    assert ensure_model("nodes-a") == "Ready"
    old = wk.registry.get_model("nodes-a").local_paths[0].path
    for name in (SHARDS[0], SHARDS[2]):
        os.unlink(f"{old}/{name}")
    os.mkfifo(f"{old}/{SHARDS[0]}")
    os.mknod(f"{old}/{SHARDS[2]}", stat.S_IFCHR | 0o644, os.makedev(1, 3))  # /dev/null's numbers
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init1(os.O_NONBLOCK)
    assert watch >= 0 and all(libc.inotify_add_watch(watch, f"{old}/{name}".encode(), 0x20) >= 0  # IN_OPEN
                              for name in (SHARDS[0], SHARDS[2]))
    try:
        hub.reset_stats()
        wk.declare("nodes-b", "hf://acme/evolve-nodes@main", workspaces=["team-a"], subpath="models/next")
        assert ensure_model("nodes-b") == "Ready"
        assert {SHARDS[0], SHARDS[2]} <= set(fetched(hub, "acme/evolve-nodes"))
        try:
            opened = os.read(watch, 4096)
        except BlockingIOError:
            opened = b""
        assert opened == b"", "a planted FIFO or device was opened"
    finally:
        os.close(watch)


def test_a_file_checked_only_by_its_git_sha1_is_never_taken_from_bytes_a_user_could_choose(wk, hub, caplog):
    """The attacker may write a verified copy's files (their own directory, their shelf, a group-writable file) and
    plants, in place of a reviewed code file in their directory, bytes whose git blob sha1 collides with it
    (simulated: the very bytes, as what matters is where they stand). A file checked only by that sha1 is never
    taken from an inode the user owns or others may write: the victim's is fetched. An LFS file there is still
    copied (its sha256 is hashed). A sha1-only file in weightkeeper's own inode is fetched too: in a directory the user
    owns, they may have put there any inode of weightkeeper's (one holding bytes of a repository they chose)."""
    code = {"modeling_tiny.py": b"def forward(x):\n    return x\n", "chat_template.jinja": b"{{ messages }}\n",
            "tokenization_tiny.py": b"class Tok:\n    pass\n"}
    a = hub.add_repo("acme/evolve-sha1", {**commit_files("A"), **code})
    hub.add_repo("acme/evolve-sha1", {**commit_files("B", (SHARDS[1], "config.json")), **code})
    wk.declare("sha1-a", f"hf://acme/evolve-sha1@{a}", workspaces=["team-a"])
    assert ensure_model("sha1-a") == "Ready"
    old = wk.registry.get_model("sha1-a").local_paths[0].path
    for name in ("modeling_tiny.py", SHARDS[0]):  # the user's own files, put in place of weightkeeper's
        data = open(f"{old}/{name}", "rb").read()
        os.unlink(f"{old}/{name}")
        with open(f"{old}/{name}", "wb") as planted:
            planted.write(data)
        os.chown(f"{old}/{name}", 4242, 4242)
    os.chown(old, 4242, 4242)  # their own directory, as their job made it: their files there are theirs to offer
    os.chmod(f"{old}/tokenizer.json", 0o664)  # weightkeeper's inode, but its group may write it
    os.chmod(f"{old}/tokenization_tiny.py", 0o646)  # ... or anyone
    hub.reset_stats()
    wk.declare("sha1-b", "hf://acme/evolve-sha1@main", workspaces=["team-a"], subpath="models/next")
    assert ensure_model("sha1-b") == "Ready"
    new = wk.registry.get_model("sha1-b").local_paths[0].path
    assert fetched(hub, "acme/evolve-sha1") == sorted(
        ["config.json", SHARDS[1], "modeling_tiny.py", "tokenizer.json", "tokenization_tiny.py", "chat_template.jinja"])
    for name in ("modeling_tiny.py", "tokenizer.json", "tokenization_tiny.py"):
        assert os.stat(f"{new}/{name}").st_ino != os.stat(f"{old}/{name}").st_ino
        assert os.stat(f"{new}/{name}").st_uid == os.geteuid()
    assert "not weightkeeper's alone, and its digest would not tell a planted collision" in caplog.text
    assert os.stat(f"{new}/{SHARDS[0]}").st_ino != os.stat(f"{old}/{SHARDS[0]}").st_ino  # copied, hashed by sha256
    assert open(f"{new}/{SHARDS[0]}", "rb").read() == commit_files("A")[SHARDS[0]]
    assert os.stat(f"{new}/chat_template.jinja").st_ino != os.stat(f"{old}/chat_template.jinja").st_ino
    expected = {**commit_files("B", (SHARDS[1], "config.json")), **code}
    assert {n: open(f"{new}/{n}", "rb").read() for n in fetched_files(new)} == expected


@pytest.mark.parametrize("whose", ["victims", "roots"])
def test_a_repair_never_lets_the_shelf_owner_read_a_file_they_moved_into_their_copy(wk, hub, users_volume, monkeypatch,
                                                                                     whose):
    """The shelf owner (a process of uid ATTACKER) moves a file they may not read, of a shard's size, into an older
    copy of theirs at that shard's name, and removes the shard from the newer copy, whose repair (root) takes it
    from the older one, and watches its folder of scratch files. Another user's file is refused there (it is neither
    root's nor the copy owner's): its bytes never reach a scratch file. Root's own file (group-writable: copied,
    not linked) is copied into a scratch file only root may read, dropped when its digest fails: the attacker reads
    nothing. The shard is fetched."""
    from weightkeeper.anchored import Dir
    from weightkeeper.tasks.verify import verify_shared_copy

    files = tiny_files("reuse-leak")
    shard = "model-00001-of-00002.safetensors"
    source = shelf_copy(wk, hub, monkeypatch, users_volume, "acme/reuse-leak", files, "old")
    target = shelf_copy(wk, hub, monkeypatch, users_volume, "acme/reuse-leak", {**files, "config.json": b"{}\n"},
                        "new", "@main")
    secret = os.urandom(len(files[shard]))
    theirs = whose == "victims"
    victims = victim_file(users_volume, secret, 0o600 if theirs else 0o660, VICTIM if theirs else 0)
    assert "PermissionError" in as_user(ATTACKER, f"open({str(victims)!r}, 'rb')").stderr
    moved = as_user(ATTACKER, f"import os; os.unlink({str(target / shard)!r}); "
                              f"os.rename({str(victims)!r}, {str(source / shard)!r})")
    assert moved.returncode == 0, moved.stderr
    scratch, read = [], []
    take = Dir.take

    def watched(self, *args, **kwargs):  # the attacker, told of each new scratch file (inotify), opens it
        how, fd = take(self, *args, **kwargs)
        for name in (n for n in self.entries() if n.endswith(".reuse")):
            scratch.append(open(self.path(name), "rb").read())
            read.append(as_user(ATTACKER, f"print(open({self.path(name)!r}, 'rb').read().hex())"))
        return how, fd

    monkeypatch.setattr(Dir, "take", watched)
    hub.reset_stats()
    assert verify_shared_copy(wk.registry.get_model("new").local_paths[0].artifact_id) == "repaired"
    assert (target / shard).read_bytes() == files[shard] and fetched(hub, "acme/reuse-leak") == [shard]
    assert all(r.stdout == "" and "PermissionError" in r.stderr for r in read), read
    assert (secret not in scratch) if theirs else (scratch == [secret])
    assert (source / shard).read_bytes() == secret


@pytest.mark.parametrize("attack", ["swapped-in", "moved-in-by-owner", "moved-in-by-mode"])
def test_a_file_checked_only_by_its_git_sha1_is_never_linked_from_where_a_user_may_rename(wk, hub, attack):
    """The attacker's always-download models (in their subpath) hold the public repository the victim uses and one
    of theirs whose code file's git blob sha1 collides with the public one's (simulated: the very bytes, as what
    matters is where they stand). weightkeeper made both directories and owns their files: each file is
    "weightkeeper's alone". But the attacker may rename there (they own their subpath or the directories, or anyone
    may write in them, sticky bit unset): they swap the two directories, or move their file over the public one's.
    The victim's new commit never hard-links that sha1-only file (its inode holds bytes the attacker chose): it is
    fetched. An LFS file (sha256, hashed) may still be linked."""
    from test_attacks import exchange

    code = {"modeling_tiny.py": b"def forward(x):\n    return x\n"}
    repo, lookalike = f"acme/evolve-{attack}", f"mallory/lookalike-{attack}"
    a = hub.add_repo(repo, {**commit_files("A"), **code})
    hub.add_repo(repo, {**commit_files("B", (SHARDS[1], "config.json")), **code})
    hub.add_repo(lookalike, {**commit_files("A"), **code})  # the "colliding" repository
    wk.declare("att-r", f"hf://{repo}@{a}", workspaces=["team-a"], subpath="models/att")
    wk.declare("att-e", f"hf://{lookalike}", workspaces=["team-a"], subpath="models/att")
    assert ensure_model("att-r") == "Ready" and ensure_model("att-e") == "Ready"
    theirs = wk.volumes["team-a"] / "models" / "att"
    real, evil = theirs / repo.replace("/", "--"), theirs / lookalike.replace("/", "--")
    if attack == "swapped-in":
        os.chown(theirs, ATTACKER, ATTACKER)  # their subpath: they may rename what it holds
        exchange(real, evil)
    else:
        for d in (real, evil):
            os.chown(d, ATTACKER, ATTACKER) if attack == "moved-in-by-owner" else os.chmod(d, 0o777)
        os.rename(evil / "modeling_tiny.py", real / "modeling_tiny.py")
    hub.reset_stats()
    wk.declare("victim", f"hf://{repo}@main", workspaces=["team-a"], subpath="models/victim",
               owner_name="bob", owner_uid=1001)
    assert ensure_model("victim") == "Ready"
    new = wk.registry.get_model("victim").local_paths[0].path
    assert os.stat(f"{new}/modeling_tiny.py").st_ino != os.stat(real / "modeling_tiny.py").st_ino, \
        "a sha1-only file was linked from where the attacker may rename"
    assert "modeling_tiny.py" in fetched(hub, repo)
    assert open(f"{new}/modeling_tiny.py", "rb").read() == code["modeling_tiny.py"]
    if attack != "swapped-in":
        assert os.stat(f"{new}/{SHARDS[0]}").st_ino == os.stat(real / SHARDS[0]).st_ino  # sha256: still linked
