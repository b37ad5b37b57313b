"""Lifecycle runs of a model: start one once (reserved in the registry), hold its lease while it runs."""

from __future__ import annotations

import contextvars
import functools
import time
import uuid
from collections.abc import Callable
from datetime import timezone
from typing import TypeVar
from uuid import UUID

import prefect.context
from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY
from prefect.states import Crashed

from weightkeeper.config import Settings, deployment_name
from weightkeeper.errors import NotFoundError
from weightkeeper.lease import renewed
from weightkeeper.registry import Holder, Model, Registry
from weightkeeper.registry.common import utcnow
from weightkeeper.registry.leases import Kind, Lease, abandoned
from weightkeeper.registry.runs import RESERVATION_SECONDS, RESERVED, reservation
from weightkeeper.runtime import prefect_settings
from weightkeeper.context import current

F = TypeVar("F", bound=Callable[..., str])
R = TypeVar("R")


def without_prefect_heartbeat() -> prefect.context.SettingsContext:
    """Flows started in this thread send no Prefect flow-run heartbeat. Their run lease is their heartbeat
    (renewed every lease/3 s; reconcile marks a run whose lease lapsed Crashed), and Prefect's heartbeat
    thread sleeps in 1 s steps: joining it made every run return up to 1 s after it had finished."""
    return prefect_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


WAIT_FOR_LEASE: contextvars.ContextVar[bool] = contextvars.ContextVar("wait_for_run_lease", default=False)
WAIT_POLL_SECONDS = 2.0


def run_here(flow: Callable[..., R], *args, wait_for_lease: bool = False) -> R:
    """Run a flow in this process and thread (the CLI, the demo, the benchmarks). `wait_for_lease`: when a
    live run holds the model's run lease, wait for it (saying who holds it) instead of stopping at once."""
    token = WAIT_FOR_LEASE.set(wait_for_lease)
    try:
        with without_prefect_heartbeat():
            return flow(*args)
    finally:
        WAIT_FOR_LEASE.reset(token)


def mark_run_crashed(run_id: str, message: str) -> str:
    """Show a Prefect flow run whose process is gone as Crashed instead of Running, with the subflow runs it
    ran in that process (a deployed child runs elsewhere and answers for itself); its final state name."""
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(run_id)).state
        if state is None or state.is_final():
            return state.name if state else "unknown"
        client.set_flow_run_state(UUID(run_id), Crashed(message=message), force=True)
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[UUID(run_id)])))
        for child in children:
            if child.deployment_id is None and child.state is not None and not child.state.is_final():
                client.set_flow_run_state(child.id, Crashed(message=f"its parent run {run_id} crashed"), force=True)
    return "Crashed"


def flow_run_of(lease: Lease) -> str | None:
    """The Prefect flow run behind a run lease: the run holding it, or the one a reservation is for (None for runs
    outside Prefect and reservations whose run is not created yet)."""
    try:
        return str(UUID(lease.holder.run.removeprefix(RESERVED)))
    except ValueError:
        return None


def still_queued(run_ids: list[str]) -> set[str]:
    """Of these flow runs, those still waiting for a worker: Scheduled (or Late), or Pending (handed to a worker)
    for less than `RESERVATION_SECONDS`. One read of Prefect per 200 runs."""
    queued, now = set(), utcnow()
    with get_client(sync_client=True) as client:
        for i in range(0, len(run_ids), 200):
            chunk = [UUID(r) for r in run_ids[i:i + 200]]
            for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=chunk)),
                                             limit=len(chunk)):
                state = run.state
                if state is not None and (state.type == StateType.SCHEDULED or (
                        state.type == StateType.PENDING
                        and (now - state.timestamp).total_seconds() < RESERVATION_SECONDS)):
                    queued.add(str(run.id))
    return queued


class NoDeployment(Exception):
    """The flow is not deployed (no `weightkeeper serve`): nothing can run it in a work pool."""


def bound_to(model: Model) -> str:
    """The model a started run is for: its registry id and creation time (SQLite may give a model declared
    since under its name the same id, never the same creation time)."""
    return f"{model.id}@{model.created_at.astimezone(timezone.utc).isoformat()}"  # PostgreSQL's in its session's zone


def reserve(registry: Registry, settings: Settings, flow: str, name: str, key: str,
            phases: tuple[str, ...] | None = None, seen: Model | None = None) -> str | None:
    """Reserve the model's run lease for a run about to start (while the model is in one of `phases`, and with
    `seen`, only while it is that very model: NotFoundError otherwise); what prevents it otherwise (a fresh
    lease's holder, or `phase <phase>`)."""
    blocker = registry.claim_run(name, flow, reservation(key), settings.lease_seconds, phases, seen)
    return blocker.describe() if isinstance(blocker, Lease) else blocker


