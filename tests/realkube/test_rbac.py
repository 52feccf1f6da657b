"""The shipped RBAC against the real authorizer (issue 13, item 4 in part): the controller, as the ServiceAccount that
``deploy/base`` creates and with a token from the TokenRequest API, can do every action its tick takes, and what it
must not do (read Secrets, delete pods directly, write whole Deployments, touch RBAC) is refused with 403.

The manifests are read from ``deploy/base`` directly (the ClusterRole, its binding and the ServiceAccount are plain
objects there; kustomize only adds the namespace and labels): a fast check of the role itself, action by action.
``test_deploy_as_serviceaccount.py`` applies the production overlay with ``kubectl apply -k`` and runs
``autoscaler run`` as its ServiceAccount end to end.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter, ReaderConfig, WriterConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.ports import EvictionOutcome
from tests.realkube.control_plane import REPO, ControlPlane
from tests.realkube.test_real_apiserver import create_deployment, deployment, job, wait_running

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

DEPLOY = REPO / "deploy" / "base"


def shipped(kind: str) -> dict[str, Any]:
    for path in (DEPLOY / "rbac.yaml", DEPLOY / "serviceaccount.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind:
                return dict(doc)
    raise AssertionError(f"no {kind} in deploy/base")


@pytest.fixture
def controller_api(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[client.ApiClient]:
    """An ApiClient authenticated as the shipped ServiceAccount, bound to the shipped ClusterRole."""
    suffix = secrets.token_hex(3)
    role = shipped("ClusterRole")
    role["metadata"]["name"] = f"gpu-autoscaler-{suffix}"
    binding = shipped("ClusterRoleBinding")
    binding["metadata"]["name"] = f"gpu-autoscaler-{suffix}"
    binding["roleRef"]["name"] = role["metadata"]["name"]
    account = shipped("ServiceAccount")
    binding["subjects"] = [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}]
    control_plane.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
    control_plane.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    control_plane.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    token = control_plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account['metadata']['name']}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "sa-kubeconfig", "gpu-autoscaler", token, namespace)
    api = load_api_client("kubeconfig", kubeconfig)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]
        for path in (
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding['metadata']['name']}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}",
        ):
            control_plane.request("DELETE", path)


def forbidden(call: Any) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_the_shipped_role_allows_the_tick_and_refuses_the_rest(
    control_plane: ControlPlane, namespace: str, controller_api: client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    create_deployment(control_plane, namespace, deployment("chat", 2))
    control_plane.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job("train", 1))
    wait_running(control_plane, namespace, "job=train", 1)

    # allowed: the whole read path (Jobs and the workload CRDs too: 404, not 403, when not installed), the scale
    # subresource, an eviction, a suspension and its resumption, an Event
    reader = KubeClusterReader(controller_api, ReaderConfig(), sleep=lambda s: None)
    with caplog.at_level(logging.WARNING, logger="autoscaler.adapters.kubernetes.reader"):
        snapshot = reader.snapshot(0.0)
    assert not [r.getMessage() for r in caplog.records if "not readable" in r.getMessage()]
    assert {d.name for d in snapshot.deployments if d.namespace == namespace} == {"chat"}
    assert len([p for p in snapshot.pods if p.namespace == namespace]) == 3
    assert [(w.kind, w.name) for w in snapshot.workloads if w.namespace == namespace] == [("Job", "train")]
    writer = KubeClusterWriter(controller_api, WriterConfig(reporting_instance="rbac-test"), sleep=lambda s: None)
    writer.scale_deployment(namespace, "chat", 3)
    wait_running(control_plane, namespace, "app=chat", 3)
    victim = next(p.name for p in snapshot.pods if p.namespace == namespace and p.owner_name == "chat")
    assert writer.evict_pod(namespace, victim) is EvictionOutcome.EVICTED
    writer.suspend_workload("Job", namespace, "train")
    writer.resume_workload("Job", namespace, "train")
    writer.emit_event("Deployment", namespace, "chat", "RbacTest", "allowed by the shipped role")

    # refused by the real authorizer: 403, never done
    core, apps = client.CoreV1Api(controller_api), client.AppsV1Api(controller_api)
    rbac = client.RbacAuthorizationV1Api(controller_api)
    refused = {
        "list secrets": forbidden(lambda: core.list_namespaced_secret(namespace)),
        "read a configmap": forbidden(lambda: core.list_namespaced_config_map(namespace)),
        "delete a pod directly": forbidden(lambda: core.delete_namespaced_pod(victim, namespace)),
        "patch a whole deployment": forbidden(
            lambda: apps.patch_namespaced_deployment("chat", namespace, {"metadata": {"labels": {"x": "y"}}})
        ),
        "create a deployment": forbidden(
            lambda: apps.create_namespaced_deployment(namespace, deployment("intruder", 1))
        ),
        "delete a job": forbidden(lambda: client.BatchV1Api(controller_api).delete_namespaced_job("train", namespace)),
        "list clusterroles": forbidden(lambda: rbac.list_cluster_role()),
    }
    assert refused == dict.fromkeys(refused, 403), refused
    assert control_plane.exists(f"/apis/apps/v1/namespaces/{namespace}/deployments/chat")
    assert not control_plane.exists(f"/apis/apps/v1/namespaces/{namespace}/deployments/intruder")
