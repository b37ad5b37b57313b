"""Per-path jobs: when a lifecycle flow runs as a deployment, each path's work is a flow run of the
`download-to-path` / `clean-path` deployment in the work pool of the path's workspace."""

from __future__ import annotations

import time

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.runtime import flow_run

from weightkeeper.config import deployment_name
from weightkeeper.registry import LocalPath
from weightkeeper.runtime import runtime

POLL_SECONDS = 2.0


def deployed() -> bool:
    """True in a flow run of a deployment; in-process runs (CLI --wait, tests, demo) run tasks here instead."""
    context = FlowRunContext.get()
    return bool(context and context.flow_run and context.flow_run.deployment_id)


def run_path_jobs(flow: str, name: str, paths: list[LocalPath]) -> list[str]:
    """Run `flow(name, path_id)` for each path in its workspace's pool and wait; what did not complete."""
    settings, _ = runtime()
    verb = flow.split("-")[0]
    runs = {p.path: run_deployment(
        deployment_name(flow, settings.pool_for(p.workspace)), parameters={"name": name, "path_id": p.id},
        timeout=0, flow_run_name=f"{verb}-{name}-{p.workspace}", idempotency_key=f"{flow_run.id}/{flow}/{p.id}")
        for p in paths}
    pending = {path: run.id for path, run in runs.items()}
    failed: list[str] = []
    with get_client(sync_client=True) as client:
        while pending:
            time.sleep(POLL_SECONDS)
            for path, run_id in list(pending.items()):
                state = client.read_flow_run(run_id).state
                if state is not None and state.is_final():
                    del pending[path]
                    if not state.is_completed():
                        failed.append(f"{path}: {flow} run {run_id} {state.name}: {state.message or ''}".rstrip(": "))
    return failed
