"""deploy/overlays/scheduler-extender: every document validates, the controller serves the extender on the port the
Service, the NetworkPolicy and the KubeSchedulerConfiguration name, and the extender entry is the one this project
relies on (node names only, ignorable, GPU pods only, a short timeout). The real kube-scheduler loads the same file
in tests/realkube/test_scheduler_extender.py.

Only the leader answers: the scheduler calls a Service that selects the leader's pod label
(leader_election.label_leader_pod, on in this overlay), which a namespaced Role lets the controller write. Before, it
called the controller's Service, which reaches both replicas, and the standby answered from a view up to a tick
interval behind the leader's. EndpointSlices following the label on a real control plane:
tests/realkube/test_extender_leader_only_real.py.

The scheduler has a namespace of its own (gpu-placement): the controller's Role patches pods in gpu-autoscaler, and a
pod's image is mutable, so a scheduler pod there handed whoever held the controller's token the scheduler's identity
(system:kube-scheduler: bind any pod, read much of the cluster). The real authorizer's answer, on the applied
overlay: tests/realkube/test_apply_kustomize.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.leader_label import LEADER_LABEL, KubernetesLeaderPodLabel
from autoscaler.adapters.kubernetes.reader import DELETION_COST_BY_ANNOTATION, POD_DELETION_COST_ANNOTATION
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
from tests.kube.test_workload_patch_policy import choose, policy_of, variable

OVERLAY = DEPLOY / "overlays" / "scheduler-extender"
CONFIG_FILE = OVERLAY / "kube-scheduler-config.yaml"
EXTENDER_SERVICE = "gpu-autoscaler-extender"
CONTROLLER_NAMESPACE = "gpu-autoscaler"
SCHEDULER = "gpu-placement-scheduler"  # the name of its Deployment, ServiceAccount, Lease; its objects' app label
SCHEDULER_NAMESPACE = "gpu-placement"


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
    # no filterVerb: the scheduler's own filters, on its newer cache, say what the snapshot could (core.extender)
    assert "filterVerb" not in ext and ext["prioritizeVerb"] == "prioritize"
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
    # the scheduler's pods in the scheduler's namespace: one peer, both selectors (a podSelector alone matches the
    # policy's own namespace only; two peers would admit any pod of gpu-placement, or the label from anywhere)
    scheduler_namespace = find(overlay, "Deployment", SCHEDULER)["metadata"]["namespace"]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": scheduler_namespace}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": SCHEDULER}},
        }
    ]


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
    # the cluster-wide role patches pods for the deletion-cost marks of a scale-down's replicas only: the admission
    # policy confines that to two annotations, and the label to pods of the controller's namespace
    # (tests/kube/test_workload_patch_policy.py)
    cluster_rules = find(overlay, "ClusterRole", "gpu-autoscaler")["rules"]
    assert _allowed(cluster_rules, "", "pods", "patch") and not _allowed(cluster_rules, "", "pods", "update")


# ---- the scheduler's own namespace ---------------------------------------------------------------------------------

# What, granted in the scheduler's namespace, hands over its identity (system:kube-scheduler) or its code: a pod's
# image or command (pods, ephemeral containers, the Deployment and ReplicaSet that make its pods), its configuration,
# a token of its ServiceAccount (the TokenRequest API, or a Secret of type service-account-token the token controller
# fills), and RBAC there. Not listed: reads, and the base ClusterRole's cluster-wide Eviction and deployments/scale
# (they can stop the scheduler, never run code as it).
TAKEOVER = {
    ("", "pods"): {"create", "update", "patch"},
    ("", "pods/ephemeralcontainers"): {"update", "patch"},
    ("apps", "deployments"): {"create", "update", "patch"},
    ("apps", "replicasets"): {"create", "update", "patch"},
    ("", "configmaps"): {"update", "patch"},
    ("", "serviceaccounts/token"): {"create"},
    ("", "secrets"): {"create", "update", "patch", "get", "list"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "update", "patch", "bind", "escalate"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "update", "patch"},
    ("coordination.k8s.io", "leases"): {"update", "patch"},  # its Lease: it would stop scheduling, not run code
}


def grants_in(docs: list[dict[str, Any]], subject: dict[str, str], namespace: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the subject may use in `namespace`: Roles bound there, ClusterRoles bound there or
    cluster-wide (the rendered objects only; the cluster's bootstrap roles aside)."""
    out = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding") or subject not in binding["subjects"]:
            continue
        if binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] != namespace:
            continue
        ref = binding["roleRef"]
        role = next(
            d
            for d in docs
            if d["kind"] == ref["kind"]
            and d["metadata"]["name"] == ref["name"]
            and (ref["kind"] == "ClusterRole" or d["metadata"]["namespace"] == binding["metadata"]["namespace"])
        )
        for rule in role["rules"]:
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def scheduler_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == SCHEDULER]


