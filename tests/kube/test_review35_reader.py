"""Review 35 of the Kubernetes cluster reader (``adapters/kubernetes/reader.py``): defects a platform engineer running
GPU clusters hits, each reproduced end to end -- objects as a real API server returns them, read through the fake
API server by ``KubeClusterReader``, then handed to the capacity arbitration (``core.arbitrate.arbitrate``) to show
the wrong preemption or the wrong burst purchase they lead to.

Each test failed on the code of stop 34 and passes with the fix: replicas on MIG slices are kept (0 GPUs), the
pressure and network condition taints of a Ready node bar it, a node whose kubelet is lost or whose GPUs are all
unhealthy is out of service (not booting), and a static pod is never a victim.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import (
    CapacityState,
    EvictPod,
    ScaleDecision,
    ScaleNodePool,
    ServicePolicy,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0  # 2027: every pod below was created on 2026-01-01, far past any minimum runtime
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-3g.40gb"
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
POOL = BurstPool("burst", 8, o.A100, boot_s=300.0, price_per_gpu_hour=0.5, nodes=1, min_nodes=0, max_nodes=4)


def _snapshot(api: client.ApiClient) -> ClusterSnapshot:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)


def _arbitrate(
    snapshot: ClusterSnapshot,
    current: int,
    desired: int,
    *,
    config: CapacityConfig | None = None,
    pool_nodes: dict[str, int] | None = None,
) -> list[Any]:
    reason = Reason.METRIC_ABOVE_TARGET if desired > current else Reason.WITHIN_TOLERANCE
    decision = ScaleDecision(CHAT.key, current, desired, reason, "")
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, [decision], {}, pool_nodes=pool_nodes)
    actions, _, _ = arbitrate(arb, CapacityState(), config or CapacityConfig())
    return list(actions)


def _stops(actions: list[Any]) -> list[Any]:
    return [a for a in actions if isinstance(a, (EvictPod, SuspendWorkload))]


def _burst_ups(actions: list[Any]) -> list[ScaleNodePool]:
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_UP]


def _training(node: str, gpus: int = 8) -> list[dict[str, Any]]:
    """A low-priority batch Job running one pod of ``gpus`` GPUs on ``node`` (the Job controller's labels)."""
    job = o.job("train", "ml", gpus=gpus)
    pod = o.pod(
        "train-abcde",
        "ml",
        gpus=gpus,
        node_name=node,
        labels={"batch.kubernetes.io/job-name": "train", "job-name": "train"},
        owner=("Job", "train"),
        priority=0,
    )
    pod["metadata"]["ownerReferences"][0]["apiVersion"] = "batch/v1"
    return [job, pod]


def _chat(replicas: int, node: str, *, resource: str = GPU) -> list[dict[str, Any]]:
    """The chat Deployment with ``replicas`` ready pods of one ``resource`` each on ``node``."""
    dep = o.deployment("chat", "inference", replicas=replicas)
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
    pods = []
    for i in range(replicas):
        pod = o.deployment_pod("chat", i, "inference", gpus=0, node_name=node, priority=1000)
        pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}, "requests": {resource: "1"}}
        pods.append(pod)
    return [dep, *pods]


# ---- 1. serving replicas on MIG slices are dropped: the arbitration sees them as missing --------------------------


