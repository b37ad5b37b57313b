"""Kubernetes workspace pools: the base job template rendered by prefect-kubernetes' own job-configuration
code and validated against the Kubernetes API models of the `kubernetes` client. No cluster runs here,
so nothing is applied to one: these tests check what a Kubernetes worker would submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

from weightkeeper.config import Workspace, load_settings
from weightkeeper.errors import ConfigError, InvalidInputError
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

RENDER = textwrap.dedent("""
    import asyncio, json, sys, uuid
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration
    from weightkeeper.kube import base_job_template

    values = json.loads(sys.argv[1])
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(base_job_template(), values))
    run = FlowRun(id=uuid.UUID(int=7), flow_id=uuid.uuid4(), name="download-m-team-a")
    config.prepare_for_flow_run(flow_run=run)
    print(json.dumps(config.job_manifest))
""")


def render(variables: dict, env: dict | None = None) -> dict:
    """The Job manifest a Kubernetes worker started with `env` would create for a run with `variables`."""
    proc = subprocess.run([sys.executable, "-c", RENDER, json.dumps(variables)], capture_output=True, text=True,
                          env=env if env is not None else dict(os.environ), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def validated(manifest: dict, kind: str):
    """The manifest as a Kubernetes API model; every field must survive the round trip (none unknown)."""

    client = ApiClient()
    model = client.deserialize(json.dumps(manifest), kind, "application/json")
    assert client.sanitize_for_serialization(model) == manifest
    return model


WORKER_ENV = {"PATH": os.environ["PATH"], "HOME": "/home/worker", "PREFECT_API_URL": "http://prefect.svc:4200/api"}


@pytest.mark.parametrize(("target", "needs_token"), [(PVC, True), (HOST, False)])
def test_rendered_job_runs_as_the_owner_with_the_workspace_volume(target, needs_token):
    variables = job_variables(target, "/mnt/models", model="m", owner_name="alice", owner_uid=1234,
                              needs_token=needs_token)
    manifest = render(variables, WORKER_ENV)
    job = validated(manifest, "V1Job")
    assert job.metadata.namespace == target.namespace
    pod = job.spec.template.spec
    assert (pod.security_context.run_as_user, pod.security_context.run_as_group) == (1234, 1234)
    assert pod.security_context.run_as_non_root and pod.automount_service_account_token is False
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
    env = {e.name: e.value for e in container.env}
    assert env["WEIGHTKEEPER_CONFIG"] == "/etc/weightkeeper/config.toml"
    assert env["PREFECT__FLOW_RUN_ID"] == "00000000-0000-0000-0000-000000000007"  # the run's label and env
    assert job.metadata.labels["prefect.io/flow-run-id"] == "00000000-0000-0000-0000-000000000007"
    assert job.metadata.labels["weightkeeper.io/owner-uid"] == "1234"
    if needs_token:  # the token comes from the Secret in the namespace, never from the manifest
        assert [s.secret_ref.name for s in container.env_from] == ["hf-token"]
        assert env["WEIGHTKEEPER_TOKEN_ENV"] == "HF_TOKEN" and "HF_TOKEN" not in env
    else:
        assert not container.env_from and "WEIGHTKEEPER_TOKEN_ENV" not in env


def test_jobs_get_no_prefect_setting_or_token_of_the_process_that_starts_the_worker():
    secrets = {"PREFECT_API_KEY": "pnu_submitterKEY123", "HF_TOKEN": "hf_submitterTOKEN123",
               "PREFECT_SERVER_DATABASE_CONNECTION_URL": "postgresql+asyncpg://prefect:dbPASSWORD123@db/prefect",
               "PREFECT_LOGGING_LEVEL": "DEBUG"}
    submitter = {**os.environ, **WORKER_ENV, **secrets}
    variables = job_variables(PVC, "/mnt/models", model="m", owner_name="alice", owner_uid=1234, needs_token=True)
    leaked = json.dumps(render(variables, submitter))
    assert "pnu_submitterKEY123" in leaked and "dbPASSWORD123" in leaked  # what a worker does with its settings
    manifest = json.dumps(render(variables, worker_environment(submitter)))
    for value in secrets.values():
        assert value not in manifest
    assert "http://prefect.svc:4200/api" in manifest  # the one setting a job needs


def test_job_variables_refuse_root_and_a_token_without_a_secret():
    with pytest.raises(InvalidInputError, match="never run as root"):
        job_variables(PVC, "/mnt/models", model="m", owner_name="root", owner_uid=0, needs_token=False)
    with pytest.raises(InvalidInputError, match="token_secret"):
        job_variables(HOST, "/mnt/models", model="m", owner_name="alice", owner_uid=1000, needs_token=True)


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
    assert [e.name for e in container.env] == ["PREFECT_API_URL"]
    assert not any(m.kind == "ClusterRole" for m in models)


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
        ('namespace = "a"\nimage = "img"\nhost_path = "d/../x"', "absolute, clean path"),
        ('namespace = "a"\nimage = "img"\nvolume_claim = "v"\nprivileged = "yes"', "unknown keys ['privileged']"),
    ]:
        with pytest.raises(ConfigError) as e:
            load(table)
        assert error in str(e.value)


def ws(name: str, cluster: str = "east", volume: str | None = "/mnt/shared") -> Workspace:
    return Workspace(name=name, volume=volume, cluster=cluster)


def test_failover_moves_only_to_the_same_volume_root_on_the_same_cluster():
    workspaces = [ws("a"), ws("other-volume", volume="/mnt/else"), ws("west-twin", cluster="west"), ws("b"), ws("c")]
    assert failover_workspace(workspaces, "a").name == "b"
    assert failover_workspace(workspaces, "b").name == "c"
    assert failover_workspace(workspaces, "c").name == "a"  # wraps around, in config order
    assert failover_workspace(workspaces, "west-twin") is None  # an equal mount path elsewhere is another filesystem
    assert failover_workspace(workspaces, "other-volume") is None
    assert failover_workspace([ws("p", volume=None), ws("q", volume=None)], "p") is None  # no volume, no move
    assert failover_workspace(workspaces, "gone") is None


def test_kubernetes_workspaces_get_a_kubernetes_pool_from_the_template(tmp_path):
    from prefect.client.orchestration import get_client

    from weightkeeper.deployments import ensure_work_pools

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
    assert east.type == "kubernetes" and east.base_job_template == base_job_template()
    assert control.type == "process"


def test_a_workspace_job_reads_the_token_from_the_mounted_secret(monkeypatch):
    from weightkeeper.runtime import load_token

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


def test_delete_waits_until_no_pod_of_a_download_run_remains(wk, hub, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from conftest import tiny_files
    from fakekube import FakeKubernetes
    from flows.delete_model import delete_model
    from flows.ensure_model import ensure_model
    from test_lifecycle import in_thread, wait_until

    cluster = FakeKubernetes()
    volume = wk.volumes["team-a"]
    wk.config.write_text(textwrap.dedent(f"""
        home = "{wk.root}"
        registry_url = "{wk._registry_url}"
        hf_endpoint = "{hub.url}"
        lease_seconds = 5
        cleanup_retry_seconds = 0.2
        cleanup_retry_max_seconds = 1
        [[workspaces]]
        name = "gpu"
        cluster = "east"
        volume = "{volume}"
        work_pool = "kube-gpu"
        [workspaces.kubernetes]
        namespace = "team-a"
        image = "registry.local/weightkeeper:0.1"
        volume_claim = "models"
        kubeconfig = "{cluster.kubeconfig(tmp_path / 'kubeconfig')}"
    """))
    hub.add_repo("acme/kube", tiny_files("kube"))
    wk.declare("kube", "hf://acme/kube")
    assert ensure_model("kube") == "Ready"
    path = Path(wk.registry.get_model("kube").local_paths[0].path)

    @flow(name="download-to-path")
    def stand_in() -> None:  # a download run whose job a Kubernetes worker started
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(stand_in, name="download-kube-gpu", state=Running())
    cluster.pods[("team-a", str(run.id))] = [("download-kube-gpu-x7k2p", "Running")]
    try:
        deletion = in_thread(delete_model, "kube")
        wait_until(lambda: "pod team-a/download-kube-gpu-x7k2p" in wk.registry.get_model("kube").message,
                   what="delete to wait for the pod")
        time.sleep(2)
        assert path.is_dir() and wk.registry.get_model("kube").local_paths  # nothing cleaned while the pod lives
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(run.id).state.is_cancelling()  # its run was asked to stop
        assert ("/api/v1/namespaces/team-a/pods", f"prefect.io/flow-run-id={run.id}") in cluster.requests
        cluster.pods[("team-a", str(run.id))] = [("download-kube-gpu-x7k2p", "Failed")]  # the pod is gone
        deletion.join(60)
        assert deletion.result.get("value") == "Released"
        assert not path.exists() and wk.registry.find_model("kube") is None
    finally:
        cluster.stop()


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
    bad = subprocess.run([*run, "nope", "--api-url", "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "has no [workspaces.kubernetes] table" in bad.stderr


def test_a_kubernetes_workspace_run_carries_the_owner_the_volume_and_the_token_secret(wk, hub):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.states import Cancelled

    from flows.jobs import run_path_jobs
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
    assert (variables["run_as_user"], variables["run_as_group"], variables["namespace"]) == (4242, 4242, "team-a")
    assert variables["volume"] == {"name": "workspace-volume", "persistentVolumeClaim": {"claimName": "models-a"}}
    assert variables["volume_mount_path"] == str(wk.volumes["team-a"])
    assert variables["env_from"] == [{"secretRef": {"name": "hf-token"}}]
    assert "hf-token-block" not in str(variables)  # the Prefect block's name, let alone the token, is not passed
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelled(), force=True)
    jobs.join(30)
    (failure,) = jobs.result["value"]
    assert not failure.crashed and "Cancelled" in failure.message  # cancelled, not crashed: no failover
