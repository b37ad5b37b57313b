"""The Hub request budget: its rules, the registry's shared take across processes, and models created at once
against a Hub test server that rate-limits the way the Hub does."""

from __future__ import annotations

import heapq
import random
import re
import subprocess
import sys
import threading
import time
from email.utils import formatdate

import pytest
from conftest import tiny_files
from sqlalchemy import select

from weightkeeper.flows.ensure_model import ensure_model
from weightkeeper.hubbudget import (
    FALLBACK_WAIT_SECONDS,
    MIN_WAIT_SECONDS,
    budget_key,
    ratelimit_wait,
    retry_after_wait,
    throttle_wait,
)
from weightkeeper.registry import open_registry
from weightkeeper.registry.budget import MARGIN_SECONDS, SLOTS, Window, take
from weightkeeper.registry.schema import HubBudgetRow

pure = pytest.mark.without_prefect_server
WAITING = re.compile(r"Waiting for the Hub request budget \(resets in [0-9]+ s\)")


# -- the rules, pure ----------------------------------------------------------------------------------------------

@pure
@pytest.mark.parametrize("headers, wait", [
    ({"RateLimit": '"api";r=0;t=55'}, 55),
    ({"ratelimit": '"api";r=0;t=55', "ratelimit-policy": '"fixed window";"api";q=1000;w=300'}, 55),
    ({"RateLimit": '"api";t=7;r=0'}, 7),  # parameters in any order
    ({"RateLimit": ' "api" ; r = 0 ; t = 9 '}, 9),
    ({"RateLimit": '"resolvers";r=0;t=120', "RateLimit-Policy": '"fixed window";"resolvers";q=5000;w=300'}, 120),
    ({"RateLimit": '"api";r=0;t=99999', "RateLimit-Policy": '"fixed window";"api";q=1000;w=300'}, 300),
    ({"RateLimit": '"api";r=3;t=10, "burst";r=0;t=4'}, 4),  # the exhausted item
    ({"RateLimit": '"a";r=0;t=4, "b";r=0;t=9'}, 9),
    ({"RateLimit": '"api";r=0;t=0'}, 0),
    ({"RateLimit": '"api";r=5;t=55'}, None),  # not exhausted
    ({"RateLimit": '"api";r=0'}, None),
    ({"RateLimit": '"api";t=55'}, None),
    ({"RateLimit": '"api";r=-1;t=5'}, None),
    ({"RateLimit": '"api";r=0;t=-5'}, None),
    ({"RateLimit": '"api";r=0;t=1e9'}, None),
    ({"RateLimit": '"api";r=0;t=5.5'}, None),
    ({"RateLimit": '"api";r=0;t=' + "9" * 40}, None),
    ({"RateLimit": "r=0;t=5"}, None),  # no item name
    ({"RateLimit": "garbage"}, None),
    ({"RateLimit": ""}, None),
    ({"RateLimit": '"api";r=0;t=5' * 2000}, None),
    ({"RateLimit": '"api";r=0;t=5', "RateLimit-Policy": "garbage"}, 5),
    ({"RateLimit": '"api";r=0;t=5', "RateLimit-Policy": '"fixed window";"api";q=1000;w=0'}, 5),
    ({"RateLimit-Policy": '"fixed window";"api";q=1000;w=300'}, None),
    ({}, None),
])
def test_the_ratelimit_header_says_how_long_an_exhausted_bucket_waits(headers, wait):
    assert ratelimit_wait(headers) == wait


@pure
@pytest.mark.parametrize("value, wait", [
    ("120", 120), (" 7 ", 7), ("0", 0), ("-5", None), ("1.5", None), ("abc", None), ("", None),
    ("9" * 40, None), ("7 s", None), (formatdate(1_000_100, usegmt=True), 100), (formatdate(999_000, usegmt=True), 0),
    ("Wed, 99 Foo 2015 07:28:00 GMT", None),
])
def test_retry_after_is_seconds_or_an_http_date_and_anything_else_is_ignored(value, wait):
    assert retry_after_wait({"Retry-After": value}, now=1_000_000) == wait
    assert retry_after_wait({"retry-after": value}, now=1_000_000) == wait


