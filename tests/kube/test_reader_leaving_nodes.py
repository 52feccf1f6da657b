"""A node the Cluster Autoscaler (or Karpenter) is removing is tainted NoSchedule instead of cordoned: the reader
treated it as ready capacity, unlike a cordoned node, so its GPUs were counted as free."""
import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.cluster import free_gpus
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "taint",
    [
        {"key": "ToBeDeletedByClusterAutoscaler", "value": "1767225600", "effect": "NoSchedule"},
        {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"},
        {"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"},  # Karpenter v0.32-v0.37
    ],
)
def test_a_node_being_removed_is_no_free_capacity(
    apiserver: FakeApiServer, api_client: client.ApiClient, taint: dict
) -> None:
    going = o.node("going")
    going["spec"]["taints"] = [taint]
    apiserver.seed(going, o.node("cordoned", unschedulable=True))
    snap = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    nodes = {n.name: n.ready for n in snap.nodes}
    assert nodes["cordoned"] is False  # cordoned: no capacity (passes)
    assert nodes["going"] is False  # being deleted: no new pod will ever land there either
    assert free_gpus(snap) == 0


def test_cordoned_tainted_and_deleted_nodes_are_leaving_not_booting(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """``NodeInfo.leaving`` tells a node that will not become ready (cordoned, tainted for removal, being deleted)
    from one that is booting: a burst node of either kind is not ready, and only a booting one is capacity on its
    way (``core.arbitrate``)."""
    tainted = o.node("tainted")
    tainted["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}]
    deleting = o.node("deleting")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    deleting["metadata"]["finalizers"] = ["example.com/instance"]
    apiserver.seed(o.node("plain"), o.node("cordoned", unschedulable=True), tainted, deleting)
    snap = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    leaving = {n.name: (n.leaving, n.ready) for n in snap.nodes}
    assert leaving == {
        "plain": (False, True),
        "cordoned": (True, False),
        "tainted": (True, False),
        "deleting": (True, False),
    }


def test_only_a_node_cordoned_and_nothing_else_reads_as_cordoned(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """``NodeInfo.cordoned``: its provider still counts it (the arbitration must not read the pool's size as a node
    requested and not registered); a node also tainted for removal or being deleted is the provider's no longer."""
    both = o.node("cordoned-and-tainted", unschedulable=True)
    both["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}]
    deleting = o.node("cordoned-and-deleting", unschedulable=True)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    deleting["metadata"]["finalizers"] = ["example.com/instance"]
    apiserver.seed(o.node("plain"), o.node("cordoned", unschedulable=True), both, deleting)
    snap = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    assert {n.name: n.out_of_service for n in snap.nodes} == {
        "plain": False,
        "cordoned": True,
        "cordoned-and-tainted": False,
        "cordoned-and-deleting": False,
    }
