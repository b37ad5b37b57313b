"""Kubernetes work pools for workspaces (prefect-kubernetes): the base job template of a workspace's pool,
the job variables of one run (the owner's identity), and a cluster's worker.

The pool's template fixes everything that decides what a job runs and with which access (namespace, image,
command, service account, volumes, env, resources, cluster) from the workspace's configuration: a run's job
variables, which anyone who may create flow runs chooses, set only its owner's uid, its name and labels, and
Prefect's watch and retry settings. Pure: nothing here talks to a cluster. The Kubernetes worker renders the
template with these variables through prefect-kubernetes' own `KubernetesWorkerJobConfiguration`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from weightkeeper.errors import InvalidInputError

TEMPLATE_PATH = Path(__file__).parent / "kubernetes" / "base-job-template.json"
VOLUME_NAME = "workspace-volume"
TOKEN_ENV = "HF_TOKEN"  # the key of the token Secret, and the variable the job reads it from
AUTH_ENV = "PREFECT_API_AUTH_STRING"  # the Prefect credential: the key of its Secret and the variable read from it
REGISTRY_ENV = "WEIGHTKEEPER_REGISTRY_URL"  # the registry URL: the key of its Secret and the variable read from it
JOB_MARK = "WEIGHTKEEPER_TOKEN_ENV"  # set in every job by the pool's template (see `weightkeeper.credentials`)
PR_SET_DUMPABLE = 4
LABEL = "weightkeeper.io"
WORKER_ENV = ("PREFECT_API_URL", AUTH_ENV)  # the Prefect settings a worker keeps (see `worker_environment`)


@dataclass(frozen=True)
class KubernetesTarget:
    """Where a workspace's jobs run: `[workspaces.kubernetes]` in the config."""

    namespace: str
    image: str
    volume_claim: str | None = None  # the workspace volume as a PVC ...
    host_path: str | None = None  # ... or as a directory of the node
    service_account: str = "weightkeeper-jobs"
    token_secret: str | None = None  # Secret in the namespace with key HF_TOKEN, for models with a token
    prefect_auth_secret: str = "weightkeeper-prefect-auth"  # Secret with key PREFECT_API_AUTH_STRING (if any)
    registry_secret: str = "weightkeeper-registry"  # Secret with key WEIGHTKEEPER_REGISTRY_URL (if any)
    config_map: str = "weightkeeper-config"  # ConfigMap with weightkeeper's config.toml (no password in it)
    cpu: str | None = None
    memory: str | None = None
    kubeconfig: str | None = None  # how the control plane reaches the cluster (default: in-cluster, ~/.kube/config)
    context: str | None = None


def base_job_template(target: KubernetesTarget, mount_path: str, deadline_seconds: int) -> dict:
    """The base job template of a workspace's pool: `kubernetes/base-job-template.json` with its
    `{{ workspace.* }}` filled from `target`, the volume mounted at `mount_path` (the workspace's volume root,
    so recorded paths are the same in the job). Jobs of a workspace with a `token_secret` get it as their
    environment (a model without a token does not use it; a job starts without it if the Secret is missing);
    every job gets the Prefect credential from the `prefect_auth_secret`, never the worker's own copy, and the
    registry URL (which carries its password) from the `registry_secret`, over the ConfigMap's `registry_url`.
    Kubernetes ends a job `deadline_seconds` after it started, pending or not: no pod outlives the run that
    waits for it, even when no worker is left to cancel it."""
    source = {"persistentVolumeClaim": {"claimName": target.volume_claim}} if target.volume_claim \
        else {"hostPath": {"path": target.host_path, "type": "Directory"}}
    quantities = {"cpu": target.cpu, "memory": target.memory}
    fixed = {
        "namespace": target.namespace, "image": target.image, "service_account_name": target.service_account,
        "volume": {"name": VOLUME_NAME, **source}, "volume_mount_path": mount_path, "config_map": target.config_map,
        "env_from": [{"secretRef": {"name": target.token_secret, "optional": True}}] if target.token_secret else [],
        "resources": {kind: {k: v for k, v in quantities.items() if v} for kind in ("requests", "limits")
                      if any(quantities.values())},
        "prefect_auth_secret": target.prefect_auth_secret, "registry_secret": target.registry_secret,
        "deadline_seconds": deadline_seconds,
    }
    template = json.loads(TEMPLATE_PATH.read_text())
    from prefect.utilities.templating import apply_values  # imported here: it costs every CLI call 1 s

    template["job_configuration"] = apply_values(template["job_configuration"], {"workspace": fixed},
                                                 remove_notset=False)
    return template


