"""S3 staging and S3 cleanup: the real boto3 client against a real S3-compatible server process (moto in
server mode) on loopback, behind a pass-through proxy that can refuse deletes or uploads."""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path

import pytest
from conftest import FETCHED, expected_size, tiny_files
from test_lifecycle import fetched_files, in_thread, wait_until

from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.flows.reconcile import reconcile
from weightkeeper.config import load_settings
from weightkeeper.errors import ConfigError, InvalidInputError

FILES_FETCHED = 5  # two shards and the three small files of `tiny_files`
SHARD = "model-00001-of-00002.safetensors"


def staged_keys(s3, repo_dir: str, commit: str) -> list[str]:
    return [k.rsplit("/", 1)[-1] for k in s3.keys(f"{s3.prefix}/{repo_dir}/{commit}/")]


def test_staged_once_then_every_workspace_is_filled_from_s3(wk, hub, s3):
    files = tiny_files("s3-life")
    files["model-00003-of-00003.safetensors"] = random.Random(3).randbytes(20 << 20)  # multipart: > 16 MiB
    commit = hub.add_repo("acme/staged", files)
    hub.reset_stats()
    wk.declare("staged", "hf://acme/staged")

    assert ensure_model("staged") == "Ready"
    model = wk.registry.get_model("staged")
    uri = f"s3://{s3.bucket}/staging/acme--staged/{commit}/"
    assert model.staging_uri == uri and model.to_json()["stagingUri"] == uri
    assert "staged to" in model.message or model.message.startswith("2 path(s) ready")
    wanted = sorted(k for k in files if k.endswith(".safetensors") or k in FETCHED)
    assert staged_keys(s3, "acme--staged", commit) == wanted
    assert hub.get_count("acme/staged") == len(wanted)  # the Hub is read once, by the staging run
    assert s3.proxy.count("POST", f"/{s3.bucket}/staging/acme--staged/{commit}/model-00003") >= 2  # multipart
    for p in model.local_paths:
        assert fetched_files(p.path) == wanted and p.size_bytes == expected_size(files) and p.status == "Ready"
        assert Path(p.path, "model-00003-of-00003.safetensors").read_bytes() == files["model-00003-of-00003.safetensors"]
    for name in wanted:  # each workspace read each object from S3
        assert s3.proxy.count("GET", f"/{s3.bucket}/staging/acme--staged/{commit}/{name}") == 2

    hub.reset_stats()
    assert ensure_model("staged") == "Ready"  # idempotent: nothing fetched or uploaded again
    assert hub.get_count("acme/staged") == 0 and sum(s3.proxy.uploads.values()) == len(wanted) + 1

    paths = [p.path for p in model.local_paths]
    assert delete_model("staged") == "Released"
    assert wk.registry.find_model("staged") is None
    assert not any(os.path.lexists(p) for p in paths)
    assert s3.keys("staging/") == []


def test_a_gated_repositorys_staged_copy_never_reaches_a_model_without_its_token(wk, hub, s3):
    """The attacker declares a gated repository another user staged, with no token (metadata is public): every
    object is already in S3, so staging would fetch nothing from the Hub. The token is proven there first."""
    from prefect.blocks.system import Secret

    token = "hf_GATEDstaged1234567890"
    commit = hub.add_repo("acme/gated-staged", tiny_files("gated-staged"), gated=True, token=token)
    Secret(value=token).save("hf-token-gated-staged", overwrite=True)
    wk.declare("entitled", "hf://acme/gated-staged", workspaces=["team-a"], token_block="hf-token-gated-staged")
    assert ensure_model("entitled") == "Ready"
    staged = staged_keys(s3, "acme--gated-staged", commit)
    assert len(staged) == FILES_FETCHED

    wk.declare("freeloader", "hf://acme/gated-staged", workspaces=["team-b"], subpath="models/freeloader")
    assert ensure_model("freeloader") == "Failed"
    model = wk.registry.get_model("freeloader")
    assert "gated" in model.message
    path = model.local_paths[0].path
    assert not os.path.lexists(path) or fetched_files(path) == []
    assert staged_keys(s3, "acme--gated-staged", commit) == staged  # the other model's copy is kept

    hub.reset_stats()
    wk.declare("entitled-2", "hf://acme/gated-staged", workspaces=["team-b"], subpath="models/second",
               token_block="hf-token-gated-staged")
    assert ensure_model("entitled-2") == "Ready"  # proven with one request, filled from S3
    assert hub.get_count("acme/gated-staged") == 0


