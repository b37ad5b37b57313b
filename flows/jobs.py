"""Per-path jobs: each path's work is one run of the `download-to-path` / `clean-path` flow, here (a subflow
per path, run concurrently) or in the work pool of the path's workspace (a deployment run). A lifecycle run
outside a deployment runs them all here; a deployed one runs here those of workspaces whose jobs share its
own process pool, since a deployment run would only be one more process on the same workers.
`run_path_jobs` runs a set of paths either way and returns the failures, so failover and every other rule
apply to both."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.states import Cancelled, Cancelling, State

from weightkeeper.flows.paths import PATH_FLOWS, run_budget
from weightkeeper.config import DOWNLOAD_FLOW, Settings, deployment_name, job_run_name
from weightkeeper.errors import InvalidInputError
from weightkeeper.kube import job_variables
from weightkeeper.planning import MAX_FAILOVERS, failover_workspace
from weightkeeper.pods import RUN_LABEL
from weightkeeper.registry import Holder, LocalPath, Model, Registry
from weightkeeper.registry.common import FAILED, READY, this_host, utcnow
from weightkeeper.registry.leases import SWITCH, abandoned
from weightkeeper.runs import mark_run_crashed, without_prefect_heartbeat
from weightkeeper.context import current

POLL_SECONDS = 2.0
START_SECONDS = 600.0  # a deployment run not started by then never will (a Kubernetes pod may pull its image)
NOBODY = Holder("", "", 0, 0.0)  # holds no lease: a write as NOBODY happens only while nobody holds the path


def deployed() -> bool:
    """True in a flow run of a deployment: its per-path jobs run in the workspaces' pools (those of its own
    process pool here, `Settings.jobs_inline`); else all here."""
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
    stopped: bool = False  # the child was cancelled and left the path as it was, to be resumed

    def __str__(self) -> str:
        return f"{self.path.path}: {self.message}"


def child_alive(path: LocalPath, run_id: uuid.UUID) -> bool:
    """False once the path's lease held by child run `run_id` is abandoned: it lapsed (nothing renewed it
    for `lease_seconds`: its worker died) or its holder was a process of this host that is gone. A path the
    child does not hold (not claimed yet, done, or waiting for another holder) says nothing: True."""
    lease = path.lease
    mine = lease is not None and lease.holder.run == f"{run_id}/{path.id}"  # weightkeeper.tasks.download.path_holder
    return not (mine and abandoned(lease, utcnow(), this_host()))


def _outcome(flow: str, path: LocalPath, run_id, state: State | None) -> JobFailure | None:
    """The failure a child run's final state says, if it did not complete."""
    if state is not None and state.is_completed():
        return None
    name = state.name if state else "without a state"
    return JobFailure(path, f"{flow} run {run_id} {name}: {state.message if state else ''}".rstrip(": "),
                      crashed=bool(state and state.is_crashed()), stopped=bool(state and state.is_cancelled()))


def _subflow(flow: str, name: str, path: LocalPath) -> JobFailure | None:
    """One path's flow as a subflow of the current run. It sends no Prefect heartbeat of its own: it lives in its
    parent's process, which the parent's run covers (the run lease is the heartbeat of record), and ending it
    would wait for a heartbeat thread's sleep (up to 1 s per path)."""
    with without_prefect_heartbeat():
        state = PATH_FLOWS[flow].with_options(flow_run_name=job_run_name(flow, name, path.workspace))(
            name, path.id, return_state=True)
    return _outcome(flow, path, state.state_details.flow_run_id, state)


@task(name="run-path-job", cache_policy=NO_CACHE)
def _run_here(flow: str, name: str, path: LocalPath) -> JobFailure | None:
    """One path's flow as a subflow of this run. Called from a task, so that subflows started together
    each get their own parent task run (Prefect numbers those of plain threads racily)."""
    return _subflow(flow, name, path)


def _submit_here(flow: str, name: str, paths: list[LocalPath]) -> list[tuple[LocalPath, PrefectFuture]]:
    """Start each path's flow here, each as a subflow in a task of its own, so they run concurrently."""
    return [(p, _run_here.with_options(task_run_name=f"run-{job_run_name(flow, name, p.workspace)}")
             .submit(flow, name, p)) for p in paths]