def test_the_controllers_pod_role_cannot_reach_the_scheduler(overlay: list[dict[str, Any]]) -> None:
    """The leader's label needs pods list/patch in the controller's namespace (leader-only.yaml's Role); a pod's
    image is mutable, so that Role must not reach the pods of the scheduler, whose ServiceAccount is bound to
    system:kube-scheduler (bind any pod, read much of the cluster). Its namespace is another one, and nothing the
    controller's ServiceAccount is granted there lets it change the scheduler's pods or take its identity."""
    controller = find(overlay, "Deployment", "gpu-autoscaler")
    scheduler = find(overlay, "Deployment", SCHEDULER)
    account = controller["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": controller["metadata"]["namespace"]}
    (pod_role,) = [
        d for d in overlay if d["kind"] == "Role" and _allowed(d["rules"], "", "pods", "patch")
    ]  # the leader-label Role
    assert pod_role["metadata"]["namespace"] == controller["metadata"]["namespace"] == CONTROLLER_NAMESPACE
    assert scheduler["metadata"]["namespace"] != pod_role["metadata"]["namespace"]
    # the Role is used where it is granted: the controller patches pods of its own namespace
    assert ("", "pods", "patch") in grants_in(overlay, subject, CONTROLLER_NAMESPACE)
    there = grants_in(overlay, subject, scheduler["metadata"]["namespace"])
    risky = {(g, r, v) for g, r, v in there if v in TAKEOVER.get((g, r), set()) or "*" in (g, r, v)}
    # The ClusterRole's pods/patch (the deletion-cost marks of a scale-down's replicas) reaches the scheduler's pods
    # too; the admission policy lets the controller change only those two annotations of a pod there: no image, no
    # label, nothing in its spec (tests/kube/test_workload_patch_policy.py, and on a real API server
    # tests/realkube/test_workload_patch_policy_real.py)
    policy, _ = policy_of(overlay)
    assert choose(variable(policy, "ownAnnotations"), "pods") == [
        POD_DELETION_COST_ANNOTATION, DELETION_COST_BY_ANNOTATION
    ]  # fmt: skip
    assert any("may label only pods of its own namespace" in v["message"] for v in policy["spec"]["validations"])
    risky -= {("", "pods", "patch")}
    assert risky == set(), f"the controller's ServiceAccount may {sorted(risky)} in the scheduler's namespace"
    # and no controller pod lives with the scheduler (the leader sweeps labels in its own namespace only)
    assert not [d for d in overlay if d["kind"] == "Deployment" and d is not scheduler
                and d["metadata"]["namespace"] == scheduler["metadata"]["namespace"]]  # fmt: skip


