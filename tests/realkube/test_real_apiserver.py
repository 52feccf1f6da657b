"""The Kubernetes adapters against a real control plane: what tests/kube checks against our imitation of the API
server, checked here against kube-apiserver, etcd, the real controllers, the real scheduler and kwok nodes.

Objects are set up with plain REST calls (``control_plane.request``); the code under test is the repository's own
adapters (``load_api_client``, ``KubeClusterReader``, ``KubeClusterWriter``, ``PolicyLoader``,
``KubernetesLeaseStore``) exactly as the controller wires them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kubernetes import client

from autoscaler.adapters.kubernetes import (
    INVALID_SPEC,
    READY,
    KubeClusterReader,
    KubeClusterWriter,
    PolicyLoader,
    ReaderConfig,
    StatusUpdate,
    WriterConfig,
)
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.adapters.kubernetes.status import condition
from autoscaler.adapters.kubernetes_lease import (
    ElectionTimings,
    KubernetesLeaseStore,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
)
from autoscaler.core.cluster import PodInfo, WorkloadInfo
from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from autoscaler.ports import EvictionOutcome
from tests.kube import objects as kube_objects
from tests.realkube import manifests
from tests.realkube.control_plane import COMPLETE_ANNOTATION, REPO, ApiError, ControlPlane
from tests.realkube.manifests import A100, gpu_pod_spec, running_ready

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

CRD_FILE = REPO / "deploy" / "base" / "crd-gpuscalingpolicies.yaml"
POLICIES = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{ns}}/{PLURAL}"


# ---- object builders ---------------------------------------------------------------------------------------------


def deployment(name: str, replicas: int, gpus: int = 1, **pod: Any) -> dict[str, Any]:
    return manifests.deployment(name, replicas, gpu_pod_spec(gpus, **pod), labels={"app": name})


def job(name: str, parallelism: int, gpus: int = 1, complete: bool = False) -> dict[str, Any]:
    annotations = {COMPLETE_ANNOTATION: "true"} if complete else {}
    return manifests.job(name, parallelism, gpu_pod_spec(gpus), annotations=annotations)


def create_deployment(cp: ControlPlane, ns: str, body: dict[str, Any], ready: int | None = None) -> dict[str, Any]:
    created = cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    want = body["spec"]["replicas"] if ready is None else ready
    name = body["metadata"]["name"]
    wait_running(cp, ns, f"app={name}", want)
    return dict(created)


def wait_running(cp: ControlPlane, ns: str, selector: str, count: int, timeout_s: float = 60) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        pods = cp.pods(ns, selector)
        running = [p for p in pods if running_ready(p)]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return running if len(running) == count and len(live) == count else None

    return cp.wait(f"{count} Running+Ready pods {selector} in {ns}", probe, timeout_s=timeout_s)


def make_writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="realkube-test"))


# ---- fixtures ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_crd(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    """The GPUScalingPolicy CRD exactly as deploy/ ships it, Established."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    name = crd["metadata"]["name"]
    exists = control_plane.exists(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    if not exists:
        control_plane.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established() -> dict[str, Any] | None:
        obj = control_plane.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}
        if conds.get("Established") != "True":
            return None
        # Established can precede the discovery/storage of the new resource by a moment: list it once.
        control_plane.get(f"/apis/{API_GROUP}/{API_VERSION}/{PLURAL}")
        return dict(obj)

    yield control_plane.wait(f"CRD {name} Established", established, timeout_s=30)


# ---- Deployment -> ReplicaSet -> Pods on kwok GPU nodes -> the reader ---------------------------------------------


