"""Download slots are leased: renewed while held, and a Prefect server restart leaks none (filesystem lease storage)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import start_session_server, stop_session_server
from served import wait_until

HOLD = """
import sys, time
from weightkeeper.config import load_settings
from weightkeeper.runtime import download_slot, ensure_download_limit
settings = load_settings()
ensure_download_limit(settings)
with download_slot(settings, lambda *_: None):
    print("holding", flush=True)
    time.sleep(600)
"""


def slots() -> int:
    from weightkeeper.runtime import slots_in_use

    return slots_in_use()[0]


def test_a_server_restart_while_a_slot_is_held_leaks_no_slot(wk, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", HOLD], env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert slots() == 1
        stop_session_server(crash=True)  # the server dies, then the holder with it (kill -9)
        holder.kill()
        holder.wait()
        monkeypatch.setenv("PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS", "2")
        start_session_server()
    finally:
        holder.kill()
    assert slots() == 1  # the lease survived the restart on disk ...
    wait_until(lambda: slots() == 0, timeout=150, what="the expired lease to free its slot", every=2)  # ... and expires


def test_a_slot_held_longer_than_its_lease_is_renewed_then_freed_on_release(wk):
    from weightkeeper.config import load_settings
    from weightkeeper.runtime import SLOT_LEASE_SECONDS, download_slot, ensure_download_limit

    settings = load_settings()
    ensure_download_limit(settings)
    with download_slot(settings, lambda *_: None):
        time.sleep(SLOT_LEASE_SECONDS + 20)  # past the lease and past a pass of the server's repossessor (15 s)
        assert slots() == 1
    assert slots() == 0
