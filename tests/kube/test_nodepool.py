"""Cluster API MachineDeployment node pools through the scale subresource."""

from __future__ import annotations

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import MachineDeploymentNodePools, make_node_pool_scaler
from autoscaler.adapters.kubernetes.nodepool import UnknownPoolError, node_pool_providers, register_node_pool_provider
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import ChangedSinceRead
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

MD = "cluster.x-k8s.io/v1beta1"


def pools(api: client.ApiClient, **kw: object) -> MachineDeploymentNodePools:
    return MachineDeploymentNodePools(api, "capi-system", sleep=lambda s: None, **kw)  # type: ignore[arg-type]


def test_node_count_and_idempotent_scale(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("gpu-burst", replicas=1))
    p = pools(api_client)
    assert p.node_count("gpu-burst") == 1
    p.scale("gpu-burst", 3)
    p.scale("gpu-burst", 3)
    assert apiserver.get(MD, "MachineDeployment", "gpu-burst", "capi-system")["spec"]["replicas"] == 3
    assert p.node_count("gpu-burst") == 3
    patches = [r for r in apiserver.requests if r.method == "PATCH"]
    assert len(patches) == 1
    assert patches[0].path == "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi-system/machinedeployments/gpu-burst/scale"
    assert patches[0].content_type == "application/merge-patch+json"


def test_scale_is_clamped_to_the_autoscaler_annotations(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=2, min_size=1, max_size=4))
    p = pools(api_client)
    assert p.bounds("b") == (1, 4)
    p.scale("b", 10)
    assert p.node_count("b") == 4
    p.scale("b", 0)
    assert p.node_count("b") == 1


@pytest.mark.parametrize(
    ("live", "expected", "nodes", "after"),
    [
        (5, 3, 4, 5),  # 5 requested, 3 registered, the size unreadable: "+1: 3 -> 4" must not shrink the pool
        (5, 5, 6, 6),  # the plan saw the live size: written
        (2, 3, 2, 2),  # somebody already made it what the plan wants: nothing to write, no error
        (6, 4, 3, 6),  # a scale-down planned from 4 while another writer grew the pool to 6: not written
        (4, None, 2, 2),  # no precondition (a caller that does not know the size): written as before
    ],
)
def test_a_resize_from_a_stale_size_writes_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient, live: int, expected: int | None, nodes: int, after: int
) -> None:
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=live))
    p = pools(api_client)
    if after == live and nodes != live:
        with pytest.raises(ChangedSinceRead, match=f"size is {live}, not the {expected}"):
            p.scale("b", nodes, expected=expected)
    else:
        p.scale("b", nodes, expected=expected)
    assert apiserver.get(MD, "MachineDeployment", "b", "capi-system")["spec"]["replicas"] == after
    if after == live:
        assert not [r for r in apiserver.requests if r.method == "PATCH"]


def test_pool_names_map_to_machine_deployments(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("gpu-md-0", replicas=0))
    p = pools(api_client, pools={"burst": "gpu-md-0"})
    p.scale("burst", 2)
    assert apiserver.get(MD, "MachineDeployment", "gpu-md-0", "capi-system")["spec"]["replicas"] == 2
    with pytest.raises(UnknownPoolError):
        p.scale("other", 1)


def test_provider_registry(api_client: client.ApiClient) -> None:
    assert "clusterapi" in node_pool_providers()
    assert isinstance(make_node_pool_scaler("clusterapi", api_client, "ns"), MachineDeploymentNodePools)
    register_node_pool_provider("memory", lambda: FakeCluster())
    assert isinstance(make_node_pool_scaler("memory"), FakeCluster)
    with pytest.raises(ValueError, match="unknown node pool provider"):
        make_node_pool_scaler("nope")
