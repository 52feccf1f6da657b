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