def test_deployment_pods_scheduled_onto_gpu_nodes_and_read_back(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    pc_name = f"rk-high-{secrets.token_hex(3)}"
    cp.request(
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": pc_name}, "value": 1000},
    )
    try:
        create_deployment(cp, ns, deployment("chat", replicas=3, gpus=2, priority_class=pc_name))

        # The real deployment controller made a ReplicaSet owned by the Deployment, which made the pods.
        rs = cp.get(f"/apis/apps/v1/namespaces/{ns}/replicasets", params={"labelSelector": "app=chat"})["items"]
        assert len(rs) == 1
        owner = rs[0]["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("Deployment", "chat", True)
        cp.wait(
            "Deployment chat readyReplicas 3",
            lambda: (
                cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat").get("status", {}).get("readyReplicas") == 3
            ),
        )

        snapshot = KubeClusterReader(api_client).snapshot(time.time())
        # The same snapshot one object per page: the real apiserver's continue tokens.
        paged_reader = KubeClusterReader(api_client, ReaderConfig(page_size=1))
        paged = paged_reader.snapshot(time.time())
        assert sorted(p.name for p in paged.pods if p.namespace == ns) == sorted(
            p.name for p in snapshot.pods if p.namespace == ns
        )
        assert paged_reader.last_stats.api_calls > len(paged.pods)

        mine = [p for p in snapshot.pods if p.namespace == ns]
        assert len(mine) == 3
        a100_nodes = {"kwok-a100-0", "kwok-a100-1"}
        for pod in mine:
            assert pod.gpus == 2
            assert pod.node in a100_nodes, pod  # the scheduler honoured the GPU-product nodeSelector
            assert (pod.owner_kind, pod.owner_name) == ("Deployment", "chat")
            assert pod.phase == "Running" and pod.ready
            assert pod.priority == 1000  # the Priority admission plugin resolved the class into spec.priority
            assert pod.created_at is not None and pod.ready_at is not None
        dep = next(d for d in snapshot.deployments if d.namespace == ns and d.name == "chat")
        assert (dep.spec_replicas, dep.ready_replicas, dep.selector) == (3, 3, {"app": "chat"})

        nodes = {n.name: n for n in snapshot.nodes}
        assert {"kwok-a100-0", "kwok-a100-1", "kwok-l4-0"} <= set(nodes)
        assert (nodes["kwok-a100-0"].allocatable_gpus, nodes["kwok-a100-0"].gpu_product) == (8, A100)
        assert (nodes["kwok-l4-0"].allocatable_gpus, nodes["kwok-l4-0"].gpu_product) == (4, "NVIDIA-L4")
        assert nodes["kwok-l4-0"].pool == "l4"
        assert all(n.ready for n in nodes.values() if n.name.startswith("kwok-"))
        # The apiserver's own bootstrap classes plus ours.
        assert snapshot.priority_classes[pc_name] == 1000
        assert snapshot.priority_classes["system-cluster-critical"] == 2_000_000_000
    finally:
        cp.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{pc_name}")


def test_pods_that_fit_no_gpu_node_stay_pending(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    # 5 GPUs per pod fit an A100 node (8) once, never an L4 node (4): the real scheduler's NodeResourcesFit.
    cp.request(
        "POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("big", replicas=1, gpus=5, product="NVIDIA-L4")
    )

    def unschedulable() -> dict[str, Any] | None:
        pods = cp.pods(ns, "app=big")
        for pod in pods:
            for c in pod.get("status", {}).get("conditions") or []:
                if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                    return pod
        return None

    pod = cp.wait("pod big Unschedulable", unschedulable, timeout_s=60)
    assert not pod["spec"].get("nodeName")
    assert "nvidia.com/gpu" in next(c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")


# ---- the scale subresource ---------------------------------------------------------------------------------------


def test_scale_deployment_through_the_scale_subresource(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    create_deployment(cp, ns, deployment("embed", replicas=1))
    writer = make_writer(api_client)

    writer.scale_deployment(ns, "embed", 4)
    assert cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/embed")["spec"]["replicas"] == 4
    wait_running(cp, ns, "app=embed", 4)

    # Idempotent: the same target again writes nothing (the resourceVersion does not move).
    rv = cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/embed")["metadata"]["resourceVersion"]
    calls = writer.api_calls
    writer.scale_deployment(ns, "embed", 4)
    assert writer.api_calls == calls + 1  # the read only
    assert cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/embed")["metadata"]["resourceVersion"] == rv

    writer.scale_deployment(ns, "embed", 2)
    wait_running(cp, ns, "app=embed", 2)

    # What the writer's optimistic concurrency relies on: a merge patch of /scale carrying a stale resourceVersion
    # is refused with 409 by the real apiserver (not applied over the newer object).
    stale = {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 7}}
    with pytest.raises(ApiError) as err:
        cp.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns}/deployments/embed/scale",
            stale,
            content_type="application/merge-patch+json",
        )
    assert err.value.status == 409
    assert cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/embed")["spec"]["replicas"] == 2


# ---- eviction and PodDisruptionBudgets ---------------------------------------------------------------------------


def test_eviction_blocked_by_a_pdb_until_the_budget_allows_it(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    create_deployment(cp, ns, deployment("serve", replicas=2))
    pdb_path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    cp.request(
        "POST",
        pdb_path,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "serve"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "serve"}}},
        },
    )

    def budget(allowed: int) -> Any:
        def probe() -> dict[str, Any] | None:
            pdb = cp.get(f"{pdb_path}/serve")
            st = pdb.get("status") or {}
            fresh = st.get("observedGeneration") == pdb["metadata"]["generation"]
            return pdb if fresh and st.get("expectedPods") == 2 and st.get("disruptionsAllowed") == allowed else None

        return cp.wait(f"PDB serve disruptionsAllowed={allowed} (disruption controller)", probe, timeout_s=60)

    budget(0)
    snapshot = KubeClusterReader(api_client).snapshot(time.time())
    pdb_info = next(p for p in snapshot.pdbs if p.namespace == ns)
    assert (pdb_info.selector, pdb_info.disruptions_allowed) == ({"app": "serve"}, 0)

    writer = make_writer(api_client)
    victim = cp.pods(ns, "app=serve")[0]["metadata"]["name"]
    assert writer.evict_pod(ns, victim) is EvictionOutcome.BLOCKED  # the apiserver's 429: "not now"
    pod = cp.get(f"/api/v1/namespaces/{ns}/pods/{victim}")
    assert not pod["metadata"].get("deletionTimestamp")

    cp.request("PATCH", f"{pdb_path}/serve", {"spec": {"minAvailable": 1}}, content_type="application/merge-patch+json")
    budget(1)
    assert writer.evict_pod(ns, victim) is EvictionOutcome.EVICTED
    cp.wait(
        f"pod {victim} gone or terminating",
        lambda: (
            not cp.exists(f"/api/v1/namespaces/{ns}/pods/{victim}")
            or bool(cp.get(f"/api/v1/namespaces/{ns}/pods/{victim}")["metadata"].get("deletionTimestamp"))
        ),
    )
    assert writer.evict_pod(ns, "no-such-pod") is EvictionOutcome.GONE
    # The ReplicaSet replaces the evicted pod.
    wait_running(cp, ns, "app=serve", 2)