def test_interrupted_staging_resumes_without_uploading_finished_objects_again(wk, hub, s3):
    files = tiny_files("s3-resume", shards=4)
    commit = hub.add_repo("acme/resume", files)
    hub.reset_stats()
    wk.declare("resume", "hf://acme/resume", workspaces=["team-a"])
    s3.proxy.allow_uploads(3)
    assert ensure_model("resume") == "Failed"
    model = wk.registry.get_model("resume")
    assert "staging to s3://" in model.message and "AccessDenied" in model.message
    assert model.local_paths[0].status == "Pending" and not os.path.exists(model.local_paths[0].path)
    assert len(staged_keys(s3, "acme--resume", commit)) == 3

    s3.proxy.allow_uploads(None)
    assert ensure_model("resume") == "Ready"
    assert len(staged_keys(s3, "acme--resume", commit)) == 7
    assert set(s3.proxy.uploads.values()) == {1}  # every object was uploaded exactly once, over both runs
    assert hub.get_count("acme/resume") == 7  # and read from the Hub once: verified local files were kept
    assert not (wk.root / "staging" / "resume").exists()  # the scratch space goes once staging is done


def test_a_staging_runs_leftovers_never_become_another_commits_objects(wk, hub, s3):
    """A staging run of commit X stops part-way, leaving verified files of X in this host's scratch space. The
    model is deleted while another model keeps the staged copy (its scratch goes all the same), and in case the
    delete ran on another host, the leftovers are put back. The repository moves to commit Y, whose shards have
    X's sizes and other bytes, and the model is declared again: Y's staged objects hold Y's bytes."""
    import shutil

    hub.add_repo("acme/left", tiny_files("s3-left-x", shards=4))
    wk.declare("again", "hf://acme/left", workspaces=["team-a"])
    s3.proxy.allow_uploads(1)
    assert ensure_model("again") == "Failed"
    scratch = wk.root / "staging" / "again"
    assert list(scratch.rglob("*.safetensors"))  # X's verified files, not uploaded
    shutil.copytree(scratch, wk.root / "left-by-x")
    s3.proxy.allow_uploads(None)
    wk.declare("keeper", "hf://acme/left", workspaces=["team-b"])
    assert ensure_model("keeper") == "Ready"
    assert delete_model("again") == "Released"  # the staged copy is kept for `keeper`
    assert not scratch.exists()
    shutil.copytree(wk.root / "left-by-x", scratch)  # as this host keeps them when the delete ran elsewhere
    y = tiny_files("s3-left-y", shards=4)
    commit = hub.add_repo("acme/left", y)
    wk.declare("again", "hf://acme/left", workspaces=["team-a"], subpath="models/again")
    assert ensure_model("again") == "Ready", wk.registry.get_model("again").message
    for name in staged_keys(s3, "acme--left", commit):
        assert s3.client.get_object(Bucket=s3.bucket, Key=f"{s3.prefix}/acme--left/{commit}/{name}")["Body"].read() \
            == y[name], name


def test_prefix_delete_never_touches_a_neighbouring_prefix(wk, hub, s3):
    commit = hub.add_repo("acme/a", tiny_files("s3-a"))
    neighbours = [f"staging/acme--a-b/{commit}/config.json", f"staging/acme--a/{commit}-old/config.json",
                  f"staging/acme--a/{'0' * 40}/config.json", "staging/acme--a", "other/acme--a/x"]
    for key in neighbours:
        s3.put(key, b"not weightkeeper's")
    wk.declare("a", "hf://acme/a", workspaces=["team-b"])
    assert ensure_model("a") == "Ready"
    assert len(staged_keys(s3, "acme--a", commit)) == FILES_FETCHED
    assert delete_model("a") == "Released"
    assert s3.keys() == sorted(neighbours)


