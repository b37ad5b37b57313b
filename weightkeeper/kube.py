"""Kubernetes work pools for workspaces (prefect-kubernetes): the base job template, the job variables
of one run (the owner's identity, the workspace volume, the token secret), and a cluster's worker.

Pure: nothing here talks to a cluster. The Kubernetes worker renders the template with these
variables through prefect-kubernetes' own `KubernetesWorkerJobConfiguration`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from weightkeeper.errors import InvalidInputError

TEMPLATE_PATH = Path(__file__).parent / "kubernetes" / "base-job-template.json"
VOLUME_NAME = "workspace-volume"
CONFIG_PATH = "/etc/weightkeeper/config.toml"
TOKEN_ENV = "HF_TOKEN"  # the key of the token Secret, and the variable the job reads it from
LABEL = "weightkeeper.io"
WORKER_ENV = ("PREFECT_API_URL",)  # all a worker passes on to its jobs (see `worker_environment`)


@dataclass(frozen=True)
class KubernetesTarget:
    """Where a workspace's jobs run: `[workspaces.kubernetes]` in the config."""

    namespace: str
    image: str
    volume_claim: str | None = None  # the workspace volume as a PVC ...
    host_path: str | None = None  # ... or as a directory of the node
    service_account: str = "weightkeeper-jobs"
    token_secret: str | None = None  # Secret in the namespace with key HF_TOKEN, for models with a token
    config_map: str = "weightkeeper-config"  # ConfigMap with weightkeeper's config.toml
    cpu: str | None = None
    memory: str | None = None
    kubeconfig: str | None = None  # how the control plane reaches the cluster (default: in-cluster, ~/.kube/config)
    context: str | None = None


def base_job_template() -> dict:
    """The base job template of every workspace pool (prefect-kubernetes' default, plus our variables)."""
    return json.loads(TEMPLATE_PATH.read_text())


def job_variables(target: KubernetesTarget, mount_path: str, *, model: str, owner_name: str, owner_uid: int,
                  needs_token: bool) -> dict:
    """The job variables of one download or cleanup run: it runs as the model owner (uid, and the
    owner's group by the user-private-group convention) with the workspace volume mounted at its root."""
    if owner_uid <= 0:
        raise InvalidInputError(f"model {model!r} is owned by uid {owner_uid}: workspace jobs never run as root")
    if needs_token and not target.token_secret:
        raise InvalidInputError(f"model {model!r} needs a Hugging Face token, but its workspace names no "
                                f"kubernetes.token_secret (a Secret in {target.namespace!r} with key {TOKEN_ENV})")
    source = {"persistentVolumeClaim": {"claimName": target.volume_claim}} if target.volume_claim \
        else {"hostPath": {"path": target.host_path, "type": "Directory"}}
    variables = {
        "namespace": target.namespace, "image": target.image, "service_account_name": target.service_account,
        "volume": {"name": VOLUME_NAME, **source}, "volume_mount_path": mount_path, "config_map": target.config_map,
        "run_as_user": owner_uid, "run_as_group": owner_uid,
        "env_from": [{"secretRef": {"name": target.token_secret}}] if needs_token else [],
        "env": {"WEIGHTKEEPER_CONFIG": CONFIG_PATH, **({"WEIGHTKEEPER_TOKEN_ENV": TOKEN_ENV} if needs_token else {})},
        "labels": {f"{LABEL}/model": model, f"{LABEL}/owner": owner_name, f"{LABEL}/owner-uid": str(owner_uid)},
    }
    for key, value in (("cpu_request", target.cpu), ("cpu_limit", target.cpu), ("memory_request", target.memory),
                       ("memory_limit", target.memory)):
        if value:
            variables[key] = value
    return variables


def worker_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment to start a Kubernetes worker with.

    A worker copies every Prefect setting it was started with into the jobs it creates, so it
    gets only the API URL: no submitter's `PREFECT_*` setting (a database URL, an API key) and no
    token ever reaches a job's manifest. Everything else (PATH, HOME, ...) is kept.
    """
    return {k: v for k, v in environ.items()
            if (not k.startswith("PREFECT_") or k in WORKER_ENV) and k not in (TOKEN_ENV, "HUGGING_FACE_HUB_TOKEN")}


def worker_manifests(pool: str, namespace: str, api_url: str, image: str) -> list[dict]:
    """A cluster's worker for one workspace pool: its ServiceAccount, a Role limited to Jobs and Pods
    in the workspace namespace, the binding, the jobs' ServiceAccount (no API access) and the Deployment."""
    name = f"weightkeeper-worker-{pool}"[:63]
    meta = {"name": name, "namespace": namespace, "labels": {f"{LABEL}/pool": pool}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
         "metadata": {**meta, "name": "weightkeeper-jobs"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [
            {"apiGroups": ["batch"], "resources": ["jobs"],
             "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status"], "verbs": ["get", "list", "watch", "delete"]},
        ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
            "replicas": 1, "selector": {"matchLabels": {f"{LABEL}/pool": pool}},
            "template": {"metadata": {"labels": {f"{LABEL}/pool": pool}}, "spec": {
                "serviceAccountName": name,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                "containers": [{
                    "name": "worker", "image": image,
                    "args": ["prefect", "worker", "start", "--pool", pool, "--type", "kubernetes"],
                    "env": [{"name": "PREFECT_API_URL", "value": api_url}],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                }]}}}},
    ]