def _collect(flow: str, futures: list[tuple[LocalPath, PrefectFuture]]) -> list[JobFailure]:
    """Wait for the subflows `_submit_here` started; the failures."""
    failed = []
    for path, future in futures:
        future.wait()
        if future.state.is_completed():
            failure = future.result()
        else:
            failure = JobFailure(path, f"{flow} for {path.workspace} {future.state.name}: {future.state.message}",
                                 crashed=future.state.is_crashed())
        if failure is not None:
            failed.append(failure)
    return failed


def _jobs_here(flow: str, name: str, paths: list[LocalPath]) -> list[JobFailure]:
    """Run each path's flow here, concurrently, and wait: the runs live and die with this process, and their
    own steps have deadlines. A single path runs as a subflow of the lifecycle run itself: no task around it."""
    if len(paths) == 1:
        return [failure] if (failure := _subflow(flow, name, paths[0])) else []
    return _collect(flow, _submit_here(flow, name, paths))


@dataclass
class _Child:
    """A deployment run working on one path."""

    path: LocalPath
    run_id: uuid.UUID
    pool: str
    namespace: str | None  # of a Kubernetes pool's jobs
    created: float = field(default_factory=time.monotonic)
    started: float | None = None


def _start_deployed(flow: str, name: str, paths: list[LocalPath]) -> tuple[list[_Child], list[JobFailure]]:
    """Start each path's flow as a deployment run in its workspace's pool."""
    settings, registry = current()
    model = registry.get_model(name)
    children, failed = [], []
    for p in paths:
        try:
            variables = workspace_job_variables(settings, model, p.workspace)
        except InvalidInputError as e:
            registry.path_failed(name, p.id, None, str(e))
            failed.append(JobFailure(p, str(e), crashed=False))
            continue
        pool, ws = settings.pool_for(p.workspace), settings.workspace(p.workspace)
        run = run_deployment(
            deployment_name(flow, pool), parameters={"name": name, "path_id": p.id}, job_variables=variables,
            timeout=0, flow_run_name=job_run_name(flow, name, p.workspace),
            idempotency_key=f"{flow_run.id or uuid.uuid4()}/{flow}/{p.id}/{p.failover_attempts}")
        children.append(_Child(p, run.id, pool, ws.kubernetes.namespace if ws and ws.kubernetes else None))
    return children, failed


def _wait_deployed(flow: str, name: str, children: list[_Child]) -> list[JobFailure]:
    """Wait for the deployment runs; the failures."""
    settings, registry = current()
    budget, failed = run_budget(flow, settings), []
    with get_client(sync_client=True) as client:
        while children:
            time.sleep(POLL_SECONDS)
            paths_now = {p.id: p for p in registry.get_model(name).local_paths}
            for child in list(children):
                done, failure = _check(client, flow, child, paths_now.get(child.path.id), budget)
                if done:
                    children.remove(child)
                    failed += [failure] if failure else []
    return failed


def _check(client, flow: str, child: _Child, path: LocalPath | None, budget: float) -> tuple[bool, JobFailure | None]:
    """Whether to stop waiting for a deployment run, and its failure. Deadlines: START_SECONDS to leave
    Scheduled/Pending (`_not_started` says why it did not), `budget` once started; a child past one is cancelled.
    A started child whose path lease is abandoned (`child_alive`) is marked Crashed (read back next poll)."""
    state, now = client.read_flow_run(child.run_id).state, time.monotonic()
    if state is not None and state.is_final():
        return True, _outcome(flow, child.path, child.run_id, state)
    if state is None or state.is_scheduled() or state.is_pending():
        if now - child.created <= START_SECONDS:
            return False, None
        failure = JobFailure(child.path, _not_started(flow, child, taken=state is not None and state.is_pending()),
                             crashed=False)
        stop = Cancelled if state is not None and state.is_scheduled() else Cancelling
    else:
        child.started = child.started or now
        if path is not None and not child_alive(path, child.run_id):
            holder = path.lease.holder
            mark_run_crashed(str(child.run_id), f"its worker is gone: nothing renews its lease on {path.path} "
                                                f"(pid {holder.pid} on host {holder.host})")
            return False, None
        if now - child.started <= budget:
            return False, None
        failure = JobFailure(child.path, f"{flow} run {child.run_id} still {state.name} after {budget:.0f} s",
                             crashed=False)
        stop = Cancelling
    client.set_flow_run_state(child.run_id, stop(message=failure.message), force=True)
    return True, failure