def test_a_delete_aborts_the_multipart_uploads_a_killed_staging_left_and_no_neighbours(wk, hub, s3):
    """A staging run killed mid-upload leaves a multipart upload whose parts S3 bills: the delete aborts it, and
    leaves alone an upload under a neighbouring prefix, even when a hostile listing names it under ours."""
    commit = hub.add_repo("acme/parts", tiny_files("s3-parts"))
    wk.declare("parts", "hf://acme/parts", workspaces=["team-b"])
    assert ensure_model("parts") == "Ready"
    ours, theirs = f"staging/acme--parts/{commit}/model-00009-of-00009.safetensors", f"staging/acme--parts-b/{commit}/x"
    for key in (ours, theirs):
        upload = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
        s3.client.upload_part(Bucket=s3.bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"a part")
    s3.proxy.rewrite_uploads = lambda body: re.sub(  # a hostile listing: the neighbour's upload under ours
        rb"(<ListMultipartUploadsResult[^>]*>)", lambda m: m.group(1) + (
            f"<Upload><Key>{theirs}</Key><UploadId>{upload}</UploadId></Upload>").encode(), body, count=1)
    wk.rewrite(hf_endpoint=hub.url, cleanup_retry_seconds=0.5, cleanup_retry_max_seconds=1)
    deletion = in_thread(delete_model, "parts")
    wait_until(lambda: wk.registry.get_model("parts").cleanup_attempts >= 1, what="a refused listing of uploads")
    assert "removal of the staged copy" in wk.registry.get_model("parts").message
    uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix="staging/").get("Uploads", [])
    assert theirs in [u["Key"] for u in uploads]  # refused, never aborted
    s3.proxy.rewrite_uploads = None
    deletion.join(60)
    assert deletion.result.get("value") == "Released"
    left = s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix="staging/").get("Uploads", [])
    assert [u["Key"] for u in left] == [theirs]


def listed(*keys: str):
    """A listing rewrite that puts `keys` first in every answer, as a hostile or careless server would."""
    def rewrite(body: bytes, query: dict) -> bytes:
        added = "".join(f"<Contents><Key>{k}</Key><Size>1</Size><ETag>&quot;{'0' * 32}&quot;</ETag></Contents>"
                        for k in keys)
        return re.sub(rb"(<ListBucketResult[^>]*>)", lambda m: m.group(1) + added.encode(), body, count=1)
    return rewrite


def test_a_listing_that_names_others_objects_never_gets_them_deleted(wk, hub, s3):
    """The staged prefix's listing also names the user's source object and a key that climbs out of the prefix
    with `..` (a gateway onto a filesystem would resolve it): nothing is deleted, the model stays Deleting and
    says why, and once the listing is honest the delete finishes."""
    commit = hub.add_repo("acme/listed", tiny_files("s3-listed"))
    s3.put("data/alice/model.safetensors", b"alice's own weights")
    wk.rewrite(hf_endpoint=hub.url, cleanup_retry_seconds=0.5, cleanup_retry_max_seconds=1)
    for keys, why in ((("data/alice/model.safetensors",), "which is not under staging/acme--listed/"),
                      ((f"staging/acme--listed/{commit}/../../../data/alice/model.safetensors",), "'..' segment")):
        wk.declare("listed", "hf://acme/listed", workspaces=["team-a"])
        assert ensure_model("listed") == "Ready"
        s3.proxy.reset()
        s3.proxy.rewrite_listing = listed(*keys)
        deletion = in_thread(delete_model, "listed")
        wait_until(lambda: wk.registry.get_model("listed").cleanup_attempts >= 1, what="a refused listing")
        model = wk.registry.get_model("listed")
        assert model.phase == "Deleting" and why in model.message, model.message
        assert s3.proxy.count("POST", f"/{s3.bucket}") == 0  # no DeleteObjects
        assert len(staged_keys(s3, "acme--listed", commit)) == FILES_FETCHED
        s3.proxy.rewrite_listing = None
        deletion.join(60)
        assert deletion.result.get("value") == "Released" and wk.registry.find_model("listed") is None
        assert s3.keys() == ["data/alice/model.safetensors"]


def leading_on(pages: int = 150):
    """A listing rewrite that answers `pages` empty pages, each saying more follow under the token A or B in
    turn (botocore's paginator sees no repeat), then the real answer."""
    asked = []

    def rewrite(body: bytes, query: dict) -> bytes:
        asked.append(query)
        if len(asked) > pages:
            return body
        token = b"B" if query.get("continuation-token") == ["A"] else b"A"
        return re.sub(rb"<Contents>.*</Contents>", b"", body, flags=re.S).replace(
            b"<IsTruncated>false</IsTruncated>",
            b"<IsTruncated>true</IsTruncated><NextContinuationToken>" + token + b"</NextContinuationToken>")
    return rewrite


