"""deploy/overlays/scheduler-extender: every document validates, the controller serves the extender on the port the
Service, the NetworkPolicy and the KubeSchedulerConfiguration name, and the extender entry is the one this project
relies on (node names only, ignorable, GPU pods only, a short timeout). The real kube-scheduler loads the same file
in tests/realkube/test_scheduler_extender.py.

Only the leader answers: the scheduler calls a Service that selects the leader's pod label
(leader_election.label_leader_pod, on in this overlay), which a namespaced Role lets the controller write. Before, it
called the controller's Service, which reaches both replicas, and the standby answered from a view up to a tick
interval behind the leader's. EndpointSlices following the label on a real control plane:
tests/realkube/test_extender_leader_only_real.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.leader_label import LEADER_LABEL, KubernetesLeaderPodLabel
from autoscaler.settings import LeaderElectionSettings, SchedulerExtenderSettings
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_deploy import (
    DEPLOY,
    NOT_IN_K8S_SCHEMAS,
    _allowed,
    _k8s_validate,
    _request_permissions,
    find,
    kustomize,
)

OVERLAY = DEPLOY / "overlays" / "scheduler-extender"
CONFIG_FILE = OVERLAY / "kube-scheduler-config.yaml"
EXTENDER_SERVICE = "gpu-autoscaler-extender"


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return kustomize(OVERLAY)


def scheduler_config(path: Path = CONFIG_FILE) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_every_document_validates(overlay: list[dict[str, Any]]) -> None:
    for doc in overlay:
        if doc["kind"] not in NOT_IN_K8S_SCHEMAS:
            _k8s_validate(doc)


def test_the_extender_entry() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpu-placement"]
    (ext,) = config["extenders"]
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert ext["httpTimeout"] == "1s" and 1 <= ext["weight"] <= 10
    assert "bindVerb" not in ext and "preemptVerb" not in ext
    assert ext["urlPrefix"] == f"http://{EXTENDER_SERVICE}.gpu-autoscaler.svc:8081/scheduler"


def test_ports_line_up(overlay: list[dict[str, Any]]) -> None:
    dep = find(overlay, "Deployment", "gpu-autoscaler")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AUTOSCALER_SCHEDULER_EXTENDER__ENABLED"] == "true"
    port = int(env["AUTOSCALER_SCHEDULER_EXTENDER__PORT"])
    assert port == SchedulerExtenderSettings().port
    assert {"name": "extender", "containerPort": port, "protocol": "TCP"} in container["ports"]
    service = find(overlay, "Service", EXTENDER_SERVICE)
    assert service["spec"]["ports"] == [{"name": "extender", "port": port, "targetPort": "extender", "protocol": "TCP"}]
    # the controller's own Service keeps the metrics port only (the ServiceMonitor's); nothing calls 8081 through it
    assert [p["name"] for p in find(overlay, "Service", "gpu-autoscaler")["spec"]["ports"]] == ["http"]
    assert f".svc:{port}/" in scheduler_config()["extenders"][0]["urlPrefix"]
    policy = find(overlay, "NetworkPolicy", "gpu-autoscaler")
    rule = policy["spec"]["ingress"][-1]
    assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpu-placement-scheduler"}}}]


def test_the_scheduler_runs_the_shipped_config(overlay: list[dict[str, Any]]) -> None:
    dep = find(overlay, "Deployment", "gpu-placement-scheduler")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--config=/etc/gpu-placement/kube-scheduler-config.yaml" in container["command"]
    assert pod["serviceAccountName"] == "gpu-placement-scheduler"
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-placement-scheduler"
    config_map = next(d for d in overlay if d["kind"] == "ConfigMap")
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]  # the generated, hashed name
    assert yaml.safe_load(config_map["data"]["kube-scheduler-config.yaml"]) == scheduler_config()
    bindings = {d["roleRef"]["name"] for d in overlay if d["kind"] in ("ClusterRoleBinding", "RoleBinding")}
    assert {"system:kube-scheduler", "system:volume-scheduler", "extension-apiserver-authentication-reader"} <= bindings
    lease = find(overlay, "Role", "gpu-placement-scheduler-lease")
    assert scheduler_config()["leaderElection"]["resourceName"] in lease["rules"][1]["resourceNames"]


def test_the_scheduler_calls_the_leader_only(overlay: list[dict[str, Any]]) -> None:
    """The Service the scheduler's urlPrefix names selects the controller's pods *and* the label only the leader's pod
    carries, with the Lease's name as its value (the settings' default: the base's Role names the same Lease)."""
    host = scheduler_config()["extenders"][0]["urlPrefix"].removeprefix("http://").split(":")[0]
    name, namespace = host.split(".")[:2]
    service = find(overlay, "Service", name)
    assert service["metadata"]["namespace"] == namespace
    dep = find(overlay, "Deployment", "gpu-autoscaler")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    lease = LeaderElectionSettings.model_fields["lease_name"].default
    assert service["spec"]["selector"] == {**dep["spec"]["selector"]["matchLabels"], LEADER_LABEL: lease}
    assert LEADER_LABEL not in pod_labels  # written by the leader on its own pod, never by the template
    # the leader's readiness is its tick's (a policy read failing makes it NotReady): the label alone decides
    assert service["spec"]["publishNotReadyAddresses"] is True
    # the setting that writes the label is on, and the container knows its pod (the downward API)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD"]["value"] == "true"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # the ServiceMonitor scrapes the controller's Service only, not the leader's (no metrics port there)
    monitor = find(overlay, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert not monitor.items() <= service["metadata"]["labels"].items()


def test_the_role_grants_exactly_the_label_writes(overlay: list[dict[str, Any]], tmp_path: Path) -> None:
    """Replays what the label adapter sends (the leader labels its pod and sweeps another's, a leaving replica
    unlabels its own) against the fake API server: each request is allowed by a Role of the controller's own
    namespace bound to its ServiceAccount, the Role grants nothing else, and the ClusterRole no pod write."""
    dep = find(overlay, "Deployment", "gpu-autoscaler")
    namespace = dep["metadata"]["namespace"]
    account = dep["spec"]["template"]["spec"]["serviceAccountName"]
    lease = LeaderElectionSettings.model_fields["lease_name"].default
    with FakeApiServer() as server:
        stale = o.pod("ctrl-b", namespace, gpus=0, labels={LEADER_LABEL: lease})
        server.seed(o.pod("ctrl-a", namespace, gpus=0), stale)
        api: client.ApiClient = load_api_client("kubeconfig", server.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            label = KubernetesLeaderPodLabel(api, namespace, "ctrl-a", lease)
            label.mark_leader(lambda: True)
            label.unmark()
        finally:
            api.close()  # type: ignore[no-untyped-call]
        seen = _request_permissions(server)
    assert seen == {("", "pods", "patch", namespace), ("", "pods", "list", namespace)}
    roles = [d for d in overlay if d["kind"] == "Role" and d["metadata"]["namespace"] == namespace]
    (role,) = [r for r in roles if _allowed(r["rules"], "", "pods", "patch")]
    for group, resource, verb, _ in seen:
        assert _allowed(role["rules"], group, resource, verb), f"the Role misses {verb} {group}/{resource}"
    rules = role["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {(g, r, v) for g, r, v, _ in seen}
    (binding,) = [
        d for d in overlay if d["kind"] == "RoleBinding" and d["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    ]  # fmt: skip
    assert binding["metadata"]["namespace"] == namespace
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    # pods are patched in the controller's namespace only: the cluster-wide role still reads them, never writes
    cluster_rules = find(overlay, "ClusterRole", "gpu-autoscaler")["rules"]
    assert not _allowed(cluster_rules, "", "pods", "patch")