def test_the_scheduler_lives_in_its_own_namespace(overlay: list[dict[str, Any]]) -> None:
    """Everything of the scheduler moved together: its ServiceAccount, the subjects of its bindings, its Lease (the
    configuration's resourceNamespace and the Role that names it), its ConfigMap, its Deployment; only the binding
    that delegated authentication reads stays in kube-system. The Namespace is rendered, with the pod security
    labels of the controller's (restricted, enforced), and the URL the scheduler calls stays a fully qualified name
    of the controller's namespace."""
    docs = scheduler_objects(overlay)
    dep = find(docs, "Deployment", SCHEDULER)
    namespace = dep["metadata"]["namespace"]
    assert namespace == SCHEDULER_NAMESPACE
    own = find(overlay, "Namespace", namespace)
    psa = {
        k: v
        for k, v in find(overlay, "Namespace", CONTROLLER_NAMESPACE)["metadata"]["labels"].items()
        if k.startswith("pod-security.kubernetes.io/")
    }
    assert psa["pod-security.kubernetes.io/enforce"] == "restricted"
    assert own["metadata"]["labels"].items() >= psa.items()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount", "ClusterRoleBinding", "ClusterRoleBinding", "RoleBinding", "Role", "RoleBinding",
         "ConfigMap", "ResourceQuota", "Deployment"]
    )  # fmt: skip
    subject = {"kind": "ServiceAccount", "name": dep["spec"]["template"]["spec"]["serviceAccountName"],
               "namespace": namespace}  # fmt: skip
    assert find(docs, "ServiceAccount", subject["name"])["metadata"]["namespace"] == namespace
    for doc in docs:
        if doc["kind"] == "ClusterRoleBinding":
            assert "namespace" not in doc["metadata"]
        elif doc["metadata"]["name"] == "gpu-placement-scheduler-authentication-reader":
            assert doc["metadata"]["namespace"] == "kube-system"
        else:
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]
        if "subjects" in doc:
            assert doc["subjects"] == [subject], doc["metadata"]
    config = scheduler_config()
    assert config["leaderElection"]["resourceNamespace"] == namespace
    lease_role = find(docs, "Role", "gpu-placement-scheduler-lease")
    assert lease_role["metadata"]["namespace"] == namespace
    assert config["leaderElection"]["resourceName"] in lease_role["rules"][1]["resourceNames"]
    assert find(docs, "ConfigMap")["metadata"]["namespace"] == namespace
    assert config["extenders"][0]["urlPrefix"].startswith(f"http://{EXTENDER_SERVICE}.{CONTROLLER_NAMESPACE}.svc:")
    assert find(overlay, "Service", EXTENDER_SERVICE)["metadata"]["namespace"] == CONTROLLER_NAMESPACE


# The PodSecurity "restricted" profile (https://kubernetes.io/docs/concepts/security/pod-security-standards/), the
# checks a pod template can fail; the real admission plugin judges the applied overlay in test_apply_kustomize.py.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}  # fmt: skip


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    out = [f"{k}: true" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_sc = pod.get("securityContext") or {}
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or not set(caps.get("add") or []) <= {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities {caps}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            out.append(f"{name}: runAsNonRoot not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{name}: hostPort")
    return out


def test_the_pods_satisfy_their_namespaces_pod_security(overlay: list[dict[str, Any]]) -> None:
    """The scheduler's namespace enforces restricted as the controller's does: both pod templates pass it."""
    namespaces = {d["metadata"]["name"]: d["metadata"].get("labels") or {} for d in overlay if d["kind"] == "Namespace"}
    deployments = [d for d in overlay if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"gpu-autoscaler", SCHEDULER}
    for dep in deployments:
        labels = namespaces[dep["metadata"]["namespace"]]
        assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", dep["metadata"]
        assert restricted_violations(dep["spec"]["template"]["spec"]) == [], dep["metadata"]["name"]


def test_the_restricted_check_catches_mistakes(overlay: list[dict[str, Any]]) -> None:
    pod = yaml.safe_load(yaml.safe_dump(find(overlay, "Deployment", SCHEDULER)["spec"]["template"]["spec"]))
    del pod["securityContext"]["seccompProfile"]
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/etc/kubernetes"}})
    pod["containers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert len(restricted_violations(pod)) == 3
