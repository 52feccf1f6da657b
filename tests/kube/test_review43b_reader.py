"""Review 43b: the reader's ``NodeInfo.broken`` (2c5dcd1) when the Ready condition carries no lastTransitionTime."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_review38_reader import NOW, _iso, _not_ready_node, _snapshot

YEAR = 365 * 86400.0


def _lost(name: str, created: float, since: float | None) -> dict[str, Any]:
    node = o.node(name, pool="burst", ready=False)
    node["metadata"]["creationTimestamp"] = _iso(created)
    cond = {"status": "Unknown", "reason": "NodeStatusUnknown"}
    if since is not None:
        cond["lastTransitionTime"] = _iso(since)
    node["status"]["conditions"][0].update(cond)
    return node


def _failed_without_time() -> dict[str, Any]:
    node = _not_ready_node("failed-no-time", created=NOW - YEAR, not_ready_since=NOW - 60, gpus_reported=True)
    del node["status"]["conditions"][0]["lastTransitionTime"]
    return node


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(_lost("lost", NOW - YEAR, NOW - 600), (True, NOW - 600), id="lost: broken since its change"),
        pytest.param(
            _lost("lost-new", NOW - 300, NOW - 200), (True, NOW - 200), id="lost while booting: broken all the same"
        ),
        pytest.param(_failed_without_time(), (False, NOW - YEAR), id="NotReady, no transition time: not broken"),
    ],
)
def test_pin_broken_and_since_when(
    apiserver: FakeApiServer, api_client: client.ApiClient, raw: dict[str, Any], expected: tuple[bool, float]
) -> None:
    apiserver.seed(raw)
    (node,) = _snapshot(api_client, gpu_pools=frozenset({"burst"})).nodes
    assert (node.broken, node.state_since) == expected


def test_a_lost_node_without_a_transition_time_is_not_broken_since_its_creation(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """WRONG (was): a burst node registered a year ago whose Ready condition is Unknown without a lastTransitionTime
    (a kubelet or a virtual node that omits it) is read broken since ``_latest(created, None)`` = its creation: a
    year broken, past any provision limit, so the arbitration gives it back at the first tick it is seen lost --
    one missed heartbeat away from a give-back (once no GPU pod on it is live). The NotReady path
    already requires the time (``failed``: ``changed is not None``).
    RIGHT: not read broken since its creation: since when it broke is unknown, so it is not broken (out of service
    still, as before the change)."""
    apiserver.seed(_lost("lost-no-time", NOW - YEAR, None))
    (node,) = _snapshot(api_client, gpu_pools=frozenset({"burst"})).nodes
    assert node.out_of_service
    assert not (node.broken and node.state_since is not None and node.state_since < NOW - 3600)
