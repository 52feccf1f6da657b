"""Stopping a training gang for inference against a real control plane (issue 12): the actuator's all-or-nothing
gang eviction (a dry-run Eviction of every pod first, then the real ones) with a PodDisruptionBudget that blocks
one pod, the same with a budget that allows it, and a Job suspended through ``SuspendWorkload``.

Nothing is half done: the gang is either fully stopped or left running, and the results say which. The budgets
are computed by the real disruption controller and enforced by kube-apiserver's eviction handler; the Job's pods
are deleted by the real Job controller; pods run on kwok GPU nodes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import ActionResult, Actuator, GuardContext
from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter, WriterConfig
from autoscaler.core.model import EvictPod, SuspendWorkload
from autoscaler.core.reasons import Reason
from tests.realkube import manifests
from tests.realkube.control_plane import ControlPlane
from tests.realkube.manifests import gpu_pod_spec, running_ready

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

GANG_LABEL = "training.kubeflow.org/job-name"  # the reader's kubeflow gang source: gang "kubeflow/<ns>/<value>"
GUARDED_LABEL = "realkube.gpuautoscaler.dev/guarded"
REPORTING_CONTROLLER = "gpuautoscaler.dev/controller"


# ---- objects -----------------------------------------------------------------------------------------------------


def gang_pod(name: str, gang: str, guarded: bool = False) -> dict[str, Any]:
    labels = {GANG_LABEL: gang, "gang": gang}
    if guarded:
        labels[GUARDED_LABEL] = "true"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": gpu_pod_spec()}


def job(name: str, parallelism: int) -> dict[str, Any]:
    return manifests.job(name, parallelism, gpu_pod_spec(), indexed=True)


def service_deployment(name: str) -> dict[str, Any]:
    """The inference service's Deployment, scaled to 0: an object for its Events, no GPUs taken."""
    return manifests.deployment(name, 0, gpu_pod_spec(), labels={"app": name})


# ---- helpers -----------------------------------------------------------------------------------------------------


def wait_running(cp: ControlPlane, ns: str, selector: str, count: int, timeout_s: float = 60) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        pods = cp.pods(ns, selector)
        running = [p for p in pods if running_ready(p)]
        return running if len(running) == count == len(pods) else None

    return cp.wait(f"{count} Running+Ready pods {selector} in {ns}", probe, timeout_s=timeout_s)


def gone_or_terminating(cp: ControlPlane, ns: str, name: str) -> bool:
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    return not cp.exists(path) or bool(cp.get(path)["metadata"].get("deletionTimestamp"))


def create_pdb(cp: ControlPlane, ns: str, name: str, min_available: int, expected: int) -> dict[str, Any]:
    """A policy/v1 PDB over the guarded pod; returns it once the disruption controller has computed its status."""
    path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    cp.request(
        "POST",
        path,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {GUARDED_LABEL: "true"}}},
        },
    )
    allowed = max(0, expected - min_available)

    def probe() -> dict[str, Any] | None:
        pdb = cp.get(f"{path}/{name}")
        st = pdb.get("status") or {}
        fresh = st.get("observedGeneration") == pdb["metadata"]["generation"]
        done = st.get("expectedPods") == expected and st.get("disruptionsAllowed") == allowed
        return pdb if fresh and done else None

    return cp.wait(f"PDB {name} disruptionsAllowed={allowed} (disruption controller)", probe, timeout_s=60)


def start_gang(cp: ControlPlane, api: client.ApiClient, ns: str, gang: str) -> tuple[str, list[str]]:
    """Three pods of one gang, the last one guarded (so the dry runs of the other two pass before the refusal);
    returns the gang id the reader gives them and the pod names in eviction order."""
    names = [f"{gang}-worker-{i}" for i in range(3)]
    for i, name in enumerate(names):
        cp.request("POST", f"/api/v1/namespaces/{ns}/pods", gang_pod(name, gang, guarded=i == 2))
    wait_running(cp, ns, f"gang={gang}", 3)
    mine = [p for p in KubeClusterReader(api, sleep=lambda s: None).snapshot(time.time()).pods if p.namespace == ns]
    assert sorted(p.name for p in mine) == names
    gang_ids = {p.gang for p in mine}
    assert gang_ids == {f"kubeflow/{ns}/{gang}"}, gang_ids
    return gang_ids.pop() or "", names


def our_events(cp: ControlPlane, ns: str) -> list[dict[str, Any]]:
    events = cp.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in events if e.get("reportingController") == REPORTING_CONTROLLER]


def make_actuator(api: client.ApiClient) -> Actuator:
    return Actuator(KubeClusterWriter(api, WriterConfig(reporting_instance="realkube-test")))


def evictions(ns: str, names: list[str], gang: str) -> list[EvictPod]:
    return [EvictPod(ns, name, Reason.PREEMPT_FOR_INFERENCE, "test", gang=gang, service=f"{ns}/chat") for name in names]


def describe(results: list[ActionResult]) -> list[tuple[str, str]]:
    return [(r.result, r.message) for r in results]


# ---- a gang's evictions: whole or not at all ---------------------------------------------------------------------


