"""A burst node that is not ready counted as capacity on its way (booting) whatever kept it from being ready: one
cordoned, tainted for removal by an autoscaler, or being deleted (a node this controller gave back included) hid a
shortfall for as long as it stayed."""

from __future__ import annotations

import pytest

from autoscaler.core.arbitrate import _free_by_node
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo


@pytest.mark.parametrize(
    ("node", "booting"),
    [
        (NodeInfo("b-1", 8, "A100", "burst", ready=False), {"b-1": 8}),  # booting: on its way
        (NodeInfo("b-1", 8, "A100", "burst", ready=False, leaving=True), {}),  # cordoned / removal taint / deleting
        (NodeInfo("o-1", 8, "A100", "onprem", ready=False), {}),  # an on-prem node whose kubelet died
        (NodeInfo("b-1", 8, "A100", "burst", ready=True), {}),  # ready: counted as ready, not as booting
    ],
)
def test_only_a_burst_node_that_is_not_leaving_is_booting(node: NodeInfo, booting: dict[str, int]) -> None:
    types: dict[str, str | None] = {}
    ready, coming = _free_by_node(ClusterSnapshot(0.0, nodes=(node,)), {"burst"}, types)
    assert coming == booting
    assert ready == ({node.name: 8} if node.ready else {})