@pytest.mark.parametrize("rewrite, refused", [
    (leading_on(), "100 pages in a row say more follow and hold no object"),
    (listed(*(f"data/alice/{i:05}" for i in range(1001))), "a page of 1003 objects"),
    (listed("data/alice/b", "data/alice/a"), "it lists 'data/alice/a' after 'data/alice/b'"),
    (listed("data/alice/x%01"), "with a control character"),  # keys come URL-encoded (EncodingType=url)
])
def test_a_listing_that_never_ends_or_is_out_of_order_is_refused(s3, rewrite, refused):
    """A hostile S3 server leads the listing on with alternating continuation tokens and no object, sends more
    than a page may hold, or lists keys out of order (how a listing that never repeats itself still ends)."""
    import boto3

    from weightkeeper.errors import DownloadError
    from weightkeeper.layout import parse_s3_uri
    from weightkeeper.s3 import list_source

    s3.put("data/alice/config.json", b"{}")
    s3.put("data/alice/model.safetensors", b"weights")
    client = boto3.client("s3", endpoint_url=s3.proxy.url, region_name="us-east-1")
    s3.proxy.rewrite_listing = rewrite
    with pytest.raises(DownloadError, match=re.escape(refused)):
        list_source(client, parse_s3_uri(f"s3://{s3.bucket}/data/alice/"))
    assert s3.proxy.count("GET", f"/{s3.bucket}") <= 101


def test_refused_prefix_delete_keeps_the_model_and_retries_until_s3_accepts(wk, hub, s3):
    commit = hub.add_repo("acme/refused", tiny_files("s3-refused"))
    wk.declare("refused", "hf://acme/refused", workspaces=["team-a"])
    assert ensure_model("refused") == "Ready"
    path = wk.registry.get_model("refused").local_paths[0].path
    wk.rewrite(hf_endpoint=hub.url, cleanup_retry_seconds=0.5, cleanup_retry_max_seconds=1)
    s3.proxy.refuse_deletes = True
    deletion = in_thread(delete_model, "refused")
    wait_until(lambda: wk.registry.get_model("refused").cleanup_attempts >= 2, what="refused deletes")
    model = wk.registry.get_model("refused")
    assert model.phase == "Deleting" and "AccessDenied" in model.message and "kept" in model.message
    assert model.local_paths == [] and not os.path.lexists(path)  # local paths went first
    listed = [m.name for m in wk.registry.list_models(include_deleting=True)]
    assert listed == ["refused"] and wk.registry.list_models() == []
    assert len(staged_keys(s3, "acme--refused", commit)) == FILES_FETCHED

    s3.proxy.refuse_deletes = False
    deletion.join(60)
    assert deletion.result.get("value") == "Released"
    assert wk.registry.find_model("refused") is None and s3.keys() == []


def test_a_prefix_another_live_model_records_is_kept(wk, hub, s3):
    commit = hub.add_repo("acme/twice", tiny_files("s3-twice"))
    wk.declare("first", "hf://acme/twice", workspaces=["team-a"])
    wk.declare("second", "hf://acme/twice", workspaces=["team-b"])
    assert ensure_model("first") == "Ready" and ensure_model("second") == "Ready"
    assert sum(s3.proxy.uploads.values()) == FILES_FETCHED  # the second found every object staged
    assert delete_model("first") == "Released"
    assert len(staged_keys(s3, "acme--twice", commit)) == FILES_FETCHED
    assert delete_model("second") == "Released"
    assert s3.keys() == []


def test_delete_stops_the_staging_run_first(wk, hub, s3):
    commit = hub.add_repo("acme/slowstage", tiny_files("s3-slow", shards=4, shard_size=1 << 20))
    hub.set_throttle(512 * 1024, repo_id="acme/slowstage")
    try:
        wk.declare("slowstage", "hf://acme/slowstage", workspaces=["team-a"])
        ensure = in_thread(ensure_model, "slowstage")
        wait_until(lambda: wk.registry.get_model("slowstage").phase == "Staging"
                   and wk.registry.get_model("slowstage").staging_lease is not None, what="staging to start")
        assert delete_model("slowstage") == "Released"
        ensure.join(60)
        assert not ensure.is_alive()
        assert s3.keys() == []  # nothing uploaded after the prefix was removed
        assert not (wk.root / "staging" / "slowstage").exists()
    finally:
        hub.set_throttle(None, repo_id="acme/slowstage")
    assert staged_keys(s3, "acme--slowstage", commit) == []


