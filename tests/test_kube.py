"""Kubernetes workspace pools: the base job template rendered by prefect-kubernetes' own job-configuration
code and validated against the Kubernetes API models of the `kubernetes` client. No cluster runs here,
so nothing is applied to one: these tests check what a Kubernetes worker would submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from kubernetes.client import ApiClient

from weightkeeper.config import load_settings
from weightkeeper.errors import ConfigError, InvalidInputError
from weightkeeper.kube import KubernetesTarget, job_variables, worker_environment, worker_manifests

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
        config.write_text(f'[[workspaces]]\nname = "w"\nvolume = "/mnt/w"\n[workspaces.kubernetes]\n{table}\n')
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
