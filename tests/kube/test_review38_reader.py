"""Review 38 of the Kubernetes cluster reader (``adapters/kubernetes/reader.py``), tests first.

The tests saying "Fixed" were strict xfails on the reader as reviewed (WRONG: what it did, RIGHT: what Kubernetes
does or what a correct snapshot holds), all fixed in the same stop; the others pin right behaviour no earlier test
covered. Objects are shaped as a
real API server returns them; end-to-end cases go through the fake API server, the rest through the conversion.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes.reader import pod_tolerations
from autoscaler.core.cluster import ClusterSnapshot, cold_starts_by_service, free_gpus, waiting_gpu_work
from autoscaler.core.victims import TrainingRules, gangs_from_snapshot
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0  # 2027-01-15: every object below was created on 2026-01-01 (o.CREATED) unless it says so
GPU = "nvidia.com/gpu"


def _reader(api: client.ApiClient | None = None, **kw: Any) -> KubeClusterReader:
    return KubeClusterReader(api or client.ApiClient(), ReaderConfig(**kw), sleep=lambda s: None)


def _snapshot(api: client.ApiClient, **kw: Any) -> ClusterSnapshot:
    return _reader(api, **kw).snapshot(NOW)


def _iso(seconds: float) -> str:
    from autoscaler.adapters.kubernetes._api import format_time

    return format_time(seconds)


def _training_pod(name: str, checkpoint: str | None) -> dict[str, Any]:
    """A running 8-GPU pod of Job ``name`` (ready since 2026-01-01), with a checkpoint annotation when given."""
    pod = o.pod(
        f"{name}-abcde",
        "ml",
        gpus=8,
        node_name="gpu-0",
        labels={"batch.kubernetes.io/job-name": name, "job-name": name},
        annotations={"gpuautoscaler.dev/last-checkpoint": checkpoint} if checkpoint is not None else None,
        owner=("Job", name),
        priority=0,
    )
    pod["metadata"]["ownerReferences"][0]["apiVersion"] = "batch/v1"
    return pod


# ---- D1. a non-finite checkpoint annotation is read as a checkpoint: the job looks free to stop --------------------


@pytest.mark.parametrize("value", ["nan", "inf", "Infinity", "1e400"])
def test_a_non_finite_checkpoint_annotation_is_no_checkpoint(value: str) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``gpuautoscaler.dev/last-checkpoint: "nan"`` (or "inf", "1e400") is read by ``parse_time`` through
    ``float()`` as NaN / +inf; the victim ranking then computes ``max(0, now - since)`` = 0 lost GPU-seconds, so a
    run that never checkpointed (a typo'd or templated-but-empty annotation) is the cheapest gang to preempt.
    RIGHT: a value that is not a finite time is no checkpoint (``last_checkpoint_at`` None): the lost work counts
    from the run's start, as for a pod without the annotation."""
    info = _reader()._pod(_training_pod("train", value), {}, 0)
    assert info is not None and info.last_checkpoint_at is None


def test_a_checkpoint_in_the_future_is_no_checkpoint() -> None:
    """Fixed (was a strict xfail).

    WRONG: a job that publishes its checkpoint in epoch milliseconds (JavaScript ``Date.now()``, Java
    ``currentTimeMillis``: "1767225600000") is read as a checkpoint in the year 57970; the gang's lost work is 0 and
    it is taken before a gang that checkpointed a minute ago.
    RIGHT: a checkpoint later than the snapshot's time (beyond clock skew) is not a checkpoint the run has made: it
    is unknown, and the lost work counts from the start (8 GPUs x about a year here)."""
    snap = ClusterSnapshot(time=NOW, pods=(_reader()._pod(_training_pod("train", "1767225600000"), {}, 0),))  # type: ignore[arg-type]
    (gang,) = gangs_from_snapshot(snap, NOW, TrainingRules())
    assert gang.lost_work_gpu_s > 0


def test_a_go_rfc3339nano_checkpoint_is_read() -> None:
    """Pinned: a checkpoint written with Go's ``time.RFC3339Nano`` (nine fractional digits) or as Unix seconds is
    read (Python's ``fromisoformat`` would refuse nine digits before 3.11)."""
    nano = _reader()._pod(_training_pod("a", "2026-06-01T00:00:00.123456789Z"), {}, 0)
    secs = _reader()._pod(_training_pod("b", "1780272000"), {}, 0)
    assert nano is not None and nano.last_checkpoint_at == pytest.approx(1780272000.123456)
    assert secs is not None and secs.last_checkpoint_at == 1780272000.0


