"""The Kubernetes adapters' fault handling against the real apiserver, through the fault proxy (fault_proxy.py):
the cases tests/kube ran against the fake API server's fault injection (issue 13, item 6), moved here with the
same assertions. The objects are real (created with plain REST on the apiserver); only the fault is made up, by a
proxy between the official client and the apiserver that answers the status, holds or drops the requests its rule
matches and forwards everything else untouched, so the retries, the resourceVersion preconditions and a late write
land on the real apiserver.

Reader: 410 on a continue token, 500/429 retried and 403 not, a failure mid-pagination, bounded timeouts, 403 on
HPAs and on Jobs, a failing workload list. Writer: a persistent 409 bounded, a 500 not retried blindly, a write
whose answer is lost never doubled, 429/500/lost answer on an eviction, a persistent 409 on resume. The policy
loader under a failing status write; the MachineDeployment node pools under 409; ``autoscaler run --once`` exiting
1 when the Lease read fails with 500.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import (
    ConflictError,
    KubeApiError,
    KubeClusterReader,
    KubeClusterWriter,
    KubeUnavailable,
    MachineDeploymentNodePools,
    PolicyLoader,
    ReaderConfig,
    WriterConfig,
)
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.nodepool import DELETE_MACHINE_ANNOTATION
from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from autoscaler.ports import EvictionOutcome, PortError
from tests.kube import objects as o
from tests.realkube.control_plane import GPU_RESOURCE, ApiError, ControlPlane
from tests.realkube.fault_proxy import FaultProxy
from tests.realkube.test_faults_real import install_crd
from tests.runtime.test_run_exit_codes import LEASE, run_once

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

NOW = 1_800_000_000.0
OURS = {
    "gpuautoscaler.dev/suspended-by": "gpu-autoscaler",
    "gpuautoscaler.dev/suspended-at": "2027-01-15T08:00:00Z",
}
NO_NODE = {"realkube.gpuautoscaler.dev/no-such-node": "true"}  # pods stay Pending: no GPU taken, no kwok work


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    with FaultProxy.for_control_plane(control_plane) as p:
        yield p


@pytest.fixture
def proxied_kubeconfig(proxy: FaultProxy, control_plane: ControlPlane, tmp_path: Path) -> Path:
    return proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig", control_plane.tokens["admin"], control_plane.ca_file)


@pytest.fixture
def api(proxied_kubeconfig: Path) -> Iterator[client.ApiClient]:
    """An ``ApiClient`` built the way the controller builds it, pointed at the proxy."""
    api_client = load_api_client("kubeconfig", proxied_kubeconfig)
    try:
        yield api_client
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def reader(api: client.ApiClient, **kw: Any) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(**kw), sleep=lambda s: None)


def writer(api: client.ApiClient, **kw: Any) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0", **kw), sleep=lambda s: None)


def pending_pod(name: str, **labels: str) -> dict[str, Any]:
    """A GPU pod (the reader keeps only those) that no node can take: it stays Pending."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": NO_NODE,
            "containers": [{"name": "c", "image": "pause", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def create_pods(cp: ControlPlane, ns: str, names: list[str]) -> None:
    for name in names:
        cp.request("POST", f"/api/v1/namespaces/{ns}/pods", pending_pod(name))


def create_deployment(cp: ControlPlane, ns: str, name: str = "chat", replicas: int = 0) -> None:
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"nodeSelector": NO_NODE, "containers": [{"name": "c", "image": "pause"}]},
            },
        },
    }
    cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)