def test_an_s3_source_is_filled_and_never_deleted(wk, hub, s3):
    source_bucket = f"{s3.bucket}-src"
    s3.client.create_bucket(Bucket=source_bucket)
    files = tiny_files("s3-source")
    for name, body in files.items():
        s3.put(f"team/acme--src/{name}", body, bucket=source_bucket)
    s3.put("team/acme--src-b/config.json", b"{}", bucket=source_bucket)
    hub.reset_stats()
    model = wk.declare("src", f"s3://{source_bucket}/team/acme--src/")
    assert [p.path for p in model.local_paths] == [str(wk.volumes[w] / "models" / "acme--src")
                                                  for w in ("team-a", "team-b")]

    assert ensure_model("src") == "Ready"
    model = wk.registry.get_model("src")
    wanted = sorted(k for k in files if k.endswith(".safetensors") or k in FETCHED)
    for p in model.local_paths:
        assert fetched_files(p.path) == wanted and p.size_bytes == expected_size(files)
    assert hub.get_count() == 0 and s3.keys("staging/") == []  # no Hub, no staging
    assert model.staging_uri == f"s3://{source_bucket}/team/acme--src/" and not model.staging_owned
    assert len(model.commit) == 40 and all(f["md5"] for f in model.files)

    assert delete_model("src") == "Released"
    assert len(s3.keys(bucket=source_bucket)) == len(files) + 1  # the source is never ours to delete


def test_repair_fetches_only_the_damaged_file_from_s3(wk, hub, s3):
    commit = hub.add_repo("acme/mend", tiny_files("s3-mend"))
    wk.declare("mend", "hf://acme/mend", workspaces=["team-a"])
    assert ensure_model("mend") == "Ready"
    shard = Path(wk.registry.get_model("mend").local_paths[0].path, "model-00001-of-00002.safetensors")
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=0)
    hub.reset_stats()
    before = s3.proxy.count("GET", f"/{s3.bucket}/staging/")
    reconcile()
    assert wk.registry.get_model("mend").phase == "Ready"
    assert hub.get_count() == 0  # repaired from the staged copy, not the Hub
    assert s3.proxy.count("GET", f"/{s3.bucket}/staging/") - before == 1
    assert s3.proxy.count("GET", f"/{s3.bucket}/staging/acme--mend/{commit}/model-00001-of-00002.safetensors") == 2


def test_credentials_come_from_a_secret_block_and_never_leak(wk, hub, s3, monkeypatch):
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    secret = "wkS3SecretKey0123456789abcdefSECRET"
    hub.add_repo("acme/creds", tiny_files("s3-creds"))
    wk._s3["credentials_block"] = "s3-missing"
    wk.rewrite(hf_endpoint=hub.url)
    wk.declare("nocreds", "hf://acme/creds", workspaces=["team-a"])
    assert ensure_model("nocreds") == "Failed"
    assert "cannot load S3 credentials block 's3-missing'" in wk.registry.get_model("nocreds").message

    Secret(value={"aws_access_key_id": "wk-test", "aws_secret_access_key": secret}).save("s3-creds", overwrite=True)
    wk._s3["credentials_block"] = "s3-creds"
    wk.rewrite(hf_endpoint=hub.url)
    wk.declare("creds", "hf://acme/creds", workspaces=["team-b"])
    assert ensure_model("creds") == "Ready"
    assert delete_model("creds") == "Released" and s3.keys()  # the failed model still records the prefix
    assert delete_model("nocreds") == "Released" and s3.keys() == []
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = [str(log.message) for log in client.read_logs(LogFilter(), limit=200, sort=LogSort.TIMESTAMP_DESC)]
        text = " ".join(logs + [str(r.parameters) for r in client.read_flow_runs(limit=50)]
                        + [str(a.data) for a in client.read_artifacts(limit=100)])
    assert secret not in text
    (deprecated,) = [line for line in logs if "'s3-creds' is a Secret holding JSON, which is deprecated" in line]
    assert "AwsCredentials(aws_access_key_id=..., aws_secret_access_key=...).save('s3-creds')" in deprecated


