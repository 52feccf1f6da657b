"""The actuator over the real ``KubeClusterWriter`` against kube-apiserver: a write reports what it did.

An eviction of a pod already deleted (404) and one whose uid precondition names a pod re-created since under the
same name (kube-apiserver: 409 Conflict, reason Conflict, "the UID in the precondition (...) does not match the UID
in record (...)") are ``gone``, and no Event is written about that pod name -- before, both were ``applied`` with an
Event, and the one on the re-created pod's name was attached (by a uid looked up by name) to the new pod. A scale to
the replicas a Deployment already has, a suspension of a Job already suspended and a resumption of one running are
``unchanged``: nothing written (the resourceVersion does not move), no Event.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.adapters.kubernetes import KubeClusterWriter, WriterConfig
from autoscaler.core.model import EvictPod, ResumeWorkload, ScaleDeployment, SuspendWorkload
from autoscaler.core.reasons import Reason
from autoscaler.ports import EvictionOutcome, WriteOutcome
from tests.realkube import manifests
from tests.realkube.control_plane import ApiError, ControlPlane
from tests.realkube.manifests import gpu_pod_spec, running_ready

pytestmark = [pytest.mark.integration, pytest.mark.realkube]


def make_writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="realkube-test"))


def create_pod(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"gang": "g1"}},
            "spec": gpu_pod_spec(1, grace_s=0)}  # fmt: skip
    return dict(cp.request("POST", f"/api/v1/namespaces/{ns}/pods", body))


def delete_pod(cp: ControlPlane, ns: str, name: str) -> None:
    cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
    cp.wait(f"pod {name} deleted", lambda: not cp.exists(f"/api/v1/namespaces/{ns}/pods/{name}"), timeout_s=30)


def wait_running(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        pod = cp.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return dict(pod) if running_ready(pod) else None

    return cp.wait(f"pod {name} running", probe, timeout_s=60)


REPORTER = "gpuautoscaler.dev/controller"


def events_about(
    cp: ControlPlane, ns: str, name: str, *, selector: str = "involvedObject.name"
) -> list[dict[str, Any]]:
    """Our core/v1 Events whose involvedObject is ``name`` (``kubectl describe`` selects them by name and uid; the
    scheduler's and kwok's own Events about the pod are left out)."""
    params = {"fieldSelector": f"{selector}={name}"}
    items = cp.get(f"/api/v1/namespaces/{ns}/events", params=params)["items"]
    return [e for e in items if e.get("reportingComponent") == REPORTER]


def our_events(cp: ControlPlane, ns: str) -> list[dict[str, Any]]:
    items = cp.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reportingController") == REPORTER]


def context() -> GuardContext:
    return GuardContext(time.time(), {})


# ---- evictions --------------------------------------------------------------------------------------------------


def test_the_eviction_of_a_deleted_pod_is_gone_without_an_event(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    uid = create_pod(cp, ns, "w-0")["metadata"]["uid"]
    delete_pod(cp, ns, "w-0")
    assert make_writer(api_client).evict_pod(ns, "w-0", uid=uid) is EvictionOutcome.GONE  # 404
    (got,) = Actuator(make_writer(api_client)).apply(
        [EvictPod(ns, "w-0", Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", uid=uid)], context()
    )
    assert got.result == "gone", got
    assert events_about(cp, ns, "w-0") == [] and our_events(cp, ns) == []


def test_the_eviction_of_a_recreated_pod_is_gone_and_no_event_lands_on_the_new_pod(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    """A gang read at w-0 (uid A) and w-1; w-0 is deleted and created again under its name (uid B, a StatefulSet or
    JobSet successor) before the eviction. The uid precondition spares the new pod (the real apiserver's 409), the
    result is ``gone``, the rest of the gang is evicted, and no Event names w-0 -- so ``kubectl describe pod w-0``
    (Events selected by involvedObject name and uid B) does not say the autoscaler evicted it."""
    cp, ns = control_plane, namespace
    old = create_pod(cp, ns, "w-0")["metadata"]["uid"]
    w1 = create_pod(cp, ns, "w-1")["metadata"]["uid"]
    wait_running(cp, ns, "w-1")
    delete_pod(cp, ns, "w-0")
    new = create_pod(cp, ns, "w-0")["metadata"]["uid"]
    assert new != old
    wait_running(cp, ns, "w-0")

    # what the writer relies on, from kube-apiserver itself
    stale = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "w-0", "namespace": ns},
             "deleteOptions": {"preconditions": {"uid": old}, "dryRun": ["All"]}}  # fmt: skip
    with pytest.raises(ApiError) as err:
        cp.request("POST", f"/api/v1/namespaces/{ns}/pods/w-0/eviction", stale)
    assert (err.value.status, err.value.body["reason"]) == (409, "Conflict")
    assert "UID in the precondition" in err.value.body["message"]

    gang = "pod-group/g1"
    actions = [
        EvictPod(ns, "w-0", Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", gang=gang, uid=old),
        EvictPod(ns, "w-1", Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", gang=gang, uid=w1),
    ]
    results = Actuator(make_writer(api_client)).apply(actions, context())
    assert [r.result for r in results] == ["gone", "applied"], results

    pod = cp.get(f"/api/v1/namespaces/{ns}/pods/w-0")
    assert pod["metadata"]["uid"] == new and not pod["metadata"].get("deletionTimestamp")  # spared
    assert events_about(cp, ns, "w-0") == []  # none names the new pod (by name, let alone by its uid)
    assert events_about(cp, ns, new, selector="involvedObject.uid") == []  # nor by the new pod's uid
    (evicted,) = events_about(cp, ns, "w-1")
    assert evicted["involvedObject"]["uid"] == w1  # the evicted pod's own uid
    assert evicted["reason"] == "PreemptForInference"


# ---- already at target -------------------------------------------------------------------------------------------


def test_a_scale_to_the_replicas_the_deployment_has_is_unchanged(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/chat"
    cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
               manifests.deployment("chat", 2, gpu_pod_spec(1), labels={"app": "chat"}))  # fmt: skip
    generation = cp.get(path)["metadata"]["generation"]  # moves with every spec write (status updates do not)
    writer = make_writer(api_client)
    assert writer.scale_deployment(ns, "chat", 2, expected_replicas=1) is WriteOutcome.ALREADY
    # somebody else scaled it 1 -> 2 between the tick's read and our write of 2
    (got,) = Actuator(writer).apply([ScaleDeployment(ns, "chat", 2, 1, Reason.METRIC_ABOVE_TARGET, "up")], context())
    assert got.result == "unchanged", got
    assert cp.get(path)["metadata"]["generation"] == generation  # nothing written
    assert our_events(cp, ns) == []
    (done,) = Actuator(writer).apply([ScaleDeployment(ns, "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")], context())
    assert done.result == "applied" and cp.get(path)["spec"]["replicas"] == 3
    assert [e["regarding"]["name"] for e in our_events(cp, ns)] == ["chat"]
    cp.request("DELETE", path)
    assert writer.scale_deployment(ns, "chat", 4, expected_replicas=3) is WriteOutcome.GONE


def test_a_suspension_of_a_suspended_job_and_a_resumption_of_a_running_one_are_unchanged(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    held = manifests.job("held", 1, gpu_pod_spec(1))
    held["spec"]["suspend"] = True  # suspended by somebody else (a queue, a person)
    cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", held)
    cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", manifests.job("run", 1, gpu_pod_spec(1)))
    generation = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/held")["metadata"]["generation"]
    writer = make_writer(api_client)
    actions = [
        SuspendWorkload("Job", ns, "held", Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", service=f"{ns}/chat"),
        ResumeWorkload("Job", ns, "run", Reason.RESUME_TRAINING, "GPUs free again"),
        SuspendWorkload("Job", ns, "no-such-job", Reason.PREEMPT_FOR_INFERENCE, "for ml/chat"),
    ]
    results = Actuator(writer).apply(actions, context())
    assert [r.result for r in results] == ["unchanged", "unchanged", "gone"], results
    job = cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/held")
    assert job["metadata"]["generation"] == generation and job["spec"]["suspend"] is True  # not written
    assert not (job["metadata"].get("annotations") or {})  # not marked as ours either
    assert our_events(cp, ns) == []
    # and the same writer does report the change it makes
    (done,) = Actuator(writer).apply(
        [SuspendWorkload("Job", ns, "run", Reason.PREEMPT_FOR_INFERENCE, "for ml/chat")], context()
    )
    assert done.result == "applied" and cp.get(f"/apis/batch/v1/namespaces/{ns}/jobs/run")["spec"]["suspend"] is True
    assert [e["regarding"]["name"] for e in our_events(cp, ns)] == ["run"]
