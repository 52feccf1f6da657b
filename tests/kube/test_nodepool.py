"""Cluster API MachineDeployment node pools through the scale subresource."""

from __future__ import annotations

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import MachineDeploymentNodePools, make_node_pool_scaler
from autoscaler.adapters.kubernetes._api import JSON
from autoscaler.adapters.kubernetes.nodepool import (
    MachineNotFoundError,
    UnknownPoolError,
    node_pool_providers,
    register_node_pool_provider,
)
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import ChangedSinceRead, PortError
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


# ---- a scale-down names its node: the Machine is annotated for deletion first ----------------------------------

DELETE = "cluster.x-k8s.io/delete-machine"


def machines(apiserver: FakeApiServer) -> dict[str, JSON]:
    return {m["metadata"]["name"]: m for m in apiserver.objects(MD, "Machine", "capi-system")}


def marked(apiserver: FakeApiServer) -> set[str]:
    return {name for name, m in machines(apiserver).items() if DELETE in (m["metadata"].get("annotations") or {})}


def seed_pool(apiserver: FakeApiServer, *extra: JSON, md: JSON | None = None, crd: JSON | None = None) -> None:
    apiserver.seed(
        crd or o.machine_deployment_crd(),
        o.machine_crd(),
        md or o.machine_deployment("burst", replicas=3),
        o.machine("burst-a", "burst", "node-a"),
        o.machine("burst-b", "burst", "node-b"),
        o.machine("burst-c", "burst", None),  # still provisioning: no Node yet
        o.machine("other-x", "other", "node-x"),
        *extra,
    )