def test_credentials_come_from_an_aws_credentials_block(wk, s3, monkeypatch):
    from prefect_aws import AwsCredentials

    from weightkeeper.sources import s3_client

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    AwsCredentials(aws_access_key_id="wk-block-key", aws_secret_access_key="wkAwsBlockSecret0123456789").save(
        "s3-aws-creds", overwrite=True)
    wk._s3["credentials_block"] = "s3-aws-creds"
    wk.rewrite()
    client = s3_client(wk.settings)
    signed: list[str] = []
    client.meta.events.register("before-send.s3", lambda request, **_: signed.append(request.headers["Authorization"]))
    client.put_object(Bucket=s3.bucket, Key="probe", Body=b"x")
    assert s3.keys() == ["probe"] and "Credential=wk-block-key/" in str(signed[0])


def test_s3_sources_need_s3_configured_and_take_no_token_block(wk, s3):
    with pytest.raises(InvalidInputError, match="token-block"):
        wk.declare("tok", f"s3://{s3.bucket}/x/acme--m/", token_block="hf-token")
    wk._s3 = None
    wk.rewrite()
    with pytest.raises(InvalidInputError, match="S3 is not configured"):
        wk.declare("nos3", f"s3://{s3.bucket}/x/acme--m/")


def test_with_staging_disabled_new_models_go_direct_and_staged_copies_can_still_be_removed(wk, hub, s3):
    hub.add_repo("acme/off", tiny_files("s3-off"))
    wk.declare("staged-first", "hf://acme/off", workspaces=["team-a"])
    assert ensure_model("staged-first") == "Ready" and s3.keys()
    wk._s3["enabled"] = False
    wk.rewrite(hf_endpoint=hub.url)
    hub.reset_stats()
    s3.proxy.reset()
    wk.declare("direct", "hf://acme/off", workspaces=["team-b"])
    assert ensure_model("direct") == "Ready"
    assert wk.registry.get_model("direct").staging_uri is None
    assert hub.get_count("acme/off") == FILES_FETCHED and sum(s3.proxy.uploads.values()) == 0
    assert delete_model("staged-first") == "Released" and s3.keys() == []


@pytest.mark.parametrize(("table", "error"), [
    ('bucket = "Bad_Bucket"', "valid S3 bucket name"),
    ('prefix = "p"', "bucket is required"),
    ('bucket = "ok-bucket"\nprefix = "/abs"', "plain segments"),
    ('bucket = "ok-bucket"\nprefix = "a/../b"', "plain segments"),
    ('bucket = "ok-bucket"\nregion = ""', "region must be a non-empty string"),
    ('bucket = "ok-bucket"\nenabled = "no"', "enabled must be true or false"),
    ('bucket = "ok-bucket"\nsecret_key = "x"', "[s3]: unknown keys ['secret_key']"),
])
def test_s3_settings_are_validated(tmp_path, table, error):
    config = tmp_path / "config.toml"
    config.write_text(f"[s3]\n{table}\n")
    with pytest.raises(ConfigError) as e:
        load_settings(config)
    assert error in str(e.value)


def test_waiting_on_another_users_deleted_staging_names_no_model_of_theirs(wk, hub, s3):
    """Alice's model in her private workspace is deleted while S3 refuses to remove its staged prefix; bob declares
    the same repository: his model waits for that prefix, and its message names no model of hers."""
    hub.add_repo("acme/hidden-stage", tiny_files("s3-hidden-stage"))
    wk.declare("alice-secret", "hf://acme/hidden-stage", workspaces=["private"])
    assert ensure_model("alice-secret") == "Ready"
    wk.rewrite(hf_endpoint=hub.url, cleanup_retry_seconds=0.5, cleanup_retry_max_seconds=1)
    s3.proxy.refuse_deletes = True
    deletion = in_thread(delete_model, "alice-secret")
    try:
        wait_until(lambda: wk.registry.get_model("alice-secret").cleanup_attempts >= 1, what="a refused delete")
        wk.declare("bob-stage", "hf://acme/hidden-stage", workspaces=["team-a"], owner_name="bob", owner_uid=1001)
        ensure = in_thread(ensure_model, "bob-stage")
        message = wait_until(lambda: (m := wk.registry.get_model("bob-stage").message).startswith("Waiting") and m,
                             what="bob's staging to wait")
        assert message.startswith("Waiting for deleted another user's model to finish with s3://"), message
        assert "alice" not in message
    finally:
        s3.proxy.refuse_deletes = False
    deletion.join(60)
    ensure.join(120)
    assert deletion.result.get("value") == "Released" and ensure.result.get("value") == "Ready"


