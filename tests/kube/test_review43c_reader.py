"""Review of stop 43c, the reader side: ``NodeInfo.gpus_unhealthy`` (every GPU unhealthy while the kubelet reports
Ready) read as broken since this reader first saw it so, and ``NodeInfo.do_not_disrupt``."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.cluster import NodeInfo
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_reader_broken_nodes import _gpus, _lost
from tests.kube.test_review38_reader import NOW, _iso


def _reader(api_client: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api_client, ReaderConfig(gpu_pools=frozenset({"burst"})), sleep=lambda s: None)


def _by_name(reader: KubeClusterReader, at: float) -> dict[str, NodeInfo]:
    return {n.name: n for n in reader.snapshot(at).nodes}


def _read(n: NodeInfo) -> tuple[bool, bool, bool, bool, bool]:
    return n.ready, n.broken, n.gpus_unhealthy, n.leaving, n.out_of_service


@pytest.mark.parametrize(
    ("allocatable", "expected"),
    [
        pytest.param("8", (True, False, False, False, False), id="every GPU healthy"),
        pytest.param("3", (True, False, False, False, False), id="5 of 8 unhealthy: still serves, not broken"),
        pytest.param("1", (True, False, False, False, False), id="7 of 8 unhealthy"),
        pytest.param("0", (False, True, True, True, True), id="every GPU unhealthy: broken"),
    ],
)
def test_only_a_node_with_every_gpu_unhealthy_is_broken(
    apiserver: FakeApiServer, api_client: client.ApiClient, allocatable: str, expected: tuple[bool, ...]
) -> None:
    apiserver.seed(_gpus(o.node("n", pool="burst"), allocatable))
    assert _read(_by_name(_reader(api_client), NOW)["n"]) == expected


def test_a_lost_node_with_unhealthy_gpus_is_broken_since_its_kubelet_was_lost(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Ready Unknown and allocatable 0: broken as lost (since its Ready condition changed), not as unhealthy; not
    remembered, so once it answers again with its GPUs still unhealthy it counts from that read."""
    apiserver.seed(_gpus(_lost("n", NOW - 600), "0"))
    reader = _reader(api_client)
    got = _by_name(reader, NOW)["n"]
    assert (got.broken, got.gpus_unhealthy, got.state_since) == (True, False, NOW - 600)
    back = _gpus(apiserver.get("v1", "Node", "n"), "0")
    back["status"]["conditions"][0].update({"status": "True", "lastTransitionTime": _iso(NOW + 30)})
    apiserver.update_object(back)
    got = _by_name(reader, NOW + 60)["n"]
    assert (got.broken, got.gpus_unhealthy, got.state_since) == (True, True, NOW + 60)


def test_a_device_plugin_restart_read_once_starts_no_clock(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Allocatable 0 for one read (a device plugin restarting): broken from that read only, forgotten at the next
    healthy one; the next time counts afresh (the arbitration waits a whole provision limit from it)."""
    apiserver.seed(_gpus(o.node("n", pool="burst"), "0"))
    reader = _reader(api_client)
    assert _by_name(reader, NOW)["n"].state_since == NOW
    apiserver.update_object(_gpus(apiserver.get("v1", "Node", "n"), "8"))
    assert not _by_name(reader, NOW + 30)["n"].broken
    apiserver.update_object(_gpus(apiserver.get("v1", "Node", "n"), "0"))
    assert _by_name(reader, NOW + 60)["n"].state_since == NOW + 60


def test_a_node_recreated_under_the_same_name_does_not_inherit_the_old_ones_time(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Defect (76e9e36): every GPU unhealthy, the Node deleted and a new one registered under its name between two
    reads (a VM recreated, its GPUs unhealthy at once): the new node is broken since no earlier than it registered and
    became Ready, not since the reader first saw the old one -- else it is given back a provision limit early. (A
    kubelet restart, its Ready condition changing, restarts the clock too: later, never earlier.)"""
    apiserver.seed(_gpus(o.node("n", pool="burst"), "0"))
    reader = _reader(api_client)
    assert _by_name(reader, NOW)["n"].state_since == NOW
    apiserver.delete_object("v1", "Node", "n")
    again: dict[str, Any] = _gpus(o.node("n", pool="burst"), "0")
    again["metadata"]["creationTimestamp"] = _iso(NOW + 240)
    again["status"]["conditions"][0]["lastTransitionTime"] = _iso(NOW + 300)
    apiserver.seed(again)
    got = _by_name(reader, NOW + 600)["n"]
    assert (got.broken, got.gpus_unhealthy) == (True, True)
    assert got.state_since == NOW + 300
    # remembered from there on; a Ready condition changed in the future (a skewed clock) counts from now at most
    assert _by_name(reader, NOW + 900)["n"].state_since == NOW + 300
    skewed = _gpus(apiserver.get("v1", "Node", "n"), "0")
    skewed["status"]["conditions"][0]["lastTransitionTime"] = _iso(NOW + 5000)
    apiserver.update_object(skewed)
    assert _by_name(reader, NOW + 1000)["n"].state_since == NOW + 1000


def test_an_unhealthy_node_is_broken_before_the_snapshot_is_built(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """``_with_unhealthy_since`` runs before the ClusterSnapshot is built: every node in it carries ``broken`` and
    ``state_since``; and the annotation is read beside it."""
    raw = _gpus(o.node("n", pool="burst"), "0")
    raw["metadata"]["annotations"] = {"karpenter.sh/do-not-disrupt": "true"}
    apiserver.seed(raw)
    snapshot = _reader(api_client).snapshot(NOW)
    (got,) = snapshot.nodes
    assert (got.broken, got.gpus_unhealthy, got.do_not_disrupt, got.state_since) == (True, True, True, NOW)
