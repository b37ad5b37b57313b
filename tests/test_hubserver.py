"""Tests for weightkeeper.hubserver, driven by the real huggingface_hub client."""

import atexit
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_HF_HOME = tempfile.mkdtemp(prefix="wk-test-hf-home-")
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
os.environ.update(
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_HUB_DISABLE_PROGRESS_BARS="1",
    HF_HUB_DISABLE_XET="1",
    HF_HUB_DISABLE_UPDATE_CHECK="1",
    HF_HOME=_HF_HOME,
)
os.environ.pop("HF_TOKEN", None)

import httpx  # noqa: E402
import pytest  # noqa: E402
from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get  # noqa: E402
from huggingface_hub.hf_api import RepoFile, RepoFolder  # noqa: E402

from weightkeeper.hubserver import HubServer  # noqa: E402

REPO = "acme/tiny"
WEIGHTS = os.urandom(300_000)
FILES = {
    "config.json": b'{"hidden_size": 8}',
    "model.safetensors": WEIGHTS,
    "README.md": b"# tiny\n",
    "tokenizer/vocab.txt": b"a\nb\nc\n",
}


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub-root") as server:
        yield server


@pytest.fixture
def sha(hub):
    return hub.add_repo(REPO, FILES)


def resolve_url(hub, filename, revision="main", repo_id=REPO):
    return f"{hub.url}/{repo_id}/resolve/{revision}/{filename}"


def test_model_info_with_files_metadata(hub, sha):
    info = HfApi(endpoint=hub.url).model_info(REPO, revision="main", files_metadata=True)
    assert info.id == REPO and info.sha == sha and len(sha) == 40
    assert info.gated is False and info.private is False
    siblings = {s.rfilename: s for s in info.siblings}
    assert sorted(siblings) == sorted(FILES)
    for name, data in FILES.items():
        assert siblings[name].size == len(data)
        assert siblings[name].blob_id == git_blob_sha1(data)
    assert siblings["model.safetensors"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert siblings["model.safetensors"].lfs.pointer_size == 134
    assert siblings["config.json"].lfs is None
    # The commit is addressable by sha, and the sha is deterministic.
    assert HfApi(endpoint=hub.url).repo_info(REPO, revision=sha).sha == sha
    assert hub.add_repo(REPO, FILES) == sha


def test_new_commit_moves_ref_and_keeps_old_commit(hub, sha):
    api = HfApi(endpoint=hub.url)
    new_sha = hub.add_repo(REPO, {**FILES, "extra.txt": b"x"})
    assert new_sha != sha
    assert api.model_info(REPO).sha == new_sha
    assert len(api.model_info(REPO, revision=sha).siblings) == len(FILES)
    pr_sha = hub.add_repo(REPO, {"config.json": b"{}"}, revision="refs/pr/1")
    assert api.model_info(REPO, revision="refs/pr/1").sha == pr_sha


def test_list_repo_tree(hub, sha, tmp_path):
    big = tmp_path / "weights.bin"
    big.write_bytes(b"\0" * 1000)
    hub.add_repo(REPO, {**FILES, "nested/deep/weights.bin": big})
    api = HfApi(endpoint=hub.url)
    entries = {e.path: e for e in api.list_repo_tree(REPO, recursive=True)}
    assert isinstance(entries["tokenizer"], RepoFolder) and isinstance(entries["nested/deep"], RepoFolder)
    weights = entries["nested/deep/weights.bin"]
    assert isinstance(weights, RepoFile) and weights.size == 1000 and weights.lfs.size == 1000
    assert entries["config.json"].size == len(FILES["config.json"]) and entries["config.json"].lfs is None
    top = {e.path for e in api.list_repo_tree(REPO)}
    assert top == {"config.json", "model.safetensors", "README.md", "tokenizer", "nested"}
    assert {e.path for e in api.list_repo_tree(REPO, path_in_repo="nested")} == {"nested/deep"}


def test_snapshot_download_with_patterns(hub, sha, tmp_path):
    local = Path(snapshot_download(REPO, revision=sha, local_dir=tmp_path / "out", endpoint=hub.url,
                                   allow_patterns=["*.json", "*.safetensors"]))
    got = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file() and ".cache" not in p.parts}
    assert got == {"config.json", "model.safetensors"}
    assert (local / "model.safetensors").read_bytes() == WEIGHTS
    assert hub.get_count(REPO) == 2 and hub.get_count(REPO, "config.json") == 1
    assert hub.bytes_served(REPO) == len(WEIGHTS) + len(FILES["config.json"])