# ---- Job suspension ----------------------------------------------------------------------------------------------


def test_suspending_a_job_makes_the_job_controller_delete_its_pods(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("train", parallelism=2, gpus=4))
    pods = wait_running(cp, ns, "job=train", 2)
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "Job" for p in pods)

    snapshot = KubeClusterReader(api_client).snapshot(time.time())
    mine = [p for p in snapshot.pods if p.namespace == ns]
    assert [(p.owner_kind, p.owner_name, p.gpus) for p in mine] == [("Job", "train", 4)] * 2

    writer = make_writer(api_client)
    writer.suspend_workload("Job", ns, "train")
    assert cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train")["spec"]["suspend"] is True

    cp.wait("the Job controller deleted the pods of the suspended Job", lambda: cp.pods(ns, "job=train") == [])

    def suspended() -> dict[str, Any] | None:
        st = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train").get("status") or {}
        conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
        return st if conds.get("Suspended") == "True" and not st.get("active") else None

    cp.wait("Job train Suspended", suspended, timeout_s=60)
    # Idempotent: suspending a suspended Job writes nothing.
    rv = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train")["metadata"]["resourceVersion"]
    writer.suspend_workload("Job", ns, "train")
    assert cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train")["metadata"]["resourceVersion"] == rv
    writer.suspend_workload("Job", ns, "no-such-job")  # gone: the goal is met, no error