def test_two_users_s3_sources_that_list_the_same_files_never_share_a_copy(wk, hub, s3):
    """Bob lists under his prefix the names, sizes and MD5s alice's prefix lists (the same last segment too):
    files made to collide in MD5 would pass for hers (simulated: the very bytes, as what matters is where they
    go). Each model gets a copy of its own source: bob's files never stand in alice's model, and a repair of
    hers fails naming her source to her alone, while bob's model stays Ready."""
    source = f"{s3.bucket}-src"
    s3.client.create_bucket(Bucket=source)
    files = tiny_files("s3-two-sources")
    for owner in ("bob", "alice"):
        for name, body in files.items():
            s3.put(f"{owner}/llama/{name}", body, bucket=source)
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("src-bob", f"s3://{source}/bob/llama/", subpath="models/bob", owner_name="bob", owner_uid=1001,
               **shared)
    assert ensure_model("src-bob") == "Ready"
    wk.declare("src-alice", f"s3://{source}/alice/llama/", **shared)
    assert ensure_model("src-alice") == "Ready"
    copies = {a.users[0].model: a for a in wk.registry.list_artifacts()}
    assert sorted(copies) == ["src-alice", "src-bob"] and all(len(a.users) == 1 for a in copies.values())
    alice = wk.registry.get_model("src-alice")
    assert os.path.realpath(alice.local_paths[0].path) == copies["src-alice"].path
    assert os.stat(Path(copies["src-alice"].path, SHARD)).st_ino != os.stat(Path(copies["src-bob"].path, SHARD)).st_ino
    Path(copies["src-alice"].path, SHARD).unlink()
    s3.client.delete_object(Bucket=source, Key=f"alice/llama/{SHARD}")
    assert reconcile()[copies["src-alice"].path] == "failed"
    bob, alice = wk.registry.get_model("src-bob"), wk.registry.get_model("src-alice")
    assert bob.phase == "Ready" and "alice" not in bob.message.replace(str(wk.root), "")
    assert alice.phase == "Failed" and f"s3://{source}/alice/llama/{SHARD}" in alice.message  # her own source


def test_botocore_debug_logs_carry_no_session_token_or_signature(wk, hub, s3, monkeypatch, caplog):
    """With DEBUG logging on, staging and filling from S3 with a session token log neither the token nor a
    signature (botocore logs the signed headers, the string it signs and the signature at DEBUG)."""
    token = "wkSessionToken0123456789abcdefSECRET"
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    hub.add_repo("acme/debug-log", tiny_files("s3-debug-log"))
    wk.declare("debug-log", "hf://acme/debug-log", workspaces=["team-a"])
    with caplog.at_level(logging.DEBUG):
        assert ensure_model("debug-log") == "Ready"
    assert {"botocore.hooks", "urllib3.connectionpool"} <= {r.name for r in caplog.records}  # DEBUG was on
    for secret in (token, "Signature", "Credential=", "X-Amz-Security-Token"):
        assert secret not in caplog.text, secret


def test_waiting_for_a_download_slot_does_not_count_against_the_staging_timeout(wk, hub, s3, monkeypatch):
    """Every download slot is busy for longer than download_timeout_seconds before staging gets one: the staging run
    still has its whole timeout to fetch and upload (as a download has), rather than failing for good at once."""
    import contextlib
    import time

    from weightkeeper import runtime

    taken = runtime.download_slot  # what `runtime.fetch_in_slot` holds

    @contextlib.contextmanager
    def late_slot(settings, on_wait):
        time.sleep(6)
        with taken(settings, on_wait):
            yield

    monkeypatch.setattr(runtime, "download_slot", late_slot)
    hub.add_repo("acme/late-slot", tiny_files("s3-late-slot"))
    wk.rewrite(hf_endpoint=hub.url, download_timeout_seconds=5)
    wk.declare("late-slot", "hf://acme/late-slot", workspaces=["team-a"])
    assert ensure_model("late-slot") == "Ready", wk.registry.get_model("late-slot").message


# -- a staging bucket that takes bytes slowly -------------------------------------------------------------------------


