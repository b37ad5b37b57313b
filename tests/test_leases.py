"""The one lease: the takeover rule (pure, exhaustively), the one renewer, and takeover as a user meets it."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

from conftest import tiny_files
from test_cli import cli
from test_lifecycle import wait_until

from weightkeeper.lease import RENEWER, renewed
from weightkeeper.registry import Holder, open_registry
from weightkeeper.registry.common import process_start_time, this_host, utcnow
from weightkeeper.registry.leases import Kind, Lease, abandoned, takeable

NOW = utcnow()
HERE = "this-host"


def lease(run: str, host: str, pid: int, started: float, lapses_in: float) -> Lease:
    return Lease("path", 1, Holder(run, host, pid, started), "download", NOW - timedelta(seconds=5),
                 NOW + timedelta(seconds=lapses_in))


def test_takeover_rule_over_every_combination():
    """Free, own, lapsed, or a process of this host that is gone: taken. A reservation (no process) only
    lapses; another host's live-looking holder is trusted until its lease lapses. Own is the same run in the same
    process: another process of the run (a rescheduled pod while the evicted one still writes) is another holder."""
    me = Holder("me", HERE, 10, 1.0)
    assert takeable(None, me, NOW, HERE)
    for lapsed, alive in itertools.product((True, False), (True, False)):
        mine = Lease("path", 1, me, "download", NOW, NOW + timedelta(seconds=-1 if lapsed else 30))
        assert takeable(mine, me, NOW, HERE, alive=lambda h: alive)
    for run, host, pid, started, lapsed, alive in itertools.product(
            ("me", "them"), (HERE, "other-host"), (0, 10, 42), (0.0, 7.0), (True, False), (True, False)):
        held = lease(run, host, pid, started, -1 if lapsed else 30)
        gone = host == HERE and pid > 0 and started > 0 and not alive
        expected = lapsed or gone
        assert takeable(held, me, NOW, HERE, alive=lambda h: alive) is expected, (run, host, pid, started, lapsed,
                                                                                  alive)
        assert abandoned(held, NOW, HERE, alive=lambda h: alive) is (lapsed or gone)


def test_a_second_process_of_one_run_is_another_holder(tmp_path):
    """Evicted, a run's pod is rescheduled as the same flow run while the old one still writes through its grace
    period: the new process waits for the old one's lease, and the old one, once taken over, is told it lost the
    path and can neither renew it nor mark it Ready."""
    registry = open_registry(f"sqlite:///{tmp_path / 'r.db'}")
    from test_registry import plan, spec

    path_id = registry.create_model(spec("m"), plan("/v/models/o--n")).local_paths[0].id
    evicted, rescheduled = Holder("run-1/1", "pod-a", 7, 100.0), Holder("run-1/1", "pod-b", 7, 200.0)
    assert registry.claim_download("m", path_id, evicted, 60).ok
    assert registry.claim_download("m", path_id, rescheduled, 60).outcome == "busy"
    assert registry.renew_leases([("path", path_id, rescheduled, 60)]) == ({("path", path_id)}, set())
    assert not registry.path_downloaded("m", path_id, rescheduled, 1, "1 bytes")
    assert registry.renew_leases([("path", path_id, evicted, 0)]) == (set(), set())  # lapsed
    assert registry.claim_download("m", path_id, rescheduled, 60).ok
    assert registry.renew_leases([("path", path_id, evicted, 60)]) == ({("path", path_id)}, set())
    assert not registry.path_progressed("m", path_id, evicted, 5)
    assert not registry.path_downloaded("m", path_id, evicted, 1, "1 bytes")
    path = registry.get_model("m").local_paths[0]
    assert path.status == "Downloading" and path.lease.holder == rescheduled


def test_a_run_whose_lease_was_dropped_never_marks_the_path_ready(tmp_path):
    """A run paused before it measured its path; meanwhile its lease was dropped and the path is another run's
    business (here: failed by it). Resumed, the stale run's Ready is refused: nothing vouches for the bytes. Once
    another run made the path Ready, the stale run cannot fail or stop it either; a Ready recorded without a holder
    (hashed whole) never overrides a run that works on the path."""
    registry = open_registry(f"sqlite:///{tmp_path / 'r.db'}")
    from test_registry import plan, spec

    path_id = registry.create_model(spec("m"), plan("/v/models/o--n")).local_paths[0].id
    stale, fresh = Holder("run-1/1", "host", 7, 100.0), Holder("run-2/1", "host", 8, 100.0)
    assert registry.claim_download("m", path_id, stale, 0).ok  # lapses at once
    assert registry.claim_download("m", path_id, fresh, 60).ok
    registry.path_failed("m", path_id, fresh, "cut off halfway")
    assert not registry.path_downloaded("m", path_id, stale, 5, "5 bytes")
    path = registry.get_model("m").local_paths[0]
    assert path.status == "Failed" and path.size_bytes != 5 and path.message == "cut off halfway"
    assert registry.claim_download("m", path_id, fresh, 60).ok
    assert registry.path_downloaded("m", path_id, fresh, 7, "7 bytes")
    assert registry.path_downloaded("m", path_id, fresh, 7, "7 bytes")  # a retried call: already recorded
    registry.path_failed("m", path_id, stale, "the stale run gives up")  # nor does it fail a Ready path
    registry.path_stopped("m", path_id, stale, "the stale run stops")
    path = registry.get_model("m").local_paths[0]
    assert (path.status, path.size_bytes, path.message) == ("Ready", 7, "7 bytes")
    third = Holder("run-3/1", "host", 9, 100.0)
    assert registry.claim_download("m", path_id, third, 60).ok
    assert not registry.path_downloaded("m", path_id, None, 7, "hashed whole")  # another run works on it
    assert registry.get_model("m").local_paths[0].lease.holder == third


def test_a_holder_cut_off_from_the_registry_stops_before_its_lease_lapses(tmp_path, monkeypatch):
    """The registry is unreachable (a partition, a hung connection): renewals fail, so the holder cannot hear of a
    delete or a takeover. It counts itself stopped once LAPSE_SHARE of the lease passed unrenewed, before another
    run may take the lease; renewals that come back let it go on."""
    from weightkeeper import lease as leases

    registry = open_registry(f"sqlite:///{tmp_path / 'r.db'}")
    from test_registry import plan, spec

    path_id = registry.create_model(spec("m"), plan("/v/models/o--n")).local_paths[0].id
    mine = Holder.here("cut-off")
    assert registry.claim_download("m", path_id, mine, 2).ok
    with renewed(registry, Kind.PATH, path_id, mine, 2) as held:
        time.sleep(1.0)
        assert not held.stopped  # renewed every 0.5 s
        with monkeypatch.context() as cut:
            cut.setattr(registry, "renew_leases", lambda _held: (_ for _ in ()).throw(OSError("no route to host")))
            wait_until(lambda: held.stopped, timeout=5, what="the holder to stop")
            lease = registry.lease_of(Kind.PATH, path_id)
            assert lease.holder == mine and lease.lapses_in() > 0  # nobody else may take it yet
            assert not (held.lost.is_set() or held.stop.is_set()) and held.lapsing
        wait_until(lambda: not held.stopped, timeout=5, what="a renewal to come back")
    assert leases.LAPSE_SHARE < 1


def test_describe_says_who_since_when_and_when_it_lapses():
    text = lease("run-7", "gpu-3", 4242, 1.0, 42).describe(NOW)
    assert text.startswith("run run-7 on host gpu-3 (pid 4242) since ") and text.endswith("lapses in 42 s")


def test_a_dead_process_of_this_host_is_taken_over_at_once_and_a_reused_pid_is_not_alive(tmp_path):
    registry = open_registry(f"sqlite:///{tmp_path / 'r.db'}")
    from test_registry import plan, spec

    path_id = registry.create_model(spec("m"), plan("/v/models/o--n")).local_paths[0].id
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = Holder("gone", this_host(), dead.pid, 123.0)
    assert registry.claim_download("m", path_id, gone, 600).ok
    assert registry.claim_download("m", path_id, Holder.here("next"), 600).ok  # at once, not after 600 s
    me = Holder.here("me")  # this very process under another start time is a reused pid: gone
    assert takeable(lease("x", me.host, me.pid, me.started + 1, 30), Holder.here("y"), NOW, me.host)
    assert not takeable(lease("x", me.host, me.pid, process_start_time(me.pid), 30), Holder.here("y"), NOW,
                        me.host)


def test_one_renewer_thread_renews_every_lease_and_reports_lost_and_stopped(tmp_path):
    registry = open_registry(f"sqlite:///{tmp_path / 'r.db'}")
    from test_registry import plan, spec

    paths = [p.id for p in registry.create_model(spec("m"), plan(*[f"/v/models/m{i}" for i in range(6)])).local_paths]
    mine = Holder.here("mine")
    for path_id in paths:
        assert registry.claim_download("m", path_id, mine, 0.6).ok
    before = {t.name for t in threading.enumerate()}
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(renewed(registry, Kind.PATH, p, mine, 0.6)) for p in paths]
        renewers = [t for t in threading.enumerate() if t.name == "weightkeeper-lease-renewer"]
        assert len(renewers) == 1, renewers  # one thread, whatever the number of leases
        time.sleep(1.5)  # past the 0.6 s lease: only renewals keep it
        assert registry.claim_download("m", paths[0], Holder("other", "elsewhere", 1, 1.0), 60).outcome == "busy"
        registry.release_lease(Kind.PATH, paths[1], mine)
        registry.claim_download("m", paths[1], Holder("thief", "elsewhere", 1, 1.0), 60)
        registry.mark_deleting("m")
        wait_until(lambda: held[1].lost.is_set() and held[0].stop.is_set(), timeout=5, what="the renewer to notice")
        assert not held[0].lost.is_set() and held[0].stopped and held[1].stopped
    assert not RENEWER._held
    assert {t.name for t in threading.enumerate()} - before <= {"weightkeeper-lease-renewer"}


def test_a_live_holder_on_another_host_is_waited_for_with_a_line_then_taken_over(wk, hub):
    """`model ensure --wait` while another host's run holds the model: it waits, saying who holds the lease,
    since when and when it lapses, and takes over once it lapsed."""
    hub.add_repo("acme/elsewhere", tiny_files("elsewhere"))
    wk.declare("elsewhere", "hf://acme/elsewhere", workspaces=["team-a"])
    registry = wk.registry
    assert registry.claim_run("elsewhere", "ensure-model", Holder("run-on-gpu-9", "gpu-9", 4242, 99.0), 15) is None
    started = time.monotonic()
    out = cli(wk, "model", "ensure", "elsewhere", "--wait")
    assert time.monotonic() - started >= 14  # it waited for the lease to lapse
    text = out.stdout + out.stderr
    assert "waiting for ensure-model run run-on-gpu-9 on host gpu-9 (pid 4242) since" in text, text
    assert "lapses in" in text and registry.get_model("elsewhere").phase == "Ready"
    assert registry.run_leases() == {}


def test_create_wait_killed_mid_download_then_ensure_wait_takes_over_at_once(wk, hub):
    """SIGKILL a `model create --wait`; `model ensure --wait` right after takes the model over at once (the
    holder was this host's process, now gone), resumes the partial files, and shows the dead run Crashed."""
    files = tiny_files("takeover", shards=2, shard_size=8 << 20)
    hub.add_repo("acme/takeover", files)
    hub.set_throttle(2 << 20, repo_id="acme/takeover")
    wk.rewrite(hf_endpoint=hub.url, lease_seconds=600)  # waiting out the lease would take ten minutes: only takeover is fast
    env = dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config))
    log = open(wk.root / "create.log", "wb")
    create = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "model", "create", "takeover", "--source",
                               "hf://acme/takeover", "--workspace", "team-a", "--wait"], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: (m := wk.registry.find_model("takeover")) and m.local_paths[0].bytes_done > 4 << 20,
                   timeout=120, what=f"the first run to fetch 4 MiB ({wk.root / 'create.log'})")
    finally:
        log.close()
        os.killpg(create.pid, signal.SIGKILL)
        create.wait()
        hub.set_throttle(None, repo_id="acme/takeover")
    dead_run = wk.registry.run_leases()["takeover"].lease.holder.run
    started = time.monotonic()
    out = cli(wk, "model", "ensure", "takeover", "--wait")
    assert time.monotonic() - started < 60 and "Ready" in out.stdout
    assert "whose process is gone" in out.stdout + out.stderr
    from prefect.client.orchestration import get_client

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(dead_run).state.name == "Crashed"
        (child,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[dead_run])))  # its in-process download-to-path
        assert child.name == "download-takeover-team-a" and child.state.name == "Crashed"