def test_suspend_and_resume_an_indexed_job_round_trip(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    """suspend_workload -> the real Job controller deletes the pods, the reader shows the Job suspended by us;
    resume_workload -> the Job controller makes the pods again and the scheduler puts them on kwok GPU nodes."""
    cp, ns = control_plane, namespace
    body = job("train", parallelism=2, gpus=1)
    # backoffLimit 0 (job()): pods deleted by a suspension must not count as failures, or the resume would fail it
    body["spec"].update(completionMode="Indexed", suspend=False)
    cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body)
    first = wait_running(cp, ns, "job=train", 2)
    assert sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in first) == ["0", "1"]
    reader = KubeClusterReader(api_client, sleep=lambda s: None)

    def mine() -> tuple[WorkloadInfo | None, list[PodInfo]]:
        snap = reader.snapshot(time.time())
        workloads = [w for w in snap.workloads if w.namespace == ns]
        assert len(workloads) <= 1
        return (workloads[0] if workloads else None), [p for p in snap.pods if p.namespace == ns]

    workload, pods = mine()
    gang = f"job/{ns}/train"
    assert workload == WorkloadInfo("Job", ns, "train", gang, suspended=False, pod_gpus=(1, 1), gpu_product=A100)
    assert [p.gang for p in pods] == [gang, gang]  # the pods carry the gang the workload is listed under

    writer = make_writer(api_client)
    started = time.time()
    writer.suspend_workload("Job", ns, "train")
    cp.wait("the Job controller deleted the pods of the suspended Job", lambda: cp.pods(ns, "job=train") == [])
    obj = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train")
    annotations = obj["metadata"]["annotations"]
    assert annotations["gpuautoscaler.dev/suspended-by"] == "gpu-autoscaler"
    assert annotations["gpuautoscaler.dev/suspended-generation"] == str(obj["metadata"]["generation"])
    workload, pods = mine()
    assert workload is not None and workload.suspended and pods == []
    assert workload.suspended_by_us_at is not None and started - 1 <= workload.suspended_by_us_at <= time.time()

    writer.resume_workload("Job", ns, "train")
    again = wait_running(cp, ns, "job=train", 2, timeout_s=60)
    assert {p["metadata"]["uid"] for p in again}.isdisjoint(p["metadata"]["uid"] for p in first)  # new pods
    obj = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train")
    assert obj["spec"]["suspend"] is False and not obj.get("status", {}).get("failed")
    assert not any(k.startswith("gpuautoscaler.dev/") for k in obj["metadata"].get("annotations") or {})
    workload, pods = mine()
    assert workload is not None and not workload.suspended and workload.suspended_by_us_at is None
    assert len(pods) == 2 and all(p.gang == gang and p.node for p in pods)
    # Idempotent: resuming a running Job only reads it (the Job controller keeps writing its status meanwhile, so
    # the resourceVersion is no witness here).
    calls = writer.api_calls
    writer.resume_workload("Job", ns, "train")
    assert writer.api_calls == calls + 1
    writer.resume_workload("Job", ns, "no-such-job")  # gone: nothing to resume, no error


@pytest.fixture(scope="module")
def jobset_crd(control_plane: ControlPlane) -> Iterator[str]:
    """A JobSet CRD (jobset.x-k8s.io/v1alpha2, schema open) without its controller: the adapters' CR paths."""
    crd = kube_objects.jobset_crd()
    name = crd["metadata"]["name"]
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    if not control_plane.exists(path):
        control_plane.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established() -> bool:
        conds = {c["type"]: c["status"] for c in control_plane.get(path).get("status", {}).get("conditions") or []}
        if conds.get("Established") != "True":
            return False
        control_plane.get("/apis/jobset.x-k8s.io/v1alpha2/jobsets")
        return True

    control_plane.wait(f"CRD {name} Established", established, timeout_s=30)
    try:
        yield name
    finally:
        control_plane.request("DELETE", path)


def test_a_jobset_is_read_suspended_and_resumed_through_the_custom_objects_api(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, jobset_crd: str
) -> None:
    cp, ns = control_plane, namespace
    body = kube_objects.jobset("llama", ns, replicated_jobs=[kube_objects.replicated_job("w", 2, 1, 2, product=A100)])
    cp.request("POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", body)
    reader = KubeClusterReader(api_client, sleep=lambda s: None)

    def mine() -> WorkloadInfo:
        (workload,) = [w for w in reader.snapshot(time.time()).workloads if w.namespace == ns]
        return workload

    assert mine() == WorkloadInfo("JobSet", ns, "llama", f"jobset/{ns}/llama", False, pod_gpus=(2, 2), gpu_product=A100)
    writer = make_writer(api_client)
    writer.suspend_workload("JobSet", ns, "llama")
    obj = cp.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/llama")
    generation = str(obj["metadata"]["generation"])
    assert obj["spec"]["suspend"] is True
    assert obj["metadata"]["annotations"]["gpuautoscaler.dev/suspended-generation"] == generation
    suspended = mine()
    assert suspended.suspended and suspended.suspended_by_us_at is not None
    writer.resume_workload("JobSet", ns, "llama")
    obj = cp.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/llama")
    assert obj["spec"]["suspend"] is False and not obj["metadata"].get("annotations")  # merge-patch null removed them
    resumed = mine()
    assert not resumed.suspended and resumed.suspended_by_us_at is None