def test_hf_hub_download_to_cache(hub, sha, tmp_path):
    path = hf_hub_download(REPO, "tokenizer/vocab.txt", endpoint=hub.url, cache_dir=tmp_path / "cache")
    assert Path(path).read_bytes() == FILES["tokenizer/vocab.txt"]
    assert f"snapshots/{sha}/tokenizer/vocab.txt" in Path(path).as_posix()
    assert hub.get_count(REPO, "tokenizer/vocab.txt") == 1
    heads = [r for r in hub.requests if r.method == "HEAD"]
    assert heads and heads[0].status == 200 and not heads[0].authorization_present
    hub.reset_stats()
    assert hub.requests == [] and hub.get_count() == 0


def test_not_found_errors(hub, sha, tmp_path):
    api = HfApi(endpoint=hub.url)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/nope")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/nope", "config.json", endpoint=hub.url, cache_dir=tmp_path)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch", endpoint=hub.url, cache_dir=tmp_path)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.bin", endpoint=hub.url, cache_dir=tmp_path)


def test_gated_and_private_repos(hub, tmp_path):
    hub.add_repo("acme/gated", FILES, gated=True, token="s3cret")
    hub.add_repo("acme/private", FILES, private=True, token="s3cret")
    api = HfApi(endpoint=hub.url)
    assert api.model_info("acme/gated").gated == "auto"  # gated metadata is public, as on the Hub
    with pytest.raises(GatedRepoError):
        hf_hub_download("acme/gated", "config.json", endpoint=hub.url, cache_dir=tmp_path)
    with pytest.raises(GatedRepoError):
        hf_hub_download("acme/gated", "config.json", endpoint=hub.url, cache_dir=tmp_path, token="wrong")
    path = hf_hub_download("acme/gated", "config.json", endpoint=hub.url, cache_dir=tmp_path, token="s3cret")
    assert Path(path).read_bytes() == FILES["config.json"]
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/private")
    assert api.model_info("acme/private", token="s3cret").private is True
    assert any(r.authorization_present for r in hub.requests)
    assert all("s3cret" not in repr(r) for r in hub.requests)


def test_range_resume_with_http_get(hub, sha, tmp_path):
    target = tmp_path / "partial"
    half = len(WEIGHTS) // 2
    target.write_bytes(WEIGHTS[:half])
    with open(target, "ab") as f:
        http_get(resolve_url(hub, "model.safetensors"), f, resume_size=half, expected_size=len(WEIGHTS))
    assert target.read_bytes() == WEIGHTS
    ranged = [r for r in hub.requests if r.range]
    assert ranged and ranged[0].range == f"bytes={half}-" and ranged[0].status == 206


def test_range_edge_cases(hub, sha):
    url = resolve_url(hub, "model.safetensors")
    r = httpx.get(url, headers={"Range": "bytes=10-19"})
    assert r.status_code == 206 and r.content == WEIGHTS[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{len(WEIGHTS)}"
    assert httpx.get(url, headers={"Range": "bytes=-5"}).content == WEIGHTS[-5:]
    r = httpx.get(url, headers={"Range": f"bytes={len(WEIGHTS)}-"})
    assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(WEIGHTS)}"
    head = httpx.head(url)
    assert head.headers["X-Linked-Etag"] == f'"{hashlib.sha256(WEIGHTS).hexdigest()}"'
    assert head.headers["X-Repo-Commit"] == sha and not any(h.lower().startswith("x-xet") for h in head.headers)