def start_deployment(registry: Registry, settings: Settings, flow: str, name: str, key: str,
                     phases: tuple[str, ...] | None = None, seen: Model | None = None) -> str | None:
    """Start the `flow` deployment for a model unless a run already works on it (or the model left
    `phases`); the new flow run id. `key` is the idempotency key: one request never creates two runs.
    The run is bound to the model reserved (`seen`, or the one of that name now): it leaves alone a model
    declared under the name by the time it runs. NotFoundError when the model is gone (or is not `seen`).
    """
    seen = seen or registry.get_model(name)
    if reserve(registry, settings, flow, name, key, phases, seen):
        return None
    try:
        run = run_deployment(deployment_name(flow), parameters={"name": name, "bound": bound_to(seen)}, timeout=0,
                             idempotency_key=key, flow_run_name=f"{flow.split('-')[0]}-{name}")
    except BaseException as e:  # no run was started: free the reservation at once (a run that was takes it over)
        registry.release_run(name, reservation(key))
        if isinstance(e, ObjectNotFound):
            raise NoDeployment(f"deployment {deployment_name(flow)!r} does not exist; start `weightkeeper serve`") \
                from None
        raise
    registry.name_reserved_run(name, key, str(run.id))
    return str(run.id)


def _claim(registry: Registry, settings: Settings, name: str, flow: str, holder: Holder,
           seen: Model | None) -> Lease | str | None:
    """Take the model's run lease (with `seen`, only that very model's); when a live run holds it, wait (if
    `WAIT_FOR_LEASE`) saying who holds it. A run taken over from a process that is gone is marked Crashed in
    Prefect."""
    logger, said = get_run_logger(), None
    while True:
        previous = registry.lease_of(Kind.RUN, registry.get_model(name).id)
        blocker = registry.claim_run(name, flow, holder, settings.lease_seconds, seen=seen)
        if blocker is None:
            if previous and (run_id := flow_run_of(previous)) not in (None, holder.run) \
                    and abandoned(previous, utcnow(), holder.host):
                logger.warning("%s: took over from %s run %s, whose process is gone", name, previous.purpose, run_id)
                try:
                    mark_run_crashed(run_id, f"its process is gone; run {holder.run} took model {name!r} over")
                except Exception as e:  # noqa: BLE001 - showing it is a courtesy; the work goes on
                    logger.warning("%s: could not mark run %s Crashed: %s", name, run_id, e)
            return None
        if isinstance(blocker, str) or not WAIT_FOR_LEASE.get():
            return blocker
        if said != blocker.holder.run:
            said = blocker.holder.run
            logger.info("%s: waiting for %s %s", name, blocker.purpose, blocker.describe())
        time.sleep(min(WAIT_POLL_SECONDS, max(0.2, blocker.lapses_in())))


def _gone(name: str, flow: str, model: str) -> str:
    get_run_logger().info("%s: the model this %s run was started for (%s) is released; one declared under its name "
                          "since is left alone", name, flow, model)
    return "Released"


def holds_run_lease(flow: str) -> Callable[[F], F]:
    """Run a lifecycle flow body only while holding the model's run lease (renewed by the process's renewer).

    When another live run holds it, the body is skipped and the model's phase returned (or, in a run
    started with `run_here(..., wait_for_lease=True)`, it waits for that run). A run `start_deployment` started
    is bound to its model (the flow's parameter `bound`, as `bound_to` says it, read here and not passed on): a
    model declared under the name since (its own released) is left alone, and the run returns Released.
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(name: str, bound: str | None = None) -> str:
            settings, registry = current()
            holder = Holder.here(str(flow_run.id) if flow_run.id else f"process/{uuid.uuid4()}")
            seen = registry.find_model(name) if bound else None
            if bound and (seen is None or bound_to(seen) != bound):
                return _gone(name, flow, bound)
            try:
                other = _claim(registry, settings, name, flow, holder, seen)
            except NotFoundError:
                return _gone(name, flow, bound) if bound else fn(name)  # the flow says what an unknown model means
            if other:
                held = registry.find_model(name)
                get_run_logger().info("%s: %s is already working on it; this %s run stops", name,
                                      other.describe() if isinstance(other, Lease) else other, flow)
                return held.phase if held else "Released"
            try:
                with renewed(registry, Kind.RUN, registry.get_model(name).id, holder, settings.lease_seconds):
                    return fn(name)
            finally:
                registry.release_run(name, holder)

        return run  # type: ignore[return-value]

    return wrap
