"""The reader keeps since when each Node has been as it is (``NodeInfo.state_since``: the later of its registration
and its Ready condition's last change): a burst node not ready that long is no capacity on its way
(``core.arbitrate``). And a booting burst node of a configured pool is a GPU node before its device plugin reports
GPUs or GPU feature discovery labels it (``ReaderConfig.gpu_pools``, which the controller fills from
``capacity.burst_pools``): left out, it read as a node the provider counts that never registered."""

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes._api import parse_time
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def test_the_node_creation_time_is_read_and_a_configured_burst_pools_booting_node_is_kept(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    booting = o.node("burst-a", 0, product=None, pool="burst", ready=False)
    apiserver.seed(o.node("n1"), booting)
    snap = KubeClusterReader(api_client, ReaderConfig(gpu_pools=frozenset({"burst"})), sleep=lambda s: None).snapshot(
        NOW
    )
    created = {n.name: n.state_since for n in snap.nodes}
    assert created == {"n1": parse_time(o.CREATED), "burst-a": parse_time(o.CREATED)}
    # without the pool configured, a node with no GPU resource and no GPU label is not a GPU node
    bare = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    assert [n.name for n in bare.nodes] == ["n1"]


def test_the_controller_reads_its_burst_pools_nodes_as_gpu_nodes(apiserver: FakeApiServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``app.build_adapters`` gives the reader the capacity settings' burst pools."""
    from autoscaler.app import build_adapters
    from autoscaler.settings import Settings

    settings = Settings(
        kubernetes={"config_mode": "kubeconfig", "kubeconfig": str(apiserver.write_kubeconfig(tmp_path / "kc"))},
        prometheus={"url": "http://127.0.0.1:9"},
        capacity={"burst_pools": {"a100-spot": {"max_nodes": 4}, "h100": {"max_nodes": 2}}},
    )
    reader = build_adapters(settings, check_prometheus=False).cluster
    assert isinstance(reader, KubeClusterReader)
    assert reader.config.gpu_pools == frozenset({"a100-spot", "h100"})