def test_fail_next_and_offline(hub, sha):
    api = HfApi(endpoint=hub.url)
    hub.fail_next(2, 500, repo_id=REPO)
    for _ in range(2):
        with pytest.raises(HfHubHTTPError) as exc:
            api.model_info(REPO)
        assert exc.value.response.status_code == 500
    assert api.model_info(REPO).sha == sha
    hub.fail_next(1, 429, retry_after=7, path_contains="/api/")
    with pytest.raises(HfHubHTTPError) as exc:
        api.model_info(REPO)
    assert exc.value.response.status_code == 429 and exc.value.response.headers["Retry-After"] == "7"
    hub.set_offline(True)
    with pytest.raises(HfHubHTTPError) as exc:
        api.model_info(REPO)
    assert exc.value.response.status_code == 503
    hub.set_offline(False)
    assert api.model_info(REPO).sha == sha


def test_drop_after_is_resumed_by_http_get(hub, tmp_path):
    # http_get writes in DOWNLOAD_CHUNK_SIZE chunks (10 MiB by default): a drop mid-chunk loses that partial
    # chunk, and the retry asks for a Range from the last whole one.
    from huggingface_hub import constants

    chunk = constants.DOWNLOAD_CHUNK_SIZE
    big = os.urandom(chunk + chunk // 5 * 2)
    hub.add_repo(REPO, {"model.safetensors": big})
    hub.drop_after(chunk + chunk // 5, repo_id=REPO, filename="model.safetensors")
    target = tmp_path / "dropped"
    with open(target, "wb") as f:
        http_get(resolve_url(hub, "model.safetensors"), f, expected_size=len(big))
    assert target.read_bytes() == big
    first, second = [r for r in hub.requests if r.method == "GET"]
    assert first.bytes_sent == chunk + chunk // 5 and first.status == 200
    assert second.range == f"bytes={chunk}-" and second.status == 206
    assert second.bytes_sent == len(big) - chunk
    assert hub.get_count(REPO) == 2


def test_throttle_and_peak_concurrent_repos(hub, tmp_path):
    for name in ("acme/a", "acme/b"):
        hub.add_repo(name, {"model.safetensors": WEIGHTS})
    hub.set_throttle(1_000_000)  # 300 kB each => ~0.3 s
    errors = []

    def fetch(repo_id):
        try:
            hf_hub_download(repo_id, "model.safetensors", endpoint=hub.url, cache_dir=tmp_path / repo_id)
        except Exception as e:  # pragma: no cover - surfaced by the assert below
            errors.append(e)

    start = time.monotonic()
    threads = [threading.Thread(target=fetch, args=(r,)) for r in ("acme/a", "acme/b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert time.monotonic() - start >= 0.25
    assert hub.peak_concurrent_repos == 2
    assert hub.bytes_served("acme/a") == hub.bytes_served("acme/b") == len(WEIGHTS)
    # Sequential downloads never overlap, even though stats are read right after each one completes.
    hub.set_throttle(None)
    hub.reset_stats()
    assert hub.peak_concurrent_repos == 0
    for repo_id in ("acme/a", "acme/b", "acme/a"):
        hf_hub_download(repo_id, "model.safetensors", endpoint=hub.url, cache_dir=tmp_path / "seq", force_download=True)
        assert hub.bytes_served(repo_id) > 0
    assert hub.peak_concurrent_repos == 1 and hub.get_count() == 3


def test_hf_cli_download(hub, sha, tmp_path):
    hf = Path(sys.executable).with_name("hf")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
    out = tmp_path / "cli-out"
    result = subprocess.run([str(hf), "download", REPO, "--local-dir", str(out)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name, data in FILES.items():
        assert (out / name).read_bytes() == data
    assert hub.get_count(REPO) == len(FILES)


def test_main_serves_directories(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_bytes(b"{}")
    (src / "sub" / "model.safetensors").write_bytes(WEIGHTS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightkeeper.hubserver", "--root", str(tmp_path / "root"), "--repo", f"{REPO}={src}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read()
        info = HfApi(endpoint=url).model_info(REPO, files_metadata=True)
        assert {s.rfilename: s.size for s in info.siblings} == {"config.json": 2, "sub/model.safetensors": len(WEIGHTS)}
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