def deployment(cp: ControlPlane, ns: str, name: str = "chat") -> dict[str, Any]:
    return dict(cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"))


def settled(cp: ControlPlane, ns: str, name: str = "chat") -> None:
    """Until the deployment controller has written the Deployment's status and stopped: a write held back by the
    proxy must meet the resourceVersion its precondition names, not one the controller bumped meanwhile."""

    def still() -> bool | None:
        before = deployment(cp, ns, name)
        if (before.get("status") or {}).get("observedGeneration") != before["metadata"]["generation"]:
            return None
        # 2 s without a write: the controller's status writes for a new Deployment come in quick succession, but on
        # a loaded machine two of them can be more than a second apart
        time.sleep(2.0)
        return deployment(cp, ns, name)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"] or None

    cp.wait(f"Deployment {ns}/{name} settled", still, timeout_s=60)


@contextlib.contextmanager
def crd(cp: ControlPlane, body: dict[str, Any]) -> Iterator[None]:
    """A CustomResourceDefinition for one test, Established, deleted afterwards.

    Created once a previous test's copy has finished terminating: created while it is, the 409 was swallowed and
    the CRD vanished under the test."""
    name = body["metadata"]["name"]
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"

    def not_terminating() -> bool | None:
        try:
            return not cp.get(path)["metadata"].get("deletionTimestamp") or None
        except ApiError as exc:
            return exc.status == 404 or None

    cp.wait(f"CRD {name} not terminating", not_terminating, timeout_s=60)
    with contextlib.suppress(ApiError):
        cp.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body)
    spec = body["spec"]
    version = spec["versions"][0]["name"]

    def established() -> bool | None:
        obj = cp.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}
        if conds.get("Established") != "True":
            return None
        cp.get(f"/apis/{spec['group']}/{version}/{spec['names']['plural']}")
        return True

    cp.wait(f"CRD {name} Established", established, timeout_s=30)
    try:
        yield
    finally:
        with contextlib.suppress(ApiError):
            cp.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")


# ---- the reader --------------------------------------------------------------------------------------------------