def test_a_scale_down_marks_the_named_nodes_machine_before_lowering_the_size(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Without the mark the MachineSet deletes a Machine by its delete policy (Random by default): a busy node could
    go instead of the one the plan emptied. The Cluster Autoscaler's Cluster API provider marks first, then scales."""
    seed_pool(apiserver)
    pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert marked(apiserver) == {"burst-b"}
    assert machines(apiserver)["burst-b"]["metadata"]["annotations"][DELETE].startswith("gpu-autoscaler ")
    assert apiserver.get(MD, "MachineDeployment", "burst", "capi-system")["spec"]["replicas"] == 2
    patches = [r.path.rsplit("/", 2)[-2:] for r in apiserver.requests if r.method == "PATCH"]
    assert patches == [["machines", "burst-b"], ["burst", "scale"]]  # the mark precedes the size
    listed = [r for r in apiserver.requests if r.method == "GET" and r.path.endswith("/machines")]
    assert listed and all(r.query.get("labelSelector") == "cluster.x-k8s.io/deployment-name=burst" for r in listed)


@pytest.mark.parametrize(
    ("node", "extra", "message"),
    [
        ("node-z", (), "node node-z has no Machine in MachineDeployment capi-system/burst"),
        ("node-x", (), "node node-x has no Machine"),  # a Machine of another MachineDeployment
        ("node-d", (o.machine("burst-d", "burst", "node-d", deleting=True),), "already being deleted"),
    ],
)
def test_a_node_whose_machine_cannot_be_marked_is_not_removed_by_chance(
    apiserver: FakeApiServer, api_client: client.ApiClient, node: str, extra: tuple[JSON, ...], message: str
) -> None:
    seed_pool(apiserver, *extra)
    with pytest.raises(MachineNotFoundError, match=message):
        pools(api_client).scale("burst", 2, expected=3, remove_node=node)
    assert apiserver.get(MD, "MachineDeployment", "burst", "capi-system")["spec"]["replicas"] == 3
    assert not [r for r in apiserver.requests if r.method == "PATCH"]


def test_the_mark_is_taken_back_when_the_size_write_fails(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A mark left on a Machine whose size was never lowered makes the next scale-down by anyone (the Cluster
    Autoscaler, a person) remove that node, busy or not by then."""
    crd = o.machine_deployment_crd()
    # the pool's own schema refuses fewer than 3 replicas: the scale write is a 422 from the apiserver
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"replicas": {"type": "integer", "minimum": 3}},
            }
        },
    }
    seed_pool(apiserver, crd=crd)
    with pytest.raises(PortError):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-a")
    assert apiserver.get(MD, "MachineDeployment", "burst", "capi-system")["spec"]["replicas"] == 3
    assert marked(apiserver) == set()
    patches = [r.path.rsplit("/", 2)[-2:] for r in apiserver.requests if r.method == "PATCH"]
    assert patches == [["machines", "burst-a"], ["burst", "scale"], ["machines", "burst-a"]]


@pytest.mark.parametrize(
    ("md", "nodes", "replicas"),
    [
        (o.machine_deployment("burst", replicas=3, min_size=3), 2, 3),  # clamped to min: nothing removed
        (o.machine_deployment("burst", replicas=3), 4, 4),  # a scale-up: the node is not marked
        (o.machine_deployment("burst", replicas=2), 2, 2),  # already there
    ],
)
def test_no_mark_when_the_size_does_not_go_down(
    apiserver: FakeApiServer, api_client: client.ApiClient, md: JSON, nodes: int, replicas: int
) -> None:
    seed_pool(apiserver, md=md)
    pools(api_client).scale("burst", nodes, remove_node="node-a")
    assert apiserver.get(MD, "MachineDeployment", "burst", "capi-system")["spec"]["replicas"] == replicas
    assert marked(apiserver) == set()


def test_size_and_bounds_in_one_get(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """The controller reads a pool's size and its Cluster Autoscaler bounds every tick: one GET of the
    MachineDeployment gives both (its spec.replicas is what the scale subresource reads)."""
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=3, min_size=1, max_size=4))
    p = pools(api_client)
    before = len(apiserver.requests)
    assert p.size_and_bounds("b") == (p.node_count("b"), p.bounds("b")) == (3, (1, 4))
    gets = [r for r in apiserver.requests[before:] if r.method == "GET"]
    assert len(gets) == 3  # size_and_bounds, node_count (the scale subresource), bounds: one each
    assert gets[0].path == "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi-system/machinedeployments/b"


MD_PATH = "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi-system/machinedeployments"


# ---- review 46b pins: size_and_bounds (moved here from tests/runtime/test_review46b.py) ----------------------


def test_pin_size_and_bounds_reads_the_mapped_machine_deployment_with_one_call(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """With ``pools={...}`` the pool name is mapped to its MachineDeployment as ``node_count`` and ``bounds`` map
    it; ``api_calls`` counts the one request."""
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("md-burst", replicas=3, min_size=1, max_size=5))
    pools = MachineDeploymentNodePools(api_client, "capi-system", {"burst": "md-burst"}, sleep=lambda s: None)
    before, calls = len(apiserver.requests), pools.api_calls
    assert pools.size_and_bounds("burst") == (3, (1, 5))
    assert pools.api_calls == calls + 1
    assert [(r.method, r.path) for r in apiserver.requests[before:]] == [("GET", f"{MD_PATH}/md-burst")]
    assert pools.size_and_bounds("burst") == (pools.node_count("burst"), pools.bounds("burst"))


def test_pin_size_and_bounds_of_an_unknown_pool_raises_and_sends_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("md-burst", replicas=3))
    pools = MachineDeploymentNodePools(api_client, "capi-system", {"burst": "md-burst"}, sleep=lambda s: None)
    before, calls = len(apiserver.requests), pools.api_calls
    with pytest.raises(UnknownPoolError, match="'other'"):
        pools.size_and_bounds("other")
    assert len(apiserver.requests) == before and pools.api_calls == calls


@pytest.mark.parametrize("case", ["spec.replicas absent", "being deleted"])
def test_pin_size_and_bounds_agrees_with_node_count(
    apiserver: FakeApiServer, api_client: client.ApiClient, case: str
) -> None:
    """The scale subresource of a custom resource reads a missing ``spec.replicas`` as 0, as the one GET does; a
    MachineDeployment being deleted still reports its ``spec.replicas`` through both (the resize refuses it)."""
    md = o.machine_deployment("b", replicas=2, min_size=0, max_size=4)
    if case == "spec.replicas absent":
        del md["spec"]["replicas"]
    else:
        md["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        md["metadata"]["finalizers"] = ["machinedeployment.cluster.x-k8s.io"]
    apiserver.seed(o.machine_deployment_crd(), md)
    pools = MachineDeploymentNodePools(api_client, "capi-system", sleep=lambda s: None)
    assert pools.size_and_bounds("b") == (pools.node_count("b"), pools.bounds("b"))
