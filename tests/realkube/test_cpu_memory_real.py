"""CPU and memory beside the GPUs against a real control plane: the reader's view of a node's CPU (its allocatable
less every bound pod's requests, a CPU-only pod included) steers the victim search away from a gang whose node the
replica could not use, and the real kube-scheduler agrees -- with that gang gone the replica stays Unschedulable
("Insufficient cpu"), with the gang the search chose gone it is bound.

Two kwok nodes of a GPU product no other test selects (8 GPUs, 16 CPUs, 64 Gi each). On node a: a CPU-only pod
requesting 12 CPUs and a 1-pod training gang (8 GPUs, 1 CPU) checkpointed a minute ago -- the cheaper one to stop. On
node b: a gang checkpointed an hour ago. The chat replica asks 1 GPU and 6 CPUs: a has 3 left with its gang gone."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader
from autoscaler.adapters.kubernetes._api import format_time
from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import CapacityState, EvictPod, ScaleDecision, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.victims import TrainingRules
from tests.realkube import manifests
from tests.realkube.control_plane import GPU_PRODUCT_LABEL, GPU_RESOURCE, ControlPlane, GpuNode

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

GANG_LABEL = "training.kubeflow.org/job-name"  # the reader's kubeflow gang source
PAUSE = "registry.k8s.io/pause:3.10"


def _pod(name: str, node: str, product: str, gpus: int, cpu: str, memory: str, labels: dict[str, str],
         annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "spec": {
            "nodeSelector": {GPU_PRODUCT_LABEL: product, "kubernetes.io/hostname": node},
            "containers": [{"name": "c", "image": PAUSE, "resources": resources}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _chat_spec(product: str) -> dict[str, Any]:
    return {
        "nodeSelector": {GPU_PRODUCT_LABEL: product},
        "containers": [{"name": "c", "image": PAUSE, "resources": {
            "requests": {"cpu": "6", "memory": "8Gi"}, "limits": {GPU_RESOURCE: "1"}}}],
        "terminationGracePeriodSeconds": 0,
    }  # fmt: skip


def _running_on(cp: ControlPlane, namespace: str, name: str) -> str | None:
    pod = cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    if pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"):
        return str(pod["spec"].get("nodeName") or "") or None
    return None


def _unschedulable_why(cp: ControlPlane, namespace: str, name: str) -> str | None:
    pod = cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "")
    return None


def _delete(cp: ControlPlane, namespace: str, name: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    cp.request("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    cp.wait(f"pod {name} gone", lambda: (not cp.exists(path)) or None, timeout_s=60)


@contextlib.contextmanager
def two_gpu_nodes(cp: ControlPlane, prefix: str, pools: tuple[str, str], **size: str) -> Iterator[tuple[str, str, str]]:
    """Two kwok nodes of a GPU product no other test selects (8 GPUs each, in ``pools``, ``size`` their cpu and
    memory): (product, node a, node b); deleted afterwards."""
    tag = secrets.token_hex(3)
    product = f"{prefix.upper()}-TEST-{tag}"
    names = (f"{prefix}-{tag}-a", f"{prefix}-{tag}-b")
    for name, pool in zip(names, pools, strict=True):
        cp.request("POST", "/api/v1/nodes", cp.node_manifest(GpuNode(name, 8, product, pool, **size)))
    try:
        cp.wait_nodes_schedulable(list(names), timeout_s=60)
        yield product, names[0], names[1]
    finally:
        for name in names:
            cp.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, str, str]]:
    with two_gpu_nodes(control_plane, "cpu", ("onprem", "onprem"), cpu="16", memory="64Gi") as made:
        yield made


def start_two_gangs(cp: ControlPlane, namespace: str, product: str, nodes: tuple[str, str], memory: str) -> float:
    """A 1-pod 8-GPU gang on each node: "fresh" on node a, checkpointed a minute ago (the cheaper one to stop), "old"
    on node b, an hour ago; both running. Returns the time their checkpoints are counted from."""
    now = time.time()
    for name, node, age in (("fresh", nodes[0], 60), ("old", nodes[1], 3600)):
        body = _pod(f"{name}-0", node, product, 8, "1", memory, {GANG_LABEL: name},
                    {"gpuautoscaler.dev/last-checkpoint": format_time(now - age)})  # fmt: skip
        cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    for name in ("fresh-0", "old-0"):
        cp.wait(f"{name} running", functools.partial(_running_on, cp, namespace, name), timeout_s=60)
    return now


def this_tests_view(read: ClusterSnapshot, namespace: str, nodes: tuple[str, str], now: float) -> ClusterSnapshot:
    """Only this test's nodes, pods and Deployments (the session's other tests leave theirs behind). Both gangs have
    run for two hours (created seconds ago here: a gang's lost work is counted from its start when that is later than
    its checkpoint, and "old", ready a second after "fresh" under load, was then the cheaper one -- a blind check
    flaked in a loaded CI run): the checkpoint decides."""
    return dataclasses.replace(
        read,
        nodes=tuple(n for n in read.nodes if n.name in nodes),
        pods=tuple(
            dataclasses.replace(p, created_at=now - 7200, scheduled_at=now - 7200, ready_at=now - 7200)
            for p in read.pods
            if p.namespace == namespace
        ),
        deployments=tuple(d for d in read.deployments if d.namespace == namespace),
        workloads=(),
    )


def victims(namespace: str, view: ClusterSnapshot) -> list[str]:
    """The gangs the capacity arbitration stops for one more chat replica (no burst pool, no minimum runtime)."""
    chat = ServicePolicy(namespace, "chat", max_replicas=4, priority=1000)
    config = CapacityConfig(pools=(), training=TrainingRules(min_runtime_s=0.0))
    decision = ScaleDecision(chat.key, 0, 1, Reason.METRIC_ABOVE_TARGET, "")
    arb = ArbitrationInput(time.time(), view, {chat.key: chat}, [decision])
    actions, _, _ = arbitrate(arb, CapacityState(), config)
    return sorted({a.gang or "" for a in actions if isinstance(a, EvictPod)})


def test_the_victim_search_and_the_scheduler_agree_on_cpu(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    cp = control_plane
    product, node_a, node_b = nodes
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", _pod("cpu-hog", node_a, product, 0, "12", "4Gi",
                                                                   {"app": "hog"}))  # fmt: skip
    cp.wait("cpu-hog running", functools.partial(_running_on, cp, namespace, "cpu-hog"), timeout_s=60)
    now = start_two_gangs(cp, namespace, product, (node_a, node_b), "4Gi")
    cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments",
               manifests.deployment("chat", 0, _chat_spec(product), labels={"app": "chat"}))  # fmt: skip

    reader = KubeClusterReader(api_client, sleep=lambda s: None)
    read = reader.snapshot(time.time())
    mine = {n.name: n for n in read.nodes if n.name in (node_a, node_b)}
    # allocatable less every bound pod: the CPU-only pod (not in the snapshot) too
    assert mine[node_a].free_beside_gpus == (16_000 - 12_000 - 1_000, 64 * 2**30 - 8 * 2**30)
    assert mine[node_b].free_beside_gpus == (15_000, 60 * 2**30)
    snapshot = this_tests_view(read, namespace, (node_a, node_b), now)

    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/old"]
    # without the CPU the cheaper gang on node a would have been stopped
    blind = dataclasses.replace(
        snapshot, nodes=tuple(dataclasses.replace(n, free_beside_gpus=None) for n in snapshot.nodes)
    )
    assert victims(namespace, blind) == [f"kubeflow/{namespace}/fresh"]

    # The real scheduler: with "fresh" gone, node a has the GPUs but not the CPU -- the replica waits
    assert_the_scheduler_agrees(cp, namespace, "Insufficient cpu", node_b)


def assert_the_scheduler_agrees(cp: ControlPlane, namespace: str, why_waiting: str, node_b: str) -> None:
    """The real kube-scheduler's side of a victim-search test: with the gang the search left alone ("fresh-0") gone,
    the chat replica (scaled to 1) stays Unschedulable, its reason holding ``why_waiting``; with the gang it chose
    ("old-0") gone, it is bound on ``node_b``."""
    _delete(cp, namespace, "fresh-0")
    cp.request("PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/chat", {"spec": {"replicas": 1}},
               content_type="application/merge-patch+json")  # fmt: skip
    replica = cp.wait(
        "a chat pod",
        lambda: next(iter(p["metadata"]["name"] for p in cp.pods(namespace, "app=chat")), None),
        timeout_s=60,
    )
    why = cp.wait("chat unschedulable", lambda: _unschedulable_why(cp, namespace, replica), timeout_s=60)
    assert why_waiting in why, why
    _delete(cp, namespace, "old-0")
    assert cp.wait("chat running", lambda: _running_on(cp, namespace, replica), timeout_s=60) == node_b