def test_expired_continue_token_restarts_the_list(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    names = [f"p{i:02d}" for i in range(10)]
    create_pods(control_plane, namespace, names)
    rule = proxy.inject("GET", r"^/api/v1/pods$", 410, query=r"continue=", reason="Expired", times=1)
    snap = reader(api, page_size=3).snapshot(NOW)
    mine = [p.name for p in snap.pods if p.namespace == namespace]
    assert sorted(mine) == names  # every pod once: no duplicates from the restart
    assert rule.hits == 1


def test_transient_errors_are_retried_persistent_ones_raise(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    create_pods(control_plane, namespace, [f"p{i}" for i in range(4)])

    def mine() -> int:
        return sum(1 for p in reader(api).snapshot(NOW).pods if p.namespace == namespace)

    proxy.inject("GET", r"^/api/v1/pods$", 500, times=2)  # 2 failures, then fine: within 2 retries
    assert mine() == 4
    proxy.inject("GET", r"^/api/v1/pods$", 429, retry_after=1, times=1)
    assert mine() == 4
    proxy.inject("GET", r"^/api/v1/nodes$", 500)
    before = proxy.count("GET", r"^/api/v1/nodes$")
    with pytest.raises(KubeApiError) as exc:
        reader(api).snapshot(NOW)
    assert exc.value.status == 500 and isinstance(exc.value, PortError)
    assert proxy.count("GET", r"^/api/v1/nodes$") - before == 3  # 1 + 2 retries, then give up
    proxy.clear()
    proxy.inject("GET", r"^/api/v1/pods$", 403, times=1)
    before = proxy.count("GET", r"^/api/v1/pods$")
    with pytest.raises(KubeApiError) as forbidden:  # 403 is not transient: no retry
        reader(api).snapshot(NOW)
    assert forbidden.value.status == 403 and proxy.count("GET", r"^/api/v1/pods$") - before == 1


def test_a_failure_mid_pagination_never_yields_a_partial_snapshot(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    create_pods(control_plane, namespace, [f"p{i:02d}" for i in range(10)])
    rule = proxy.inject("GET", r"^/api/v1/pods$", 500, query=r"continue=")
    with pytest.raises(PortError):
        reader(api, page_size=3).snapshot(NOW)
    assert rule.hits == 3  # the second page, tried three times; never a snapshot of the first page alone


def test_timeouts_are_bounded(proxy: FaultProxy, api: client.ApiClient) -> None:
    proxy.inject("GET", r"^/api/v1/nodes$", delay_s=6.0)
    with pytest.raises(KubeUnavailable):
        reader(api, request_timeout_s=1.0, read_retries=1).snapshot(NOW)
    gave_up = time.monotonic()
    # two attempts of 1 s (the read retry), not urllib3's default of four
    assert proxy.count("GET", r"^/api/v1/nodes$") == 2
    first = min(r.time for r in proxy.records if r.path == "/api/v1/nodes")
    # each attempt bounded by the request timeout: about 2 s after the first was received, with 1.5 s of room (TLS
    # handshakes, a loaded machine); waiting for an answer would take 6 s or more
    assert gave_up - first < 3.5, gave_up - first


def test_hpas_forbidden_is_not_an_error(proxy: FaultProxy, api: client.ApiClient) -> None:
    proxy.inject("GET", r"horizontalpodautoscalers", 403)
    assert reader(api).snapshot(NOW).hpas == ()


def test_workloads_forbidden_is_said_once(
    control_plane: ControlPlane,
    namespace: str,
    proxy: FaultProxy,
    api: client.ApiClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cp = control_plane
    with crd(cp, o.workload_crd()):
        body = o.workload("wl", namespace, pod_sets=[(1, 1)])
        cp.request("POST", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads", body)
        proxy.inject("GET", r"^/apis/batch/v1/jobs$", 403)
        r = reader(api)
        with caplog.at_level("WARNING"):
            first = r.snapshot(NOW)
            second = r.snapshot(NOW)
        assert [w.name for w in first.workloads if w.namespace == namespace] == ["wl"]
        assert [w.name for w in second.workloads if w.namespace == namespace] == ["wl"]
    warnings = [rec for rec in caplog.records if "jobs.batch" in rec.getMessage()]
    assert len(warnings) == 1 and "grant list" in warnings[0].getMessage()
    assert proxy.count("GET", r"^/apis/batch/v1/jobs$") == 2  # 403 is not retried


def test_a_workload_list_failure_fails_the_snapshot(proxy: FaultProxy, api: client.ApiClient) -> None:
    proxy.inject("GET", r"^/apis/batch/v1/jobs$", 500)
    with pytest.raises(KubeApiError):
        reader(api).snapshot(NOW)


# ---- the writer --------------------------------------------------------------------------------------------------

SCALE = r"/deployments/chat/scale$"


def test_persistent_conflict_is_bounded(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    create_deployment(control_plane, namespace)
    proxy.inject("PATCH", SCALE, 409, reason="Conflict")
    with pytest.raises(ConflictError):
        writer(api, conflict_retries=3).scale_deployment(namespace, "chat", 6)
    assert proxy.count("PATCH") == 4 and proxy.count("GET", SCALE) == 4  # a fresh read before each attempt
    assert deployment(control_plane, namespace)["spec"]["replicas"] == 0


def test_a_failed_write_is_not_retried_blindly(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    create_deployment(control_plane, namespace)
    proxy.inject("PATCH", SCALE, 500, times=1)
    with pytest.raises(KubeApiError) as exc:
        writer(api).scale_deployment(namespace, "chat", 6)
    assert exc.value.status == 500 and isinstance(exc.value, PortError)
    assert proxy.count("PATCH") == 1
    writer(api).scale_deployment(namespace, "chat", 6)  # the next tick re-applies the same absolute target
    assert deployment(control_plane, namespace)["spec"]["replicas"] == 6


def test_a_lost_response_never_doubles_the_action(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    cp = control_plane
    create_deployment(cp, namespace)
    settled(cp, namespace)
    # applied, but after the client gave up (1.5 s: well past the 0.3 s timeout even on a loaded machine, and short,
    # as a status write of the deployment controller meanwhile would fail the held write's precondition)
    proxy.inject("PATCH", SCALE, delay_s=1.5, times=1)
    w = writer(api, request_timeout_s=0.3)
    with pytest.raises(KubeUnavailable):
        w.scale_deployment(namespace, "chat", 6)
    cp.wait("the late write", lambda: deployment(cp, namespace)["spec"]["replicas"] == 6 or None, timeout_s=30)
    w.scale_deployment(namespace, "chat", 6)  # re-applied: a no-op, no second write
    assert proxy.count("PATCH", SCALE) == 1
    after = deployment(cp, namespace)
    # One spec change (0 -> 6): the generation, unlike the resourceVersion, ignores the controllers' status writes.
    assert after["spec"]["replicas"] == 6 and after["metadata"]["generation"] == 2, after["metadata"]


def test_throttled_eviction_is_blocked_and_500_is_an_error(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    create_pods(control_plane, namespace, ["p"])
    proxy.inject("POST", r"/eviction$", 429, retry_after=2, times=1)  # API priority and fairness
    assert writer(api).evict_pod(namespace, "p") is EvictionOutcome.BLOCKED
    proxy.inject("POST", r"/eviction$", 500, times=1)
    with pytest.raises(PortError):
        writer(api).evict_pod(namespace, "p")
    assert proxy.count("POST", r"/eviction$") == 2  # never retried by the writer
    assert writer(api).evict_pod(namespace, "p") is EvictionOutcome.EVICTED


def test_eviction_with_lost_response_then_retry_is_gone(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    cp = control_plane
    create_pods(cp, namespace, ["p"])
    proxy.inject("POST", r"/eviction$", delay_s=3.0, times=1)  # well past the 0.3 s timeout, even on a loaded machine
    w = writer(api, request_timeout_s=0.3)
    with pytest.raises(KubeUnavailable):
        w.evict_pod(namespace, "p")
    cp.wait("the late eviction", lambda: not cp.exists(f"/api/v1/namespaces/{namespace}/pods/p") or None, 30)
    assert w.evict_pod(namespace, "p") is EvictionOutcome.GONE


def test_persistent_conflict_on_resume_is_bounded(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "annotations": OURS},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": NO_NODE,
                    "containers": [{"name": "c", "image": "pause", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
                }
            },
        },
    }
    control_plane.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    proxy.inject("PATCH", r"/jobs/train$", 409, reason="Conflict")
    with pytest.raises(ConflictError):
        writer(api, conflict_retries=2).resume_workload("Job", namespace, "train")
    assert proxy.count("PATCH") == 3
    assert control_plane.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/train")["spec"]["suspend"] is True


# ---- the policy loader, the node pools, the Lease ----------------------------------------------------------------


def test_a_failing_status_write_does_not_hide_the_valid_policies(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    cp = control_plane
    install_crd(cp)
    path = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
    # "bad" is valid for the schema (which now refuses at admission every field the parser refuses) but not for the
    # controller: a second policy on chat's Deployment, the newcomer, gets InvalidSpec ("already scaled by ...")
    for name in ("chat", "bad"):
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "GPUScalingPolicy",
            "metadata": {"name": name},
            "spec": {"targetRef": {"name": "chat"}, "metric": {"type": "gpu_utilization", "target": 60}},
        }
        cp.request("POST", path, body)
        time.sleep(1.1)  # creationTimestamp has whole seconds: chat is the older one
    rule = proxy.inject("*", r"/status$", 500)
    policies = PolicyLoader(api, [namespace]).sync(writer(api), NOW)
    assert [p.name for p in policies.valid] == ["chat"] and [p.name for p in policies.invalid] == ["bad"]
    assert rule.hits >= 1  # the InvalidSpec condition's write failed
    assert "status" not in cp.get(f"{path}/bad")


def test_node_pool_conflicts_are_retried_then_bounded(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    cp = control_plane
    with crd(cp, o.machine_deployment_crd()):
        body = o.machine_deployment("b", namespace, replicas=1)
        status = body.pop("status")
        path = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{namespace}/machinedeployments"
        cp.request("POST", path, body)
        cp.request("PUT", f"{path}/b/status", {**cp.get(f"{path}/b"), "status": status})
        pools = MachineDeploymentNodePools(api, namespace, sleep=lambda s: None)
        proxy.inject("PATCH", r"/scale$", 409, reason="Conflict", times=1)
        pools.scale("b", 2)
        assert cp.get(f"{path}/b")["spec"]["replicas"] == 2
        proxy.inject("PATCH", r"/scale$", 409, reason="Conflict")
        with pytest.raises(ConflictError):
            MachineDeploymentNodePools(api, namespace, sleep=lambda s: None, conflict_retries=2).scale("b", 5)
        assert cp.get(f"{path}/b")["spec"]["replicas"] == 2


def test_a_burst_scale_down_marks_its_machine_and_takes_the_mark_back_on_a_failed_write(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    """The node the plan emptied is the one the MachineSet removes: its Machine carries the delete-machine annotation
    before the size falls. When the size write is refused (a 422 here), the mark is taken back: left behind, it would
    make the next scale-down by anyone remove that node, busy or not by then. When the write's answer is lost (a
    timeout), the write may land anyway: the mark stays, or the MachineSet would remove a node of its own choosing."""
    cp = control_plane
    group = "/apis/cluster.x-k8s.io/v1beta1/namespaces/" + namespace
    with crd(cp, o.machine_deployment_crd()), crd(cp, o.machine_crd()):
        body = o.machine_deployment("b", namespace, replicas=2)
        status = body.pop("status")
        cp.request("POST", f"{group}/machinedeployments", body)
        live = cp.get(f"{group}/machinedeployments/b")
        cp.request("PUT", f"{group}/machinedeployments/b/status", {**live, "status": status})
        for name, node in (("b-1", "burst-1"), ("b-2", "burst-2")):
            machine = o.machine(name, "b", node, namespace)
            machine_status = machine.pop("status")
            cp.request("POST", f"{group}/machines", machine)
            live = cp.get(f"{group}/machines/{name}")
            cp.request("PUT", f"{group}/machines/{name}/status", {**live, "status": machine_status})

        def annotations(name: str) -> dict[str, str]:
            return cp.get(f"{group}/machines/{name}")["metadata"].get("annotations") or {}

        pools = MachineDeploymentNodePools(api, namespace, sleep=lambda s: None)
        rule = proxy.inject("PATCH", r"/machinedeployments/b/scale$", 422, reason="Invalid")
        with pytest.raises(PortError):
            pools.scale("b", 1, expected=2, remove_node="burst-2")
        assert rule.hits >= 1
        assert cp.get(f"{group}/machinedeployments/b")["spec"]["replicas"] == 2
        assert DELETE_MACHINE_ANNOTATION not in annotations("b-2")
        assert proxy.count("PATCH", r"/machines/b-2$") == 2  # marked, then taken back
        proxy.clear()
        # held past the client's timeout, then forwarded: the write lands after the adapter gave up on it
        proxy.inject("PATCH", r"/machinedeployments/b/scale$", delay_s=3.0, times=1)
        slow = MachineDeploymentNodePools(api, namespace, sleep=lambda s: None, request_timeout_s=1.0)
        with pytest.raises(PortError):
            slow.scale("b", 1, expected=2, remove_node="burst-2")
        assert DELETE_MACHINE_ANNOTATION in annotations("b-2")  # the outcome is unknown: the mark stays
        cp.wait("the delayed size write", lambda: cp.get(f"{group}/machinedeployments/b")["spec"]["replicas"] == 1
                or None, timeout_s=30)  # fmt: skip
        assert DELETE_MACHINE_ANNOTATION in annotations("b-2") and DELETE_MACHINE_ANNOTATION not in annotations("b-1")


def test_api_server_error_on_the_lease_exits_1(proxy: FaultProxy, proxied_kubeconfig: Path) -> None:
    """``autoscaler run --once`` (its Lease in ``default``): a 500 on the Lease read is "could not reach", exit 1,
    never "another replica holds the Lease" (exit 3)."""
    proxy.inject("GET", rf"^/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE}$", 500)
    result = run_once(proxied_kubeconfig)
    assert result.returncode == 1, result.stderr
    assert "could not reach the Kubernetes API to take the Lease" in result.stderr, result.stderr
    assert "500" in result.stderr, result.stderr
    assert proxy.count("GET", r"/leases/") >= 1