def test_kwok_completes_job_pods_only_when_annotated(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("once", parallelism=1, complete=True))

    def complete() -> bool:
        st = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/once").get("status") or {}
        return any(c["type"] == "Complete" and c["status"] == "True" for c in st.get("conditions") or [])

    cp.wait("Job once Complete", complete, timeout_s=60)


# ---- the GPUScalingPolicy CRD: schema validation and the status subresource --------------------------------------


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": name},
        "spec": {"targetRef": {"name": name}, **spec},
    }


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"maxReplicas": 0}, "spec.maxReplicas", "should be greater than or equal to 1"),
        ({"maxReplicas": "ten"}, "spec.maxReplicas", "must be of type integer"),
        ({"minReplicas": 5, "maxReplicas": 2}, "spec.minReplicas", "minReplicas must be <= maxReplicas"),
        ({"metric": {"type": "gpu_util", "target": 70}}, "spec.metric.type", "Unsupported value"),
        (
            {"metric": {"type": "gpu_utilization", "target": 0}},
            "spec.metric.target",
            "should be greater than or equal to 1e-06",
        ),
    ],
    ids=["maxReplicas-0", "maxReplicas-string", "min-over-max-CEL", "metric-enum", "target-0"],
)
def test_the_crd_schema_rejects_bad_policies(
    control_plane: ControlPlane, namespace: str, policy_crd: dict[str, Any], spec: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ApiError) as err:
        control_plane.request("POST", POLICIES.format(ns=namespace), policy("bad", **spec))
    assert err.value.status == 422, err.value
    assert err.value.reason == "Invalid"
    causes = err.value.body["details"]["causes"]
    assert any(c.get("field") == field and says in c.get("message", "") for c in causes), causes


