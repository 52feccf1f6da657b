"""The controller deployed for real, as far as a control plane without kubelets allows (issue 13, item 4):
``kubectl apply -k deploy/overlays/production`` (with stand-in CRDs for the Prometheus Operator's two kinds, as in
test_apply_kustomize.py), then ``autoscaler run`` as the ServiceAccount that overlay creates: a token from the
TokenRequest API (``create_namespaced_service_account_token``) bound to a pod of the shipped Deployment (kwok runs
it; nothing runs in it), in a kubeconfig with the apiserver's CA, ``POD_NAME``/``POD_NAMESPACE`` as the downward API
gives them to that pod. The Lease therefore lives in the overlay's namespace (``gpu-autoscaler``): the shipped Role
lets the controller get/create/update Leases there and nowhere else.

What the real authorizer says, read from the apiserver's audit log (every request of that ServiceAccount):
- every request the controller process made succeeded (no 403, no 5xx; 404 only for the optional workload CRDs not
  installed here and the Lease before it exists): the lists of its tick, the GPUScalingPolicies, the scale
  subresource (read and patch), the policy status, Events, the Lease (get, create, update, release); an eviction
  through the real writer with the same credentials succeeds too;
- what it must not do is refused with 403 and changes nothing: Secrets (in its own and the workloads' namespace),
  deleting a pod directly, patching a Deployment's spec outside the scale subresource, creating a Deployment,
  writing a policy's spec, deleting or listing Leases, a Lease outside its namespace, nodes, deleting Events, RBAC.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kubernetes import KubeClusterWriter, WriterConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from autoscaler.ports import EvictionOutcome
from tests.realkube.control_plane import ControlPlane, find_kubectl
from tests.realkube.controller_world import (
    DEPLOYMENT,
    LEASE_NAME,
    OVERLOADED,
    POLICY,
    Request,
    World,
    audit_requests,
    create_policy,
    deployment,
    events,
    lease_holder,
    open_world,
    running_pods,
    spec_replicas,
    start_controller,
    status_at,
    wait_steady,
)
from tests.realkube.test_apply_kustomize import CRD, MONITORING, OVERLAYS, Kubectl, monitoring_crd, uninstall

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

OVERLAY = OVERLAYS / "production"
# 404 is an answer, not a refusal: the optional workload kinds the reader lists when their CRDs exist
OPTIONAL_KINDS = {"jobsets", "pytorchjobs", "tfjobs", "workloads", "podgroups"}


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    found, why = find_kubectl()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and kubectl is unavailable: {why}", pytrace=False)
        pytest.skip(why)
    return Kubectl(found, control_plane.admin_kubeconfig, tmp_path_factory.mktemp("kubectl-home"))


@pytest.fixture
def production(kubectl: Kubectl, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """The production overlay applied with ``kubectl apply -k`` (after the monitoring stand-in CRDs); its rendered
    objects. Deleted again with ``kubectl delete -k``, waited for."""
    crds = tmp_path / "monitoring-crds.yaml"
    crds.write_text(yaml.safe_dump_all([monitoring_crd(k, p) for k, p in MONITORING.items()]))
    names = [f"crd/{p}.monitoring.coreos.com" for p in MONITORING.values()]
    docs = kubectl.render(OVERLAY)
    try:
        kubectl.run("apply", "-f", str(crds))
        kubectl.run("wait", "--for=condition=Established", "--timeout=60s", *names)
        kubectl.run("apply", "-k", str(OVERLAY))
        kubectl.run("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
        yield docs
    finally:
        uninstall(kubectl, OVERLAY)
        kubectl.run("delete", "--ignore-not-found", "--wait=false", *names, check=False)


@pytest.fixture
def world(
    control_plane: ControlPlane, production: list[dict[str, Any]], namespace: str, tmp_path: Path
) -> Iterator[World]:
    with open_world(control_plane, namespace, tmp_path) as w:
        yield w


def rendered(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def status_of(call: Callable[[], Any]) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_controller_as_the_production_serviceaccount(
    world: World, production: list[dict[str, Any]], api_client: client.ApiClient
) -> None:
    w, cp = world, world.cp
    started = time.time()
    # -- what the overlay says: the ServiceAccount, the namespace the Lease may be in, the Deployment using both --
    account = rendered(production, "ServiceAccount")["metadata"]
    sa_name, sa_ns = account["name"], account["namespace"]
    role = rendered(production, "Role")
    assert role["metadata"]["namespace"] == sa_ns
    # the Lease, and the rebalancer's move ledger (a ConfigMap; the rebalancer is off here, so it is never asked)
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"leases", "configmaps"}
    shipped = rendered(production, "Deployment")
    pod_env = {e["name"]: e for e in shipped["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert pod_env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert (
        shipped["metadata"]["namespace"] == sa_ns
        and shipped["spec"]["template"]["spec"]["serviceAccountName"] == sa_name
    )
    selector = ",".join(f"{k}={v}" for k, v in shipped["spec"]["selector"]["matchLabels"].items())
    [pod, *_] = cp.wait("a pod of the shipped Deployment", lambda: cp.pods(sa_ns, selector) or None, timeout_s=60)
    pod_name = pod["metadata"]["name"]

    # -- a token for the ServiceAccount from the TokenRequest API, bound to that pod, as its kubelet would get it --
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=3600,
            bound_object_ref=client.V1BoundObjectReference(
                kind="Pod", api_version="v1", name=pod_name, uid=pod["metadata"]["uid"]
            ),
        )
    )
    answer = client.CoreV1Api(api_client).create_namespaced_service_account_token(sa_name, sa_ns, request)
    token = answer.status.token if answer.status is not None else None
    assert token, answer
    kubeconfig = cp.write_kubeconfig(w.tmp_path / "controller.kubeconfig", sa_name, token, sa_ns)
    user = f"system:serviceaccount:{sa_ns}:{sa_name}"

    # -- `autoscaler run` as that pod: POD_NAME and POD_NAMESPACE as the downward API sets them --
    wait_steady(w, 2, OVERLOADED)
    create_policy(w)
    ctrl = start_controller(w, pod_name, kubeconfig, lease_namespace=sa_ns)

    def wait(what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
        try:
            return cp.wait(what, probe, timeout_s=timeout_s, interval_s=0.2)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{ctrl.log()}") from None

    wait(f"the Lease in {sa_ns}", lambda: lease_holder(w, sa_ns) == pod_name or None, 60)
    wait("the Deployment scaled 2 -> 4", lambda: spec_replicas(w) == 4 or None, 60)
    wait("the policy status: current 4", lambda: status_at(w, 4), 30)
    [up] = wait("Event MetricAboveTarget", lambda: events(w, "MetricAboveTarget") or None, 30)
    assert up["reportingInstance"] == pod_name, up
    assert ctrl.stop(signal.SIGTERM) == 0, ctrl.log()  # releases the Lease: an update
    assert lease_holder(w, sa_ns) == "", ctrl.log()
    log = ctrl.log(200_000)
    assert "HTTP 403" not in log and "Forbidden" not in log, log

    # -- an eviction through the real writer with the same credentials (the rebalancer's and preemption's write) --
    sa_api = load_api_client("kubeconfig", kubeconfig)
    try:
        writer = KubeClusterWriter(sa_api, WriterConfig(reporting_instance=pod_name), sleep=lambda s: None)
        victim, survivor = sorted(running_pods(w))[:2]
        assert writer.evict_pod(w.namespace, victim) is EvictionOutcome.EVICTED
        controller_done = time.time()

        # -- refused by the real authorizer --
        core, apps = client.CoreV1Api(sa_api), client.AppsV1Api(sa_api)
        leases, custom = client.CoordinationV1Api(sa_api), client.CustomObjectsApi(sa_api)
        other = w.namespace
        intruder = {**deployment("X", 1), "metadata": {"name": "intruder"}}
        lease_body = {"metadata": {"name": LEASE_NAME}, "spec": {"holderIdentity": pod_name}}
        refused = {
            "list secrets (its own namespace)": status_of(lambda: core.list_namespaced_secret(sa_ns)),
            "list secrets (a workload namespace)": status_of(lambda: core.list_namespaced_secret(other)),
            "delete a pod directly": status_of(lambda: core.delete_namespaced_pod(survivor, other)),
            "patch a Deployment's spec.replicas (not the scale subresource)": status_of(
                lambda: apps.patch_namespaced_deployment(DEPLOYMENT, other, {"spec": {"replicas": 7}})
            ),
            "create a Deployment": status_of(
                lambda: apps.create_namespaced_deployment(other, intruder)  # type: ignore[arg-type]
            ),
            "patch a policy's spec": status_of(
                lambda: custom.patch_namespaced_custom_object(
                    API_GROUP, API_VERSION, other, PLURAL, POLICY, {"spec": {"maxReplicas": 99}}
                )
            ),
            "delete the Lease": status_of(lambda: leases.delete_namespaced_lease(LEASE_NAME, sa_ns)),
            "list Leases": status_of(lambda: leases.list_namespaced_lease(sa_ns)),
            "create a Lease outside its namespace": status_of(
                lambda: leases.create_namespaced_lease(other, lease_body)  # type: ignore[arg-type]
            ),
            "patch a node": status_of(lambda: core.patch_node(w.nodes[0], {"metadata": {"labels": {"x": "y"}}})),
            "delete Events": status_of(lambda: core.delete_collection_namespaced_event(other)),
            "list ClusterRoles": status_of(lambda: client.RbacAuthorizationV1Api(sa_api).list_cluster_role()),
        }
    finally:
        sa_api.close()  # type: ignore[no-untyped-call]
    assert refused == dict.fromkeys(refused, 403), refused
    # ... and nothing changed
    assert spec_replicas(w) == 4
    assert cp.get(f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{other}/{PLURAL}/{POLICY}")["spec"]["maxReplicas"] == 8
    assert cp.exists(f"/api/v1/namespaces/{other}/pods/{survivor}")
    assert cp.exists(f"/apis/coordination.k8s.io/v1/namespaces/{sa_ns}/leases/{LEASE_NAME}")
    assert not cp.exists(f"/apis/coordination.k8s.io/v1/namespaces/{other}/leases/{LEASE_NAME}")
    assert not cp.exists(f"/apis/apps/v1/namespaces/{other}/deployments/intruder")

    # -- the audit log: every request of the ServiceAccount --
    requests = [r for r in audit_requests(cp, user) if r.received >= started and r.user == user]
    assert {r.pod for r in requests} == {pod_name}
    mine = [r for r in requests if r.received < controller_done]
    assert all(r.agent.startswith("gpu-autoscaler/") for r in mine), {r.agent for r in mine}

    def answered(r: Request) -> bool:
        return r.ok or (r.code == 404 and (r.resource in OPTIONAL_KINDS or (r.verb, r.resource) == ("get", "leases")))

    assert all(answered(r) for r in mine), "\n".join(str(r) for r in mine if not answered(r))
    done = {(r.verb, r.resource) for r in mine if r.ok}
    wanted = {
        ("list", "pods"),
        ("list", "nodes"),
        ("list", "deployments"),
        ("list", "gpuscalingpolicies"),
        ("get", "deployments/scale"),
        ("patch", "deployments/scale"),
        ("update", "gpuscalingpolicies/status"),
        ("create", "events"),
        ("get", "leases"),
        ("create", "leases"),
        ("update", "leases"),
        ("create", "pods/eviction"),
    }
    assert wanted <= done, sorted(wanted - done)
    assert not [r for r in mine if r.verb == "watch"]
    forbidden = [r for r in requests if r.received >= controller_done]
    assert len(forbidden) == len(refused) and all(r.code == 403 for r in forbidden), "\n".join(map(str, forbidden))
    print(f"as {user} (token bound to pod {pod_name}, Lease in {sa_ns}):")
    print("  allowed: " + ", ".join(f"{v} {res}" for v, res in sorted(done)))
    print("  refused with 403: " + ", ".join(f"{r.verb} {r.resource}" for r in forbidden if r.code == 403))
