"""Hard topology spread constraints against a real control plane (stop 49): the reader reads a Deployment template's
``topologySpreadConstraints`` (zones, ``maxSkew: 1``, ``DoNotSchedule``), the victim search then leaves alone the gang
in the zone already ahead -- its GPUs freed could not take the next replica -- and the real kube-scheduler agrees:
with that gang gone the new replica stays Unschedulable on the spread constraint, with the gang the search chose gone
it is bound in the other zone.

Two kwok nodes of a GPU product no other test selects (8 GPUs each), node a in zone "za", node b in zone "zb". On
node a a chat replica (a 1-GPU pod labelled ``app: chat``, not preemptible) and a 1-pod training gang of 7 GPUs
checkpointed a minute ago (the cheaper one to stop); on node b an 8-GPU gang checkpointed an hour ago."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader
from autoscaler.adapters.kubernetes._api import format_time
from tests.realkube import manifests
from tests.realkube.control_plane import GPU_PRODUCT_LABEL, GPU_RESOURCE, ControlPlane
from tests.realkube.test_cpu_memory_real import (
    GANG_LABEL,
    _delete,
    _pod,
    _running_on,
    _unschedulable_why,
    this_tests_view,
    two_gpu_nodes,
    victims,
)

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

PAUSE = "registry.k8s.io/pause:3.10"
ZONE = "topology.kubernetes.io/zone"


def _chat_spec(product: str) -> dict[str, Any]:
    return {
        "nodeSelector": {GPU_PRODUCT_LABEL: product},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                                       "labelSelector": {"matchLabels": {"app": "chat"}}}],
        "containers": [{"name": "c", "image": PAUSE, "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU_RESOURCE: "1"}}}],
        "terminationGracePeriodSeconds": 0,
    }  # fmt: skip


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, str, str]]:
    with two_gpu_nodes(control_plane, "tsc", ("onprem", "onprem")) as made:
        for name, zone in zip(made[1:], ("za", "zb"), strict=True):
            control_plane.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {ZONE: zone}}},
                                  content_type="application/merge-patch+json")  # fmt: skip
        yield made


def test_the_victim_search_and_the_scheduler_agree_on_topology_spread(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    cp = control_plane
    product, node_a, node_b = nodes
    now = time.time()
    running = _pod(
        "solo-chat", node_a, product, 1, "1", "1Gi", {"app": "chat", "gpuautoscaler.dev/preemptible": "false"}
    )
    fresh = _pod("fresh-0", node_a, product, 7, "1", "1Gi", {GANG_LABEL: "fresh"},
                 {"gpuautoscaler.dev/last-checkpoint": format_time(now - 60)})  # fmt: skip
    old = _pod("old-0", node_b, product, 8, "1", "1Gi", {GANG_LABEL: "old"},
               {"gpuautoscaler.dev/last-checkpoint": format_time(now - 3600)})  # fmt: skip
    for body in (running, fresh, old):
        cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    for name in ("solo-chat", "fresh-0", "old-0"):
        cp.wait(f"{name} running", functools.partial(_running_on, cp, namespace, name), timeout_s=60)
    cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments",
               manifests.deployment("chat", 0, _chat_spec(product), labels={"app": "chat"}))  # fmt: skip

    read = KubeClusterReader(api_client, sleep=lambda s: None).snapshot(time.time())
    snapshot = this_tests_view(read, namespace, (node_a, node_b), now)
    (chat_deployment,) = snapshot.deployments
    assert chat_deployment.spread_constraints, "the reader kept the hard spread constraint"
    assert {n.labels.get(ZONE) for n in snapshot.nodes} == {"za", "zb"}

    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/old"]
    # read without the constraint, the cheaper gang beside the running replica would have been stopped
    blind = dataclasses.replace(snapshot, deployments=(dataclasses.replace(chat_deployment, spread_constraints=()),))
    assert victims(namespace, blind) == [f"kubeflow/{namespace}/fresh"]

    # The real scheduler: with "fresh" gone zone za has 7 GPUs free, but a second replica there is two ahead of zb
    _delete(cp, namespace, "fresh-0")
    cp.request("PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/chat", {"spec": {"replicas": 1}},
               content_type="application/merge-patch+json")  # fmt: skip
    replica = cp.wait(
        "a chat replica",
        lambda: next((p["metadata"]["name"] for p in cp.pods(namespace, "app=chat")
                      if p["metadata"]["name"].startswith("chat-")), None),
        timeout_s=60,
    )  # fmt: skip
    why = cp.wait("chat unschedulable", lambda: _unschedulable_why(cp, namespace, replica), timeout_s=60)
    assert "topology spread" in why, why
    _delete(cp, namespace, "old-0")
    assert cp.wait("chat running", lambda: _running_on(cp, namespace, replica), timeout_s=60) == node_b
