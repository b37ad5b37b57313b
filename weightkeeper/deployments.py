"""Every flow as a Prefect deployment, the work pools they run in, and the download limit.

- `ensure-model/ensure-model`, `delete-model/delete-model`, `reconcile/reconcile` (on an interval):
  in the control pool (`work_pool`, default `weightkeeper-local`);
- `download-to-path/<pool>`, `clean-path/<pool>`: one per work pool of a workspace other than the control
  pool, so a workspace's jobs run in its pool. The jobs of a workspace in the control pool run inside the
  lifecycle run that needs them (`Settings.jobs_inline`): one process per model, not two.

The lifecycle flows go to the work queue `lifecycle`, the per-path jobs to `path-jobs`: a run-limited
worker per queue (`weightkeeper serve`) never fills its runs with parents waiting for children it
cannot start.

Flows are deployed by module path (the package is installed where the workers run), and carry
`WEIGHTKEEPER_CONFIG` so a worker's runs read the same configuration (in a Kubernetes pool, the
pool's template sets it: its job variables are only the owner's identity).
"""

from __future__ import annotations

import math

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.exceptions import ObjectNotFound
from prefect.workers.process import ProcessWorker

from weightkeeper.config import CLEAN_FLOW, DELETE_FLOW, DOWNLOAD_FLOW, ENSURE_FLOW, RECONCILE_FLOW, Settings
from weightkeeper.errors import ConfigError
from weightkeeper.kube import base_job_template
from weightkeeper.runtime import ensure_download_limit

LIFECYCLE_QUEUE, JOBS_QUEUE = "lifecycle", "path-jobs"


def worker_queues(settings: Settings) -> list[tuple[str, str]]:
    """(work pool, work queue) of every deployment: the control pool's lifecycle queue, and the jobs queue of
    each workspace's pool but the control pool (its workspaces' jobs run in the lifecycle runs)."""
    pools = sorted({settings.pool_for(w.name) for w in settings.workspaces if not settings.jobs_inline(w.name)})
    return [(settings.work_pool, LIFECYCLE_QUEUE), *((pool, JOBS_QUEUE) for pool in pools)]


def declared(settings: Settings) -> list[tuple[RunnerDeployment, str]]:
    """(deployment, work pool) for every flow."""
    from weightkeeper.flows.delete_model import delete_model
    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.flows.paths import clean_one_path, download_to_path
    from weightkeeper.flows.reconcile import reconcile

    job = {"env": {"WEIGHTKEEPER_CONFIG": str(settings.config_path)}} if settings.config_path else {}

    def deployment(flow, name: str, pool: str, queue: str, **kw) -> tuple[RunnerDeployment, str]:
        return flow.to_deployment(name=name, entrypoint_type=EntrypointType.MODULE_PATH, tags=["weightkeeper"],
                                  job_variables={} if pool in settings.kubernetes_pools else job,
                                  work_queue_name=queue, **kw), pool

    out = []
    for pool, queue in worker_queues(settings):
        if queue == LIFECYCLE_QUEUE:
            out += [deployment(ensure_model, ENSURE_FLOW, pool, queue),
                    deployment(delete_model, DELETE_FLOW, pool, queue),
                    deployment(reconcile, RECONCILE_FLOW, pool, queue, interval=settings.reconcile_interval_seconds)]
        else:
            out += [deployment(download_to_path, pool, pool, queue), deployment(clean_one_path, pool, pool, queue)]
    return out


def kubernetes_template(settings: Settings, pool: str) -> dict:
    """The base job template of a Kubernetes pool, from its workspaces' `[workspaces.kubernetes]` and volume,
    which the template fixes: workspaces sharing the pool must agree on them. Its jobs' deadline is the longest
    a lifecycle run waits for one (`START_SECONDS` to start, then its flow's `run_budget`) and MARGIN_SECONDS
    more: the lifecycle run gives up on a job (and cancels it) before Kubernetes ends it."""
    from weightkeeper.flows.jobs import START_SECONDS
    from weightkeeper.flows.paths import MARGIN_SECONDS, run_budget

    targets = {(w.kubernetes, w.volume) for w in settings.workspaces if w.work_pool == pool and w.kubernetes}
    if len(targets) != 1:
        names = sorted(w.name for w in settings.workspaces if w.work_pool == pool)
        raise ConfigError(f"Kubernetes pool {pool!r} serves workspaces {names} whose volume or [workspaces.kubernetes] "
                          f"differ, but its job template fixes them: give each its own work_pool")
    ((target, volume),) = targets
    deadline = START_SECONDS + max(run_budget(flow, settings) for flow in (DOWNLOAD_FLOW, CLEAN_FLOW)) + MARGIN_SECONDS
    return base_job_template(target, volume, math.ceil(deadline))


def ensure_work_pools(settings: Settings) -> list[str]:
    """Create the missing pools: Kubernetes pools from `infra/kubernetes/base-job-template.json` for workspaces
    that run their jobs in a cluster, local process pools for the others; returns the ones created. An existing
    Kubernetes pool gets the template of the current configuration (and of this version of weightkeeper)."""
    created = []
    with get_client(sync_client=True) as client:
        for pool in settings.pools:
            template = kubernetes_template(settings, pool) if pool in settings.kubernetes_pools else None
            try:
                existing = client.read_work_pool(pool)
                if template is not None and existing.base_job_template != template:
                    client.update_work_pool(pool, WorkPoolUpdate(base_job_template=template))
            except ObjectNotFound:
                if template is not None:
                    create = WorkPoolCreate(name=pool, type="kubernetes", base_job_template=template,
                                            description="weightkeeper jobs in a workspace's Kubernetes namespace")
                else:
                    create = WorkPoolCreate(name=pool, type="process", description="weightkeeper jobs on this host",
                                            base_job_template=ProcessWorker.get_default_base_job_template())
                client.create_work_pool(create)
                created.append(pool)
    return created


def apply_deployments(settings: Settings) -> list[str]:
    """Create or update the download limit, the work pools and every deployment; their names."""
    ensure_download_limit(settings)
    ensure_work_pools(settings)
    names = []
    for deployment, pool in declared(settings):
        deployment.apply(work_pool_name=pool)
        names.append(f"{deployment.flow_name}/{deployment.name}")
    return names
