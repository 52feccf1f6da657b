"""Required node affinity against a real control plane (stop 48): the reader reads a Deployment template's
``requiredDuringSchedulingIgnoredDuringExecution``, the victim search then leaves alone a gang on a node the
replicas' affinity rules out, and the real kube-scheduler agrees -- with that gang gone the replica stays
Unschedulable on affinity, with the gang the search chose gone it is bound.

Two kwok nodes of a GPU product no other test selects (8 GPUs each), node a in pool "spot", node b in pool "onprem".
On node a a 1-pod training gang checkpointed a minute ago (the cheaper one to stop), on node b one checkpointed an
hour ago. The chat replica (1 GPU) is kept off spot nodes by a ``NotIn`` term."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from kubernetes import client

from autoscaler.core.cluster import NodeSelector
from tests.realkube.control_plane import NODE_POOL_LABEL, ControlPlane
from tests.realkube.test_cpu_memory_real import (
    assert_the_scheduler_agrees,
    start_two_gangs,
    two_gpu_nodes,
    victims,
)
from tests.realkube.test_pod_anti_affinity_real import chat_spec, deploy_chat_and_read

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

OFF_SPOT = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": NODE_POOL_LABEL, "operator": "NotIn", "values": ["spot"]}]}
            ]
        }
    }
}


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, str, str]]:
    with two_gpu_nodes(control_plane, "aff", ("spot", "onprem")) as made:
        yield made


def test_the_victim_search_and_the_scheduler_agree_on_required_node_affinity(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    cp = control_plane
    product, node_a, node_b = nodes
    now = start_two_gangs(cp, namespace, product, (node_a, node_b), "1Gi")
    snapshot = deploy_chat_and_read(
        cp, api_client, namespace, chat_spec(product, affinity=OFF_SPOT), (node_a, node_b), now
    )
    (chat_deployment,) = snapshot.deployments
    assert isinstance(chat_deployment.node_selector, NodeSelector)  # the reader kept the required affinity

    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/old"]
    # read without the affinity, the cheaper gang on the spot node would have been stopped
    blind = dataclasses.replace(
        snapshot, deployments=(dataclasses.replace(chat_deployment, node_selector=dict(chat_deployment.node_selector)),)
    )
    assert victims(namespace, blind) == [f"kubeflow/{namespace}/fresh"]

    # The real scheduler: with "fresh" gone, node a has the GPUs but the affinity rules it out -- the replica waits;
    # with the gang the search chose gone, it is bound on node b
    assert_the_scheduler_agrees(cp, namespace, "affinity", node_b)
