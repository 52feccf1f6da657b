"""Required pod anti-affinity against a real control plane (stop 49): the reader reads a Deployment template's
``podAntiAffinity`` (one replica per node, ``kubernetes.io/hostname``), the victim search then leaves alone the
gang beside a running replica -- its GPUs freed could not take the next one -- and the real kube-scheduler agrees:
with that gang gone the new replica stays Unschedulable on anti-affinity, with the gang the search chose gone it is
bound.

Two kwok nodes of a GPU product no other test selects (8 GPUs each). On node a a chat replica (a 1-GPU pod labelled
``app: chat``, not preemptible) and a 1-pod training gang of 7 GPUs checkpointed a minute ago (the cheaper one to
stop); on node b an 8-GPU gang checkpointed an hour ago."""

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
from autoscaler.core.cluster import HOSTNAME_LABEL, ClusterSnapshot, spread_domains
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
ONE_PER_NODE = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "chat"}}, "topologyKey": HOSTNAME_LABEL}
        ]
    }
}

# a pod's affinity keeping it off every node where one of chat's pods runs
AWAY_FROM_CHAT = ONE_PER_NODE


def chat_spec(product: str, **placement: Any) -> dict[str, Any]:
    """The chat replica's pod spec: 1 GPU, 1 CPU, 1 Gi, on the test's GPU product, with ``placement`` (an
    ``affinity``, ``topologySpreadConstraints``) beside its nodeSelector."""
    return {
        "nodeSelector": {GPU_PRODUCT_LABEL: product},
        **placement,
        "containers": [{"name": "c", "image": PAUSE, "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU_RESOURCE: "1"}}}],
        "terminationGracePeriodSeconds": 0,
    }  # fmt: skip


def start_beside_a_replica(cp: ControlPlane, namespace: str, product: str, node_a: str, node_b: str) -> float:
    """On node a a running chat replica (``solo-chat``, 1 GPU, ``app: chat``, not preemptible) beside the gang
    "fresh" (7 GPUs, checkpointed a minute ago: the cheaper one to stop); on node b the gang "old" (8 GPUs, an hour
    ago). Returns the time their checkpoints are counted from."""
    solo = _pod("solo-chat", node_a, product, 1, "1", "1Gi", {"app": "chat", "gpuautoscaler.dev/preemptible": "false"})
    return start_two_gangs(cp, namespace, product, (node_a, node_b), solo)


def start_two_gangs(
    cp: ControlPlane,
    namespace: str,
    product: str,
    nodes: tuple[str, str],
    *beside: dict[str, Any],
    fresh_affinity: dict[str, Any] | None = None,
) -> float:
    """The pods ``beside`` (made first), then the gang "fresh" on node a (7 GPUs, checkpointed a minute ago: the
    cheaper one to stop; ``fresh_affinity`` its pod's affinity) and "old" on node b (8 GPUs, an hour ago), all
    running. Returns the time their checkpoints are counted from."""
    node_a, node_b = nodes
    now = time.time()
    fresh = _pod("fresh-0", node_a, product, 7, "1", "1Gi", {GANG_LABEL: "fresh"},
                 {"gpuautoscaler.dev/last-checkpoint": format_time(now - 60)})  # fmt: skip
    if fresh_affinity is not None:
        fresh["spec"]["affinity"] = fresh_affinity
    old = _pod("old-0", node_b, product, 8, "1", "1Gi", {GANG_LABEL: "old"},
               {"gpuautoscaler.dev/last-checkpoint": format_time(now - 3600)})  # fmt: skip
    bodies = (*beside, fresh, old)
    for body in bodies:
        cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    for body in bodies:
        name = body["metadata"]["name"]
        cp.wait(f"{name} running", functools.partial(_running_on, cp, namespace, name), timeout_s=60)
    return now


def scale_chat_to_one_refused(cp: ControlPlane, namespace: str, why: str) -> str:
    """Scale the chat Deployment to one replica and wait until kube-scheduler leaves it Unschedulable, its reason
    holding ``why``; returns the replica's name."""
    cp.request("PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/chat", {"spec": {"replicas": 1}},
               content_type="application/merge-patch+json")  # fmt: skip
    replica = cp.wait(
        "a chat replica",
        lambda: next((p["metadata"]["name"] for p in cp.pods(namespace, "app=chat")
                      if p["metadata"]["name"].startswith("chat-")), None),
        timeout_s=60,
    )  # fmt: skip
    message = cp.wait("chat unschedulable", lambda: _unschedulable_why(cp, namespace, replica), timeout_s=60)
    assert why in message, message
    return str(replica)


def assert_the_scheduler_refuses_beside_then_binds(cp: ControlPlane, namespace: str, why: str, node_b: str) -> None:
    """With "fresh" gone node a has 7 GPUs free, but the chat Deployment's first replica (scaled to 1) may not go
    there: Unschedulable, its reason holding ``why``; with "old" gone it is bound on ``node_b``."""
    _delete(cp, namespace, "fresh-0")
    replica = scale_chat_to_one_refused(cp, namespace, why)
    _delete(cp, namespace, "old-0")
    assert cp.wait("chat running", lambda: _running_on(cp, namespace, replica), timeout_s=60) == node_b


def deploy_chat_and_read(
    cp: ControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    spec: dict[str, Any],
    nodes: tuple[str, str],
    now: float,
) -> ClusterSnapshot:
    """Create the chat Deployment (0 replicas, ``spec``) and read the cluster as the controller does, cut to this
    test's view (``this_tests_view``)."""
    cp.request(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        manifests.deployment("chat", 0, spec, labels={"app": "chat"}),
    )
    read = KubeClusterReader(api_client, sleep=lambda s: None).snapshot(time.time())
    return this_tests_view(read, namespace, nodes, now)


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, str, str]]:
    with two_gpu_nodes(control_plane, "anti", ("onprem", "onprem")) as made:
        yield made