@pure
def test_a_429_waits_the_longest_it_is_told_bounded_by_the_window_and_a_minimum():
    now = 1_000_000.0
    assert throttle_wait({"Retry-After": "20", "RateLimit": '"api";r=0;t=55'}, 0, 300, now) == 55
    assert throttle_wait({"Retry-After": "80", "RateLimit": '"api";r=0;t=55'}, 0, 300, now) == 80
    assert throttle_wait({"Retry-After": "99999999999", "RateLimit": '"api";r=0;t=999999999'}, 0, 300, now) == 300
    assert throttle_wait({"Retry-After": formatdate(now + 10 ** 9, usegmt=True)}, 0, 2, now) == 2
    assert throttle_wait({"Retry-After": "0"}, 0, 300, now) == MIN_WAIT_SECONDS
    waits = [throttle_wait({"RateLimit": "garbage"}, attempt, 60, now) for attempt in range(40)]
    assert waits[0] >= MIN_WAIT_SECONDS and waits == sorted(waits) and waits[-1] == 60


def ask(window: Window, now: float, limit: int, seconds: float, times: int) -> tuple[Window, int, float]:
    granted, wait = 0, 0.0
    for _ in range(times):
        window, wait = take(window, now, limit, seconds)
        granted += wait == 0
    return window, granted, wait


@pure
def test_a_budget_grants_its_limit_then_says_when_the_oldest_request_leaves_its_window():
    window, granted, wait = ask(Window(0, (), 0.0), 100.5, 3, 30, 5)  # slots of 1 s
    assert granted == 3 and wait == pytest.approx(30 + MARGIN_SECONDS + 0.5)
    assert ask(window, 120.0, 3, 30, 1)[1:] == (0, pytest.approx(12))
    assert ask(window, 131.0, 3, 30, 5)[1] == 0
    assert ask(window, 132.0, 3, 30, 5)[1] == 3


@pure
@pytest.mark.parametrize("seconds, limit", [(30, 5), (300, 60), (2, 20), (7, 1)])
def test_no_window_of_the_budget_holds_more_than_its_limit_wherever_it_starts(seconds, limit):
    """Workers asking at random times, each again when told to: any `limit` + 1 grants span more than a
    window and its margin, and a saturated budget still grants nearly its limit per window."""
    rng, window, grants = random.Random(f"{seconds}/{limit}"), Window(0, (), 0.0), []
    asks = sorted(rng.uniform(0, 20 * seconds) for _ in range(40 * limit))
    while asks:
        now = heapq.heappop(asks)
        window, wait = take(window, now, limit, seconds)
        if wait:
            heapq.heappush(asks, now + wait)
        else:
            grants.append(now)
    assert all(b - a >= seconds + MARGIN_SECONDS for a, b in zip(grants, grants[limit:]))
    pace = seconds + MARGIN_SECONDS + 2 * seconds / SLOTS
    assert len(grants) >= limit * (20 * seconds / pace - 1)


@pure
def test_a_429_block_holds_every_request_but_a_block_or_counts_from_a_wrong_clock_do_not():
    full = ask(Window(0, (), 0.0), 100.0, 3, 30, 3)[0]
    assert take(Window(0, (), 130.0), 110.0, 3, 60) == (Window(0, (), 130.0), 20)
    assert take(Window(0, (), 1e12), 110.0, 3, 60)[1] == 0  # further ahead than a window: ignored
    assert take(Window(0, (), 105.0), 110.0, 3, 60)[1] == 0  # over
    assert take(full, 100.0, 3, 30)[1] > 0 and take(full, 99.0, 3, 30)[1] > 0  # a clock a second behind
    assert take(Window(full.slot + 10 ** 6, full.counts, 0.0), 100.0, 3, 30)[1] == 0  # a clock far ahead
    assert take(Window(full.slot, full.counts[:-1] + (-9,), 0.0), 100.0, 3, 30)[1] == 0  # garbage counts


@pure
def test_the_budget_key_is_per_endpoint_and_token_and_never_holds_the_token():
    key = budget_key("https://huggingface.co/", "hf_secret")
    assert key == budget_key("https://huggingface.co", "hf_secret") and re.fullmatch("[0-9a-f]{64}", key)
    assert len({key, budget_key("https://huggingface.co", None), budget_key("https://hub.local", "hf_secret")}) == 3
    assert "secret" not in key


