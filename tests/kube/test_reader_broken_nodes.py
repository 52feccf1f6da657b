"""``NodeInfo.broken`` (stop 43): the reader marks a node broken, not by anyone's choice, when its kubelet is lost
(Ready Unknown) or when it went NotReady long after it registered its GPUs; the arbitration gives such a burst node
back past its pool's provision limit (``tests/core/test_stuck_burst_node_evicted.py``). Cordoned, tainted for
removal, still booting, or re-imaged under an old name: not broken."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_review38_reader import NOW, _iso, _not_ready_node, _snapshot


def _lost(name: str, since: float) -> dict[str, Any]:
    node = o.node(name, pool="burst", ready=False)
    node["status"]["conditions"][0].update(
        {"status": "Unknown", "reason": "NodeStatusUnknown", "lastTransitionTime": _iso(since)}
    )
    return node


def test_a_lost_or_failed_node_is_broken_and_nothing_else_is(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    tainted = _lost("tainted-lost", NOW - 600)
    tainted["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}]
    apiserver.seed(
        o.node("plain", pool="burst"),
        o.node("cordoned", pool="burst", unschedulable=True),
        _lost("lost", NOW - 600),
        tainted,
        _not_ready_node("failed", created=NOW - 365 * 86400, not_ready_since=NOW - 60, gpus_reported=True),
        _not_ready_node("booting", created=NOW - 120, not_ready_since=NOW - 120, gpus_reported=False),
        _not_ready_node("reimaged", created=NOW - 365 * 86400, not_ready_since=NOW - 60, gpus_reported=False),
    )
    nodes = _snapshot(api_client, gpu_pools=frozenset({"burst"})).nodes
    assert {n.name: (n.broken, n.out_of_service) for n in nodes} == {
        "plain": (False, False),
        "cordoned": (False, True),
        "lost": (True, True),
        "tainted-lost": (True, False),  # broken, but being removed: not out of service, not given back again
        "failed": (True, True),
        "booting": (False, False),
        "reimaged": (False, False),
    }
    # how long it has been broken: since its Ready condition changed
    assert {n.name: n.state_since for n in nodes if n.broken} == {
        "lost": NOW - 600,
        "tainted-lost": NOW - 600,
        "failed": NOW - 60,
    }


def test_a_node_annotated_not_to_be_removed_is_read_so(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """``NodeInfo.do_not_disrupt``: the Cluster Autoscaler's scale-down-disabled and Karpenter's do-not-disrupt on the
    Node (values as those autoscalers read them, case and spaces aside); a pod's safe-to-evict on a Node means
    nothing."""
    annotated = {
        "ca": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"},
        "karpenter": {"karpenter.sh/do-not-disrupt": " True "},
        "ca-false": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "false"},
        "pod-annotation": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
        "plain": {},
    }
    nodes = []
    for name, marks in annotated.items():
        raw = o.node(name, pool="burst")
        raw["metadata"]["annotations"] = marks
        nodes.append(raw)
    apiserver.seed(*nodes)
    got = {n.name: n.do_not_disrupt for n in _snapshot(api_client, gpu_pools=frozenset({"burst"})).nodes}
    assert got == {"ca": True, "karpenter": True, "ca-false": False, "pod-annotation": False, "plain": False}


def _gpus(raw: dict[str, Any] | None, allocatable: str) -> dict[str, Any]:
    assert raw is not None
    # a copy: the fixture's capacity and allocatable are one dict
    raw["status"]["allocatable"] = {**raw["status"]["allocatable"], "nvidia.com/gpu": allocatable}
    return raw


def test_a_node_whose_gpus_all_went_unhealthy_is_broken_since_first_seen_so(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Every GPU unhealthy while the kubelet reports Ready (allocatable 0 of 8: a GPU fallen off the bus) is broken,
    since this reader first saw it so -- the Node keeps no time for it; healthy again, it starts afresh; a new reader
    (a restarted controller) counts from its own first sight."""
    from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig

    apiserver.seed(_gpus(o.node("sick", pool="burst"), "0"), o.node("well", pool="burst"))
    reader = KubeClusterReader(api_client, ReaderConfig(gpu_pools=frozenset({"burst"})), sleep=lambda s: None)

    def read(at: float) -> dict[str, tuple[bool, bool, float | None]]:
        return {
            n.name: (n.broken, n.gpus_unhealthy, n.state_since if n.broken else None) for n in reader.snapshot(at).nodes
        }

    assert read(NOW) == {"sick": (True, True, NOW), "well": (False, False, None)}
    assert read(NOW + 600)["sick"] == (True, True, NOW)
    apiserver.update_object(_gpus(apiserver.get("v1", "Node", "sick"), "8"))
    assert read(NOW + 700)["sick"] == (False, False, None)
    apiserver.update_object(_gpus(apiserver.get("v1", "Node", "sick"), "0"))
    assert read(NOW + 800)["sick"] == (True, True, NOW + 800)
    fresh = KubeClusterReader(api_client, ReaderConfig(gpu_pools=frozenset({"burst"})), sleep=lambda s: None)
    assert {n.name: n.state_since for n in fresh.snapshot(NOW + 900).nodes if n.broken} == {"sick": NOW + 900}
