"""KubeClusterWriter against the fake API server: idempotence, 409 on a fresh read, 429/404 evictions.

The injected faults (a persistent 409, a 500, a lost answer, 429/500 on an eviction) run against the real apiserver
through the fault proxy: tests/realkube/test_adapter_faults_real.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import (
    INVALID_SPEC,
    READY,
    ConditionUpdate,
    KubeClusterWriter,
    LastAction,
    StatusUpdate,
    UnsupportedWorkloadError,
    WriterConfig,
)
from autoscaler.core.model import ScaleDeployment
from autoscaler.core.reasons import Reason
from autoscaler.ports import ChangedSinceRead, EvictionOutcome, WriteNotAllowed, WriteOutcome
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def writer(api: client.ApiClient, **kw: Any) -> KubeClusterWriter:
    cfg = WriterConfig(reporting_instance="test-0", **kw)
    return KubeClusterWriter(api, cfg, clock=lambda: NOW, sleep=lambda s: None)


def rv(server: FakeApiServer, api_version: str, kind: str, name: str, ns: str = "default") -> str:
    obj = server.get(api_version, kind, name, ns)
    assert obj is not None
    return str(obj["metadata"]["resourceVersion"])


# ---- scale --------------------------------------------------------------------------------------------------------


def test_scale_is_idempotent(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.deployment("chat", "ml", replicas=2))
    w = writer(api_client)
    w.scale_deployment("ml", "chat", 5)
    after_first = rv(apiserver, "apps/v1", "Deployment", "chat", "ml")
    w.scale_deployment("ml", "chat", 5)
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == 5
    assert rv(apiserver, "apps/v1", "Deployment", "chat", "ml") == after_first  # the re-apply wrote nothing
    patches = [r for r in apiserver.requests if r.method == "PATCH"]
    assert len(patches) == 1
    assert patches[0].path == "/apis/apps/v1/namespaces/ml/deployments/chat/scale"
    assert patches[0].content_type == "application/merge-patch+json"
    assert patches[0].body["metadata"]["resourceVersion"]  # written with a precondition


def _race_once(w: KubeClusterWriter, attr: str, api: str, race: Callable[[], None]) -> None:
    """Make another client write right after the writer's first read (a genuine resourceVersion conflict)."""
    target = getattr(w, api)
    original = getattr(target, attr)
    calls = {"n": 0}

    def read(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            race()
        return result

    setattr(target, attr, read)


def _set_replicas(apiserver: FakeApiServer, replicas: int) -> Callable[[], None]:
    def someone_else_scales() -> None:  # kubectl scale, another controller
        dep = apiserver.get("apps/v1", "Deployment", "chat", "ml")
        dep["spec"]["replicas"] = replicas
        apiserver.update_object(dep)

    return someone_else_scales


def test_scale_conflict_on_an_unrelated_change_is_retried_on_a_fresh_read(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A 409 caused by a change that left the replicas as the tick saw them (a label, the Deployment's status during
    a rollout) is retried on a fresh read and written."""
    apiserver.seed(o.deployment("chat", "ml", replicas=2))
    w = writer(api_client)

    def someone_labels_the_deployment() -> None:
        dep = apiserver.get("apps/v1", "Deployment", "chat", "ml")
        dep["metadata"].setdefault("labels", {})["touched"] = "yes"
        apiserver.update_object(dep)

    _race_once(w, "read_namespaced_deployment_scale", "_apps", someone_labels_the_deployment)
    w.scale_deployment("ml", "chat", 6, expected_replicas=2)
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == 6
    statuses = [r.status for r in apiserver.requests if r.method == "PATCH"]
    assert statuses == [409, 200]
    assert apiserver.request_count("GET", r"/scale$") == 2


def test_scale_conflict_on_a_replica_change_is_not_written(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The decision 2 -> 6 was made from 2; somebody scaled to 3 before our PATCH: the 409's fresh read shows 3, and
    nothing is written (the next tick decides from 3), where the old writer wrote 6 over it."""
    apiserver.seed(o.deployment("chat", "ml", replicas=2))
    w = writer(api_client)
    _race_once(w, "read_namespaced_deployment_scale", "_apps", _set_replicas(apiserver, 3))
    with pytest.raises(ChangedSinceRead, match="changed from 2 to 3 replicas since the tick read it"):
        w.scale_deployment("ml", "chat", 6, expected_replicas=2)
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == 3
    assert [r.status for r in apiserver.requests if r.method == "PATCH"] == [409]
    assert apiserver.request_count("GET", r"/scale$") == 2


# (tick saw, decided, somebody else scaled to between our read and our PATCH)
RACES = [
    pytest.param(4, 5, 10, id="scale-up raced by a higher value (old writer: 10 -> 5, a scale-down)"),
    pytest.param(4, 5, 2, id="scale-up raced by a lower value"),
    pytest.param(6, 3, 10, id="scale-down raced by a higher value (old writer: 10 -> 3)"),
    pytest.param(6, 3, 1, id="scale-down raced by a lower value (old writer: 1 -> 3, a scale-up)"),
]


@pytest.mark.parametrize(("seen", "target", "raced"), RACES)
def test_a_scale_raced_between_read_and_write_never_writes_over_the_other_writer(
    apiserver: FakeApiServer, api_client: client.ApiClient, seen: int, target: int, raced: int
) -> None:
    apiserver.seed(o.deployment("chat", "ml", replicas=seen))
    w = writer(api_client)
    _race_once(w, "read_namespaced_deployment_scale", "_apps", _set_replicas(apiserver, raced))
    with pytest.raises(ChangedSinceRead, match=f"changed from {seen} to {raced} replicas"):
        w.scale_deployment("ml", "chat", target, expected_replicas=seen)
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == raced
    assert [r.status for r in apiserver.requests if r.method == "PATCH"] == [409]  # the raced one only


@pytest.mark.parametrize(("seen", "target", "raced"), RACES)
def test_a_scale_changed_before_the_writers_read_sends_no_patch(
    apiserver: FakeApiServer, api_client: client.ApiClient, seen: int, target: int, raced: int
) -> None:
    apiserver.seed(o.deployment("chat", "ml", replicas=raced))  # changed between the tick's read and the writer's
    with pytest.raises(ChangedSinceRead):
        writer(api_client).scale_deployment("ml", "chat", target, expected_replicas=seen)
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == raced
    assert apiserver.request_count("PATCH") == 0


@pytest.mark.parametrize("omitted", [False, True], ids=["replicas: 0", "replicas omitted"])
def test_scale_from_zero_with_the_expected_replicas(
    apiserver: FakeApiServer, api_client: client.ApiClient, omitted: bool
) -> None:
    """autoscaling/v1 ``ScaleSpec.replicas`` is ``omitempty``: the real API server sends no field for 0 replicas, which
    must read as 0 (not as "changed since the tick read 0", which would keep a scaled-to-zero service there)."""
    apiserver.seed(o.deployment("chat", "ml", replicas=0))
    w = writer(api_client)
    if omitted:
        read = w._read

        def read_without_zero(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            scale = read(what, fn, *args, **kwargs)
            if scale.get("spec", {}).get("replicas") == 0:
                del scale["spec"]["replicas"]
            return scale

        w._read = read_without_zero  # type: ignore[method-assign]
    w.scale_deployment("ml", "chat", 1, expected_replicas=0)
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == 1


# ---- the write guard (leadership checked immediately before every request that changes something) -----------------


class Guard:
    """A ``can_write`` that says yes ``allowed`` times, then no; counts the questions."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked <= self.allowed


def writes(apiserver: FakeApiServer) -> list[tuple[str, str, int]]:
    return [(r.method, r.path, r.status) for r in apiserver.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")]


def test_scale_guard_refusing_between_the_read_and_the_write_sends_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The lease was lost while the writer read (its read retries can outlast the lease): no PATCH."""
    apiserver.seed(o.deployment("chat", "ml", replicas=2))
    w = writer(api_client)
    lost = {"value": False}

    def lose_the_lease() -> None:
        lost["value"] = True

    _race_once(w, "read_namespaced_deployment_scale", "_apps", lose_the_lease)
    with pytest.raises(WriteNotAllowed, match="not the leader any more"):
        w.scale_deployment("ml", "chat", 6, expected_replicas=2, can_write=lambda: not lost["value"])
    assert apiserver.request_count("GET", r"/scale$") == 1
    assert writes(apiserver) == []
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == 2


def test_scale_guard_is_asked_again_before_the_write_after_a_conflict(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.deployment("chat", "ml", replicas=2))
    w = writer(api_client)

    def someone_labels_the_deployment() -> None:
        dep = apiserver.get("apps/v1", "Deployment", "chat", "ml")
        dep["metadata"].setdefault("labels", {})["touched"] = "yes"
        apiserver.update_object(dep)

    _race_once(w, "read_namespaced_deployment_scale", "_apps", someone_labels_the_deployment)
    guard = Guard(allowed=1)  # yes for the first PATCH (409), no for the retry
    with pytest.raises(WriteNotAllowed):
        w.scale_deployment("ml", "chat", 6, expected_replicas=2, can_write=guard)
    assert guard.asked == 2
    assert [r.status for r in apiserver.requests if r.method == "PATCH"] == [409]
    assert apiserver.get("apps/v1", "Deployment", "chat", "ml")["spec"]["replicas"] == 2


def test_every_write_asks_the_guard_and_sends_nothing_when_refused(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        o.pod("p", "ml"), o.job("train", "ml", suspend=False, gpus=1), o.policy_crd(), o.gpu_policy("chat", "ml")
    )
    w = writer(api_client)
    no = Guard(allowed=0)
    for write in (
        lambda: w.evict_pod("ml", "p", can_write=no),
        lambda: w.evict_pod("ml", "p", dry_run=True, can_write=no),
        lambda: w.suspend_workload("Job", "ml", "train", can_write=no),
        lambda: w.emit_event("Pod", "ml", "p", "PreemptForInference", "x", can_write=no),
        lambda: w.update_policy_status("ml", "chat", StatusUpdate(current_replicas=3), can_write=no),
    ):
        with pytest.raises(WriteNotAllowed):
            write()
    assert no.asked == 5
    assert writes(apiserver) == []
    assert apiserver.get("v1", "Pod", "p", "ml") is not None
    assert apiserver.get("batch/v1", "Job", "train", "ml")["spec"]["suspend"] is False
    # and with the guard saying yes, the same writes happen (resume: the suspended job)
    yes = Guard(allowed=100)
    w.suspend_workload("Job", "ml", "train", can_write=yes)
    w.resume_workload("Job", "ml", "train", can_write=yes)
    w.emit_event("Pod", "ml", "p", "PreemptForInference", "x", can_write=yes)
    w.emit_event("Pod", "ml", "p", "PreemptForInference", "x", can_write=yes)  # the bump: POST 409, then PATCH
    assert w.update_policy_status("ml", "chat", StatusUpdate(current_replicas=3), can_write=yes) is True
    assert w.evict_pod("ml", "p", can_write=yes) is EvictionOutcome.EVICTED
    # one question per request: suspend, resume, event POST, event POST (409 AlreadyExists) + bump PATCH, status PUT,
    # eviction POST
    assert len(writes(apiserver)) == yes.asked == 7


def test_scale_conflict_that_resolves_itself_writes_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.deployment("chat", "ml", replicas=2))
    w = writer(api_client)

    def someone_else_scales_to_the_same() -> None:
        dep = apiserver.get("apps/v1", "Deployment", "chat", "ml")
        dep["spec"]["replicas"] = 6
        apiserver.update_object(dep)

    _race_once(w, "read_namespaced_deployment_scale", "_apps", someone_else_scales_to_the_same)
    w.scale_deployment("ml", "chat", 6)
    assert [r.status for r in apiserver.requests if r.method == "PATCH"] == [409]  # fresh read: already 6


def test_scale_missing_deployment_is_gone(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    # 404: deleted since the tick read it; nothing to scale, nothing written, no error (``gone``)
    assert writer(api_client).scale_deployment("ml", "nope", 2) is WriteOutcome.GONE
    assert not [r for r in apiserver.requests if r.method == "PATCH"]


# ---- evictions ----------------------------------------------------------------------------------------------------


def test_eviction_outcomes(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        o.pod("free", "ml", labels={"app": "free"}),
        o.pod("guarded", "ml", labels={"app": "guarded"}),
        o.pdb("guarded", "ml", selector={"app": "guarded"}, disruptions_allowed=0, current=1),
    )
    w = writer(api_client)
    assert w.evict_pod("ml", "free") is EvictionOutcome.EVICTED
    assert w.evict_pod("ml", "free") is EvictionOutcome.GONE  # repeated: already gone, which is fine
    assert w.evict_pod("ml", "guarded") is EvictionOutcome.BLOCKED
    assert apiserver.get("v1", "Pod", "guarded", "ml") is not None
    post = next(r for r in apiserver.requests if r.method == "POST")
    assert post.path == "/api/v1/namespaces/ml/pods/free/eviction"
    assert post.body["apiVersion"] == "policy/v1" and post.body["kind"] == "Eviction"


def test_an_eviction_names_the_pod_the_plan_read_not_a_successor_of_the_same_name(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A worker with a fixed name (PyTorchJob ``-worker-0``) recreated between the read and the eviction: the uid
    precondition spares the new pod (409 from the API server: GONE, the one meant has gone)."""
    apiserver.seed(o.pod("train-worker-0", "ml"))
    read_uid = apiserver.get("v1", "Pod", "train-worker-0", "ml")["metadata"]["uid"]
    apiserver.delete_object("v1", "Pod", "train-worker-0", "ml")
    apiserver.seed(o.pod("train-worker-0", "ml"))  # its successor: same name, new uid
    w = writer(api_client)
    assert w.evict_pod("ml", "train-worker-0", uid=read_uid, dry_run=True) is EvictionOutcome.GONE
    assert w.evict_pod("ml", "train-worker-0", uid=read_uid) is EvictionOutcome.GONE
    assert apiserver.get("v1", "Pod", "train-worker-0", "ml") is not None  # the successor runs on
    post = [r for r in apiserver.requests if r.method == "POST"][-1]
    assert post.body["deleteOptions"]["preconditions"] == {"uid": read_uid}
    current = apiserver.get("v1", "Pod", "train-worker-0", "ml")["metadata"]["uid"]
    assert w.evict_pod("ml", "train-worker-0", uid=current) is EvictionOutcome.EVICTED  # the pod read: evicted


# ---- suspension ---------------------------------------------------------------------------------------------------


OURS = {
    "gpuautoscaler.dev/suspended-by": "gpu-autoscaler",
    "gpuautoscaler.dev/suspended-at": "2027-01-15T08:00:00Z",  # NOW, RFC 3339 UTC
}
WORKLOADS = (
    ("batch/v1", "Job", "train", ("spec", "suspend"), True),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", "llama", ("spec", "suspend"), True),
    ("kubeflow.org/v1", "PyTorchJob", "bert", ("spec", "runPolicy", "suspend"), True),
    ("kueue.x-k8s.io/v1beta1", "Workload", "job-bert-1", ("spec", "active"), False),
)


def _seed_workloads(apiserver: FakeApiServer) -> None:
    apiserver.seed(
        o.job("train", "ml", suspend=False, gpus=1),
        o.jobset_crd(),
        o.jobset("llama", "ml"),
        o.kubeflow_crds(),
        o.pytorchjob("bert", "ml"),
        o.workload_crd(),
        o.workload("job-bert-1", "ml"),
    )


def _field(obj: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def test_suspend_job_jobset_kubeflow_and_kueue_workload(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    _seed_workloads(apiserver)
    w = writer(api_client)
    for _, kind, name, _, _ in WORKLOADS:
        w.suspend_workload(kind, "ml", name)
    for api_version, kind, name, path, suspended in WORKLOADS:
        obj = apiserver.get(api_version, kind, name, "ml")
        assert _field(obj, path) is suspended, kind
        # marked as ours in the same write, with the generation that write produced (a later spec change = stale)
        annotations = obj["metadata"]["annotations"]
        assert annotations == {**OURS, "gpuautoscaler.dev/suspended-generation": str(obj["metadata"]["generation"])}
    patches = [r for r in apiserver.requests if r.method == "PATCH"]
    assert len(patches) == 4 and all(r.content_type == "application/merge-patch+json" for r in patches)
    assert all(r.body["metadata"]["resourceVersion"] for r in patches)  # written with a precondition
    assert patches[0].path == "/apis/batch/v1/namespaces/ml/jobs/train"
    w.suspend_workload("Job", "ml", "train")
    w.suspend_workload("JobSet", "ml", "llama")
    assert apiserver.request_count("PATCH") == 4  # idempotent
    w.suspend_workload("Job", "ml", "gone")  # a deleted workload uses no GPUs: done, not an error
    with pytest.raises(UnsupportedWorkloadError):
        w.suspend_workload("VolcanoJob", "ml", "x")


def test_a_workload_suspended_by_someone_else_is_not_marked_as_ours(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.job("queued", "ml", suspend=True, gpus=1))  # e.g. Kueue holds it until admitted
    writer(api_client).suspend_workload("Job", "ml", "queued")
    assert apiserver.request_count("PATCH") == 0
    assert "annotations" not in apiserver.get("batch/v1", "Job", "queued", "ml")["metadata"]


def test_resume_undoes_suspend(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    _seed_workloads(apiserver)
    w = writer(api_client)
    for _, kind, name, _, _ in WORKLOADS:
        w.suspend_workload(kind, "ml", name)
    apiserver.clear_requests()
    for _, kind, name, _, _ in WORKLOADS:
        w.resume_workload(kind, "ml", name)
    for api_version, kind, name, path, suspended in WORKLOADS:
        obj = apiserver.get(api_version, kind, name, "ml")
        assert _field(obj, path) is (not suspended), kind
        assert not obj["metadata"].get("annotations"), kind  # our marks are gone
    patches = [r for r in apiserver.requests if r.method == "PATCH"]
    assert len(patches) == 4
    assert patches[0].body == {
        "spec": {"suspend": False},
        "metadata": {
            "resourceVersion": patches[0].body["metadata"]["resourceVersion"],
            "annotations": {
                "gpuautoscaler.dev/suspended-by": None,  # merge patch: null removes the key
                "gpuautoscaler.dev/suspended-at": None,
                "gpuautoscaler.dev/suspended-generation": None,
            },
        },
    }
    assert patches[-1].body["spec"] == {"active": True}
    for _, kind, name, _, _ in WORKLOADS:
        w.resume_workload(kind, "ml", name)
    assert apiserver.request_count("PATCH") == 4  # idempotent: a running, unmarked workload is not written
    w.resume_workload("Job", "ml", "gone")  # 404: nothing to resume, not an error
    w.resume_workload("JobSet", "ml", "gone")
    assert [r.status for r in apiserver.requests if r.method == "GET"][-2:] == [404, 404]
    with pytest.raises(UnsupportedWorkloadError):
        w.resume_workload("VolcanoJob", "ml", "x")


def test_resume_keeps_other_annotations_and_clears_a_stale_mark(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    job = o.job("train", "ml", suspend=False, gpus=1, annotations={"team": "vision", **OURS})  # resumed by hand
    apiserver.seed(job)
    w = writer(api_client)
    w.resume_workload("Job", "ml", "train")
    obj = apiserver.get("batch/v1", "Job", "train", "ml")
    assert obj["metadata"]["annotations"] == {"team": "vision"} and obj["spec"]["suspend"] is False
    (patch,) = [r for r in apiserver.requests if r.method == "PATCH"]
    assert "spec" not in patch.body  # already running: only the stale mark is removed


def test_suspend_and_resume_conflicts_are_retried_on_a_fresh_read(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.job("train", "ml", suspend=False, gpus=1))
    w = writer(api_client)

    def someone_labels_the_job() -> None:
        job = apiserver.get("batch/v1", "Job", "train", "ml")
        job["metadata"].setdefault("labels", {})["touched"] = "yes"
        apiserver.update_object(job)

    _race_once(w, "read_namespaced_job", "_batch", someone_labels_the_job)
    w.suspend_workload("Job", "ml", "train")
    assert [r.status for r in apiserver.requests if r.method == "PATCH"] == [409, 200]
    job = apiserver.get("batch/v1", "Job", "train", "ml")
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"] == {"touched": "yes"}
    assert job["metadata"]["annotations"]["gpuautoscaler.dev/suspended-by"] == "gpu-autoscaler"

    apiserver.clear_requests()
    w = writer(api_client)
    _race_once(w, "read_namespaced_job", "_batch", someone_labels_the_job)
    w.resume_workload("Job", "ml", "train")
    assert [r.status for r in apiserver.requests if r.method == "PATCH"] == [409, 200]
    job = apiserver.get("batch/v1", "Job", "train", "ml")
    assert job["spec"]["suspend"] is False and not job["metadata"].get("annotations")


def test_resume_conflict_that_resolves_itself_writes_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.workload_crd(), o.workload("wl", "ml"))
    w = writer(api_client)
    w.suspend_workload("Workload", "ml", "wl")

    def someone_resumes_it() -> None:
        obj = apiserver.get("kueue.x-k8s.io/v1beta1", "Workload", "wl", "ml")
        obj["spec"]["active"] = True
        obj["metadata"]["annotations"] = {}
        apiserver.update_object(obj)

    apiserver.clear_requests()
    _race_once(w, "get_namespaced_custom_object", "_custom", someone_resumes_it)
    w.resume_workload("Workload", "ml", "wl")
    assert [r.status for r in apiserver.requests if r.method == "PATCH"] == [409]  # fresh read: already active


# ---- events -------------------------------------------------------------------------------------------------------


def test_event_on_the_object_with_its_uid_and_deduplicated(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.deployment("chat", "ml"), o.node("gpu-0"))
    w = writer(api_client)
    w.emit_event("Deployment", "ml", "chat", "MetricAboveTarget", "scaled 2 -> 4: utilisation 95% > 70%")
    w.emit_event("Deployment", "ml", "chat", "MetricAboveTarget", "scaled 2 -> 4: utilisation 95% > 70%")
    w.emit_event("Node", "", "gpu-0", "Rebalance", "drained for a gang", "Warning", action="Drain")
    events = apiserver.objects("events.k8s.io/v1", "Event")
    assert len(events) == 2
    dep_event = next(e for e in events if e["regarding"]["kind"] == "Deployment")
    uid = apiserver.get("apps/v1", "Deployment", "chat", "ml")["metadata"]["uid"]
    assert dep_event["regarding"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "chat",
        "namespace": "ml",
        "uid": uid,
    }
    assert dep_event["reason"] == "MetricAboveTarget" and dep_event["type"] == "Normal"
    assert dep_event["reportingController"] == "gpuautoscaler.dev/controller"
    assert dep_event["reportingInstance"] == "test-0"
    assert dep_event["series"]["count"] == 2
    node_event = next(e for e in events if e["regarding"]["kind"] == "Node")
    assert node_event["metadata"]["namespace"] == "default" and node_event["action"] == "Drain"
    assert "namespace" not in node_event["regarding"] and node_event["type"] == "Warning"


def test_long_notes_are_truncated_and_core_v1_events_work(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    w = writer(api_client, event_api="v1")
    w.emit_event("Pod", "ml", "gone-pod", "PreemptForInference", "é" * 2000)  # pod gone: event without uid
    w.emit_event("Pod", "ml", "gone-pod", "PreemptForInference", "é" * 2000)
    (event,) = apiserver.objects("v1", "Event")
    assert len(event["message"].encode()) <= 1024 and event["count"] == 2
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "gone-pod", "namespace": "ml"}


# ---- GPUScalingPolicy status ----------------------------------------------------------------------------------------


def test_policy_status_merge_idempotence_and_transitions(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.policy_crd(), o.gpu_policy("chat", "ml"))
    clock = {"now": NOW}
    w = KubeClusterWriter(api_client, WriterConfig(), clock=lambda: clock["now"], sleep=lambda s: None)
    action = ScaleDeployment("ml", "chat", 4, 2, Reason.METRIC_ABOVE_TARGET, "util 95% > 70%")
    update = StatusUpdate(
        current_replicas=2,
        desired_replicas=4,
        last_action=LastAction.from_action(action, NOW),
        conditions=(ConditionUpdate(READY, True, "Active", "scaling ml/chat"),),
    )
    assert w.update_policy_status("ml", "chat", update, generation=1) is True
    version = rv(apiserver, "gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml")
    clock["now"] = NOW + 60
    assert w.update_policy_status("ml", "chat", update, generation=1) is False  # same content: no write
    assert rv(apiserver, "gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml") == version
    status = apiserver.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml")["status"]
    assert status["currentReplicas"] == 2 and status["desiredReplicas"] == 4 and status["observedGeneration"] == 1
    assert status["lastAction"]["reason"] == "metric_above_target" and status["lastAction"]["toReplicas"] == 4
    assert status["lastScaleTime"] == "2027-01-15T08:00:00Z"
    ready = status["conditions"][0]
    assert ready["lastTransitionTime"] == "2027-01-15T08:00:00Z"
    # a message change keeps the transition time; a status flip moves it
    w.update_policy_status("ml", "chat", StatusUpdate(conditions=(ConditionUpdate(READY, True, "Active", "x"),)))
    cond = apiserver.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml")["status"]["conditions"][0]
    assert cond["message"] == "x" and cond["lastTransitionTime"] == "2027-01-15T08:00:00Z"
    w.update_policy_status(
        "ml",
        "chat",
        StatusUpdate(
            conditions=(
                ConditionUpdate(READY, False, "DeploymentNotFound", "gone"),
                ConditionUpdate(INVALID_SPEC, False, "Valid"),
            )
        ),
    )
    status = apiserver.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml")["status"]
    assert status["conditions"][0]["lastTransitionTime"] == "2027-01-15T08:01:00Z"
    assert [c["type"] for c in status["conditions"]] == [READY, INVALID_SPEC]
    assert status["currentReplicas"] == 2  # fields not in the update are kept
    puts = [r for r in apiserver.requests if r.method == "PUT"]
    assert all(r.path.endswith("/gpuscalingpolicies/chat/status") for r in puts) and len(puts) == 3


def test_policy_status_conflict_keeps_the_other_writers_fields(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.policy_crd(), o.gpu_policy("chat", "ml"))
    w = writer(api_client)

    def another_replica_writes_status() -> None:
        obj = apiserver.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml")
        obj["status"] = {"lastForecast": {"time": "2027-01-15T07:59:00Z", "horizonSeconds": 300, "quantile": 0.9}}
        apiserver.update_object(obj)

    _race_once(w, "get_namespaced_custom_object", "_custom", another_replica_writes_status)
    assert w.update_policy_status("ml", "chat", StatusUpdate(current_replicas=3)) is True
    status = apiserver.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml")["status"]
    assert status["currentReplicas"] == 3 and status["lastForecast"]["horizonSeconds"] == 300  # no lost write
    assert [r.status for r in apiserver.requests if r.method == "PUT"] == [409, 200]
