"""The Kubernetes writer says what each write did (``WriteOutcome`` / ``EvictionOutcome``), and the actuator over it
reports ``applied`` and writes an Event only for a change it made: a scale to the replicas the Deployment has, a
suspension of a Job already suspended, a resumption of one running are ``unchanged``; an eviction answered 404, or
refused by its uid precondition because a successor holds the pod's name, is ``gone`` and names no pod in an Event.
Against the fake API server (``tests/kube/fake_apiserver.py``); the same against kube-apiserver is in
``tests/realkube/test_actuator_outcomes_real.py``."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.adapters.kubernetes import KubeClusterWriter, WriterConfig
from autoscaler.adapters.kubernetes._api import ConflictError
from autoscaler.core.model import Action, EvictPod, ResumeWorkload, ScaleDeployment, SuspendWorkload
from autoscaler.core.reasons import Reason
from autoscaler.ports import ChangedSinceRead, EvictionOutcome, WriteOutcome
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
NS = "ml"
EVENTS = "events.k8s.io/v1"


def writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), clock=lambda: NOW, sleep=lambda s: None)


def uid_of(apiserver: FakeApiServer, api_version: str, kind: str, name: str) -> str:
    obj = apiserver.get(api_version, kind, name, NS)
    assert obj is not None
    return str(obj["metadata"]["uid"])


def events_on(apiserver: FakeApiServer, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in apiserver.objects(EVENTS, "Event", NS)
        if (e["regarding"]["kind"], e["regarding"]["name"]) == (kind, name)
    ]


# ---- the writer's outcomes ---------------------------------------------------------------------------------------


def test_scale_says_wrote_already_or_gone(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.deployment("chat", NS, replicas=2))
    w = writer(api_client)
    assert w.scale_deployment(NS, "chat", 3, expected_replicas=2) is WriteOutcome.WROTE
    assert w.scale_deployment(NS, "chat", 3, expected_replicas=2) is WriteOutcome.ALREADY  # somebody's, or ours
    assert w.scale_deployment(NS, "gone", 3, expected_replicas=2) is WriteOutcome.GONE
    assert len([r for r in apiserver.requests if r.method == "PATCH"]) == 1


def test_suspend_and_resume_say_wrote_already_or_gone(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.job("train", NS, suspend=False, gpus=1), o.job("queued", NS, suspend=True, gpus=1))
    w = writer(api_client)
    assert w.suspend_workload("Job", NS, "train") is WriteOutcome.WROTE
    assert w.suspend_workload("Job", NS, "train") is WriteOutcome.ALREADY
    assert w.suspend_workload("Job", NS, "queued") is WriteOutcome.ALREADY  # somebody else's: left unmarked
    assert w.suspend_workload("Job", NS, "nope") is WriteOutcome.GONE
    assert w.resume_workload("Job", NS, "train") is WriteOutcome.WROTE
    assert w.resume_workload("Job", NS, "train") is WriteOutcome.ALREADY
    assert w.resume_workload("Job", NS, "nope") is WriteOutcome.GONE
    with pytest.raises(ChangedSinceRead, match="not by this controller"):
        w.resume_workload("Job", NS, "queued")
    assert apiserver.get("batch/v1", "Job", "queued", NS)["spec"]["suspend"] is True  # type: ignore[index]


def test_a_resume_that_only_removes_a_stale_mark_is_already(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Running, with a mark of ours left on it (resumed by hand): the mark goes, but the resume changed nothing."""
    marks = {
        "gpuautoscaler.dev/suspended-by": "gpu-autoscaler",
        "gpuautoscaler.dev/suspended-at": "2026-01-01T00:00:00Z",
    }
    apiserver.seed(o.job("train", NS, suspend=False, gpus=1, annotations=marks))
    assert writer(api_client).resume_workload("Job", NS, "train") is WriteOutcome.ALREADY
    job = apiserver.get("batch/v1", "Job", "train", NS)
    assert job is not None and not (job["metadata"].get("annotations") or {}).keys() & marks.keys()


