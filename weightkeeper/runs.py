"""Lifecycle runs of a model: start one once (reserved in the registry), hold its lease while it runs."""

from __future__ import annotations

import functools
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import TypeVar

import prefect.context
from prefect import get_run_logger
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

from weightkeeper.config import Settings, deployment_name
from weightkeeper.errors import NotFoundError
from weightkeeper.registry import Holder, Registry
from weightkeeper.registry.runs import RESERVED
from weightkeeper.runtime import prefect_settings, runtime

F = TypeVar("F", bound=Callable[..., str])
R = TypeVar("R")


def without_prefect_heartbeat() -> prefect.context.SettingsContext:
    """Flows started in this thread send no Prefect flow-run heartbeat. Their run lease is their heartbeat
    (renewed every lease/3 s; reconcile marks a run whose lease lapsed Crashed), and Prefect's heartbeat
    thread sleeps in 1 s steps: joining it made every run return up to 1 s after it had finished."""
    return prefect_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def run_here(flow: Callable[..., R], *args) -> R:
    """Run a flow in this process and thread (the CLI, the demo, the benchmarks)."""
    with without_prefect_heartbeat():
        return flow(*args)


class NoDeployment(Exception):
    """The flow is not deployed (no `weightkeeper serve`): nothing can run it in a work pool."""


def reserve(registry: Registry, settings: Settings, flow: str, name: str, key: str,
            phases: tuple[str, ...] | None = None) -> str | None:
    """Reserve the model's run lease for a run about to start (while the model is in one of `phases`);
    what prevents it otherwise (a fresh lease's holder, or `phase <phase>`)."""
    holder = Holder(f"{RESERVED}{key}", socket.gethostname(), os.getpid(), 0.0)
    return registry.claim_run(name, flow, holder, settings.lease_seconds, phases)


def start_deployment(registry: Registry, settings: Settings, flow: str, name: str, key: str,
                     phases: tuple[str, ...] | None = None) -> str | None:
    """Start the `flow` deployment for a model unless a run already works on it (or the model left
    `phases`); the new flow run id. `key` is the idempotency key: one request never creates two runs.
    """
    if reserve(registry, settings, flow, name, key, phases):
        return None
    try:
        run = run_deployment(deployment_name(flow), parameters={"name": name}, timeout=0, idempotency_key=key,
                             flow_run_name=f"{flow.split('-')[0]}-{name}")
    except BaseException as e:  # no run was started: free the reservation at once (a run that was takes it over)
        registry.release_run(name, Holder(f"{RESERVED}{key}", "", 0, 0.0))
        if isinstance(e, ObjectNotFound):
            raise NoDeployment(f"deployment {deployment_name(flow)!r} does not exist; start `weightkeeper serve`") \
                from None
        raise
    return str(run.id)


def holds_run_lease(flow: str) -> Callable[[F], F]:
    """Run a lifecycle flow body only while holding the model's run lease (renewed in a thread).

    When another run holds a fresh lease, the body is skipped and the model's phase returned.
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(name: str, *args, **kwargs) -> str:
            settings, registry = runtime()
            holder = Holder.here(str(flow_run.id) if flow_run.id else f"local/{uuid.uuid4()}")
            try:
                other = registry.claim_run(name, flow, holder, settings.lease_seconds)
            except NotFoundError:
                return fn(name, *args, **kwargs)  # the flow says what an unknown model means
            if other:
                model = registry.find_model(name)
                get_run_logger().info("%s: run %s is already working on it; this %s run stops", name, other, flow)
                return model.phase if model else "Released"
            stop = threading.Event()

            def renew() -> None:
                while not stop.wait(max(0.5, settings.lease_seconds / 3)):
                    try:
                        if not registry.renew_run(name, holder):
                            return
                    except Exception:  # noqa: BLE001 - retried on the next beat; expiry is the backstop
                        pass

            beat = threading.Thread(target=renew, name=f"run-lease-{name}", daemon=True)
            beat.start()
            try:
                return fn(name, *args, **kwargs)
            finally:
                stop.set()
                beat.join()
                registry.release_run(name, holder)

        return run  # type: ignore[return-value]

    return wrap
