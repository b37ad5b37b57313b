"""What still runs in a workspace's cluster for a model's jobs: pod lists read from the cluster's API with the
`kubernetes` client's configuration (address, credentials, TLS, proxy), each answer bounded in time (its headers
too: `hub.HeadersInTime`) and bytes, and checked before it is believed."""

from __future__ import annotations

import functools
import json
import re
import time

from weightkeeper.config import DOWNLOAD_FLOW
from weightkeeper.errors import CleanupError, said
from weightkeeper.hub import HeadersInTime
from weightkeeper.kube import LABEL, KubernetesTarget, model_label
from weightkeeper.watchdog import BodyRefused, read_whole

RUN_LABEL = "prefect.io/flow-run-id"  # set by the Kubernetes worker on the Job and its pods
MODEL_LABEL = f"{LABEL}/model"  # set by weightkeeper's job variables (`kube.job_variables`), whatever Prefect keeps
FLOW_LABEL = "prefect.io/flow-name"  # set by the worker: a model's downloads, not its path cleanups
API_TIMEOUT_SECONDS = 30  # per pod list: its headers, and its whole answer, from asking
MAX_ANSWER_BYTES = 8 << 20  # a pod list of one run or model is a few KiB
FINISHED = ("Succeeded", "Failed")
POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS subdomain, as the API server names pods


class _HeadersInTime(HeadersInTime):
    def headers_seconds(self) -> float:
        return API_TIMEOUT_SECONDS


@functools.cache
def _headers_in_time(pool_class: type) -> type:
    """`pool_class` (plain, TLS, through a SOCKS proxy) whose connections get their answers' headers in time."""
    connection = type(f"InTime{pool_class.ConnectionCls.__name__}", (_HeadersInTime, pool_class.ConnectionCls), {})
    return type(f"InTime{pool_class.__name__}", (pool_class,), {"ConnectionCls": connection})


def _session(target: KubernetesTarget):
    """(pool manager, API address, headers) of the cluster, as the kubernetes client configures them."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    if target.kubeconfig:
        config.load_kube_config(target.kubeconfig, target.context, client_configuration=cfg, persist_config=False)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException:
            config.load_kube_config(context=target.context, client_configuration=cfg, persist_config=False)
    token = cfg.get_api_key_with_prefix("authorization")
    headers = {"Accept": "application/json", **({"Authorization": token} if token else {})}
    pool = client.ApiClient(cfg).rest_client.pool_manager
    pool.pool_classes_by_scheme = {scheme: _headers_in_time(c) for scheme, c in pool.pool_classes_by_scheme.items()}
    return pool, cfg.host.rstrip("/"), headers


def _list(session, namespace: str, selector: str) -> list[dict]:
    """The pods of `namespace` that `selector` names, as the API server answered them."""
    import urllib3

    pool, host, headers = session
    what = f"the pod list of namespace {namespace!r} ({selector})"
    timeout = urllib3.Timeout(connect=API_TIMEOUT_SECONDS, read=API_TIMEOUT_SECONDS)
    deadline = time.monotonic() + API_TIMEOUT_SECONDS
    response = pool.request("GET", f"{host}/api/v1/namespaces/{namespace}/pods", fields={"labelSelector": selector},
                            headers=headers, preload_content=False, timeout=timeout, retries=False, redirect=False)
    try:
        if response.status != 200:
            raise CleanupError(f"{what} failed: HTTP {response.status} {said(response.reason)}; the model is kept")
        answer = json.loads(read_whole(response, MAX_ANSWER_BYTES, max(0.0, deadline - time.monotonic())))
    except BodyRefused as e:
        raise CleanupError(f"{what}: {e}; the model is kept: check the cluster's API server") from None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise CleanupError(f"{what} is not JSON; the model is kept: check the cluster's API server") from None
    finally:
        response.close()
    items = answer.get("items") if isinstance(answer, dict) else None
    if not isinstance(items, list) or not all(isinstance(p, dict) and isinstance(p.get("metadata"), dict)
                                              and isinstance(p["metadata"].get("name"), str)
                                              and POD_NAME.fullmatch(p["metadata"]["name"]) for p in items):
        raise CleanupError(f"{what} is not a list of pods; the model is kept: check the cluster's API server")
    return items


def _unfinished(pod: dict) -> bool:
    """Pending, Running, Unknown, without a phase, or being deleted."""
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return phase not in FINISHED or bool(pod["metadata"].get("deletionTimestamp"))


def live_pods(target: KubernetesTarget, run_ids: list[str], model: str | None = None) -> list[str]:
    """Pods of these flow runs, or of `model`'s downloads (those of runs Prefect no longer knows), that have not
    finished."""
    selectors = [f"{RUN_LABEL}={run_id}" for run_id in run_ids] + (
        [f"{MODEL_LABEL}={model_label(model)},{FLOW_LABEL}={DOWNLOAD_FLOW}"] if model else [])
    if not selectors:
        return []
    try:
        import urllib3
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise CleanupError(f"workspace namespace {target.namespace!r} runs in Kubernetes, but the kubernetes client "
                           "is not installed here: pip install 'weightkeeper[kubernetes]'") from None
    try:
        session = _session(target)
        pods = [pod for selector in selectors for pod in _list(session, target.namespace, selector)]
    except (ConfigException, OSError, urllib3.exceptions.HTTPError) as e:
        why = e.args[-1] if isinstance(e, urllib3.exceptions.ProtocolError) and e.args else e  # the cause it wraps
        raise CleanupError(f"cannot list the pods of namespace {target.namespace!r}: {why}; the model is kept: check "
                           "the cluster's API server") from None
    return sorted({f"{target.namespace}/{p['metadata']['name']}" for p in pods if _unfinished(p)})