# (spec, the field the apiserver names when it refuses, or None when both the apiserver and the parser accept it)
AGREEMENT: dict[str, tuple[dict[str, Any], str | None]] = {
    # the schema's default target (70) is a gpu_utilization percentage: stored as it is, the parser refused it
    "engine_active-default-target": ({"metric": {"type": "engine_active"}}, "spec.metric.target"),
    "engine_active-over-1": ({"metric": {"type": "engine_active", "target": 1.5}}, "spec.metric.target"),
    "engine_active-ratio": ({"metric": {"type": "engine_active", "target": 0.7}}, None),
    "gpu_utilization-over-100": ({"metric": {"type": "gpu_utilization", "target": 150}}, "spec.metric.target"),
    "default-type-over-100": ({"metric": {"target": 101}}, "spec.metric.target"),
    "gpu_utilization-100": ({"metric": {"type": "gpu_utilization", "target": 100}}, None),
    "request_rate-over-100": ({"metric": {"type": "request_rate", "target": 500}}, None),
    "target-tiny": ({"metric": {"type": "request_rate", "target": 5e-324}}, "spec.metric.target"),
    "target-smallest": ({"metric": {"type": "request_rate", "target": 1e-6}}, None),
    # an integer is compared with a fractional minimum truncated (0 >= int(1e-06)): a CEL rule repeats the bound
    "target-integer-0": ({"metric": {"type": "request_rate", "target": 0}}, "spec.metric.target"),
    "ratePerReplica-integer-0": ({"forecast": {"mode": "active", "ratePerReplica": 0}}, "spec.forecast.ratePerReplica"),
    "untrustedTargetRatio-integer-0": (
        {"forecast": {"mode": "active", "untrustedTargetRatio": 0}},
        "spec.forecast.untrustedTargetRatio",
    ),
    "untrustedTargetRatio-1": ({"forecast": {"mode": "active", "untrustedTargetRatio": 1}}, None),
    "ratePerReplica-tiny": ({"forecast": {"mode": "active", "ratePerReplica": 1e-9}}, "spec.forecast.ratePerReplica"),
    "untrustedTargetRatio-tiny": (
        {"forecast": {"mode": "active", "untrustedTargetRatio": 1e-9}},
        "spec.forecast.untrustedTargetRatio",
    ),
    "hpaWithoutBehavior-scaleUp-policies": (
        {
            "behavior": {
                "hpaWithoutBehavior": True,
                "scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]},
            }
        },
        "spec.behavior.scaleUp",
    ),
    "hpaWithoutBehavior-scaleDown-select": (
        {"behavior": {"hpaWithoutBehavior": True, "scaleDown": {"selectPolicy": "Min"}}},
        "spec.behavior.scaleDown",
    ),
    "hpaWithoutBehavior-scaleUp-window": (
        {"behavior": {"hpaWithoutBehavior": True, "scaleUp": {"stabilizationWindowSeconds": 30}}},
        "spec.behavior.scaleUp.stabilizationWindowSeconds",
    ),
    "hpaWithoutBehavior-defaults": (
        {
            "behavior": {
                "hpaWithoutBehavior": True,
                "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": None},
                "scaleDown": {"stabilizationWindowSeconds": 600, "tolerance": 0.2},
            }
        },
        None,
    ),
    "behavior-policies-without-the-flag": (
        {
            "behavior": {
                "hpaWithoutBehavior": False,
                "scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]},
            }
        },
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(AGREEMENT))
def test_the_crd_schema_and_the_parser_agree(
    control_plane: ControlPlane, namespace: str, policy_crd: dict[str, Any], case: str
) -> None:
    """What the apiserver stores (its defaults applied) the controller accepts, and what the controller would refuse
    the apiserver refuses at admission (CEL where one field depends on another), naming the same field."""
    spec, field = AGREEMENT[case]
    name = f"p-{secrets.token_hex(3)}"
    body = policy(name, **spec)
    parsed = validate_policy({**body, "metadata": {"name": name, "namespace": namespace}})
    if field is None:
        stored = control_plane.request("POST", POLICIES.format(ns=namespace), body)
        result = validate_policy(stored)
        assert isinstance(result, LoadedPolicy), f"stored {stored['spec']}, refused by the controller: {result}"
        assert isinstance(parsed, LoadedPolicy), parsed
        return
    with pytest.raises(ApiError) as err:
        control_plane.request("POST", POLICIES.format(ns=namespace), body)
    assert err.value.status == 422, err.value
    causes = err.value.body["details"]["causes"]
    # the parser names the object of a cross-field rule (spec.metric), the apiserver its field (spec.metric.target)
    assert isinstance(parsed, InvalidPolicy) and field.startswith(parsed.field), parsed
    # a cross-field rule says what the parser says; a bound, in the apiserver's words ("should be greater than...")
    says = parsed.message.split(" (got ")[0]
    says = "should be" if says.startswith("Input should be") else says
    assert any(c.get("field") == field and says in c.get("message", "") for c in causes), (says, causes)