# ---- D2. a pod held by a scheduling gate is read as GPU work waiting for GPUs --------------------------------------


def test_a_pod_held_by_a_scheduling_gate_is_not_waiting_for_gpus(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail).

    WRONG: a Pending pod with ``spec.schedulingGates`` (an operator holding it until its dataset is staged: the
    scheduler does not even try it, PodScheduled False reason SchedulingGated) is read as an unbound GPU pod: it
    takes 8 GPUs off ``free_gpus`` and is ``waiting_gpu_work``, so the rebalancer evicts inference replicas and the
    arbitration holds scale-downs for work no freed GPU can start. Cluster Autoscaler and Karpenter act only on pods
    the scheduler marked Unschedulable, never on gated ones.
    RIGHT: an unbound gated pod is no GPU demand (dropped like an unbound terminating pod, or marked gated); the 8
    free GPUs stay free."""
    gated = o.pod("prep-0", "ml", gpus=8, phase="Pending", node_name=None, ready=False)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/dataset-staged"}]
    gated["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "Scheduling is blocked"}
    ]
    apiserver.seed(o.node("gpu-0"), gated)
    snap = _snapshot(api_client)
    assert waiting_gpu_work(snap) == [] and free_gpus(snap) == 8


def test_sanity_an_ungated_pending_pod_is_waiting_for_gpus(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Pinned (the counterpart of the test above): a pending 8-GPU pod the scheduler could not place is demand."""
    pending = o.pod("train-0", "ml", gpus=8, phase="Pending", node_name=None, ready=False)
    pending["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    apiserver.seed(o.node("gpu-0"), pending)
    snap = _snapshot(api_client)
    assert [w.gpus for w in waiting_gpu_work(snap)] == [8] and free_gpus(snap) == 0


# ---- D3. a replica's recovery after a container restart is read as its cold start ----------------------------------


def _replica(index: int, *, ready_time: str, restarts: int = 0) -> dict[str, Any]:
    pod = o.deployment_pod(
        "chat", index, "inference", gpus=1, scheduled_time="2026-01-01T00:00:10Z", ready_time=ready_time, priority=1000
    )
    pod["status"]["containerStatuses"] = [
        {"name": "main", "ready": True, "restartCount": restarts, "state": {"running": {"startedAt": ready_time}}}
    ]
    return pod


def test_a_replica_whose_container_restarted_gives_no_cold_start(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``ready_at`` is the Ready condition's ``lastTransitionTime``; a replica whose model server was
    OOM-killed three days after it started (restartCount 1) became Ready again then, and ``cold_starts_by_service``
    measures bind-to-ready as three days. With five replicas that one sample is the p95, and the predictive lead time
    (``lead_time_s``) looks three days ahead.
    RIGHT: a replica whose containers restarted reports no first-ready time (``ready_at`` None) or its real one;
    the cold starts are the four 80 s ones and the restarted replica's is not three days."""
    pods = [_replica(i, ready_time="2026-01-01T00:01:30Z") for i in range(4)]
    pods.append(_replica(4, ready_time="2026-01-04T00:00:00Z", restarts=1))
    apiserver.seed(o.node("gpu-0"), o.deployment("chat", "inference", replicas=5), *pods)
    starts = cold_starts_by_service(_snapshot(api_client))["inference/chat"]
    assert max(starts) < 600


def test_sanity_replicas_without_restarts_give_their_bind_to_ready(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Pinned: five replicas bound at 00:00:10 and ready at 00:01:30 give five 80 s cold starts."""
    pods = [_replica(i, ready_time="2026-01-01T00:01:30Z") for i in range(5)]
    apiserver.seed(o.node("gpu-0"), o.deployment("chat", "inference", replicas=5), *pods)
    assert cold_starts_by_service(_snapshot(api_client))["inference/chat"] == [80.0] * 5


# ---- D4. a node that went NotReady long after it started is read as booting capacity -------------------------------


def _not_ready_node(name: str, *, created: float, not_ready_since: float, gpus_reported: bool) -> dict[str, Any]:
    node = o.node(name, pool="burst", ready=False)
    node["metadata"]["creationTimestamp"] = _iso(created)
    node["status"]["conditions"][0].update(
        {
            "reason": "KubeletNotReady",
            "message": "container runtime is down",
            "lastTransitionTime": _iso(not_ready_since),
        }
    )
    if not gpus_reported:
        for key in ("capacity", "allocatable"):
            node["status"][key][GPU] = "0"
    return node


def test_a_node_that_went_not_ready_after_running_is_out_of_service(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail).

    WRONG: a burst node registered a year ago, its GPUs reported, whose kubelet now reports Ready=False (container
    runtime down, a driver crash) is ``leaving`` False and ``out_of_service`` False: the arbitration counts its 8 GPUs
    as capacity on its way for the whole provision limit, and buys nothing for the shortfall meanwhile.
    RIGHT: as Cluster Autoscaler's clusterstate judges it (a node is still starting only while its Ready condition
    changed within MaxNodeStartupTime, 15 min, of its creation), a node whose Ready turned False long after its
    registration, GPU capacity already reported, is broken: out of service, not booting. (A VM recreated under an
    old Node name is told apart: its kubelet zeroes the device-plugin capacity until the plugin registers again.)"""
    apiserver.seed(_not_ready_node("burst-0", created=NOW - 365 * 86400, not_ready_since=NOW - 60, gpus_reported=True))
    (node,) = _snapshot(api_client, gpu_pools=frozenset({"burst"})).nodes
    assert node.out_of_service and node.leaving and not node.ready


def test_sanity_a_new_or_recreated_not_ready_node_is_still_booting(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Pinned: a node registered two minutes ago and NotReady, and a VM recreated under an old Node name (Ready
    False since a minute, device-plugin capacity zeroed by its kubelet), are booting: neither leaving nor out of
    service."""
    apiserver.seed(
        _not_ready_node("new-0", created=NOW - 120, not_ready_since=NOW - 120, gpus_reported=False),
        _not_ready_node("reimaged-0", created=NOW - 365 * 86400, not_ready_since=NOW - 60, gpus_reported=False),
    )
    nodes = _snapshot(api_client, gpu_pools=frozenset({"burst"})).nodes
    assert [(n.name, n.ready, n.leaving, n.out_of_service) for n in nodes] == [
        ("new-0", False, False, False),
        ("reimaged-0", False, False, False),
    ]


# ---- D5. every pod (template) is said to tolerate the GPU resource's taint, GPUs requested or not ------------------


def test_only_pods_requesting_the_gpu_resource_tolerate_its_taint() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``pod_tolerations`` gives every pod and template ``nvidia.com/gpu:NoSchedule`` (Exists), also one that
    requests no ``nvidia.com/gpu`` -- a MIG-slice replica (kept since review 35), a CPU sidecar Deployment -- so the
    core takes it to fit a node tainted nvidia.com/gpu, where kube-scheduler's TaintToleration filter refuses it.
    RIGHT: the ExtendedResourceToleration admission plugin adds, for each extended resource a container or init
    container requests, a toleration keyed by that resource (Exists, NoSchedule): none for nvidia.com/gpu here, one
    for nvidia.com/mig-3g.40gb."""
    mig = {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}
    keys = {t.key for t in pod_tolerations(mig)}
    assert GPU not in keys and "nvidia.com/mig-3g.40gb" in keys


# ---- pinned right behaviour no earlier test covers ----------------------------------------------------------------


def test_an_admitted_spec_priority_wins_over_the_class_name_even_when_zero() -> None:
    """Pinned: ``spec.priority`` is what the Priority admission plugin resolved when the pod was created; it wins
    over a lookup of ``priorityClassName`` (here 0 against the class's 100, the class created or changed later)."""
    pod = o.pod("p", "ml", gpus=1, priority=0, priority_class="training")
    info = _reader()._pod(pod, {"training": 100}, 7)
    assert info is not None and info.priority == 0
    del pod["spec"]["priority"]  # not admitted yet (a template-like pod): the class, else the global default
    assert _reader()._pod(pod, {"training": 100}, 7).priority == 100  # type: ignore[union-attr]
    pod["spec"]["priorityClassName"] = "gone"
    assert _reader()._pod(pod, {"training": 100}, 7).priority == 7  # type: ignore[union-attr]


def test_plain_init_containers_take_the_max_and_sidecars_add_with_overhead() -> None:
    """Pinned (``resourcehelper.PodRequests``): plain init containers 4 and 2 -> max 4 against the app's 1+1;
    a sidecar of 1 started before them adds to both (init 4+1, app 2+1); the RuntimeClass overhead of 1 on top."""
    from autoscaler.adapters.kubernetes.reader import pod_gpus

    def c(n: int, **kw: Any) -> dict[str, Any]:
        return {"name": "c", "resources": {"limits": {GPU: str(n)}}, **kw}

    spec: dict[str, Any] = {"containers": [c(1), c(1)], "initContainers": [c(4), c(2)]}
    assert pod_gpus(spec, GPU) == 4
    spec["initContainers"] = [c(1, restartPolicy="Always"), c(4), c(2)]
    assert pod_gpus(spec, GPU) == 5
    spec["overhead"] = {GPU: "1"}
    assert pod_gpus(spec, GPU) == 6


def test_allocatable_not_capacity_counts_when_some_gpus_are_unhealthy() -> None:
    """Pinned: the device plugin withdrew 2 unhealthy GPUs of 8 (allocatable 6, capacity 8): 6 GPUs, still ready
    and in service (only a node with none left is out of service)."""
    node = o.node("gpu-0")
    node["status"]["allocatable"] = {**node["status"]["allocatable"], GPU: "6"}
    info = _reader()._node(node)
    assert info is not None and (info.allocatable_gpus, info.ready, info.leaving, info.out_of_service) == (
        6,
        True,
        False,
        False,
    )


def test_a_time_sliced_node_keeps_its_shared_product_and_its_replicated_count() -> None:
    """Pinned: under GPU time-slicing GFD labels the product ``<name>-SHARED`` and the device plugin advertises
    GPUs x replicas; both are read verbatim -- a pod's nodeSelector on the unshared name does not match the node in
    Kubernetes either, and 32 is what the scheduler places against."""
    node = o.node("ts-0", product=o.A100 + "-SHARED", labels={"nvidia.com/gpu.replicas": "4"})
    for key in ("capacity", "allocatable"):
        node["status"][key] = {**node["status"][key], GPU: "32"}
    info = _reader()._node(node)
    assert info is not None and (info.gpu_product, info.allocatable_gpus, info.ready) == (o.A100 + "-SHARED", 32, True)


def test_a_bare_replicaset_stays_a_serving_replicaset_not_a_gang() -> None:
    """Pinned: a pod of a ReplicaSet no Deployment made (no ``pod-template-hash``) keeps owner ReplicaSet (a serving
    kind, never preempted as training) and no owner gang; a Deployment's keeps resolving to the Deployment."""
    bare = o.pod("runner-x1", "ml", gpus=1, labels={"app": "runner"}, owner=("ReplicaSet", "runner-5f6d7"))
    info = _reader()._pod(bare, {}, 0)
    assert info is not None and (info.owner_kind, info.owner_name, info.gang) == ("ReplicaSet", "runner-5f6d7", None)
    dep = _reader()._pod(o.deployment_pod("chat", 0, "inference"), {}, 0)
    assert dep is not None and (dep.owner_kind, dep.owner_name, dep.gang) == ("Deployment", "chat", None)


def test_a_cronjobs_job_is_a_job_gang_and_a_suspendable_workload(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Pinned: a Job a CronJob made is a batch Job like any other: its pod's gang is ``job/<ns>/<job>`` and the Job
    is the workload suspended for it (the CronJob does not undo a Job's suspension)."""
    job = o.job("nightly-29000000", "ml", gpus=8, template_labels={"batch.kubernetes.io/job-name": "nightly-29000000"})
    job["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u-cj", "controller": True}
    ]
    pod = _training_pod("nightly-29000000", None)
    apiserver.seed(o.node("gpu-0"), job, pod)
    snap = _snapshot(api_client)
    (p,) = snap.pods
    (w,) = snap.workloads
    assert p.gang == w.gang == "job/ml/nightly-29000000" and (w.kind, w.pod_gpus, w.suspended) == ("Job", (8,), False)


def test_null_fields_everywhere_are_read_not_raised() -> None:
    """Pinned: ``null`` where the API omits a field (ownerReferences, conditions, resources, limits, overhead,
    taints, allocatable, PDB spec and status) reads as absent, never an exception that fails the whole snapshot."""
    r = _reader(include_non_gpu_nodes=True)
    gpu = {"containers": [{"name": "m", "resources": {"limits": {GPU: "1"}, "requests": None}}]}
    pod = {
        "metadata": {"name": "a", "namespace": "ml", "ownerReferences": None, "labels": None, "annotations": None},
        "spec": {**gpu, "initContainers": None, "overhead": None, "nodeSelector": None, "tolerations": None},
        "status": {"conditions": None, "phase": None},
    }
    info = r._pod(pod, {}, 0)
    assert info is not None and (info.gpus, info.phase, info.ready, info.owner_kind) == (1, "Unknown", False, None)
    node = r._node(
        {"metadata": {"name": "n", "labels": None}, "spec": {"taints": None}, "status": {"allocatable": None}}
    )
    assert node is not None and (node.allocatable_gpus, node.ready, node.taints) == (0, False, ())
    pdb = r._pdb({"metadata": {"name": "p", "namespace": "ml"}, "spec": None, "status": None})
    assert (pdb.selector, pdb.disruptions_allowed) == ({}, 0)
