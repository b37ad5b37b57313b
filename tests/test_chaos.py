"""Lifecycle runs SIGKILLed at a named point, then run again as an operator would: the model converges, and a
delete leaves nothing weightkeeper made behind."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import tiny_files

from weightkeeper.flows.delete_model import delete_model
from weightkeeper.flows.ensure_model import ensure_model

KILLED_AFTER = """
import os, signal, sys
from weightkeeper.registry import Registry
from weightkeeper.cli import main
real = getattr(Registry, sys.argv[1])
def then_killed(self, *args, **kwargs):
    real(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
setattr(Registry, sys.argv[1], then_killed)
sys.exit(main(sys.argv[2:]))
"""


def killed_after(wk, registry_event: str, *cli: str) -> int:
    """Run the CLI in a process of its own, SIGKILLed once the registry recorded its first `registry_event`."""
    log = open(wk.root / "killed.log", "ab")
    return subprocess.run([sys.executable, "-c", KILLED_AFTER, registry_event, *cli], stdout=log,
                          stderr=subprocess.STDOUT, env=dict(os.environ, WEIGHTKEEPER_CONFIG=str(wk.config)),
                          timeout=120).returncode


def test_a_delete_killed_once_a_link_is_gone_collects_its_shared_copy_when_run_again(wk, hub):
    """The killed delete removed one path's link and its entry, the only record of the copy it linked to: the delete
    run again still collects that copy before it releases the model."""
    hub.add_repo("acme/chaos-shared", tiny_files("chaos-shared"))
    wk.declare("shared", "hf://acme/chaos-shared", workspaces=["team-a", "team-b"], download_policy="reuse-if-exists")
    assert ensure_model("shared") == "Ready"
    repo_dirs = [wk.volumes[ws] / "models" / "_artifacts" / "acme--chaos-shared" for ws in ("team-a", "team-b")]
    assert all(len(os.listdir(repo_dir)) == 1 for repo_dir in repo_dirs)

    assert killed_after(wk, "remove_path", "model", "delete", "shared", "--wait") == -9
    model = wk.registry.get_model("shared")
    assert model.phase == "Deleting" and len(model.local_paths) < 2

    assert delete_model("shared") == "Released"
    assert not any(repo_dir.exists() for repo_dir in repo_dirs) and wk.registry.list_artifacts() == []
    assert sorted(os.listdir(wk.volumes["team-a"] / "models")) == ["_artifacts"]
