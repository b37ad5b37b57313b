"""The Prefect server weightkeeper starts (`weightkeeper.prefectserver`): concurrent writes wait their turn on
SQLite instead of failing, and the embedded default (`weightkeeper demo`, no `PREFECT_API_URL`) starts one,
runs the whole lifecycle against it and stops it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import Counter

import httpx
import pytest


def test_concurrent_writes_wait_their_turn_instead_of_failing_with_a_locked_database():
    """Flow runs created and moved through their states from 8 clients at once, with no client retries: Prefect's
    stock SQLite transactions answer some of these with 503 ("database is locked"); this server answers all."""
    api = os.environ["PREFECT_API_URL"]
    flow = httpx.post(f"{api}/flows/", json={"name": "write-contention"}, timeout=30).json()["id"]
    codes: Counter[int] = Counter()

    def client() -> None:
        with httpx.Client(base_url=api, timeout=60) as c:
            for _ in range(5):
                run = c.post("/flow_runs/", json={"flow_id": flow, "state": {"type": "PENDING"}})
                codes[run.status_code] += 1
                for state in ("RUNNING", "COMPLETED") if run.status_code == 201 else ():
                    codes[c.post(f"/flow_runs/{run.json()['id']}/set_state",
                                 json={"state": {"type": state}}).status_code] += 1

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == {201: 8 * 5 * 3}


def test_the_demo_starts_its_own_prefect_server_runs_the_lifecycle_and_stops_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "WEIGHTKEEPER_CONFIG")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), TMPDIR=str(tmp_path), COLUMNS="200")
    demo = subprocess.run([sys.executable, "-m", "weightkeeper.cli", "demo", "--offline"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "demo complete" in out and "registry: 0 model(s) left" in out
    assert "Error logging to API" not in out  # run logs were sent before the server stopped
    ui = re.search(r"Prefect UI at (http://127\.0\.0\.1:\d+)", out).group(1)
    assert (tmp_path / "prefect-home" / "prefect.db").exists()  # the runs were recorded in a server of its own
    with pytest.raises(httpx.ConnectError):  # stopped with the demo
        httpx.get(f"{ui}/api/health", timeout=2)
