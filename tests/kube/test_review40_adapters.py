"""Review 40 of the Kubernetes reader and writer adapters (``adapters/kubernetes/reader.py``, ``writer.py``,
``workloads.py``, ``_api.py``), tests first, against the REST-faithful fake API server.

Defects found (each a strict xfail first, WRONG/RIGHT in its test's docstring; the tests saying "Fixed" pass now):

1. WRONG: Kueue Workloads are read and written at ``kueue.x-k8s.io/v1beta1`` only. Kueue serves v1beta2 since 0.15,
   stores it since 0.16 and stops serving v1beta1 in 0.20 (kubernetes-sigs/kueue#14558). There every Workload list
   is a 404, which the reader takes for "Kueue not installed" (a debug line). Three things follow. A Workload we
   deactivated before the upgrade is no longer seen, so it is never resumed. A running Job Kueue manages is offered
   as suspendable through its own ``spec.suspend``; Kueue starts it again at once (its Workload is still admitted),
   so each preemption kills the run's pods and frees nothing, tick after tick. And a deactivation or resume the
   writer sends answers 404, which it reports as ``GONE`` (goal met).
   RIGHT: read and write a Workload at the first version the API server serves: v1beta1 as before, else v1beta2. The
   fields read (``spec.active``, ``spec.podSets[].count/template``, ``spec.priority``) mean the same in both. The
   version that answered is asked first the next time. The reader asks v1beta2 after a 404 only when Kueue is known
   to be there: a version answered before, or something in the snapshot carries a ``kueue.x-k8s.io/`` label,
   annotation or scheduling gate (a Kueue Job's queue name). So a cluster without Kueue still pays one 404 a tick,
   not two. The limit: after a restart on Kueue >= 0.20, a Workload with no Kueue trace anywhere in the cluster (a
   deactivated RayJob's, nothing else queued) is found only once some Kueue object shows up.
2. WRONG: a Kueue Workload that Kueue holds no quota for (``QuotaReserved`` False: it waits in its ClusterQueue, or
   was evicted to be requeued) is read as running training when no listed kind stands for it. That covers
   RayJob, MPIJob, LeaderWorkerSet and plain pod groups, and a Job whose list is not readable. Its GPUs are missing
   from the waiting GPU work (``waiting_gpu_work``) that the arbitration gives capacity back to. A queued Kueue Job
   is counted there already, through its suspended owner.
   RIGHT: such a Workload is waiting in its queue: ``suspended`` and ``queued``, as a queued Job is. One Kueue has
   not looked at yet (no conditions) stays as before.

The right behaviour pinned besides: older Kueue (v1beta1 only) is still read and written, with the served version
asked first once known. Writes are never retried blindly: an eviction answered 429 (with or without Retry-After) is
``BLOCKED`` after one POST, an eviction under two budgets (500) raises and deletes nothing, and a suspension the API
server rejects (422) raises after one PATCH and leaves the object as it was. A suspension of a workload that exists
at no served version is ``GONE``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter, ReaderConfig, WriterConfig
from autoscaler.adapters.kubernetes._api import KubeApiError
from autoscaler.adapters.kubernetes.workloads import (
    SUSPENDED_AT_ANNOTATION,
    SUSPENDED_BY_ANNOTATION,
    SUSPENDED_BY_VALUE,
    SUSPENDED_GENERATION_ANNOTATION,
)
from autoscaler.core.cluster import waiting_gpu_work
from autoscaler.ports import EvictionOutcome, WriteOutcome
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
OURS = {
    SUSPENDED_BY_ANNOTATION: SUSPENDED_BY_VALUE,
    SUSPENDED_AT_ANNOTATION: "2026-06-01T00:00:00Z",
    SUSPENDED_GENERATION_ANNOTATION: "2",
}


def _reader(api: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None)


def _writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), clock=lambda: NOW, sleep=lambda s: None)


def _kueue_crd(*served: str) -> dict[str, Any]:
    """Kueue's Workload CRD serving ``served`` (v1beta2 stored when served): Kueue 0.20 serves v1beta2 only, Kueue
    0.14 v1beta1 only."""
    crd = o.workload_crd()
    version = crd["spec"]["versions"][0]
    crd["spec"]["versions"] = [
        dict(copy.deepcopy(version), name=name, served=name in served, storage=name == max(served))
        for name in ("v1beta1", "v1beta2")
    ]
    return crd


def _workload(name: str, version: str, **kw: Any) -> dict[str, Any]:
    obj = o.workload(name, "ml", **kw)
    obj["apiVersion"] = f"kueue.x-k8s.io/{version}"
    return obj


def _kueue_job(name: str, *, suspend: bool) -> dict[str, Any]:
    job = o.job(name, "ml", suspend=suspend, gpus=8)
    job["metadata"]["labels"] = {QUEUE_LABEL: "team-a"}
    return job


def _ours(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["annotations"] = dict(OURS)
    obj["metadata"]["generation"] = 2
    return obj


# ---- 1. Kueue Workloads at v1beta1 only: on Kueue >= 0.20 they vanish ------------------------------------------------


def _kueue_020_cluster(apiserver: FakeApiServer) -> None:
    apiserver.seed(
        _kueue_crd("v1beta2"),
        # admitted and running: Kueue would undo a suspension of the Job itself
        _kueue_job("train", suspend=False),
        _workload("job-train-ab12", "v1beta2", pod_sets=[(1, 8)], owner=("Job", "train")),
        # deactivated by us before the upgrade: Kueue suspended its Job
        _kueue_job("paused", suspend=True),
        _ours(_workload("job-paused-cd34", "v1beta2", pod_sets=[(1, 8)], active=False, owner=("Job", "paused"))),
    )


def test_workloads_of_a_kueue_that_serves_only_v1beta2_are_read(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail).

    WRONG: on Kueue 0.20 (v1beta1 not served) the Workload list is a 404, read as "Kueue not installed": the running
    Kueue Job ``train`` is offered as a Job to suspend through its spec (Kueue undoes it), and the Workload we
    deactivated is not in the snapshot, so it is never resumed.
    RIGHT: the Workloads are read at v1beta2; each stands for its Job, ours is suspended by us."""
    _kueue_020_cluster(apiserver)
    workloads = {(w.kind, w.name): w for w in _reader(api_client).snapshot(NOW).workloads}
    assert set(workloads) == {("Workload", "job-train-ab12"), ("Workload", "job-paused-cd34")}
    running = workloads["Workload", "job-train-ab12"]
    assert (running.gang, running.suspended) == ("job/ml/train", False)
    paused = workloads["Workload", "job-paused-cd34"]
    assert paused.gang == "job/ml/paused" and paused.suspended and paused.suspended_by_us_at is not None