def test_an_eviction_tells_a_successor_from_another_conflict(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """409 on an eviction with a uid precondition: GONE only when the pod of that name is another one (or none)
    now. A 409 for the very pod meant is not a successor: an error, never reported as done."""
    apiserver.seed(o.pod("w-0", NS))
    uid = uid_of(apiserver, "v1", "Pod", "w-0")
    w = writer(api_client)
    real = w._core.create_namespaced_pod_eviction

    def conflict(*args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=409, reason="Conflict")

    w._core.create_namespaced_pod_eviction = conflict  # type: ignore[method-assign]
    with pytest.raises(ConflictError):
        w.evict_pod(NS, "w-0", uid=uid)
    w._core.create_namespaced_pod_eviction = real  # type: ignore[method-assign]
    apiserver.delete_object("v1", "Pod", "w-0", NS)
    assert w.evict_pod(NS, "w-0", uid=uid) is EvictionOutcome.GONE  # 404
    apiserver.seed(o.pod("w-0", NS))  # its successor
    assert w.evict_pod(NS, "w-0", uid=uid) is EvictionOutcome.GONE  # 409, and the pod read has another uid
    assert apiserver.get("v1", "Pod", "w-0", NS) is not None


def test_an_event_given_a_uid_carries_it_and_is_a_series_of_its_own(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.pod("w-0", NS))
    successor = uid_of(apiserver, "v1", "Pod", "w-0")
    w = writer(api_client)
    w.emit_event("Pod", NS, "w-0", "PreemptForInference", "evict pod w-0", uid="uid-of-the-evicted-pod")
    w.emit_event("Pod", NS, "w-0", "PreemptForInference", "evict pod w-0", uid=successor)
    assert sorted(e["regarding"]["uid"] for e in events_on(apiserver, "Pod", "w-0")) == sorted(
        ["uid-of-the-evicted-pod", successor]
    )


# ---- the actuator over the real writer: kind x {wrote, already, gone} ---------------------------------------------


SCALE = ScaleDeployment(NS, "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")
SUSPEND = SuspendWorkload("Job", NS, "train", Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", service=f"{NS}/chat")
RESUME = ResumeWorkload("Job", NS, "train", Reason.RESUME_TRAINING, "GPUs free again")


@pytest.mark.parametrize(
    ("objects", "action", "result", "events"),
    [
        ([o.deployment("chat", NS, replicas=2)], SCALE, "applied", [("Deployment", "chat")]),
        ([o.deployment("chat", NS, replicas=3)], SCALE, "unchanged", []),
        ([], SCALE, "gone", []),
        ([o.job("train", NS, suspend=False, gpus=1)], SUSPEND, "applied", [("Job", "train"), ("Deployment", "chat")]),
        ([o.job("train", NS, suspend=True, gpus=1)], SUSPEND, "unchanged", []),
        ([], SUSPEND, "gone", []),
        ([o.job("train", NS, suspend=False, gpus=1)], RESUME, "unchanged", []),
        ([o.job("train", NS, suspend=True, gpus=1)], RESUME, "skipped", []),  # not suspended by us
        ([], RESUME, "gone", []),
    ],
    ids=[
        "scale-wrote", "scale-already", "scale-gone", "suspend-wrote", "suspend-already", "suspend-gone",
        "resume-already", "resume-not-ours", "resume-gone",
    ],
)  # fmt: skip
def test_the_actuator_reports_what_the_writer_did(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    objects: list[dict[str, Any]],
    action: Action,
    result: str,
    events: list[tuple[str, str]],
) -> None:
    apiserver.seed(*objects)
    (got,) = Actuator(writer(api_client)).apply([action], GuardContext(NOW, {}))
    assert got.result == result, got
    written = [(e["regarding"]["kind"], e["regarding"]["name"]) for e in apiserver.objects(EVENTS, "Event", NS)]
    assert sorted(written) == sorted(events)


def test_a_resume_that_was_suspended_by_us_is_applied(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.job("train", NS, suspend=False, gpus=1))
    w = writer(api_client)
    assert w.suspend_workload("Job", NS, "train") is WriteOutcome.WROTE
    (got,) = Actuator(w).apply([RESUME], GuardContext(NOW, {}))
    assert got.result == "applied"
    assert [e["reason"] for e in events_on(apiserver, "Job", "train")] == ["ResumeTraining"]


def test_an_eviction_of_a_replaced_pod_is_gone_and_no_event_names_the_successor(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The pod the plan read was replaced by a successor of the same name (a StatefulSet/JobSet pod): the uid
    precondition spares it, the result is ``gone``, and no Event is written about that name -- before, an
    ``applied`` Event was written, looked up the name's uid (the successor's), and ``kubectl describe pod`` of the
    new pod said the autoscaler evicted it."""
    apiserver.seed(o.pod("w-0", NS), o.pod("w-1", NS))
    read = {n: uid_of(apiserver, "v1", "Pod", n) for n in ("w-0", "w-1")}
    apiserver.delete_object("v1", "Pod", "w-0", NS)
    apiserver.seed(o.pod("w-0", NS))
    successor = uid_of(apiserver, "v1", "Pod", "w-0")
    actions = [EvictPod(NS, n, Reason.PREEMPT_FOR_INFERENCE, "t", uid=read[n]) for n in ("w-0", "w-1")]
    results = Actuator(writer(api_client)).apply(actions, GuardContext(NOW, {}))
    assert [r.result for r in results] == ["gone", "applied"]
    assert uid_of(apiserver, "v1", "Pod", "w-0") == successor  # spared
    assert events_on(apiserver, "Pod", "w-0") == []
    (evicted,) = events_on(apiserver, "Pod", "w-1")
    assert evicted["regarding"]["uid"] == read["w-1"]  # the evicted pod's own uid, never a successor's


def test_an_eviction_of_a_pod_already_gone_writes_no_event(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    results = Actuator(writer(api_client)).apply(
        [EvictPod(NS, "w-0", Reason.REBALANCE, "move", uid="uid-w-0")], GuardContext(NOW, {})
    )
    assert [r.result for r in results] == ["gone"]
    assert apiserver.objects(EVENTS, "Event", NS) == []