def _left_running() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith(("stage", "watchdog", "fetch"))]


@pytest.mark.parametrize("drip, settings, said", [
    ((4096, 0.1), {"min_download_bytes_per_second": 256 * 1024, "stall_seconds": 2},
     "stalled: S3 took"),
    ((4096, 0.1), {"download_timeout_seconds": 4, "min_download_bytes_per_second": 1}, "exceeded its timeout"),
    ((0, 0.1), {"download_timeout_seconds": 4, "min_download_bytes_per_second": 0}, "exceeded its timeout"),
], ids=["below-the-pace", "past-the-deadline", "silent-past-the-deadline"])
def test_a_staging_bucket_that_takes_bytes_slowly_fails_the_staging_promptly(wk, hub, s3, download_limit, monkeypatch,
                                                                             drip, settings, said):
    """The staging bucket drips an upload's body (40 KB/s), or takes no more of it at all: the staging run fails at
    the minimum pace (each of its attempts) or at its deadline, as a download from the Hub would, in one line naming
    the model, its staged prefix, why and what next; its download slot is given back and nothing of it runs on."""
    import time

    from weightkeeper.runtime import slots_in_use
    from weightkeeper.tasks.stage import stage_to_s3

    monkeypatch.setattr(stage_to_s3, "retry_delay_seconds", [0, 0])
    commit = hub.add_repo("acme/drip-stage", tiny_files("s3-drip-stage", shards=1, shard_size=8 << 20))
    wk.rewrite(hf_endpoint=hub.url, **settings)
    wk.declare("drip-stage", "hf://acme/drip-stage", workspaces=["team-a"])
    s3.proxy.drip_uploads(*drip)
    try:
        started = time.monotonic()
        run = in_thread(ensure_model, "drip-stage")
        run.join(60)
        took = time.monotonic() - started
        assert not run.is_alive(), "the staging run still goes on after 60 s"
        assert run.result.get("value") == "Failed", run.result
        model = wk.registry.get_model("drip-stage")
        assert model.phase == "Failed", (model.phase, model.message)
        assert f"staging 'drip-stage' to s3://{s3.bucket}/staging/acme--drip-stage/{commit}/ " in model.message
        assert said in model.message and "\n" not in model.message, model.message
        if said.startswith("stalled"):
            assert "below the minimum of 262144 B/s (min_download_bytes_per_second); the objects already staged are " \
                   "kept and the next attempt uploads the rest" in model.message, model.message
            assert took < 30, took  # three attempts, each stopped about 2 s after S3 took too little
        else:
            assert "`weightkeeper model ensure` resumes it" in model.message, model.message
            assert took < 15, took  # stopped at its 4 s deadline, not retried
        assert s3.proxy.drips >= 1  # the upload had begun
        assert slots_in_use()[0] == 0  # the download slot is given back
        assert _left_running() == []
        assert "model-00001-of-00001.safetensors" not in staged_keys(s3, "acme--drip-stage", commit)
    finally:
        s3.proxy.reset()


def test_a_delete_while_the_staging_bucket_takes_nothing_stops_the_staging_at_once(wk, hub, s3, download_limit):
    """The staging bucket stops taking an upload's bytes (no progress callback fires any more), with no minimum pace
    and a long timeout: deleting the model still stops the staging run at once (its watchdog's beat)."""
    import time

    from weightkeeper.runtime import slots_in_use

    commit = hub.add_repo("acme/silent-stage", tiny_files("s3-silent-stage", shards=1, shard_size=8 << 20))
    wk.rewrite(hf_endpoint=hub.url, min_download_bytes_per_second=0)
    wk.declare("silent-stage", "hf://acme/silent-stage", workspaces=["team-a"])
    s3.proxy.drip_uploads(0)
    try:
        ensure = in_thread(ensure_model, "silent-stage")
        wait_until(lambda: s3.proxy.drips >= 1, what="an upload to begin")
        started = time.monotonic()
        assert delete_model("silent-stage") == "Released"
        ensure.join(30)
        assert not ensure.is_alive()
        assert time.monotonic() - started < 20
        assert "error" not in ensure.result, ensure.result
        assert slots_in_use()[0] == 0
        assert _left_running() == []
        assert staged_keys(s3, "acme--silent-stage", commit) == []
    finally:
        s3.proxy.reset()
