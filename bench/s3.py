"""S3 staging and fill throughput against `aws s3 cp --recursive`, on the same S3 server and data, same run.

    .venv/bin/python bench/s3.py [--shards 4] [--shard-mib 64] [--quick]

The S3 server is moto in server mode in a process of its own on loopback. Three rows:
- stage: weightkeeper's upload (`weightkeeper.s3.stage_snapshot`: transfer manager, files in
  parallel, digest metadata) of the snapshot's files from local disk vs `aws s3 cp --recursive`
  of the same directory;
- fill: weightkeeper's fill of a model directory from the staged prefix (`fill_from_s3`: ranged
  GETs into hashed, resumable `.part` files) vs `aws s3 cp --recursive` down;
- pipeline: create -> Ready through Prefect with S3 enabled (Hub -> stage -> fill 2 workspaces)
  vs the same by hand: `hf download`, then `aws s3 cp` up, then `aws s3 cp` down twice.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _setup import MIB, HubProcess, prepare_environment, row, sh, timed, write_repo

BUCKET = "bench"


def start_s3(root: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(100):
        try:
            httpx.get(url, timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the S3 server did not start")


def aws(endpoint: str, *args: str) -> None:
    sh(str(Path(sys.executable).parent / "aws"), "--endpoint-url", endpoint, "s3", *args, "--only-show-errors")


def snapshot_of(directory: Path):
    from weightkeeper.download import RemoteFile, Snapshot, file_hasher

    files = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        remote = RemoteFile(str(path.relative_to(directory)), path.stat().st_size, "x", sha256="0" * 64)
        h = file_hasher(remote)
        h.update(path.read_bytes())
        files.append(RemoteFile(remote.path, remote.size, "x", sha256=h.hexdigest()))
    return Snapshot("bench/s3", "c" * 40, tuple(files))


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / MIB / seconds:.0f} MiB/s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.shards, args.shard_mib = 2, 16
    root = Path(tempfile.mkdtemp(prefix="wk-bench-s3-"))
    prepare_environment(root)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    from weightkeeper.anchored import Dir
    from weightkeeper.config import S3Settings
    from weightkeeper.s3 import fill_from_s3, make_client, stage_snapshot

    s3_proc, endpoint = start_s3(root)
    hub = None
    try:
        client = make_client(S3Settings(bucket=BUCKET, endpoint_url=endpoint, region="us-east-1"))
        client.create_bucket(Bucket=BUCKET)
        repo = root / "repo"
        write_repo(repo, args.shards, args.shard_mib)
        snapshot = snapshot_of(repo)
        total = snapshot.total_bytes
        size = f"{len(snapshot.files)} files, {total / MIB:.0f} MiB"

        def local(f, _poll):  # the file as staging's fetch gives it: open, and (here) nothing to remove after
            return open(repo / f.path, "rb"), lambda: None

        ours = timed(lambda: stage_snapshot(client, f"s3://{BUCKET}/wk/", snapshot, local, lambda _n: None))
        theirs = timed(lambda: aws(endpoint, "cp", "--recursive", str(repo), f"s3://{BUCKET}/ref/"))
        row(f"S3 stage (upload) {size}", rate(total, ours), f"{rate(total, theirs)} (`aws s3 cp --recursive`)",
            f"{theirs / ours:.2f}x aws's speed")

        def fill() -> None:
            with Dir.root(root / "fill-wk", create=True) as target:
                fill_from_s3(client, f"s3://{BUCKET}/wk/", snapshot, target, lambda _n: None, float("inf"))

        ours = timed(fill)
        theirs = timed(lambda: aws(endpoint, "cp", "--recursive", f"s3://{BUCKET}/ref/", str(root / "fill-aws")))
        row(f"S3 fill (download) {size}", rate(total, ours), f"{rate(total, theirs)} (`aws s3 cp --recursive`)",
            f"{theirs / ours:.2f}x aws's speed")

        write_repo(root / "tiny", 1, 1)
        hub = HubProcess(root / "hub", {"bench/s3": repo, "bench/tiny": root / "tiny"})
        create = configure_pipeline(root, hub.url, endpoint)
        create("warm-up", "hf://bench/tiny")  # the Prefect server and the imports, not measured
        ours = timed(lambda: create("bench", "hf://bench/s3"))
        theirs = timed(lambda: by_hand(root, hub.url, endpoint))
        row(f"S3 pipeline: Hub -> stage -> 2 workspaces, {size}", f"{ours:.1f} s (create -> Ready)",
            f"{theirs:.1f} s (`hf download` + `aws s3 cp` up + 2x down)", f"{theirs / ours:.2f}x the manual speed")
    finally:
        if hub:
            hub.stop()
        s3_proc.terminate()
        s3_proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def configure_pipeline(root: Path, hub_url: str, endpoint: str):
    """A config with two workspaces and S3 enabled; returns `create(name, source)`: declare, then ensure."""
    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.config import load_settings
    from weightkeeper.runs import run_here
    from weightkeeper.service import declare_model
    from weightkeeper.registry import registry_for

    volumes = {name: root / "volumes" / name for name in ("team-a", "team-b")}
    lines = [f'home = "{root / "wk-home"}"', f'hf_endpoint = "{hub_url}"']
    for name, volume in volumes.items():
        volume.mkdir(parents=True)
        lines += ["[[workspaces]]", f'name = "{name}"', f'volume = "{volume}"']
    lines += ["[s3]", f'bucket = "{BUCKET}"', 'prefix = "pipeline"', f'endpoint_url = "{endpoint}"',
              'region = "us-east-1"']
    (root / "config.toml").write_text("\n".join(lines) + "\n")
    os.environ["WEIGHTKEEPER_CONFIG"] = str(root / "config.toml")
    settings = load_settings()

    def create(name: str, source: str) -> None:
        declare_model(settings, registry_for(settings), name=name, source=source, owner_name="bench",
                      owner_uid=os.getuid())
        if run_here(ensure_model, name) != "Ready":
            raise RuntimeError(registry_for(settings).get_model(name).message)

    return create


def by_hand(root: Path, hub_url: str, endpoint: str) -> None:
    env = dict(os.environ, HF_ENDPOINT=hub_url)
    sh(str(Path(sys.executable).parent / "hf"), "download", "bench/s3", "--local-dir", str(root / "by-hand"), env=env)
    aws(endpoint, "cp", "--recursive", str(root / "by-hand"), f"s3://{BUCKET}/by-hand/", "--exclude", ".cache/*")
    for name in ("a", "b"):
        aws(endpoint, "cp", "--recursive", f"s3://{BUCKET}/by-hand/", str(root / f"by-hand-{name}"))


if __name__ == "__main__":
    main()
