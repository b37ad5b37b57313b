"""The free-space decision (pure) and the configuration of its margin."""

from __future__ import annotations

import os
import random

import pytest

from conftest import tiny_files
from test_attacks import ATTACKER, as_user, rewrite_users_volume, shelf_copy, users_volume  # noqa: F401 - a fixture
from test_sharing import SHARD, shared_dir
from weightkeeper import space
from weightkeeper.anchored import Dir
from weightkeeper.config import load_settings
from weightkeeper.download import PARTIAL_DIR, RemoteFile, present_bytes
from weightkeeper.errors import ConfigError
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.planning import bytes_to_fetch, space_problem


@pytest.mark.parametrize("files, expected", [
    ([], 0),
    ([(100, 0)], 100),
    ([(100, 100)], 0),                    # in place
    ([(100, 40)], 60),                    # a partial file counts what it holds
    ([(100, 150)], 0),                    # a partial file longer than the file needs nothing more
    ([(100, 0), (50, 50), (30, 10)], 120),
])
def test_bytes_to_fetch(files, expected):
    assert bytes_to_fetch(files) == expected


@pytest.mark.parametrize("needed, free, margin, fits", [
    (0, 0, 0, True),           # nothing to write never fails, even on a full volume
    (0, 10, 100, True),
    (100, 100, 0, True),       # exactly fits
    (101, 100, 0, False),
    (100, 150, 50, True),      # exactly leaves the margin
    (100, 149, 50, False),
    (1, 10 << 30, 1 << 30, True),
    (-5, 0, 0, True),
])
def test_space_problem_decides_on_needed_free_and_margin(needed, free, margin, fits):
    problem = space_problem(needed, free, margin, "/mnt/vol")
    assert (problem is None) == fits
    if not fits:
        assert problem == (f"needs {needed} bytes, {free} free on /mnt/vol "
                           f"(a download leaves free_space_margin_bytes = {margin} free)")


def test_margin_defaults_to_one_gib_and_is_configurable(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("")
    assert load_settings(config).free_space_margin_bytes == 1 << 30
    config.write_text("free_space_margin_bytes = 0\n")
    assert load_settings(config).free_space_margin_bytes == 0
    config.write_text("free_space_margin_bytes = -1\n")
    with pytest.raises(ConfigError, match="free_space_margin_bytes must be 0 or more"):
        load_settings(config)


@pytest.mark.without_prefect_server
def test_a_partial_file_counts_the_bytes_it_holds_on_disk_and_only_when_it_is_weightkeepers(tmp_path):
    size = 1 << 20
    remote = RemoteFile("w.safetensors", size, "", sha256="0" * 64)
    part = tmp_path / PARTIAL_DIR / "w.safetensors.part"
    part.parent.mkdir(parents=True)
    with Dir.root(tmp_path) as d:
        with open(part, "wb") as sparse:
            sparse.truncate(size)  # its size, and no block
        holes = present_bytes(d, remote)
        part.write_bytes(os.urandom(size // 2))
        written = present_bytes(d, remote)
        os.chown(part, ATTACKER, ATTACKER)  # another user's file: replaced, never resumed
        theirs = present_bytes(d, remote)
    assert (holes, written, theirs) == (0, size // 2, 0)


def test_a_sparse_partial_file_the_shelf_owner_plants_never_gets_a_repair_past_the_space_check(wk, hub, users_volume,
                                                                                                monkeypatch):
    """The volume has no room for a shard the shelf owner removed from their copy: its repair (root, which no quota
    and no blocks reserved for root stop) waits. The owner (a process of uid ATTACKER) makes the shard's partial file
    at its size, holding no block (`truncate -s`): counted as present, it would let the repair fetch the whole shard
    once its digest failed. It counts nothing (not root's, and no block), and the repair still waits."""
    from weightkeeper.tasks.verify import verify_shared_copy

    files = tiny_files("sparse-space")
    copy = shelf_copy(wk, hub, monkeypatch, users_volume, "acme/sparse-space", files)
    st = os.statvfs(users_volume)
    rewrite_users_volume(wk, hub, free_space_margin_bytes=st.f_bavail * st.f_frsize + (1 << 30))  # the volume is full
    artifact_id = wk.registry.get_model("mine").local_paths[0].artifact_id
    assert as_user(ATTACKER, f"import os; os.unlink({str(copy / SHARD)!r})").returncode == 0
    assert verify_shared_copy(artifact_id) == "postponed"
    part = copy / PARTIAL_DIR / f"{SHARD}.part"
    planted = as_user(ATTACKER, f"import os; os.truncate(os.open({str(part)!r}, os.O_WRONLY | os.O_CREAT, 0o644), "
                                f"{len(files[SHARD])})")
    assert planted.returncode == 0, planted.stderr
    assert verify_shared_copy(artifact_id) == "postponed" and not (copy / SHARD).exists()
    assert "free_space_margin_bytes" in wk.registry.get_model("mine").message


@pytest.mark.parametrize("run", ["download", "repair"])
def test_a_resumed_partial_file_that_fails_its_digest_is_fetched_again_only_if_it_fits(wk, hub, monkeypatch, run):
    """Half of a shard's partial file, weightkeeper's own, holds wrong bytes (a disk fault, an earlier answer). The
    space check counts them as present; the volume has room for the other half only. Once the shard fails its digest
    the partial file is dropped, and fetching it whole needs room the check never gave: space is checked again
    first, so the download fails and the repair waits, saying so, and nothing more is fetched or written."""
    data = random.Random("refetch-room").randbytes(256 * 1024)
    files = {SHARD: data, "config.json": b'{"model_type": "tiny"}\n'}
    commit = hub.add_repo(f"acme/refetch-{run}", files)
    wk.rewrite(hf_endpoint=hub.url, free_space_margin_bytes=0)
    name, half = f"refetch-{run}", len(data) // 2
    if run == "download":
        wk.declare(name, f"hf://acme/refetch-{run}", workspaces=["team-a"])
        path, missing = wk.made_by_an_earlier_run(name), sum(map(len, files.values()))
    else:
        wk.declare(name, f"hf://acme/refetch-{run}", workspaces=["team-a"], download_policy="reuse-if-exists")
        assert ensure_model(name) == "Ready"
        path, missing = shared_dir(wk, f"acme--refetch-{run}", commit), len(data)
        (path / SHARD).unlink()
    (path / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
    (path / PARTIAL_DIR / f"{SHARD}.part").write_bytes(b"\xff" * half)
    hub.reset_stats()
    with monkeypatch.context() as full:
        full.setattr(space, "free_space", lambda target: ("/volume", missing - half // 2))
        if run == "download":
            assert ensure_model(name) == "Failed"
        else:
            from weightkeeper.tasks.verify import verify_shared_copy
            assert verify_shared_copy(wk.registry.get_model(name).local_paths[0].artifact_id) == "postponed"
    message = wk.registry.get_model(name).message
    # the shard's bytes, and config.json's too when its fetch (at the same time) has not ended yet
    needs = {len(data), len(data) + len(files["config.json"]) * (run == "download")}
    assert any(f"needs {n} bytes, {missing - half // 2} free on /volume" in message for n in needs), message
    assert not (path / SHARD).exists() and hub.bytes_served(f"acme/refetch-{run}") == missing - half
