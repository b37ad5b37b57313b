"""Per-path jobs: when a lifecycle flow runs as a deployment, each path's work is a flow run of the
`download-to-path` / `clean-path` deployment in the work pool of the path's workspace."""

from __future__ import annotations

import time
from dataclasses import dataclass

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.runtime import flow_run

from weightkeeper.config import DOWNLOAD_FLOW, Settings, deployment_name, job_run_name
from weightkeeper.errors import InvalidInputError
from weightkeeper.kube import job_variables
from weightkeeper.planning import MAX_FAILOVERS, failover_workspace
from weightkeeper.registry import LocalPath, Model
from weightkeeper.registry.common import FAILED
from weightkeeper.runtime import runtime

POLL_SECONDS = 2.0


def deployed() -> bool:
    """True in a flow run of a deployment; in-process runs (CLI --wait, tests, demo) run tasks here instead."""
    context = FlowRunContext.get()
    return bool(context and context.flow_run and context.flow_run.deployment_id)


def workspace_job_variables(settings: Settings, model: Model, workspace: str) -> dict | None:
    """A Kubernetes workspace's job runs as the model owner with the volume mounted (None: a local pool)."""
    ws = settings.workspace(workspace)
    if ws is None or ws.kubernetes is None:
        return None
    return job_variables(ws.kubernetes, model=model.name, owner_name=model.owner_name,
                         owner_uid=model.owner_uid, needs_token=bool(model.token_block))


@dataclass(frozen=True)
class JobFailure:
    path: LocalPath
    message: str
    crashed: bool  # the infrastructure went away (Prefect's Crashed), not the work itself failing

    def __str__(self) -> str:
        return f"{self.path.path}: {self.message}"


def run_path_jobs(flow: str, name: str, paths: list[LocalPath]) -> list[JobFailure]:
    """Run `flow(name, path_id)` for each path in its workspace's pool and wait; the runs that did not complete."""
    settings, registry = runtime()
    model = registry.get_model(name)
    runs, failed = {}, []
    for p in paths:
        try:
            variables = workspace_job_variables(settings, model, p.workspace)
        except InvalidInputError as e:
            registry.finish_path(name, p.id, None, FAILED, str(e))
            failed.append(JobFailure(p, str(e), crashed=False))
            continue
        runs[p.id] = p, run_deployment(
            deployment_name(flow, settings.pool_for(p.workspace)), parameters={"name": name, "path_id": p.id},
            job_variables=variables, timeout=0, flow_run_name=job_run_name(flow, name, p.workspace),
            idempotency_key=f"{flow_run.id}/{flow}/{p.id}")
    pending = dict(runs)
    with get_client(sync_client=True) as client:
        while pending:
            time.sleep(POLL_SECONDS)
            for path_id, (path, run) in list(pending.items()):
                state = client.read_flow_run(run.id).state
                if state is not None and state.is_final():
                    del pending[path_id]
                    if not state.is_completed():
                        failed.append(JobFailure(path, f"{flow} run {run.id} {state.name}: {state.message or ''}"
                                                 .rstrip(": "), crashed=state.is_crashed()))
    return failed


def download_paths(name: str, paths: list[LocalPath]) -> bool:
    """Fill each path with a download-to-path run in its workspace's pool. A run whose infrastructure
    crashed moves to another workspace of the same cluster with the same volume root (`failover_workspace`),
    at most `MAX_FAILOVERS` times per path, counted in the registry. True when every path completed."""
    settings, registry = runtime()
    todo, final = paths, []
    while todo:
        moved = []
        for failure in run_path_jobs(DOWNLOAD_FLOW, name, todo):
            target = failure.crashed and failover_workspace(settings.workspaces, failure.path.workspace)
            if target and registry.fail_over(name, failure.path.id, target.name, MAX_FAILOVERS):
                get_run_logger().warning("%s: %s; moved to workspace %r", name, failure, target.name)
                moved.append(next(p for p in registry.get_model(name).local_paths if p.id == failure.path.id))
            else:
                final.append(failure)
        todo = moved
    return not final