def test_a_pdb_on_one_pod_leaves_the_whole_gang_running(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", service_deployment("chat"))
    gang, names = start_gang(cp, api_client, ns, "g1")
    pdb = create_pdb(cp, ns, "guard", min_available=1, expected=1)
    assert pdb["status"]["disruptionsAllowed"] == 0

    results = make_actuator(api_client).apply(evictions(ns, names, gang), GuardContext(time.time(), {}))

    assert [r.result for r in results] == ["blocked"] * 3, describe(results)
    for r in results:
        assert r.message.startswith(f"gang {gang} left running"), r.message
        assert "left running" in r.message and names[2] in r.message  # says which pod's budget refused
    # Nothing was evicted: the dry runs of the first two pods changed nothing, the real evictions never ran.
    for name in names:
        assert cp.exists(f"/api/v1/namespaces/{ns}/pods/{name}"), f"{name} was evicted"
        pod = cp.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        assert not pod["metadata"].get("deletionTimestamp"), name
        assert running_ready(pod), name
    after = cp.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/guard")["status"]
    assert not after.get("disruptedPods")  # no eviction was admitted against the budget
    # No Event claims an eviction that did not happen (neither on the pods nor on the service).
    assert not [e for e in our_events(cp, ns) if e.get("note", "").lower().startswith("evict")], our_events(cp, ns)


def test_a_gang_whose_budget_allows_it_is_evicted_whole(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    """A budget that allows exactly one disruption of the guarded pod: the dry run must not spend it, or the real
    eviction of that pod would be refused after the other two were evicted (a half-stopped gang)."""
    cp, ns = control_plane, namespace
    cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", service_deployment("chat"))
    gang, names = start_gang(cp, api_client, ns, "g1")
    create_pdb(cp, ns, "guard", min_available=0, expected=1)  # disruptionsAllowed 1

    results = make_actuator(api_client).apply(evictions(ns, names, gang), GuardContext(time.time(), {}))

    assert [r.result for r in results] == ["applied"] * 3, describe(results)
    for name in names:
        assert gone_or_terminating(cp, ns, name), name  # a real eviction marks the pod at once
    # The guarded pod's eviction spent the budget (the apiserver decremented it; the disruption controller, once the
    # pod is gone, recomputes 0 too): had the dry run spent it, the real eviction would have been refused.
    assert cp.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/guard")["status"]["disruptionsAllowed"] == 0
    cp.wait("the gang's pods deleted", lambda: cp.pods(ns, "gang=g1") == [], timeout_s=60)
    events = our_events(cp, ns)
    on_pods = {e["regarding"]["name"] for e in events if e["regarding"]["kind"] == "Pod"}
    assert on_pods == set(names), events
    on_service = [e for e in events if (e["regarding"]["kind"], e["regarding"]["name"]) == ("Deployment", "chat")]
    assert len(on_service) == 1, events  # once per gang, not once per pod
    assert on_service[0]["reason"] == "PreemptForInference"
    assert f"gang {gang}" in on_service[0]["note"]
    dep_uid = cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat")["metadata"]["uid"]
    assert on_service[0]["regarding"].get("uid") == dep_uid


# ---- a Job suspended through the actuator ------------------------------------------------------------------------


def test_suspend_workload_stops_a_job_and_tells_the_job_and_the_service(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", service_deployment("chat"))
    cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("train", parallelism=2))
    wait_running(cp, ns, "job=train", 2)

    action = SuspendWorkload("Job", ns, "train", Reason.PREEMPT_FOR_INFERENCE, "test", service=f"{ns}/chat")
    results = make_actuator(api_client).apply([action], GuardContext(time.time(), {}))

    assert [r.result for r in results] == ["applied"], describe(results)
    job_obj = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/train")
    assert job_obj["spec"]["suspend"] is True
    cp.wait("the Job controller deleted the pods of the suspended Job", lambda: cp.pods(ns, "job=train") == [])

    events = our_events(cp, ns)
    on_job = [e for e in events if (e["regarding"]["kind"], e["regarding"]["name"]) == ("Job", "train")]
    assert [e["reason"] for e in on_job] == ["PreemptForInference"], events
    assert on_job[0]["type"] == "Normal"
    assert on_job[0]["regarding"].get("uid") == job_obj["metadata"]["uid"]
    assert on_job[0]["regarding"]["apiVersion"] == "batch/v1"
    on_service = [e for e in events if (e["regarding"]["kind"], e["regarding"]["name"]) == ("Deployment", "chat")]
    assert [e["reason"] for e in on_service] == ["PreemptForInference"], events
    assert f"job/{ns}/train" in on_service[0]["note"]
    dep_uid = cp.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat")["metadata"]["uid"]
    assert on_service[0]["regarding"].get("uid") == dep_uid
    # The same Events through the core/v1 view that `kubectl describe job` reads.
    core = cp.get(f"/api/v1/namespaces/{ns}/events")["items"]
    assert any(
        e["involvedObject"].get("uid") == job_obj["metadata"]["uid"] and e["reason"] == "PreemptForInference"
        for e in core
    )
