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
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.realkube.control_plane import ControlPlane
from tests.realkube.test_cpu_memory_real import two_gpu_nodes, victims
from tests.realkube.test_pod_anti_affinity_real import (
    assert_the_scheduler_refuses_beside_then_binds,
    chat_spec,
    deploy_chat_and_read,
    start_beside_a_replica,
)

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

ZONE = "topology.kubernetes.io/zone"
BY_ZONE = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "chat"}}}]  # fmt: skip


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
    now = start_beside_a_replica(cp, namespace, product, node_a, node_b)
    snapshot = deploy_chat_and_read(
        cp, api_client, namespace, chat_spec(product, topologySpreadConstraints=BY_ZONE), (node_a, node_b), now
    )
    (chat_deployment,) = snapshot.deployments
    assert chat_deployment.spread_constraints, "the reader kept the hard spread constraint"
    assert {n.labels.get(ZONE) for n in snapshot.nodes} == {"za", "zb"}

    assert victims(namespace, snapshot) == [f"kubeflow/{namespace}/old"]
    # read without the constraint, the cheaper gang beside the running replica would have been stopped
    blind = dataclasses.replace(snapshot, deployments=(dataclasses.replace(chat_deployment, spread_constraints=()),))
    assert victims(namespace, blind) == [f"kubeflow/{namespace}/fresh"]

    # The real scheduler: with "fresh" gone zone za has 7 GPUs free, but a second replica there is two ahead of zb
    assert_the_scheduler_refuses_beside_then_binds(cp, namespace, "topology spread", node_b)