# -- the shared budget in the registry ------------------------------------------------------------------------------

TAKER = """
import sys
from weightkeeper.registry import open_registry
registry = open_registry(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
print(sum(registry.take_hub_request("k" * 64, "api", 25, 60) == 0 for _ in range(60)))
"""


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_two_worker_processes_never_take_more_than_the_budget_together(db, tmp_path, request):
    url = f"sqlite:///{tmp_path / 'registry.db'}" if db == "sqlite" else request.getfixturevalue("pg_url")
    registry = open_registry(url)
    takers = [subprocess.Popen([sys.executable, "-c", TAKER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True) for _ in range(2)]
    assert [t.stdout.readline() for t in takers] == ["ready\n"] * 2
    for t in takers:  # both take at once
        t.stdin.write("go\n")
        t.stdin.flush()
    granted = [int(t.communicate(timeout=120)[0]) for t in takers]
    assert sum(granted) == 25
    assert registry.hub_request_counts() == {"api": (25, 0), "resolve": (0, 0)}
    registry.hub_throttled("k" * 64, "api", 30, 60)
    wait = registry.take_hub_request("k" * 64, "api", 1000, 60)
    assert 28 < wait <= 30 and registry.hub_request_counts()["api"] == (25, 1)


SKEWED = """
import sys, time
from weightkeeper.registry import open_registry
registry, skew = open_registry(sys.argv[1]), float(sys.argv[2])
real = time.time
time.time = lambda: real() + skew  # this host's clock, off by `skew`
if sys.argv[3] == "throttled":
    registry.hub_throttled("s" * 64, "api", 3600, 3600)  # a 429 recorded by a host an hour ahead
print(sum(registry.take_hub_request("s" * 64, "api", 10, 60) == 0 for _ in range(int(sys.argv[4]))))
"""


def test_a_host_whose_clock_is_off_neither_resets_the_budget_nor_blocks_it_for_others(pg_url):
    """On PostgreSQL (hosts share the budget) the database's clock counts: a host 400 s ahead does not reset the
    others' counts, and a 429 block recorded by a host an hour ahead is replaced by the next 429's own."""
    registry = open_registry(pg_url)

    def take(skew: float, times: int, throttled: bool = False) -> int:
        done = subprocess.run([sys.executable, "-c", SKEWED, pg_url, str(skew), "throttled" if throttled else "-",
                               str(times)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert take(0, 6) + take(400, 6) + take(0, 6) + take(-400, 6) == 10  # one window: 10 in all, whoever asks
    take(0, 0, throttled=True)  # blocked "until" an hour ahead by the real clock
    registry.hub_throttled("s" * 64, "api", 1, 60)  # the next 429 says 1 s
    assert 0 < registry.take_hub_request("s" * 64, "api", 1000, 60) <= 1


# -- models created at once against a rate-limiting Hub ------------------------------------------------------------

HUB_WINDOW_SLACK = 3.0  # seconds a request may take from its grant to the Hub test server's count, beyond the margin
WINDOW = 4.0  # the budget's window in these tests (the Hub test server's: WINDOW - HUB_WINDOW_SLACK)


def declare_many(wk, hub, prefix: str, count: int) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        hub.add_repo(f"acme/{name}", tiny_files(name, shards=1, shard_size=4096))
        wk.declare(name, f"hf://acme/{name}", workspaces=["team-a"])
    return names


def ensure_all(wk, names: list[str]) -> set[str]:
    """Run every model's ensure at once (a thread each); the budget messages seen on models and paths meanwhile."""
    results: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            results[name] = ensure_model(name)
        except Exception as e:  # noqa: BLE001 - reported below
            results[name] = e

    runs = [threading.Thread(target=run, args=(name,), daemon=True) for name in names]
    for r in runs:
        r.start()
    messages: set[str] = set()
    while any(r.is_alive() for r in runs):
        for m in wk.registry.list_models():
            messages.update(f"{where}: {text}" for where, text in [("model", m.message)] + [
                ("path", p.message) for p in m.local_paths] if "Hub request budget" in text)
        time.sleep(0.1)
    assert [results.get(name) for name in names] == ["Ready"] * len(names), results
    return messages


@pytest.fixture
def rate_limited(hub):
    """The Hub test server's rate limit, removed afterwards."""
    hub.reset_stats()
    yield hub.set_rate_limit
    for bucket in ("api", "resolvers"):
        hub.set_rate_limit(bucket, None)


def hub_requests(hub) -> tuple[int, int]:
    return (sum(r.path.startswith("/api/") for r in hub.requests),
            sum("/resolve/" in r.path for r in hub.requests))


def test_fifty_models_at_once_within_the_hubs_limit_get_no_429(wk, hub, rate_limited):
    wk.rewrite(hf_endpoint=hub.url, hub_api_requests_per_5min=10, hub_resolve_requests_per_5min=40,
               hub_budget_window_seconds=WINDOW, lease_seconds=30)  # 50 flows in one process: renewals can be late
    names = declare_many(wk, hub, "burst", 50)
    # The Hub's windows are shorter than the budget's by HUB_WINDOW_SLACK: the budget counts a request when it
    # grants it, the Hub when it arrives, and 50 flows in one process on a loaded machine may take seconds between
    # the two (more than the budget's MARGIN_SECONDS, which a 5-minute window amply covers).
    rate_limited("api", 10, WINDOW - HUB_WINDOW_SLACK)
    rate_limited("resolvers", 40, WINDOW - HUB_WINDOW_SLACK)
    ensure_all(wk, names)
    assert hub.throttled_count() == 0, (hub.throttled_count("api"), hub.throttled_count("resolvers"))
    counts = wk.registry.hub_request_counts()
    assert counts == {"api": (50, 0), "resolve": (400, 0)}  # one model_info; a HEAD and a GET of each of 4 files
    assert hub_requests(hub) == (50, 400)


def test_a_model_waiting_for_the_budget_says_so_on_the_model_then_on_its_path(wk, hub, rate_limited):
    wk.rewrite(hf_endpoint=hub.url, hub_api_requests_per_5min=1, hub_resolve_requests_per_5min=3,
               hub_budget_window_seconds=WINDOW)
    names = declare_many(wk, hub, "patient", 1)
    rate_limited("resolvers", 3, WINDOW - HUB_WINDOW_SLACK)
    registry, deadline = wk.registry, time.monotonic() + 120

    def another_worker() -> None:
        """Spends the API budget as it frees up until the model says it waits for it."""
        while not WAITING.fullmatch(registry.get_model(names[0]).message) and time.monotonic() < deadline:
            registry.take_hub_request(budget_key(hub.url, None), "api", 1, WINDOW)
            time.sleep(0.05)

    worker = threading.Thread(target=another_worker, daemon=True)
    worker.start()
    messages = ensure_all(wk, names)
    worker.join()
    assert any(m.startswith("model: ") for m in messages) and any(m.startswith("path: ") for m in messages)
    assert all(WAITING.fullmatch(m.split(": ", 1)[1]) for m in messages)
    assert hub.throttled_count() == 0 and registry.hub_request_counts()["resolve"] == (8, 0)


def test_a_budget_above_the_hubs_limit_gets_429s_absorbed_and_every_model_ready(wk, hub, rate_limited):
    wk.rewrite(hf_endpoint=hub.url, hub_budget_window_seconds=2.0, max_concurrent_downloads=1)
    names = declare_many(wk, hub, "over", 10)
    rate_limited("api", 3, 2.0)
    rate_limited("resolvers", 6, 2.0)  # fewer than one download's 8 requests
    ensure_all(wk, names)
    counts = wk.registry.hub_request_counts()
    assert hub.throttled_count("resolvers") > 0
    assert counts["api"].throttled == hub.throttled_count("api")
    assert counts["resolve"].throttled == hub.throttled_count("resolvers")
    assert hub_requests(hub) == (counts["api"].requests, counts["resolve"].requests)


def test_garbage_and_huge_waits_are_bounded_and_cdn_requests_take_nothing(wk, hub, rate_limited):
    wk.rewrite(hf_endpoint=hub.url, hub_budget_window_seconds=2.0,
               hub_redirect_hosts=[f"localhost:{hub.url.rsplit(':', 1)[1]}"])
    hub.add_repo("acme/garbage", tiny_files("garbage", shards=1, shard_size=4096))
    wk.declare("garbage", "hf://acme/garbage", workspaces=["team-a"])
    hub.fail_next(1, 429, path_contains="/api/models/acme/garbage", headers={
        "Retry-After": "9" * 30, "RateLimit": '"api";r=0;t=99999999999', "RateLimit-Policy": '"x";q=1;w=999999'})
    hub.fail_next(1, 429, path_contains="/acme/garbage/resolve/", headers={
        "Retry-After": "Thu, 01 Jan 2099 00:00:00 GMT", "RateLimit": '"api";r=0;t=ninety, "";;;=='})
    hub.cdn_redirects = True  # the shard (an LFS file) comes from another origin: the CDN
    try:
        assert ensure_model("garbage") == "Ready"
    finally:
        hub.cdn_redirects = False
    registry = wk.registry
    assert registry.hub_request_counts() == {"api": (2, 1), "resolve": (8, 1)}  # 4 HEADs and 3 GETs, one sent twice
    assert hub_requests(hub) == (2, 8)
    with registry._tx() as s:
        blocks = s.scalars(select(HubBudgetRow.blocked_until)).all()
    assert blocks and max(blocks) <= time.time()  # each block was bounded by the 2 s window


@pure
@pytest.mark.parametrize("header", ['"a"' + ";a= " * 250 + ";a", ('"a"' + " ;  a  =  " * 100)[:1000],
                                    ('"a";' + '"b"  ;' * 200)[:1000] + "x"])
def test_a_ratelimit_header_made_to_backtrack_parses_at_once(header):
    """A hostile server's `RateLimit` made for a backtracking parser (2^n steps, holding the GIL: every thread of
    the process, the lease renewer's too, would stop). In a process of its own, bounded: it ends at once."""
    code = ("import sys; from weightkeeper.hubbudget import throttle_wait; "
            "print(throttle_wait({'RateLimit': sys.argv[1], 'RateLimit-Policy': sys.argv[1]}, 0, 300, 0.0))")
    done = subprocess.run([sys.executable, "-c", code, header], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and float(done.stdout) == FALLBACK_WAIT_SECONDS, done.stderr


def test_waiting_for_the_budget_is_no_download_time(wk, hub, rate_limited):
    """A fetch that spends longer waiting for the request budget than its whole timeout allows still finishes:
    only the time its ranges transfer counts against `download_timeout_seconds`."""
    wk.rewrite(hf_endpoint=hub.url, hub_resolve_requests_per_5min=2, hub_budget_window_seconds=2.0,
               download_timeout_seconds=3)
    names = declare_many(wk, hub, "unhurried", 1)
    started = time.monotonic()
    assert ensure_all(wk, names)  # it waited for the budget, and said so
    assert time.monotonic() - started > 3 and wk.registry.hub_request_counts()["resolve"].requests == 8


def test_a_deletion_stops_a_resolve_waiting_for_the_budget_and_keeps_its_message(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, hub_api_requests_per_5min=1, hub_budget_window_seconds=60.0)
    (name,) = declare_many(wk, hub, "abandoned", 1)
    registry = wk.registry
    assert registry.take_hub_request(budget_key(hub.url, None), "api", 1, 60.0) == 0  # spent for a minute
    done = threading.Event()
    run = threading.Thread(target=lambda: (ensure_model(name, return_state=True), done.set()), daemon=True)
    run.start()
    deadline = time.monotonic() + 60
    while not WAITING.fullmatch(registry.get_model(name).message) and time.monotonic() < deadline:
        time.sleep(0.1)
    registry.mark_deleting(name)
    assert done.wait(15), "the resolve went on waiting for the budget of a model being deleted"
    model = registry.get_model(name)
    assert model.phase == "Deleting" and model.message == "deletion requested: stopping downloads"


def test_a_head_check_that_waited_for_the_budget_leaves_the_models_message_as_it_was(wk, hub):
    wk.rewrite(hf_endpoint=hub.url, hub_api_requests_per_5min=1, hub_budget_window_seconds=2.0,
               track_interval_seconds=0)
    hub.add_repo("acme/headwait", tiny_files("headwait"))
    wk.declare("headwait", "hf://acme/headwait@main", workspaces=["team-a"], track=True)
    assert ensure_model("headwait") == "Ready"
    registry, before = wk.registry, wk.registry.get_model("headwait").message
    while registry.take_hub_request(budget_key(hub.url, None), "api", 1, 2.0) == 0:
        pass  # spent: the head check waits
    messages = ensure_all(wk, ["headwait"])
    assert messages and all(WAITING.fullmatch(m.split(": ", 1)[1]) for m in messages)
    assert registry.get_model("headwait").message == before


def test_a_fetch_waiting_long_for_the_budget_gives_its_slot_to_a_download_that_needs_none(wk, hub, monkeypatch):
    """One download slot; a model whose token's resolve budget is spent for 30 s holds it only until it would wait
    (longer than SLOT_WAIT_SECONDS): a model fetched with another token's budget gets the slot meanwhile and is Ready
    before the budget frees up, then the first one resumes in a slot of its own."""
    from prefect.blocks.system import Secret

    import weightkeeper.hubbudget

    monkeypatch.setattr(weightkeeper.hubbudget, "SLOT_WAIT_SECONDS", 1.0)
    wk.rewrite(hf_endpoint=hub.url, max_concurrent_downloads=1, hub_resolve_requests_per_5min=8,
               hub_budget_window_seconds=30.0)
    spent, other = declare_many(wk, hub, "spent", 1)[0], "other-token"
    hub.add_repo(f"acme/{other}", tiny_files(other, shards=1, shard_size=4096))
    Secret(value="hf_OTHERtoken1234567890").save("hf-token-other", overwrite=True)
    wk.declare(other, f"hf://acme/{other}", workspaces=["team-b"], token_block="hf-token-other")
    registry, ready, spent_until = wk.registry, {}, time.monotonic() + 30
    for _ in range(8):  # the anonymous resolve budget, spent for 30 s (a download takes 8: a HEAD and a GET of 4)
        assert registry.take_hub_request(budget_key(hub.url, None), "resolve", 8, 30.0) == 0

    def run(name: str) -> None:
        ensure_model(name)
        ready[name] = time.monotonic()

    first = threading.Thread(target=run, args=(spent,), daemon=True)
    first.start()
    deadline = time.monotonic() + 60
    while not WAITING.fullmatch(registry.get_model(spent).local_paths[0].message):
        assert time.monotonic() < deadline and first.is_alive(), registry.get_model(spent)
        time.sleep(0.1)
    run(other)  # one slot: free only because the waiting fetch gave it back
    first.join(120)
    assert registry.get_model(spent).phase == registry.get_model(other).phase == "Ready"
    assert ready[other] < spent_until < ready[spent]  # the slot was given back while the budget was spent
    assert registry.hub_request_counts()["resolve"].throttled == 0 and hub.throttled_count() == 0


@pure
def test_a_hub_that_always_answers_429_fails_the_fetch_however_often_its_slot_was_given_back(monkeypatch):
    """Each 429 says to wait longer than a slot is held for the budget, so the fetch gives its slot back and runs again
    each time: the request's 429s are still counted in a row across those runs, and the eighth ends it."""
    import contextlib

    import weightkeeper.hubbudget
    from weightkeeper.errors import DownloadError
    from weightkeeper.hubbudget import THROTTLE_ATTEMPTS, HubBudget, Throttled

    monkeypatch.setattr(weightkeeper.hubbudget, "SLOT_WAIT_SECONDS", 0.2)
    monkeypatch.setattr(weightkeeper.hubbudget, "MIN_WAIT_SECONDS", 0.3)
    budget, sent, runs = HubBudget(None, {}, 300.0), [], []

    def refused():
        sent.append(1)
        raise Throttled({"Retry-After": "0"})

    def fetch(deadline: float) -> None:
        runs.append(deadline)
        assert len(runs) <= 3 * THROTTLE_ATTEMPTS, "the 429s were never counted across the runs: it never ends"
        budget.call("key", "resolve", refused, "config.json of acme/always")

    with pytest.raises(DownloadError, match=f"429 Too Many Requests {THROTTLE_ATTEMPTS} times in a row for config"):
        budget.held(contextlib.nullcontext, 60.0, fetch)
    assert len(sent) == THROTTLE_ATTEMPTS and len(runs) == THROTTLE_ATTEMPTS
    assert all(later > first for first, later in zip(runs, runs[1:]))  # its deadline moved by each wait without a slot