def test_a_workload_of_a_kueue_that_serves_only_v1beta2_is_resumed_and_deactivated(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail).

    WRONG: the writer reads the Workload at v1beta1, gets 404 and reports ``GONE``: the resume of the Workload we
    deactivated (and any deactivation) is taken as done while nothing was written.
    RIGHT: read and patched at v1beta2: the resume is ``WROTE`` (active again, our marks removed), and so is a
    deactivation."""
    _kueue_020_cluster(apiserver)
    w = _writer(api_client)
    assert w.resume_workload("Workload", "ml", "job-paused-cd34") is WriteOutcome.WROTE
    resumed = apiserver.get("kueue.x-k8s.io/v1beta2", "Workload", "job-paused-cd34", "ml")
    assert resumed is not None and resumed["spec"]["active"] is True
    assert not set(OURS) & set(resumed["metadata"].get("annotations") or {})
    assert w.suspend_workload("Workload", "ml", "job-train-ab12") is WriteOutcome.WROTE
    deactivated = apiserver.get("kueue.x-k8s.io/v1beta2", "Workload", "job-train-ab12", "ml")
    assert deactivated is not None and deactivated["spec"]["active"] is False
    patches = [r.path for r in apiserver.requests if r.method == "PATCH"]
    assert patches and all("/kueue.x-k8s.io/v1beta2/" in p for p in patches)


def test_the_version_that_answered_is_asked_first_and_no_kueue_means_one_404(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Part of the fix of 1. Kueue 0.20: the first snapshot asks v1beta1 (404), then v1beta2 (a Kueue Job says Kueue
    is there); the next one asks v1beta2 only."""
    _kueue_020_cluster(apiserver)
    r = _reader(api_client)
    r.snapshot(NOW)
    paths = [(q.path, q.status) for q in apiserver.requests if q.path.endswith("/workloads")]
    assert paths == [("/apis/kueue.x-k8s.io/v1beta1/workloads", 404), ("/apis/kueue.x-k8s.io/v1beta2/workloads", 200)]
    apiserver.clear_requests()
    assert len(r.snapshot(NOW).workloads) == 2
    paths = [(q.path, q.status) for q in apiserver.requests if q.path.endswith("/workloads")]
    assert paths == [("/apis/kueue.x-k8s.io/v1beta2/workloads", 200)]


