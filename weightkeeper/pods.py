"""What still runs in a workspace's cluster for a model's jobs, with the real `kubernetes` client."""

from __future__ import annotations

from weightkeeper.errors import CleanupError
from weightkeeper.kube import KubernetesTarget

RUN_LABEL = "prefect.io/flow-run-id"  # set by the Kubernetes worker on the Job and its pods
API_TIMEOUT_SECONDS = 30


def _core_api(target: KubernetesTarget):
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if target.kubeconfig:
        return client.CoreV1Api(config.new_client_from_config(config_file=target.kubeconfig, context=target.context))
    try:
        config.load_incluster_config()
        return client.CoreV1Api()
    except ConfigException:
        return client.CoreV1Api(config.new_client_from_config(context=target.context))


def live_pods(target: KubernetesTarget, run_ids: list[str]) -> list[str]:
    """Pods of these flow runs that have not finished (Pending, Running, Unknown, or being deleted)."""
    if not run_ids:
        return []
    try:
        from kubernetes import client
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise CleanupError(f"workspace namespace {target.namespace!r} runs in Kubernetes, but the kubernetes client "
                           "is not installed here: pip install 'weightkeeper[kubernetes]'") from None
    try:
        api = _core_api(target)
        pods = [pod for run_id in run_ids for pod in api.list_namespaced_pod(
            target.namespace, label_selector=f"{RUN_LABEL}={run_id}", _request_timeout=API_TIMEOUT_SECONDS).items]
    except (ConfigException, client.ApiException, OSError) as e:
        raise CleanupError(f"cannot list the pods of namespace {target.namespace!r}: {e}") from None
    return [f"{target.namespace}/{p.metadata.name}" for p in pods
            if p.status is None or p.status.phase not in ("Succeeded", "Failed") or p.metadata.deletion_timestamp]