def test_the_victim_search_and_the_scheduler_agree_on_pod_anti_affinity(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    cp = control_plane
    product, node_a, node_b = nodes
    now = start_beside_a_replica(cp, namespace, product, node_a, node_b)
    snapshot = deploy_chat_and_read(
        cp, api_client, namespace, chat_spec(product, affinity=ONE_PER_NODE), (node_a, node_b), now
    )
    (chat_deployment,) = snapshot.deployments
    assert chat_deployment.anti_affinity, "the reader kept the pod anti-affinity"
    assert spread_domains(chat_deployment, snapshot.nodes) is not None, "a term selecting its own pods"

    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/old"]
    # read without the anti-affinity, the cheaper gang beside the running replica would have been stopped
    blind = dataclasses.replace(snapshot, deployments=(dataclasses.replace(chat_deployment, anti_affinity=()),))
    assert victims(namespace, blind) == [f"kubeflow/{namespace}/fresh"]

    # The real scheduler: with "fresh" gone node a has 7 GPUs free, but the replica may not join solo-chat there
    assert_the_scheduler_refuses_beside_then_binds(cp, namespace, "anti-affinity", node_b)


def test_the_victim_search_and_the_scheduler_agree_on_the_symmetric_check(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    """The symmetric check: chat has no anti-affinity, but the "guard" Deployment's replica on node a keeps away from
    chat's pods. kube-scheduler refuses chat's replica on node a all the same; the victim search reads guard's
    template and stops the gang on node b."""
    cp = control_plane
    product, node_a, node_b = nodes
    guard = chat_spec(product, affinity=AWAY_FROM_CHAT)
    guard["nodeSelector"] = {**guard["nodeSelector"], HOSTNAME_LABEL: node_a}
    cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments",
               manifests.deployment("guard", 1, guard, labels={"app": "guard"}))  # fmt: skip
    cp.wait(
        "guard running",
        lambda: next(
            (p for p in cp.pods(namespace, "app=guard") if p.get("status", {}).get("phase") == "Running"), None
        ),
        timeout_s=60,
    )
    now = start_two_gangs(cp, namespace, product, (node_a, node_b))
    snapshot = deploy_chat_and_read(cp, api_client, namespace, chat_spec(product), (node_a, node_b), now)
    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/old"]
    assert_blind_would_stop_fresh(namespace, snapshot)
    assert_the_scheduler_refuses_beside_then_binds(cp, namespace, "anti-affinity", node_b)


def assert_blind_would_stop_fresh(namespace: str, snapshot: ClusterSnapshot) -> None:
    """Read without any anti-affinity (the Deployments' templates' nor the pods' own), the victim search would stop
    the cheaper gang, "fresh", beside the pod keeping chat away."""
    blind = dataclasses.replace(
        snapshot,
        deployments=tuple(dataclasses.replace(d, anti_affinity=()) for d in snapshot.deployments),
        pods=tuple(dataclasses.replace(p, anti_affinity=()) for p in snapshot.pods),
    )
    assert victims(namespace, blind) == [f"kubeflow/{namespace}/fresh"]


def test_the_victim_search_and_the_scheduler_agree_on_a_bare_pods_own_anti_affinity(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    """The symmetric check on a pod no Deployment owns (stop 50): a bare GPU pod "guard" on node a keeps away from
    chat's pods in its own spec. kube-scheduler refuses chat's replica on node a; the reader reads the pod's own
    terms, and the victim search stops the gang on node b (read from Deployment templates only, as until stop 50, it
    would stop "fresh" beside the guard)."""
    cp = control_plane
    product, node_a, node_b = nodes
    guard = _pod("guard", node_a, product, 1, "1", "1Gi", {"app": "guard", "gpuautoscaler.dev/preemptible": "false"})
    guard["spec"]["affinity"] = AWAY_FROM_CHAT
    now = start_two_gangs(cp, namespace, product, (node_a, node_b), guard)
    snapshot = deploy_chat_and_read(cp, api_client, namespace, chat_spec(product), (node_a, node_b), now)
    (read_guard,) = [p for p in snapshot.pods if p.name == "guard"]
    assert read_guard.owner_kind is None and read_guard.anti_affinity, "the bare pod's own terms were read"
    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/old"]
    assert_blind_would_stop_fresh(namespace, snapshot)
    assert_the_scheduler_refuses_beside_then_binds(cp, namespace, "anti-affinity", node_b)


def test_the_gang_that_keeps_the_replica_away_is_the_one_stopped_for_it(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    """Review 50: the gang "fresh" on node a keeps chat's pods away in its own spec (its pods' required anti-affinity);
    it is still the cheaper one to stop, and stopping it opens node a -- kube-scheduler's preemption judges a node
    without its victims. Read as a node barred whoever runs there, the search stopped "old" on node b instead."""
    cp = control_plane
    product, node_a, node_b = nodes
    now = start_two_gangs(cp, namespace, product, (node_a, node_b), fresh_affinity=AWAY_FROM_CHAT)
    snapshot = deploy_chat_and_read(cp, api_client, namespace, chat_spec(product), (node_a, node_b), now)
    (read_fresh,) = [p for p in snapshot.pods if p.name == "fresh-0"]
    assert read_fresh.anti_affinity, "the gang's own terms were read"
    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/fresh"]

    # The real scheduler: node a's free GPU is refused while "fresh" runs; once it is gone the replica binds there.
    replica = scale_chat_to_one_refused(cp, namespace, "anti-affinity")
    _delete(cp, namespace, "fresh-0")
    assert cp.wait("chat running", lambda: _running_on(cp, namespace, replica), timeout_s=60) == node_a