def test_a_gated_kueue_pod_group_on_kueue_020_is_found_and_queued(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Part of the fixes of 1 and 2. A plain pod group waiting for quota on Kueue 0.20: its pods (gated by Kueue, so
    not waiting work themselves) are the only Kueue trace, and its Workload is found at v1beta2 and counted as
    queued waiting work."""
    pods = []
    for i in range(2):
        pod = o.pod(f"group-{i}", "ml", gpus=4, node_name=None, phase="Pending", ready=False)
        pod["metadata"]["labels"] = {"kueue.x-k8s.io/pod-group-name": "group", QUEUE_LABEL: "team-a"}
        pod["metadata"]["annotations"] = {"kueue.x-k8s.io/pod-group-total-count": "2"}
        pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        pods.append(pod)
    apiserver.seed(_kueue_crd("v1beta2"), pods, _pending(_workload("group", "v1beta2", pod_sets=[(2, 4)], priority=5)))
    snapshot = _reader(api_client).snapshot(NOW)
    assert snapshot.pods == ()  # gated: the scheduler does not try them
    (group,) = snapshot.workloads
    assert (group.kind, group.gang, group.suspended, group.queued) == ("Workload", "kueue/ml/group", True, True)
    assert [(w.priority, w.gpus) for w in waiting_gpu_work(snapshot)] == [(5, 4)]


def test_without_kueue_the_workloads_are_asked_once(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.job("train", "ml", gpus=8), o.pod("train-abcde", "ml", gpus=8, labels={"job-name": "train"}))
    _reader(api_client).snapshot(NOW)
    paths = [(q.path, q.status) for q in apiserver.requests if q.path.endswith("/workloads")]
    assert paths == [("/apis/kueue.x-k8s.io/v1beta1/workloads", 404)]


def test_an_older_kueue_that_serves_only_v1beta1_is_still_read_and_written(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Kueue before 0.15 serves v1beta1 only: read and written there; once known, the served version is asked
    first (one request per list, not a 404 first every tick)."""
    apiserver.seed(
        _kueue_crd("v1beta1"),
        _ours(_workload("group", "v1beta1", pod_sets=[(2, 4)], active=False)),
    )
    r = _reader(api_client)
    (first,) = r.snapshot(NOW).workloads
    assert (first.kind, first.name, first.suspended) == ("Workload", "group", True)
    assert first.suspended_by_us_at is not None
    apiserver.clear_requests()
    assert r.snapshot(NOW).workloads == (first,)
    assert [q.path for q in apiserver.requests if "workloads" in q.path] == ["/apis/kueue.x-k8s.io/v1beta1/workloads"]
    w = _writer(api_client)
    assert w.resume_workload("Workload", "ml", "group") is WriteOutcome.WROTE
    live = apiserver.get("kueue.x-k8s.io/v1beta1", "Workload", "group", "ml")
    assert live is not None and live["spec"]["active"] is True


def test_a_workload_at_no_served_version_is_gone(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(_kueue_crd("v1beta2"))
    w = _writer(api_client)
    assert w.suspend_workload("Workload", "ml", "missing") is WriteOutcome.GONE
    assert w.resume_workload("Workload", "ml", "missing") is WriteOutcome.GONE
    assert apiserver.request_count("PATCH") == 0


# ---- 2. a Workload waiting for quota is read as running training -------------------------------------------------


def _pending(obj: dict[str, Any]) -> dict[str, Any]:
    """What Kueue writes on a Workload its ClusterQueue has no quota for yet."""
    obj["status"] = {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            }
        ]
    }
    return obj


def _rayjob_owned(obj: dict[str, Any], name: str) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": name, "uid": f"uid-{name}", "controller": True}
    ]
    return obj