def stored_without_the_metric_rules(
    cp: ControlPlane, crd: dict[str, Any], ns: str, body: dict[str, Any]
) -> dict[str, Any]:
    """``body`` created while the CRD lacks its CEL rules on spec.metric (as an object stored under an older CRD),
    the rules restored afterwards."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"

    def metric_schema(obj: dict[str, Any]) -> dict[str, Any]:
        schema: dict[str, Any] = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        return schema["properties"]["spec"]["properties"]["metric"]  # type: ignore[no-any-return]

    def admitted() -> bool:
        probe = {**body, "metadata": {"name": f"probe-{secrets.token_hex(3)}"}}
        try:
            cp.request("POST", POLICIES.format(ns=ns), probe, params={"dryRun": "All"})
        except ApiError as err:
            assert err.status == 422, err
            return False
        return True

    rules = metric_schema(cp.get(path))["x-kubernetes-validations"]
    current = cp.get(path)
    del metric_schema(current)["x-kubernetes-validations"]
    cp.request("PUT", path, current)
    try:
        cp.wait("the CRD without its spec.metric rules", lambda: admitted() or None, timeout_s=30)
        return dict(cp.request("POST", POLICIES.format(ns=ns), body))
    finally:
        current = cp.get(path)
        metric_schema(current)["x-kubernetes-validations"] = rules
        cp.request("PUT", path, current)
        cp.wait("the CRD with its spec.metric rules again", lambda: not admitted() or None, timeout_s=30)


def test_policy_loader_writes_status_through_the_subresource(
    control_plane: ControlPlane, namespace: str, policy_crd: dict[str, Any], api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    good = cp.request("POST", POLICIES.format(ns=ns), policy("chat", minReplicas=1, maxReplicas=6))
    assert good["spec"]["maxReplicas"] == 6 and good["spec"]["mode"]  # accepted, with the schema's defaults
    # Invalid for the controller, stored before the CRD had the rule that now refuses it at admission (an upgrade):
    # the controller reports it as the InvalidSpec condition on the status subresource.
    bad = stored_without_the_metric_rules(
        cp, policy_crd, ns, policy("embed", metric={"type": "gpu_utilization", "target": 150})
    )

    loader, writer = PolicyLoader(api_client, [ns]), make_writer(api_client)
    now = time.time()
    policies = loader.sync(writer, now)
    assert [p.name for p in policies.valid] == ["chat"]
    assert [(p.name, p.field) for p in policies.invalid] == [("embed", "spec.metric")]

    stored = cp.get(f"{POLICIES.format(ns=ns)}/embed")
    invalid, ready = condition(stored.get("status"), INVALID_SPEC), condition(stored.get("status"), READY)
    assert invalid is not None and invalid["status"] == "True" and invalid["message"].startswith("spec.metric: ")
    assert ready is not None and ready["status"] == "False"
    assert stored["metadata"]["generation"] == bad["metadata"]["generation"] == 1  # a status write is no spec change
    assert "status" not in cp.get(f"{POLICIES.format(ns=ns)}/chat")

    events = cp.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    warnings = [e for e in events if e["regarding"].get("name") == "embed"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and "spec.metric" in warnings[0]["note"]
    assert warnings[0]["regarding"].get("uid") == bad["metadata"]["uid"]  # `kubectl describe` finds it

    # Steady state: what was written is what the server keeps (nothing pruned), so a second sync writes nothing.
    rv = stored["metadata"]["resourceVersion"]
    loader.sync(writer, now + 15)
    assert cp.get(f"{POLICIES.format(ns=ns)}/embed")["metadata"]["resourceVersion"] == rv

    # The writer's own status fields go through the status subresource too, and survive the schema's pruning.
    assert writer.update_policy_status(ns, "chat", StatusUpdate(current_replicas=2, desired_replicas=3), now=now)
    status = cp.get(f"{POLICIES.format(ns=ns)}/chat")["status"]
    assert (status["currentReplicas"], status["desiredReplicas"], status["observedGeneration"]) == (2, 3, 1)
    assert not writer.update_policy_status(ns, "chat", StatusUpdate(current_replicas=2, desired_replicas=3), now=now)

    # Fixed by the user: generation 2, the condition flips back.
    cp.request(
        "PATCH",
        f"{POLICIES.format(ns=ns)}/embed",
        {"spec": {"metric": {"target": 60}}},
        content_type="application/merge-patch+json",
    )
    policies = loader.sync(writer, now + 30)
    assert sorted(p.name for p in policies.valid) == ["chat", "embed"]
    fixed = cp.get(f"{POLICIES.format(ns=ns)}/embed")
    assert fixed["metadata"]["generation"] == 2
    assert condition(fixed["status"], INVALID_SPEC)["status"] == "False"  # type: ignore[index]


def test_events_are_deduplicated_into_a_series(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    create_deployment(cp, ns, deployment("chat", replicas=1))
    writer = make_writer(api_client)
    writer.emit_event("Deployment", ns, "chat", "ScaledUp", "scaled from 1 to 2 replicas", action="Scale")
    writer.emit_event("Deployment", ns, "chat", "ScaledUp", "scaled from 1 to 2 replicas", action="Scale")
    events = cp.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    ours = [e for e in events if e.get("reportingController") == "gpuautoscaler.dev/controller"]
    assert len(ours) == 1
    assert ours[0]["series"]["count"] == 2
    dep_uid = cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat")["metadata"]["uid"]
    assert ours[0]["regarding"]["uid"] == dep_uid
    # The same Event through the core/v1 view that `kubectl describe` reads.
    core = cp.get(f"/api/v1/namespaces/{ns}/events")["items"]
    assert any(e["involvedObject"].get("uid") == dep_uid and e["reason"] == "ScaledUp" for e in core)


# ---- Leases ------------------------------------------------------------------------------------------------------


def test_lease_store_optimistic_concurrency(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    store = KubernetesLeaseStore(client.CoordinationV1Api(api_client), namespace, "gpu-autoscaler")
    assert store.get() is None
    now = datetime.now(UTC)
    created = store.create(LeaseRecord("a", 15.0, acquire_time=now, renew_time=now))
    assert created.holder == "a" and created.resource_version
    with pytest.raises(LeaseConflict):
        store.create(LeaseRecord("b", 15.0, acquire_time=now, renew_time=now))
    renewed = store.update(LeaseRecord("a", 15.0, now, datetime.now(UTC), 0, created.resource_version))
    assert renewed.resource_version != created.resource_version
    with pytest.raises(LeaseConflict):  # a stale resourceVersion loses the race
        store.update(LeaseRecord("b", 15.0, now, datetime.now(UTC), 1, created.resource_version))
    read = store.get()
    assert read is not None and read.holder == "a" and read.resource_version == renewed.resource_version
    assert read.lease_duration_s == 15.0


def test_lease_times_with_whole_seconds_are_accepted(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    """A wall clock that lands on a whole second (microsecond 0): ``MicroTime`` must still serialise as the
    apiserver's RFC 3339 with microseconds, or one renewal in a million fails."""
    store = KubernetesLeaseStore(client.CoordinationV1Api(api_client), namespace, "whole-second")
    whole = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
    created = store.create(LeaseRecord("a", 15.0, acquire_time=whole, renew_time=whole))
    assert created.renew_time is not None and abs((created.renew_time - whole).total_seconds()) < 1e-3


