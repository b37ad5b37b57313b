"""The one-machine lifecycle end to end, through a real Prefect server and the real HF client."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import expected_size, tiny_files

from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.download import PARTIAL_DIR
from weightkeeper.errors import ConflictError
from weightkeeper.registry import Registry
from weightkeeper.runs import run_here
from weightkeeper.runtime import SLOT_WAIT
from weightkeeper.tasks.download import PROGRESS_SECONDS


def fetched_files(path: str) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*")
                  if p.is_file() and not p.relative_to(path).parts[0] == ".cache")


def wait_until(predicate, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def in_thread(fn, *args):
    result: dict = {}

    def run():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.result = result
    return t


def test_create_ready_delete_released(wk, hub):
    files = tiny_files("lifecycle")
    commit = hub.add_repo("acme/life", files)
    hub.reset_stats()
    model = wk.declare("life", "hf://acme/life")
    assert [p.workspace for p in model.local_paths] == ["team-a", "team-b"]
    assert model.phase == "Pending"

    assert ensure_model("life") == "Ready"
    model = wk.registry.get_model("life")
    assert model.commit == commit and model.phase == "Ready"
    for p in model.local_paths:
        assert p.path == str(wk.volumes[p.workspace] / "models" / "acme--life")
        assert p.status == "Ready" and p.size_bytes == expected_size(files)
        assert fetched_files(p.path) == sorted(["config.json", "model-00001-of-00002.safetensors",
                                                "model-00002-of-00002.safetensors", "tokenizer.json",
                                                "tokenizer_config.json"])
        for name in fetched_files(p.path):
            assert (Path(p.path) / name).read_bytes() == files[name]
    for never in ("README.md", "pytorch_model.bin", "tf_model.h5", "original/consolidated.00.pth"):
        assert hub.get_count("acme/life", never) == 0
    assert hub.get_count("acme/life") == 2 * 5

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.filters import FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["ensure-life"])))
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))  # one download-to-path run per path
        assert sorted(c.name for c in children) == ["download-life-team-a", "download-life-team-b"]
        expected = {"download-life-team-a", "download-life-team-b", "record-size-life-team-a"}
        wait_until(lambda: expected <= {t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(
            id={"any_": [c.id for c in children]}))}, what="their task runs (recorded in batches, up to 1 s late)")
        (table,) = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["paths-life"])))
    assert table.type == "table" and "team-b" in str(table.data)

    assert delete_model("life") == "Released"
    for p in model.local_paths:
        assert not os.path.lexists(p.path)
        assert (Path(p.path).parent).is_dir()  # the models dir itself stays
    assert wk.registry.find_model("life") is None


def test_rerun_downloads_nothing(wk, hub):
    hub.add_repo("acme/rerun", tiny_files("rerun"))
    wk.declare("rerun", "hf://acme/rerun", workspaces=["team-a"])
    assert ensure_model("rerun") == "Ready"
    hub.reset_stats()
    assert ensure_model("rerun") == "Ready"
    assert hub.get_count("acme/rerun") == 0
    assert wk.registry.get_model("rerun").local_paths[0].size_bytes == expected_size(tiny_files("rerun"))


def test_partial_file_resumes_from_its_size(wk, hub):
    files = tiny_files("resume", shards=1, shard_size=512 * 1024)
    hub.add_repo("acme/resume", files)
    wk.declare("resume", "hf://acme/resume", workspaces=["team-a"])
    path = wk.made_by_an_earlier_run("resume")
    shard = "model-00001-of-00001.safetensors"
    part = path / PARTIAL_DIR / f"{shard}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(files[shard][:300 * 1024])
    hub.reset_stats()
    assert ensure_model("resume") == "Ready"
    assert (path / shard).read_bytes() == files[shard]
    assert hub.bytes_served("acme/resume") == expected_size(files) - 300 * 1024
    assert any(r.range == f"bytes={300 * 1024}-" for r in hub.requests if r.filename == shard)


def test_corrupt_partial_file_is_dropped_and_refetched(wk, hub):
    files = tiny_files("corrupt-part", shards=1)
    hub.add_repo("acme/corrupt-part", files)
    wk.declare("corrupt-part", "hf://acme/corrupt-part", workspaces=["team-a"])
    path = wk.made_by_an_earlier_run("corrupt-part")
    shard = "model-00001-of-00001.safetensors"
    part = path / PARTIAL_DIR / f"{shard}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\xff" * 1000)  # wrong bytes: the checksum catches it, the retry refetches
    assert ensure_model("corrupt-part") == "Ready"
    assert (path / shard).read_bytes() == files[shard]


@pytest.mark.parametrize("source, expected", [
    ("hf://acme/does-not-exist", "was not found"),
    ("hf://acme/known@no-such-branch", "revision 'no-such-branch' does not exist"),
])
def test_unknown_repo_or_revision_fails_with_message(wk, hub, source, expected):
    hub.add_repo("acme/known", tiny_files("known"))
    wk.declare("unknown", source, workspaces=["team-a"])
    assert ensure_model("unknown") == "Failed"
    model = wk.registry.get_model("unknown")
    assert model.phase == "Failed" and expected in model.message
    assert not os.path.exists(model.local_paths[0].path)


def test_repo_without_weights_fails(wk, hub):
    hub.add_repo("acme/noweights", {"config.json": b"{}", "tf_model.h5": b"x" * 10})
    wk.declare("noweights", "hf://acme/noweights", workspaces=["team-a"])
    assert ensure_model("noweights") == "Failed"
    assert "no weights" in wk.registry.get_model("noweights").message


def test_bin_fallback_when_no_safetensors(wk, hub):
    hub.add_repo("acme/binonly", {"config.json": b"{}", "pytorch_model.bin": b"b" * 100, "x.h5": b"h"})
    wk.declare("binonly", "hf://acme/binonly", workspaces=["team-a"])
    assert ensure_model("binonly") == "Ready"
    path = wk.registry.get_model("binonly").local_paths[0].path
    assert fetched_files(path) == ["config.json", "pytorch_model.bin"]


def test_gated_repo_needs_the_token_block_and_never_leaks_it(wk, hub):
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter

    token = "hf_SECRETtoken1234567890"
    hub.add_repo("acme/gated", tiny_files("gated"), gated=True, token=token)
    wk.declare("gated-no-token", "hf://acme/gated", workspaces=["team-a"])
    assert ensure_model("gated-no-token") == "Failed"
    assert "gated" in wk.registry.get_model("gated-no-token").message

    Secret(value=token).save("hf-token-gated", overwrite=True)
    wk.declare("gated", "hf://acme/gated", workspaces=["team-b"], token_block="hf-token-gated")
    assert ensure_model("gated") == "Ready"
    assert any(r.authorization_present for r in hub.requests if r.repo_id == "acme/gated")

    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(), limit=200)
        runs = client.read_flow_runs(limit=50)
        artifacts = client.read_artifacts(limit=100)
    text = " ".join([str(l.message) for l in logs] + [str(r.parameters) for r in runs]
                    + [str(a.data) for a in artifacts])
    assert token not in text
    assert token not in str(wk.registry.get_model("gated").to_json())


def test_cleanup_failure_keeps_model_and_retry_releases_it(wk, hub, immutable):
    hub.add_repo("acme/stuck", tiny_files("stuck"))
    wk.declare("stuck", "hf://acme/stuck", workspaces=["team-a"])
    assert ensure_model("stuck") == "Ready"
    path = Path(wk.registry.get_model("stuck").local_paths[0].path)
    with immutable(path):
        run = in_thread(delete_model, "stuck")
        model = wait_until(lambda: (m := wk.registry.get_model("stuck")).cleanup_attempts >= 2 and m,
                           what="two failed cleanup attempts")
        assert model.phase == "Deleting" and model.is_deleted
        assert "cleanup of" in model.message and "kept" in model.message
        assert model.local_paths and path.exists()
    run.join(60)
    assert run.result.get("value") == "Released"
    assert not path.exists() and wk.registry.find_model("stuck") is None


def test_a_path_whose_workspace_left_the_config_keeps_the_model_until_it_is_declared_again(wk, hub):
    """The files are never released unremoved: the message says which workspace to declare again, and then
    the deletion finishes."""
    hub.add_repo("acme/gone-ws", tiny_files("gone-ws"))
    wk.declare("gone-ws", "hf://acme/gone-ws", workspaces=["team-a"])
    assert ensure_model("gone-ws") == "Ready"
    path = Path(wk.registry.get_model("gone-ws").local_paths[0].path)
    wk.rewrite(hf_endpoint=hub.url, workspaces=[w for w in wk._workspaces if w["name"] != "team-a"])
    with pytest.raises(Exception, match="cleanup of 'gone-ws' incomplete"):
        delete_model("gone-ws")
    model = wk.registry.get_model("gone-ws")
    assert model.phase == "Deleting" and path.is_dir() and model.local_paths
    assert f"workspace 'team-a' is no longer declared in {wk.config}; declare it again" in model.message
    wk.rewrite(hf_endpoint=hub.url)
    assert delete_model("gone-ws") == "Released"
    assert not path.exists() and wk.registry.find_model("gone-ws") is None


def test_live_models_directory_is_kept(wk, hub):
    files = tiny_files("shared")
    hub.add_repo("acme/shared", files)
    wk.declare("first", "hf://acme/shared", workspaces=["team-a"])
    assert ensure_model("first") == "Ready"
    with pytest.raises(ConflictError) as e:
        wk.declare("dup", "hf://acme/shared", workspaces=["team-a"])
    assert e.value.code == "AlreadyExists"
    wk.declare("second", "hf://acme/shared", workspaces=["team-a", "team-b"])
    assert ensure_model("second") == "Failed"
    second = {p.workspace: p for p in wk.registry.get_model("second").local_paths}
    assert second["team-a"].status == "Failed" and "owned by model 'first'" in second["team-a"].message
    assert second["team-b"].status == "Ready"
    assert delete_model("second") == "Released"
    first = wk.registry.get_model("first").local_paths[0]
    assert fetched_files(first.path) and first.status == "Ready"
    assert not os.path.exists(second["team-b"].path)


def test_directory_another_live_model_owns_is_kept_even_if_both_claim_it(wk, hub):
    """Defence in depth: even if the registry said two models own one directory, the live one keeps it."""
    from sqlalchemy import update

    from weightkeeper.registry.schema import LocalPathRow

    hub.add_repo("acme/both", tiny_files("both"))
    wk.declare("keeper", "hf://acme/both", workspaces=["team-a"])
    assert ensure_model("keeper") == "Ready"
    other = wk.declare("other", "hf://acme/both", workspaces=["team-a", "team-b"])
    made = wk.registry.get_model("keeper").local_paths[0].made  # as if "other" had made the directory too
    with wk.registry.engine.begin() as conn:
        conn.execute(update(LocalPathRow).where(LocalPathRow.id == other.local_paths[0].id).values(owned=True,
                                                                                                   made=made))
    assert delete_model("other") == "Released"
    assert fetched_files(wk.registry.get_model("keeper").local_paths[0].path)


def test_files_the_model_never_put_down_are_untouched(wk, hub):
    from sqlalchemy import update

    from weightkeeper.registry.schema import LocalPathRow

    model = wk.declare("never-ran", "hf://acme/never-ran", workspaces=["team-a"])
    path = Path(model.local_paths[0].path)
    path.mkdir(parents=True)
    (path / "someone-elses.safetensors").write_bytes(b"precious")
    st = path.stat()  # even a registry that recorded the directory as made by it: never owned, never removed
    with wk.registry.engine.begin() as conn:
        conn.execute(update(LocalPathRow).where(LocalPathRow.id == model.local_paths[0].id).values(
            made=f"{st.st_dev}:{st.st_ino}"))
    assert delete_model("never-ran") == "Released"
    assert (path / "someone-elses.safetensors").read_bytes() == b"precious"


def test_pending_model_waits_for_a_deleting_models_path(wk, hub, immutable):
    hub.add_repo("acme/handover", tiny_files("handover"))
    wk.declare("old", "hf://acme/handover", workspaces=["team-a"])
    assert ensure_model("old") == "Ready"
    wk.declare("new", "hf://acme/handover", workspaces=["team-a", "team-b"])
    path = Path(wk.registry.get_model("old").local_paths[0].path)
    with immutable(path):
        deletion = in_thread(delete_model, "old")
        wait_until(lambda: wk.registry.get_model("old").cleanup_attempts >= 1, what="old's cleanup to fail")
        with pytest.raises(ConflictError) as e:
            wk.declare("third", "hf://acme/handover", workspaces=["team-a"])
        assert e.value.code == "ResourceProcessing"
        ensure = in_thread(ensure_model, "new")
        waiting = wait_until(lambda: next((p for p in wk.registry.get_model("new").local_paths
                                           if p.workspace == "team-a" and p.status == "Waiting"), None),
                             what="new to wait for old's cleanup")
        assert "Waiting for deleted model 'old'" in waiting.message
    deletion.join(60)
    assert deletion.result.get("value") == "Released"
    ensure.join(60)
    assert ensure.result.get("value") == "Ready"
    assert all(p.status == "Ready" for p in wk.registry.get_model("new").local_paths)


def test_delete_stops_a_running_download_first(wk, hub):
    files = tiny_files("slow", shards=2, shard_size=2 * 1024 * 1024)
    hub.add_repo("acme/slow", files)
    with hub.throttled(256 * 1024, repo_id="acme/slow"):
        wk.declare("slow", "hf://acme/slow", workspaces=["team-a"])
        ensure = in_thread(ensure_model, "slow")
        wait_until(lambda: wk.registry.get_model("slow").local_paths[0].bytes_done > 0, what="download to start")
        path = wk.registry.get_model("slow").local_paths[0].path
        assert delete_model("slow") == "Released"
        assert wk.registry.find_model("slow") is None
        ensure.join(60)
        assert not ensure.is_alive()
        assert not os.path.lexists(path)


def test_download_timeout_fails_the_path_and_keeps_the_partial_files(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, download_timeout_seconds=1)
    hub.add_repo("acme/timeout", tiny_files("timeout", shards=1, shard_size=4 * 1024 * 1024))
    with hub.throttled(1024 * 1024, repo_id="acme/timeout"):
        wk.declare("timeout", "hf://acme/timeout", workspaces=["team-a"])
        assert ensure_model("timeout") == "Failed"
    model = wk.registry.get_model("timeout")
    assert "exceeded its timeout" in model.message
    assert any(Path(model.local_paths[0].path, PARTIAL_DIR).rglob("*.part"))


def test_a_long_download_shows_its_progress_and_a_short_one_only_its_table(wk, hub, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import weightkeeper.tasks.download

    def artifacts(key: str):
        with get_client(sync_client=True) as client:
            return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))

    default = weightkeeper.tasks.download.ARTIFACT_SECONDS
    monkeypatch.setattr(weightkeeper.tasks.download, "ARTIFACT_SECONDS", 0.5)
    hub.add_repo("acme/long", tiny_files("long", shards=1, shard_size=3 * 1024 * 1024))
    hub.add_repo("acme/short", tiny_files("short"))
    with hub.throttled(1024 * 1024, repo_id="acme/long"):
        wk.declare("long", "hf://acme/long", workspaces=["team-a"])
        assert ensure_model("long") == "Ready"
    (progress,) = artifacts("progress-long-team-a")
    assert progress.type == "progress" and progress.data == 100.0 and progress.task_run_id is not None
    monkeypatch.setattr(weightkeeper.tasks.download, "ARTIFACT_SECONDS", default)
    wk.declare("short", "hf://acme/short", workspaces=["team-a"])
    assert ensure_model("short") == "Ready"
    assert artifacts("progress-short-team-a") == [] and len(artifacts("paths-short")) == 1


def test_a_progress_artifact_that_cannot_be_shown_does_not_stop_the_download(wk, hub, monkeypatch):
    import weightkeeper.tasks.download

    def refuse(**_):
        raise RuntimeError("the Prefect server is busy")

    monkeypatch.setattr(weightkeeper.tasks.download, "ARTIFACT_SECONDS", 0.3)
    monkeypatch.setattr(weightkeeper.tasks.download, "create_progress_artifact", refuse)
    hub.add_repo("acme/unshown", tiny_files("unshown", shards=1, shard_size=2 * 1024 * 1024))
    with hub.throttled(1024 * 1024, repo_id="acme/unshown"):
        wk.declare("unshown", "hf://acme/unshown", workspaces=["team-a"])
        assert ensure_model("unshown") == "Ready"
    assert hub.get_count("acme/unshown", "model-00001-of-00001.safetensors") == 1  # in one go, not retried


def test_a_run_started_here_and_every_subflow_send_no_prefect_heartbeat_the_run_lease_is_the_heartbeat(wk, hub):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    from weightkeeper.runtime import prefect_settings

    def events(flow_run_name: str, event: str) -> int:
        with get_client(sync_client=True) as client:
            (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
            found = EventFilter(event=EventNameFilter(name=[event]),
                                resource=EventResourceFilter(id=[f"prefect.flow-run.{run.id}"]))
            return len(client.read_events(found, limit=50).events)

    hub.add_repo("acme/beat", tiny_files("beat"))
    wk.declare("quiet-beat", "hf://acme/beat", workspaces=["team-a"])
    wk.declare("loud-beat", "hf://acme/beat", workspaces=["team-b"])
    with prefect_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):  # on, as in a worker's flow-run process
        assert run_here(ensure_model, "quiet-beat") == "Ready"
        assert ensure_model("loud-beat") == "Ready"
    wait_until(lambda: events("ensure-loud-beat", "prefect.flow-run.heartbeat"), what="the other run's heartbeat event")
    wait_until(lambda: events("ensure-loud-beat", "prefect.flow-run.Completed"), what="its Completed event, after its subflow")
    assert events("ensure-quiet-beat", "prefect.flow-run.heartbeat") == 0
    assert events("download-loud-beat-team-b", "prefect.flow-run.heartbeat") == 0  # its parent's process sends one


def test_private_workspace_without_volume_fails_the_model(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, workspaces=wk._workspaces + [
        {"name": "novol", "public": False, "owner": "alice"}])
    hub.add_repo("acme/novol", tiny_files("novol"))
    wk.declare("novol", "hf://acme/novol", workspaces=["novol"])
    assert ensure_model("novol") == "Failed"
    assert "no volume" in wk.registry.get_model("novol").message


def test_a_volume_missing_on_this_host_fails_the_path_saying_so_and_makes_nothing(wk, hub):
    hub.add_repo("acme/unmounted", tiny_files("unmounted"))
    missing = wk.root / "not-mounted"
    wk.rewrite(hf_endpoint=hub.url, workspaces=[{**wk._workspaces[0], "volume": str(missing)}])
    wk.declare("unmounted", "hf://acme/unmounted", workspaces=["team-a"])
    assert ensure_model("unmounted") == "Failed"
    assert (f"team-a: volume {missing} of workspace 'team-a' is not a directory on this host (not mounted?)"
            in wk.registry.get_model("unmounted").message)
    assert not missing.exists()


def test_download_cap_is_never_exceeded(wk, hub, monkeypatch):
    """At most the limit download at once; a waiting path says so, and writes the same message again at most
    every PROGRESS_SECONDS, however often it polls for a slot."""
    wk.rewrite(hf_endpoint=hub.url, max_concurrent_downloads=2)
    writes: list[tuple[int, str, float]] = []
    progressed = Registry.path_progressed

    def recording(self, name, path_id, holder, bytes_done=None, bytes_total=None, message=None):
        if message and message.startswith(SLOT_WAIT):
            writes.append((path_id, message, time.monotonic()))
        return progressed(self, name, path_id, holder, bytes_done, bytes_total, message)

    monkeypatch.setattr(Registry, "path_progressed", recording)
    names = [f"cap-{i}" for i in range(8)]
    for name in names:
        hub.add_repo(f"acme/{name}", tiny_files(name, shards=1, shard_size=768 * 1024))
        hub.set_throttle(512 * 1024, repo_id=f"acme/{name}")
        wk.declare(name, f"hf://acme/{name}", workspaces=["team-a"])
    hub.reset_stats()
    messages: set[str] = set()
    runs = [in_thread(ensure_model, name) for name in names]
    while any(r.is_alive() for r in runs):
        for m in wk.registry.list_models():
            messages.update(p.message for p in m.local_paths if p.message.startswith("Waiting for a download slot"))
        time.sleep(0.05)
    for name in names:
        hub.set_throttle(None, repo_id=f"acme/{name}")
    assert [r.result.get("value") for r in runs] == ["Ready"] * 8
    assert hub.peak_concurrent_repos == 2
    assert messages and all(re.fullmatch(r"Waiting for a download slot \([0-2]/2 in use\)", m) for m in messages)
    last: dict[int, tuple[str, float]] = {}
    repeats = []
    for path_id, message, at in writes:
        if last.get(path_id, ("", 0.0))[0] == message:
            repeats.append(at - last[path_id][1])
        last[path_id] = (message, at)
    assert repeats and min(repeats) >= PROGRESS_SECONDS - 0.5, repeats  # slack for scheduling; polls are 0.5-1 s apart


def test_a_directory_that_held_other_files_is_refused_and_keeps_them_after_deletion(wk, hub):
    files = tiny_files("adopted")
    hub.add_repo("acme/adopted", files)
    model = wk.declare("adopted", "hf://acme/adopted", workspaces=["team-a"])
    path = Path(model.local_paths[0].path)
    (path / "finetunes").mkdir(parents=True)
    (path / "finetunes" / "mine.safetensors").write_bytes(b"mine")
    assert ensure_model("adopted") == "Failed"
    assert "did not write (finetunes)" in wk.registry.get_model("adopted").local_paths[0].message
    assert delete_model("adopted") == "Released"
    assert fetched_files(str(path)) == ["finetunes/mine.safetensors"]


def test_a_volumeless_private_target_fails_the_model_even_if_others_succeed(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, workspaces=wk._workspaces + [
        {"name": "novol2", "public": False, "owner": "alice"}])
    hub.add_repo("acme/mixed", tiny_files("mixed"))
    wk.declare("mixed", "hf://acme/mixed", workspaces=["team-a", "novol2"])
    assert ensure_model("mixed") == "Failed"
    model = wk.registry.get_model("mixed")
    assert "no volume" in model.message and model.local_paths[0].status == "Ready"



def test_a_tokenless_model_of_a_gated_repository_never_keeps_its_files_once_their_owner_deletes_hers(wk, hub):
    """Bob declares alice's gated repository without a token on her shared path: refused by the Hub, his model
    holds neither the path nor the copy, so her deletion removes her link and the copy with it."""
    from prefect.blocks.system import Secret

    token = "hf_GATEDpin1234567890"
    commit = hub.add_repo("acme/gated-pin", tiny_files("gated-pin"), gated=True, token=token)
    Secret(value=token).save("alice-hf-pin", overwrite=True)
    shared = dict(workspaces=["team-a"], download_policy="reuse-if-exists")
    wk.declare("alice-pin", "hf://acme/gated-pin", token_block="alice-hf-pin", **shared)
    assert ensure_model("alice-pin") == "Ready"
    path = wk.registry.get_model("alice-pin").local_paths[0].path
    copy = os.path.realpath(path)
    wk.declare("bob-pin", "hf://acme/gated-pin", owner_name="bob", owner_uid=1001, **shared)
    assert wk.registry.get_model("bob-pin").local_paths[0].path == path
    assert ensure_model("bob-pin") == "Failed"
    assert wk.registry.get_model("bob-pin").local_paths[0].artifact_id is None  # no user of her copy
    assert delete_model("alice-pin") == "Released"
    assert not os.path.lexists(path) and not os.path.exists(copy) and commit in copy
    assert wk.registry.list_artifacts() == []
    assert wk.registry.get_model("bob-pin").phase == "Failed"  # his model stays, for him to retry with a token