def test_replicas_on_mig_slices_are_not_taken_for_missing_replicas(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    mig_node = o.node("mig-0")
    for key in ("capacity", "allocatable"):  # MIG "mixed" strategy: every GPU partitioned into 3g.40gb slices
        mig_node["status"][key][GPU] = "0"
        mig_node["status"][key][MIG] = "16"
    apiserver.seed(mig_node, o.node("gpu-0"), *_training("gpu-0"), *_chat(4, "mig-0", resource=MIG))
    snap = _snapshot(api_client)
    # chat runs its 4 replicas and wants 4: nothing is short, nothing may be stopped or bought
    actions = _arbitrate(snap, current=4, desired=4, config=CapacityConfig(pools=(POOL,)), pool_nodes={"burst": 0})
    assert _stops(actions) == [] and _burst_ups(actions) == []


# ---- 2. node-condition taints on a Ready node are dropped: the node looks like room -------------------------------


@pytest.mark.parametrize(
    ("condition", "taint"),
    [
        ("DiskPressure", "node.kubernetes.io/disk-pressure"),  # model images of 10-20 GB fill GPU nodes' disks
        ("NetworkUnavailable", "node.kubernetes.io/network-unavailable"),
        ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
        ("PIDPressure", "node.kubernetes.io/pid-pressure"),
    ],
)
def test_training_on_a_node_no_new_pod_may_land_on_is_not_preempted(
    apiserver: FakeApiServer, api_client: client.ApiClient, condition: str, taint: str
) -> None:
    sick = o.node("gpu-0")
    sick["status"]["conditions"].append({"type": condition, "status": "True", "reason": condition})
    sick["spec"]["taints"] = [{"key": taint, "effect": "NoSchedule", "timeAdded": o.CREATED}]
    apiserver.seed(sick, o.node("gpu-1"), *_training("gpu-0"), *_chat(8, "gpu-1"))
    snap = _snapshot(api_client)
    # chat fills gpu-1 and wants 2 more; stopping "train" frees gpu-0's GPUs, where no new pod is scheduled
    assert _stops(_arbitrate(snap, current=8, desired=10)) == []


def test_sanity_without_the_condition_the_training_is_preempted(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """What the fix must not change: a healthy node's training is preempted for the same shortfall."""
    apiserver.seed(o.node("gpu-0"), o.node("gpu-1"), *_training("gpu-0"), *_chat(8, "gpu-1"))
    snap = _snapshot(api_client)
    assert [type(a).__name__ for a in _stops(_arbitrate(snap, current=8, desired=10))] == ["SuspendWorkload"]


# ---- 3. a broken burst node is read like a booting one: it "covers" the shortfall for ever --------------------------


def _dead(node: dict[str, Any]) -> dict[str, Any]:
    """The kubelet stopped posting status (kernel panic, GPU Xid hang): what the node lifecycle controller writes."""
    message = "Kubelet stopped posting node status."
    unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": message}
    node["status"]["conditions"] = [unknown]
    node["spec"]["taints"] = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": o.CREATED},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": o.CREATED},
    ]
    return node


def _gpus_unhealthy(node: dict[str, Any]) -> dict[str, Any]:
    """Ready, but the device plugin marked every GPU unhealthy (Xid 79, fallen off the bus): allocatable 0."""
    node["status"]["allocatable"] = dict(node["status"]["allocatable"], **{GPU: "0"})
    return node


@pytest.mark.parametrize("broken", [_dead, _gpus_unhealthy], ids=["ready-unknown", "gpus-unhealthy"])
def test_a_broken_burst_node_is_not_capacity_on_its_way(
    apiserver: FakeApiServer, api_client: client.ApiClient, broken: Any
) -> None:
    apiserver.seed(
        o.node("n1", pool="onprem"),
        broken(o.node("burst-a", pool="burst")),
        *_chat(8, "n1"),
    )
    snap = _snapshot(api_client)
    # chat fills n1 and wants 12; the provider counts the one (broken) burst node: a second one must be bought
    actions = _arbitrate(snap, current=8, desired=12, config=CapacityConfig(pools=(POOL,)), pool_nodes={"burst": 1})
    assert [(a.nodes, a.previous_nodes) for a in _burst_ups(actions)] == [(2, 1)]


def test_sanity_a_booting_burst_node_still_covers_the_shortfall(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """What the fix must not change: a burst node that registered and is not Ready yet (its kubelet says so,
    the device plugin has not reported GPUs) is capacity on its way: nothing more is bought."""
    booting = o.node("burst-a", 0, pool="burst", ready=False)
    booting["status"]["conditions"][0]["reason"] = "KubeletNotReady"
    booting["status"]["allocatable"] = {k: v for k, v in booting["status"]["allocatable"].items() if k != GPU}
    booting["status"]["capacity"] = dict(booting["status"]["allocatable"])
    booting["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    apiserver.seed(o.node("n1", pool="onprem"), booting, *_chat(8, "n1"))
    snap = _snapshot(api_client)
    actions = _arbitrate(snap, current=8, desired=12, config=CapacityConfig(pools=(POOL,)), pool_nodes={"burst": 1})
    assert _burst_ups(actions) == []


# ---- 4. a static pod (owned by its Node) is taken for training that can be stopped --------------------------------


def test_a_static_pod_is_not_evicted_to_free_gpus(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    static = o.pod(
        "gpu-burnin-gpu-0",
        "kube-system",
        gpus=8,
        node_name="gpu-0",
        annotations={"kubernetes.io/config.mirror": "0f3c", "kubernetes.io/config.source": "file"},
        priority=0,
    )
    static["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "uid-gpu-0", "controller": True}
    ]
    apiserver.seed(o.node("gpu-0"), o.node("gpu-1"), static, *_chat(8, "gpu-1"))
    snap = _snapshot(api_client)
    assert _stops(_arbitrate(snap, current=8, desired=10)) == []