def _not_started(flow: str, child: _Child, taken: bool) -> str:
    """Why a deployment run did not start in time, and what to check: no worker took it (Scheduled, Late), or one
    did (Pending) and what it submitted never ran."""
    late = f"{flow} run {child.run_id} was not started within {START_SECONDS:.0f} s: "
    if not taken:
        return late + (f"no worker serves work pool {child.pool!r}; start one (`weightkeeper serve`, or "
                       f"`prefect worker start --pool {child.pool}`)")
    if child.namespace is None:
        return late + f"a worker of work pool {child.pool!r} took it but its process never ran; check that worker's log"
    return late + (f"its job was submitted to namespace {child.namespace!r} but its pod never ran (an image pull, a "
                   f"quota, a missing Secret, node capacity); check `kubectl -n {child.namespace} describe pod -l "
                   f"{RUN_LABEL}={child.run_id}`")


def run_path_jobs(flow: str, name: str, paths: list[LocalPath], here: bool = False) -> list[JobFailure]:
    """Run `flow(name, path_id)` for each path and wait; the runs that did not complete. A path runs here, as a
    subflow, when `here` or when its workspace's jobs belong in the control pool this run is in
    (`Settings.jobs_inline`); else as a deployment run in its workspace's pool. Both kinds run at once: the
    deployment runs are watched (deadlines, dead workers) while the subflows work."""
    settings, _ = current()
    inline = {p.id for p in paths if here or settings.jobs_inline(p.workspace)}
    if len(inline) == len(paths):
        return _jobs_here(flow, name, paths)
    children, failed = _start_deployed(flow, name, [p for p in paths if p.id not in inline])
    futures = _submit_here(flow, name, [p for p in paths if p.id in inline])
    try:
        failed += _wait_deployed(flow, name, children)
    finally:
        failed += _collect(flow, futures)  # never leave a subflow behind, even if the watch failed
    return failed


def _record(registry: Registry, name: str, failure: JobFailure) -> None:
    """Fail the path of a child that could not say why itself (crashed, never started, cut off), unless
    another run works on the path now; an abandoned lease is taken away with it. A Ready path whose switch
    was cut off stays on its commit, saying so instead of its last progress."""
    model = registry.get_model(name)
    path = next((p for p in model.local_paths if p.id == failure.path.id), None)
    if path is None or failure.stopped or path.status == FAILED:
        return
    lease = path.lease
    holder = lease.holder if lease and abandoned(lease, utcnow(), this_host()) else NOBODY
    if path.status != READY:
        registry.path_failed(name, path.id, holder, f"{failure.message}; `weightkeeper model ensure {name}` resumes it")
    elif lease and holder != NOBODY and lease.purpose == SWITCH:
        to = model.pending_commit or "a new commit"
        registry.end_switch(name, path.id, holder, f"switch of {path.path} to {to} did not finish: {failure.message}; "
                            "it stays on its commit until the next check")


def download_paths(name: str, paths: list[LocalPath], here: bool = False) -> bool:
    """Fill each path with a download-to-path run (here or in its workspace's pool). A run whose
    infrastructure crashed moves to another workspace of the same cluster with the same volume root
    (`failover_workspace`), at most `MAX_FAILOVERS` times per path, counted in the registry (not a Ready path
    switching commit). True when every path completed."""
    logger = get_run_logger()
    settings, registry = current()
    todo, final = paths, []
    while todo:
        moved = []
        for failure in run_path_jobs(DOWNLOAD_FLOW, name, todo, here):
            # a Ready path (switching commit) stays where it is, on its commit, for the next check to retry
            target = failure.crashed and failure.path.status != READY and failover_workspace(
                settings.workspaces, failure.path.workspace)
            if target and registry.fail_over(name, failure.path.id, target.name, MAX_FAILOVERS):
                logger.warning("%s: %s; moved to workspace %r", name, failure, target.name)
                moved.append(next(p for p in registry.get_model(name).local_paths if p.id == failure.path.id))
            else:
                logger.error("%s: %s", name, failure)
                _record(registry, name, failure)
                final.append(failure)
        todo = moved
    return not final