def test_two_electors_one_lease(control_plane: ControlPlane, namespace: str, api_client: client.ApiClient) -> None:
    coordination = client.CoordinationV1Api(api_client)
    timings = ElectionTimings(lease_duration_s=2.0, renew_deadline_s=1.5, retry_period_s=0.2)
    a = LeaderElector(KubernetesLeaseStore(coordination, namespace, "gpu-autoscaler"), "a", timings)
    b = LeaderElector(KubernetesLeaseStore(coordination, namespace, "gpu-autoscaler"), "b", timings)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False and b.last_error is None and b.holder == "a"
    assert a.try_acquire_or_renew() is True  # renewal
    lease = control_plane.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/gpu-autoscaler")
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 2
    a.release()
    assert not a.is_leader()
    assert b.try_acquire_or_renew() is True  # released: taken at once, no wait for expiry
    lease = control_plane.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/gpu-autoscaler")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    # b stops renewing; a takes over only after it has seen the record unchanged for a lease duration.
    assert a.try_acquire_or_renew() is False
    deadline = time.monotonic() + 30  # about 2 s (the lease duration) unless the machine is loaded
    while not a.try_acquire_or_renew():
        assert time.monotonic() < deadline, "a never took over the expired lease"
        time.sleep(0.2)
    assert not b.is_leader()  # past its renew deadline


def test_kwok_renews_its_nodes_leases(control_plane: ControlPlane) -> None:
    """Without renewed node Leases the node controller marks every kwok node's pods Ready=False about every 50 s,
    and kwok never sets them back: a long-lived pod would look unready to the controller for good."""
    node = control_plane.nodes[0].name

    def renew_time() -> str | None:
        try:
            lease = control_plane.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
            )
        except ApiError:  # 404 until kwok creates it
            return None
        return lease.get("spec", {}).get("renewTime")

    deadline = time.monotonic() + 60  # kwok renews about every 10 s (a quarter of the 40 s lease)
    first = renew_time()
    while time.monotonic() < deadline:
        now = renew_time()
        if first is not None and now is not None and now != first:
            return
        first = first or now
        time.sleep(1)
    pytest.fail(f"node {node}'s Lease was not renewed within 60 s (renewTime {first})")