def test_a_workload_waiting_for_quota_is_queued_waiting_work(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail).

    WRONG: the Workload of a RayJob that Kueue has not admitted (``QuotaReserved`` False, reason Pending) is read
    as running (``suspended`` False, ``queued`` False): its 4 x 8 GPUs are missing from the waiting GPU work.
    RIGHT: it is queued waiting work, as a queued Kueue Job is."""
    apiserver.seed(
        _kueue_crd("v1beta1"),
        _pending(_rayjob_owned(_workload("rayjob-llm-ab12", "v1beta1", pod_sets=[(4, 8)], priority=10), "llm")),
    )
    snapshot = _reader(api_client).snapshot(NOW)
    (queued,) = snapshot.workloads
    assert (queued.kind, queued.gang, queued.suspended, queued.queued) == (
        "Workload",
        "kueue/ml/rayjob-llm-ab12",
        True,
        True,
    )
    assert queued.suspended_by_us_at is None
    assert [(w.priority, w.gpus) for w in waiting_gpu_work(snapshot)] == [(10, 8)]


def test_an_admitted_or_not_yet_seen_workload_is_still_running(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """An admitted Workload (``Admitted`` True, ``status.admission`` set) runs; one Kueue has not looked at yet (no
    status) is read as before; neither is waiting work."""
    admitted = _rayjob_owned(_workload("rayjob-a", "v1beta1", pod_sets=[(1, 8)]), "a")
    admitted["status"] = {
        "admission": {"clusterQueue": "gpu", "podSetAssignments": [{"name": "ps0", "count": 1}]},
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
        ],
    }
    apiserver.seed(
        _kueue_crd("v1beta1"), admitted, _rayjob_owned(_workload("rayjob-b", "v1beta1", pod_sets=[(1, 8)]), "b")
    )
    snapshot = _reader(api_client).snapshot(NOW)
    assert {(w.name, w.suspended, w.queued) for w in snapshot.workloads} == {
        ("rayjob-a", False, False),
        ("rayjob-b", False, False),
    }
    assert waiting_gpu_work(snapshot) == []


# ---- pinned: writes are never retried blindly, and say what the API server answered ---------------------------------


@pytest.mark.parametrize("stale", [False, True], ids=["no-retry-after", "retry-after-10"])
def test_an_eviction_refused_by_a_budget_is_blocked_after_one_post(
    apiserver: FakeApiServer, api_client: client.ApiClient, stale: bool
) -> None:
    """429 with no Retry-After (``disruptionsAllowed`` 0) or with one (a budget not yet observed since its change:
    Retry-After 10): ``BLOCKED`` at once, one POST, no sleep, the pod still there."""
    budget = o.pdb("serve", "ml", selector={"app": "serve"}, disruptions_allowed=0 if not stale else 3, current=3)
    if stale:
        budget["metadata"]["generation"] = 2
    apiserver.seed(o.pod("serve-0", "ml", labels={"app": "serve"}), budget)
    slept: list[float] = []
    w = KubeClusterWriter(api_client, WriterConfig(reporting_instance="t"), clock=lambda: NOW, sleep=slept.append)
    assert w.evict_pod("ml", "serve-0") is EvictionOutcome.BLOCKED
    assert apiserver.request_count("POST") == 1 and slept == []
    assert apiserver.get("v1", "Pod", "serve-0", "ml") is not None


def test_an_eviction_under_two_budgets_raises_and_deletes_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        o.pod("serve-0", "ml", labels={"app": "serve", "tier": "gpu"}),
        o.pdb("by-app", "ml", selector={"app": "serve"}, disruptions_allowed=1, current=2),
        o.pdb("by-tier", "ml", selector={"tier": "gpu"}, disruptions_allowed=1, current=2),
    )
    with pytest.raises(KubeApiError) as exc:
        _writer(api_client).evict_pod("ml", "serve-0")
    assert exc.value.status == 500 and "more than one PodDisruptionBudget" in exc.value.message
    assert apiserver.request_count("POST") == 1
    assert apiserver.get("v1", "Pod", "serve-0", "ml") is not None


def test_a_suspension_the_api_server_rejects_raises_after_one_patch(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """422 (here a CRD schema whose ``spec.runPolicy.suspend`` is not a boolean): a ``KubeApiError`` after one
    PATCH, not ``GONE`` nor retried; the object is as it was."""
    crd = o.simple_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"runPolicy": {"type": "object", "properties": {"suspend": {"type": "string"}}}},
            }
        },
    }
    apiserver.seed(crd, o.pytorchjob("bert", "ml", workers=1, gpus=1))
    with pytest.raises(KubeApiError) as exc:
        _writer(api_client).suspend_workload("PyTorchJob", "ml", "bert")
    assert exc.value.status == 422
    assert apiserver.request_count("PATCH") == 1
    live = apiserver.get("kubeflow.org/v1", "PyTorchJob", "bert", "ml")
    assert live is not None and SUSPENDED_BY_ANNOTATION not in (live["metadata"].get("annotations") or {})