def job_variables(target: KubernetesTarget, *, model: str, owner_name: str, owner_uid: int,
                  needs_token: bool) -> dict:
    """The job variables of one download or cleanup run: it runs as the model owner (uid, and the owner's
    group by the user-private-group convention), labelled with the model and its owner in values Prefect's
    worker keeps as they are; the rest of the job is the pool's template."""
    if owner_uid <= 0:
        raise InvalidInputError(f"model {model!r} is owned by uid {owner_uid}: workspace jobs never run as root")
    if needs_token and not target.token_secret:
        raise InvalidInputError(f"model {model!r} needs a Hugging Face token, but its workspace names no "
                                f"kubernetes.token_secret (a Secret in {target.namespace!r} with key {TOKEN_ENV})")
    labels = {f"{LABEL}/model": model_label(model), f"{LABEL}/owner-uid": str(owner_uid)}
    if owner := _label_value(owner_name):
        labels[f"{LABEL}/owner"] = owner
    return {"run_as_user": owner_uid, "run_as_group": owner_uid, "labels": labels}


def model_label(model: str) -> str:
    """The `weightkeeper.io/model` label of a model's jobs and pods: its name, or for a name holding '--' the
    name with '_' for each '-'. Prefect's worker shortens '--' to '-' in every label value, which would give
    the pods of `a--b` the label of model `a-b`; no model name holds '_', so no two models share a label."""
    return model.replace("-", "_") if "--" in model else model


def _label_value(text: str) -> str | None:
    """`text` as a label value that Kubernetes accepts and Prefect's worker keeps as it is: each run of
    characters other than letters, digits, '_' and '.' as one '-', at most 63 characters, beginning and
    ending with a letter or digit (None if nothing is left: the worker would pass such a value on unchanged,
    and the API server would refuse the job)."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text)[:63].strip("-_.") or None


def shut_job_process() -> None:
    """In a workspace job, make this process undumpable. It runs as the model's owner with the Prefect credential
    (which reads every Secret block), the registry URL and the namespace's token in its environment; undumpable,
    its `/proc/<pid>/` files are root's and no debugger attaches, so the owner's other processes on the node cannot
    read them."""
    if not os.environ.get(JOB_MARK):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed in a workspace job")


def secret_env(name: str, secret: str) -> dict:
    """The variable `name` read from the key of that name in `secret`; unset if the Secret does not exist."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name, "optional": True}}}


def worker_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment to start a Kubernetes worker with.

    A worker copies every Prefect setting it was started with into the jobs it creates, so it
    gets only the API URL and the credential (which the pool's template replaces in every job by a
    reference to its Secret): no submitter's other `PREFECT_*` setting (a database URL, an API key)
    and no token ever reaches a job's manifest; nor does the worker hold the registry URL, which it never
    uses (jobs read it from the `registry_secret`). Everything else (PATH, HOME, ...) is kept.
    """
    return {k: v for k, v in environ.items()
            if (not k.startswith("PREFECT_") or k in WORKER_ENV) and k not in (TOKEN_ENV, "HUGGING_FACE_HUB_TOKEN",
                                                                               REGISTRY_ENV)}


def worker_name(pool: str) -> str:
    """The name of a pool's worker objects, a Kubernetes name (at most 63 characters): a pool name too long for it is
    cut and a digest of it added, so pools that begin alike never share (and overwrite) each other's worker."""
    name = f"weightkeeper-worker-{pool}"
    return name if len(name) <= 63 else f"{name[:54]}-{hashlib.sha256(pool.encode()).hexdigest()[:8]}"


def worker_manifests(pool: str, namespace: str, api_url: str, image: str,
                     auth_secret: str = KubernetesTarget.prefect_auth_secret) -> list[dict]:
    """A cluster's worker for one workspace pool: its ServiceAccount, a Role limited to Jobs and Pods
    in the workspace namespace, the binding, the jobs' ServiceAccount (no API access) and the Deployment.
    The worker reads the Prefect credential from `auth_secret` (key PREFECT_API_AUTH_STRING), if it exists."""
    name = worker_name(pool)
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
                    "env": [{"name": "PREFECT_API_URL", "value": api_url}, secret_env(AUTH_ENV, auth_secret)],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                }]}}}},
    ]