def test_delete_wait_right_after_a_killed_create_releases_without_waiting_out_the_lease(wk, hub):
    """The same for `model delete --wait`: the dead run's download is not waited for, its files go."""
    hub.add_repo("acme/dropped", tiny_files("dropped", shards=1, shard_size=8 << 20))
    hub.set_throttle(1 << 20, repo_id="acme/dropped")
    wk.rewrite(hf_endpoint=hub.url, lease_seconds=600)
    env = dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config))
    create = subprocess.Popen([sys.executable, "-m", "weightkeeper.cli", "model", "create", "dropped", "--source",
                               "hf://acme/dropped", "--workspace", "team-a", "--wait"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: (m := wk.registry.find_model("dropped")) and m.local_paths[0].bytes_done > 1 << 20,
                   timeout=120, what="the first run to fetch 1 MiB")
    finally:
        os.killpg(create.pid, signal.SIGKILL)
        create.wait()
        hub.set_throttle(None, repo_id="acme/dropped")
    path = wk.registry.get_model("dropped").local_paths[0].path
    started = time.monotonic()
    out = cli(wk, "model", "delete", "dropped", "--wait")
    assert time.monotonic() - started < 60 and "released" in out.stdout
    assert wk.registry.find_model("dropped") is None and not os.path.lexists(path)


def test_a_container_is_a_host_of_its_own(monkeypatch):
    """pids mean something only within their namespace: two containers with one host name are two hosts, so
    neither takes the other's live lease for a dead process."""
    import weightkeeper.registry.common as common

    for namespace, expected in (("pid:[4026531836]", socket_host()), ("pid:[4026532411]", f"{socket_host()}/4026532411")):
        monkeypatch.setattr(common.os, "readlink", lambda path, ns=namespace: ns)
        common.this_host.cache_clear()
        assert common.this_host() == expected
    monkeypatch.undo()
    common.this_host.cache_clear()


def socket_host() -> str:
    import socket

    return socket.gethostname()
