"""/metrics: every named metric present, counters moving with the events of any process, admins only.

The API runs in process (fastapi's TestClient); models are created and deleted by the flows run here, through
the loopback Hub server. Counters live in the registry, which a PostgreSQL session shares between tests: each
test looks at how they moved.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import pytest
from conftest import expected_size, tiny_files, write_config
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from weightkeeper.hubbudget import budget_message
from weightkeeper.registry import Holder
from weightkeeper.registry.common import this_host, utcnow
from weightkeeper.registry.leases import Lease, takeover
from weightkeeper.registry.metrics import bucket_bound, cumulative
from weightkeeper.registry.runs import reservation
from weightkeeper.runtime import SLOT_WAIT

TOKENS = {"root": "root-token", "alice": "alice-token", "scraper": "scrape-token"}
NAMES = ("weightkeeper_models", "weightkeeper_paths", "weightkeeper_oldest_deletion_timestamp_seconds",
         "weightkeeper_downloaded_bytes", "weightkeeper_shared_copy_served_bytes", "weightkeeper_reused_bytes",
         "weightkeeper_download_duration_seconds", "weightkeeper_cleanup_duration_seconds",
         "weightkeeper_cleanup_failures", "weightkeeper_download_slots_in_use", "weightkeeper_download_slots_limit",
         "weightkeeper_download_slots_waiting", "weightkeeper_hub_requests", "weightkeeper_hub_rate_limited",
         "weightkeeper_hub_budget_waiting", "weightkeeper_lease_takeovers")


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Scraper:
    def __init__(self, wk):
        from weightkeeper.api import create_app

        self.wk = wk
        write_config(wk, hf_endpoint=wk.settings.hf_endpoint, metrics_token_sha256=_sha(TOKENS["scraper"]))
        with wk.config.open("a") as f:
            f.write(f'[[users]]\nname = "root"\nuid = 0\nadmin = true\ntoken_sha256 = "{_sha(TOKENS["root"])}"\n'
                    f'[[users]]\nname = "alice"\nuid = 1000\ntoken_sha256 = "{_sha(TOKENS["alice"])}"\n')
        self.client = TestClient(create_app(wk.settings, wk.registry), raise_server_exceptions=False)

    def get(self, user: str | None = "root", path: str = "/metrics"):
        return self.client.get(path, headers={"Authorization": f"Bearer {TOKENS[user]}"} if user else {})

    def families(self) -> dict:
        r = self.get()
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4"), r.text
        return {f.name: f for f in text_string_to_metric_families(r.text)}

    def samples(self) -> dict[tuple, float]:
        """Every sample: (name, sorted labels) -> value."""
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in self.families().values() for s in f.samples}


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@pytest.fixture
def scraper(wk, download_limit):
    return Scraper(wk)


# -- pure rules ------------------------------------------------------------------------------------


@pytest.mark.without_prefect_server
def test_an_observation_falls_in_the_smallest_bucket_at_or_above_it_and_buckets_add_up():
    assert [bucket_bound(v, (1, 5)) for v in (0, 1, 1.5, 5, 7)] == ["1.0", "1.0", "5.0", "5.0", "+Inf"]
    buckets, total = cumulative([("1.0", 2, 0.5), ("5.0", 1, 4.0), ("+Inf", 1, 9.0), ("3.0", 1, 2.0)], (1, 5))
    assert buckets == [("1.0", 2), ("5.0", 4), ("+Inf", 5)] and total == 15.5  # 3.0: a bound no longer declared


@pytest.mark.without_prefect_server
def test_a_takeover_is_of_another_runs_lease_not_a_reservation_nor_ones_own():
    now, me = utcnow(), Holder("me", "h", 10, 1.0)

    def held(holder: Holder, lapses_in: float) -> Lease:
        from datetime import timedelta

        return Lease("path", 1, holder, "download", now, now + timedelta(seconds=lapses_in))

    them = Holder("them", "other-host", 42, 7.0)
    assert takeover(held(them, -1), me, now, "h") == "abandoned"
    assert takeover(held(them, 30), me, now, "h") == "preempted"
    assert takeover(held(Holder("them", "h", 42, 7.0), 30), me, now, "h", alive=lambda h: False) == "abandoned"
    assert takeover(held(me, -1), me, now, "h") is None
    assert takeover(held(reservation("k"), -1), me, now, "h") is None


# -- through the API -------------------------------------------------------------------------------


def test_every_named_metric_is_present_for_an_admin_or_the_scrape_token_only(scraper):
    families = scraper.families()
    assert set(NAMES) <= set(families), sorted(set(NAMES) - set(families))
    assert not [n for n in families if not n.startswith("weightkeeper_")]  # no process or platform collector
    assert families["weightkeeper_download_slots_limit"].samples[0].value == 4
    assert {s.labels["phase"] for s in families["weightkeeper_models"].samples} == {
        "Pending", "Staging", "Downloading", "Ready", "Failed", "Deleting"}
    assert scraper.get("scraper").status_code == 200
    assert scraper.get(None).status_code == 401
    assert scraper.get("alice").status_code == 403
    assert scraper.get("scraper", "/api/v1/models").status_code == 401  # the scrape token opens /metrics only


def test_a_create_and_a_delete_move_the_counters_and_gauges(wk, hub, scraper):
    from weightkeeper.flows.delete_model import delete_model
    from weightkeeper.flows.ensure_model import ensure_model

    files = tiny_files("metrics-life")
    hub.add_repo("acme/metrics-life", files)
    before = scraper.samples()
    wk.declare("metrics-life", "hf://acme/metrics-life", workspaces=["team-a"])
    assert ensure_model("metrics-life") == "Ready"
    ready = scraper.samples()
    assert moved(before, ready, "weightkeeper_downloaded_bytes_total", workspace="team-a",
                 source="hub") == expected_size(files)
    assert moved(before, ready, "weightkeeper_download_duration_seconds_count", source="hub") == 1
    assert moved(before, ready, "weightkeeper_download_duration_seconds_bucket", source="hub", le="+Inf") == 1
    assert moved(before, ready, "weightkeeper_hub_requests_total", bucket="resolve") >= 1
    assert ready[("weightkeeper_models", (("phase", "Ready"),))] == 1
    assert ready[("weightkeeper_paths", (("status", "Ready"), ("workspace", "team-a")))] == 1

    wk.registry.mark_deleting("metrics-life")
    deleting = scraper.samples()
    assert deleting[("weightkeeper_models", (("phase", "Deleting"),))] == 1
    assert time.time() - deleting[("weightkeeper_oldest_deletion_timestamp_seconds", ())] < 60
    assert delete_model("metrics-life") == "Released"
    released = scraper.samples()
    assert moved(deleting, released, "weightkeeper_cleanup_duration_seconds_count") == 1
    assert released[("weightkeeper_models", (("phase", "Ready"),))] == 0
    assert released[("weightkeeper_models", (("phase", "Deleting"),))] == 0
    assert released[("weightkeeper_paths", (("status", "Ready"), ("workspace", "team-a")))] == 0
    assert ("weightkeeper_oldest_deletion_timestamp_seconds", ()) not in released


def test_a_path_linked_to_a_shared_copy_counts_as_served_not_downloaded(wk, hub, scraper):
    from weightkeeper.flows.ensure_model import ensure_model

    files = tiny_files("metrics-share")
    hub.add_repo("acme/metrics-share", files)
    before = scraper.samples()
    wk.declare("share-one", "hf://acme/metrics-share", workspaces=["team-a"], download_policy="reuse-if-exists")
    assert ensure_model("share-one") == "Ready"  # downloads the shared copy
    first = scraper.samples()
    wk.declare("share-two", "hf://acme/metrics-share", workspaces=["team-a"], subpath="models/two",
               download_policy="reuse-if-exists")
    assert ensure_model("share-two") == "Ready"  # links to it
    second = scraper.samples()
    served, fetched = "weightkeeper_shared_copy_served_bytes_total", "weightkeeper_downloaded_bytes_total"
    assert moved(before, first, fetched, workspace="team-a", source="hub") == expected_size(files)
    assert moved(before, first, served, workspace="team-a") == 0
    assert moved(first, second, served, workspace="team-a") == expected_size(files)
    assert moved(first, second, fetched, workspace="team-a", source="hub") == 0


def test_a_cleanup_failure_moves_its_counter_once_per_attempt(wk, scraper):
    wk.declare("metrics-fail", "hf://acme/absent", workspaces=["team-a"])
    registry = wk.registry
    registry.mark_deleting("metrics-fail")
    before = scraper.samples()
    registry.cleanup_failed("metrics-fail", 1, "cleanup of a path failed: busy")
    registry.cleanup_failed("metrics-fail", 1, "cleanup of another path failed: busy")  # the same attempt
    assert moved(before, scraper.samples(), "weightkeeper_cleanup_failures_total") == 1
    registry.cleanup_failed("metrics-fail", 2, "cleanup failed again")
    assert moved(before, scraper.samples(), "weightkeeper_cleanup_failures_total") == 2


def test_lease_takeovers_count_a_dead_holders_and_a_preempted_run_not_a_reservations(wk, scraper):
    model = wk.declare("metrics-lease", "hf://acme/absent", workspaces=["team-a"])
    registry, path_id = wk.registry, model.local_paths[0].id
    before = scraper.samples()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert registry.claim_download("metrics-lease", path_id, Holder("gone", this_host(), dead.pid, 123.0), 600).ok
    assert registry.claim_download("metrics-lease", path_id, Holder.here("next"), 600).ok
    assert registry.claim_run("metrics-lease", "ensure-model", reservation("api/x"), 60) is None
    assert registry.claim_run("metrics-lease", "ensure-model", Holder.here("ensure"), 60) is None  # its reservation
    assert registry.claim_run("metrics-lease", "delete-model", Holder.here("delete"), 60) is None
    after = scraper.samples()
    assert moved(before, after, "weightkeeper_lease_takeovers_total", kind="path", reason="abandoned") == 1
    assert moved(before, after, "weightkeeper_lease_takeovers_total", kind="run", reason="preempted") == 1
    assert moved(before, after, "weightkeeper_lease_takeovers_total", kind="run", reason="abandoned") == 0


def test_slot_waiters_are_counted_from_live_leases_so_a_crash_does_not_leak(wk, scraper):
    model = wk.declare("metrics-wait", "hf://acme/absent", workspaces=["team-a", "team-b"])
    registry, (a, b) = wk.registry, [p.id for p in model.local_paths]
    holder = Holder.here("waiter")
    assert registry.claim_download("metrics-wait", a, holder, 600).ok
    assert registry.claim_download("metrics-wait", b, holder, 1).ok  # its process dies: the lease lapses
    for path_id in (a, b):
        assert registry.path_progressed("metrics-wait", path_id, holder, message=f"{SLOT_WAIT} (4/4 in use)")
    assert scraper.samples()[("weightkeeper_download_slots_waiting", ())] == 2
    time.sleep(1.2)
    assert scraper.samples()[("weightkeeper_download_slots_waiting", ())] == 1
    assert registry.path_progressed("metrics-wait", a, holder, message=budget_message(42))
    samples = scraper.samples()
    assert samples[("weightkeeper_download_slots_waiting", ())] == 0
    assert samples[("weightkeeper_hub_budget_waiting", ())] == 1


def test_hub_requests_and_429s_are_counted_by_bucket(scraper, wk):
    registry, key = wk.registry, "0" * 64
    before = scraper.samples()
    assert registry.take_hub_request(key, "api", 10, 300) == 0
    registry.hub_throttled(key, "api", 0.01, 300)
    after = scraper.samples()
    assert moved(before, after, "weightkeeper_hub_requests_total", bucket="api") == 1
    assert moved(before, after, "weightkeeper_hub_rate_limited_total", bucket="api") == 1
    assert moved(before, after, "weightkeeper_hub_rate_limited_total", bucket="resolve") == 0


@pytest.mark.without_prefect_server
def test_a_fetch_counts_the_bytes_it_transferred_even_when_it_fails_and_its_time_only_when_complete():
    from weightkeeper.tasks.download import FetchMeter

    class Recorder:
        def __init__(self):
            self.events = []

        def record(self, metric, value=1, **labels):
            self.events.append((metric.name, value, labels))

    registry, progress = Recorder(), []
    with pytest.raises(OSError), FetchMeter(registry, "team-a", "s3", progress.append) as meter:
        for present in (100, 160, 250, 130):  # present at the start, then as ranges report (out of order)
            meter(present)
        raise OSError("connection cut")
    assert registry.events == [("weightkeeper_downloaded_bytes", 150, {"workspace": "team-a", "source": "s3"})]
    assert progress == [100, 160, 250, 130]
    with FetchMeter(registry, "team-a", "hub", progress.append) as meter:
        meter(0)
        meter(10)
    assert [(name, labels) for name, _, labels in registry.events[1:]] == [
        ("weightkeeper_downloaded_bytes", {"workspace": "team-a", "source": "hub"}),
        ("weightkeeper_download_duration_seconds", {"source": "hub"})]


def test_a_prefect_that_hangs_costs_a_scrape_its_slot_gauges_only(scraper, monkeypatch):
    import threading

    from weightkeeper import metrics

    answer, reads = threading.Event(), []

    def hanging() -> tuple[int, int]:
        reads.append(1)
        answer.wait(60)
        return 1, 4

    monkeypatch.setattr(metrics, "slots_in_use", hanging)
    monkeypatch.setattr(metrics, "PREFECT_READ_SECONDS", 0.5)
    for _ in range(2):
        started = time.monotonic()
        families = scraper.families()
        assert time.monotonic() - started < 5 and "weightkeeper_models" in families
        assert "weightkeeper_download_slots_in_use" not in families
    assert len(reads) == 1  # the second scrape waited for the same read: no thread per scrape
    answer.set()
    assert scraper.samples()[("weightkeeper_download_slots_in_use", ())] == 1


def test_a_prefect_error_is_logged_without_the_password_in_its_url(scraper, caplog):
    """PREFECT_API_URL carries user info and Prefect answers the scrape's slot read with a 500 (whose message quotes
    the URL): the scrape answers without the slot gauges, and the warning it logs keeps no password."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prometheus_client import generate_latest

    from weightkeeper.metrics import metrics_registry

    class Failing(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    prefect = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    Thread(target=prefect.serve_forever, daemon=True).start()
    try:
        with temporary_settings({PREFECT_API_URL: f"http://wk:s3cret@127.0.0.1:{prefect.server_port}/api"}):
            text = generate_latest(metrics_registry(scraper.wk.settings, scraper.wk.registry)).decode()
    finally:
        prefect.shutdown()
    assert "weightkeeper_models" in text and "weightkeeper_download_slots_in_use" not in text
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "weightkeeper.metrics"]
    assert warning.startswith("download slots not read from Prefect: Server error '500") and "127.0.0.1" in warning
    assert "s3cret" not in warning, warning
