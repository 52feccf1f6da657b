"""Required node affinity against a real control plane (stop 48): the reader reads a Deployment template's
``requiredDuringSchedulingIgnoredDuringExecution``, the victim search then leaves alone a gang on a node the
replicas' affinity rules out, and the real kube-scheduler agrees -- with that gang gone the replica stays
Unschedulable on affinity, with the gang the search chose gone it is bound.

Two kwok nodes of a GPU product no other test selects (8 GPUs each), node a in pool "spot", node b in pool "onprem".
On node a a 1-pod training gang checkpointed a minute ago (the cheaper one to stop), on node b one checkpointed an
hour ago. The chat replica (1 GPU) is kept off spot nodes by a ``NotIn`` term."""

from __future__ import annotations

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
from autoscaler.core.cluster import ClusterSnapshot, NodeSelector
from autoscaler.core.model import CapacityState, EvictPod, ScaleDecision, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.victims import TrainingRules
from tests.realkube import manifests
from tests.realkube.control_plane import GPU_PRODUCT_LABEL, GPU_RESOURCE, NODE_POOL_LABEL, ControlPlane, GpuNode
from tests.realkube.test_cpu_memory_real import GANG_LABEL, _pod, _running_on, assert_the_scheduler_agrees

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

PAUSE = "registry.k8s.io/pause:3.10"
OFF_SPOT = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": NODE_POOL_LABEL, "operator": "NotIn", "values": ["spot"]}]}
            ]
        }
    }
}


def _chat_spec(product: str) -> dict[str, Any]:
    return {
        "nodeSelector": {GPU_PRODUCT_LABEL: product},
        "affinity": OFF_SPOT,
        "containers": [{"name": "c", "image": PAUSE, "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU_RESOURCE: "1"}}}],
        "terminationGracePeriodSeconds": 0,
    }  # fmt: skip


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, str, str]]:
    cp = control_plane
    tag = secrets.token_hex(3)
    product = f"AFFINITY-TEST-{tag}"
    names = (f"aff-{tag}-a", f"aff-{tag}-b")
    for name, pool in zip(names, ("spot", "onprem"), strict=True):
        cp.request("POST", "/api/v1/nodes", cp.node_manifest(GpuNode(name, 8, product, pool)))
    try:
        cp.wait_nodes_schedulable(list(names), timeout_s=60)
        yield product, names[0], names[1]
    finally:
        for name in names:
            cp.request("DELETE", f"/api/v1/nodes/{name}")


def test_the_victim_search_and_the_scheduler_agree_on_required_node_affinity(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    cp = control_plane
    product, node_a, node_b = nodes
    now = time.time()
    for body in (
        _pod("fresh-0", node_a, product, 8, "1", "1Gi", {GANG_LABEL: "fresh"},
             {"gpuautoscaler.dev/last-checkpoint": format_time(now - 60)}),
        _pod("old-0", node_b, product, 8, "1", "1Gi", {GANG_LABEL: "old"},
             {"gpuautoscaler.dev/last-checkpoint": format_time(now - 3600)}),
    ):  # fmt: skip
        cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    for name in ("fresh-0", "old-0"):
        cp.wait(f"{name} running", functools.partial(_running_on, cp, namespace, name), timeout_s=60)
    cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments",
               manifests.deployment("chat", 0, _chat_spec(product), labels={"app": "chat"}))  # fmt: skip

    read = KubeClusterReader(api_client, sleep=lambda s: None).snapshot(time.time())
    (chat_deployment,) = [d for d in read.deployments if d.namespace == namespace]
    assert isinstance(chat_deployment.node_selector, NodeSelector)  # the reader kept the required affinity
    # only this test's nodes and pods (the session's other tests leave theirs behind); both gangs have run two hours,
    # so the checkpoint alone decides which loses less (see test_cpu_memory_real)
    snapshot = dataclasses.replace(
        read,
        nodes=tuple(n for n in read.nodes if n.name in (node_a, node_b)),
        pods=tuple(
            dataclasses.replace(p, created_at=now - 7200, scheduled_at=now - 7200, ready_at=now - 7200)
            for p in read.pods
            if p.namespace == namespace
        ),
        deployments=(chat_deployment,),
        workloads=(),
    )
    chat = ServicePolicy(namespace, "chat", max_replicas=4, priority=1000)
    config = CapacityConfig(pools=(), training=TrainingRules(min_runtime_s=0.0))

    def victims(view: ClusterSnapshot) -> list[str]:
        decision = ScaleDecision(chat.key, 0, 1, Reason.METRIC_ABOVE_TARGET, "")
        arb = ArbitrationInput(time.time(), view, {chat.key: chat}, [decision])
        actions, _, _ = arbitrate(arb, CapacityState(), config)
        return sorted({a.gang or "" for a in actions if isinstance(a, EvictPod)})

    assert victims(snapshot) == [f"kubeflow/{namespace}/old"]
    # read without the affinity, the cheaper gang on the spot node would have been stopped
    blind = dataclasses.replace(
        snapshot, deployments=(dataclasses.replace(chat_deployment, node_selector=dict(chat_deployment.node_selector)),)
    )
    assert victims(blind) == [f"kubeflow/{namespace}/fresh"]

    # The real scheduler: with "fresh" gone, node a has the GPUs but the affinity rules it out -- the replica waits;
    # with the gang the search chose gone, it is bound on node b
    assert_the_scheduler_agrees(cp, namespace, "affinity", node_b)
