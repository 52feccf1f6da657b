"""A scale-UP plan on a pool already above its max-size annotation shrinks the pool (deletes running nodes)."""
from kubernetes import client

from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

MD = "cluster.x-k8s.io/v1beta1"


def test_scale_up_never_shrinks_a_pool_above_its_max(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    # 5 machines running; an operator lowered the CA max-size annotation to 3 (Cluster Autoscaler then just stops
    # growing the group, it never deletes nodes for it).
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=5, max_size=3))
    p = MachineDeploymentNodePools(api_client, "capi-system", sleep=lambda s: None)
    p.scale("b", 6, expected=5)  # the plan: +1 node, from the live size 5
    assert apiserver.get(MD, "MachineDeployment", "b", "capi-system")["spec"]["replicas"] >= 5


def test_keeping_the_live_size_never_shrinks(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=5, max_size=3))
    p = MachineDeploymentNodePools(api_client, "capi-system", sleep=lambda s: None)
    p.scale("b", 5, expected=5)  # "already there is fine" -- yet a write to 3 follows
    assert apiserver.get(MD, "MachineDeployment", "b", "capi-system")["spec"]["replicas"] == 5
