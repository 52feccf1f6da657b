"""Stop 48: a pod's, a Deployment template's and a workload template's required node affinity, read as
kube-scheduler's NodeAffinity filter reads it (``core.cluster.NodeSelector``), beside the nodeSelector."""

from __future__ import annotations

import copy

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes.reader import node_selector_of, required_affinity_of
from autoscaler.core.cluster import NodeRequirement, NodeSelector, labels_select
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
OFF_SPOT = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["spot", "burst"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["reserved-1"]}]},
            ]
        },
        # preferred affinity scores, it filters nothing: not kept
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
        ],
    }
}
TERMS = (
    (NodeRequirement("pool", "NotIn", ("spot", "burst")),),
    (NodeRequirement("metadata.name", "In", ("reserved-1",), on_name=True),),
)


def reader(api: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None)


def test_the_required_terms_are_read_and_the_preferred_ones_left() -> None:
    spec = {"nodeSelector": {"zone": "a"}, "affinity": copy.deepcopy(OFF_SPOT)}
    selector = node_selector_of(spec)
    assert isinstance(selector, NodeSelector)
    assert dict(selector) == {"zone": "a"} and selector.affinity == TERMS
    assert labels_select({"zone": "a", "pool": "train"}, selector, "n1")
    assert not labels_select({"zone": "a", "pool": "spot"}, selector, "n1")
    assert labels_select({"zone": "a", "pool": "spot"}, selector, "reserved-1")  # the second term, by name
    assert not labels_select({"pool": "train"}, selector, "n1")  # the nodeSelector still applies


def test_no_required_affinity_reads_as_the_plain_nodeselector() -> None:
    preferred_only = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    for spec in ({}, {"affinity": preferred_only}, {"affinity": {"podAntiAffinity": {}}}):
        assert required_affinity_of(spec) is None
        assert type(node_selector_of({**spec, "nodeSelector": {"zone": "a"}})) is dict


def test_what_the_api_server_would_refuse_admits_no_node() -> None:
    """A malformed term (not an object, a value that is no string, no terms at all) is kept as one admitting no node:
    read as "anywhere" it would let the arbitration stop training for pods that cannot be placed."""
    for required in (
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": [3]}]}]},
        {"nodeSelectorTerms": ["x"]},
        {"nodeSelectorTerms": []},
        {},
    ):
        spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}
        selector = node_selector_of(spec)
        assert not labels_select({"pool": "train"}, selector, "n1"), required


def test_pods_deployments_and_workloads_carry_their_required_affinity(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    pending = o.pod("waits", "ml", gpus=8, phase="Pending", node_name=None, ready=False)
    pending["spec"]["affinity"] = copy.deepcopy(OFF_SPOT)
    job = o.job("trainer", "ml", gpus=8, suspend=True, product=o.A100)
    job["spec"]["template"]["spec"]["affinity"] = copy.deepcopy(OFF_SPOT)
    apiserver.seed(pending, job)
    snapshot = reader(api_client).snapshot(NOW)
    (pod,) = [p for p in snapshot.pods if p.name == "waits"]
    assert isinstance(pod.node_selector, NodeSelector) and pod.node_selector.affinity == TERMS
    (workload,) = snapshot.workloads
    assert isinstance(workload.node_selector, NodeSelector) and workload.node_selector.affinity == TERMS
    assert dict(workload.node_selector) == {"nvidia.com/gpu.product": o.A100}

    raw = {
        "metadata": {"namespace": "inference", "name": "chat"},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {"nodeSelector": {"nvidia.com/gpu.product": "H100", "zone": "a"}, "affinity": OFF_SPOT}
            },
        },
        "status": {"readyReplicas": 2},
    }
    deployment = KubeClusterReader._deployment(raw)
    assert deployment.gpu_product == "H100"
    # the GPU type is the deployment's gpu_product (not repeated in its selector); the affinity stays
    assert dict(deployment.node_selector) == {"zone": "a"}
    assert isinstance(deployment.node_selector, NodeSelector) and deployment.node_selector.affinity == TERMS


def test_gpu_templates_of_different_affinities_keep_none() -> None:
    """One selector stands for all of a workload's GPU pods: when its templates' affinities differ none is kept (as
    only the labels all templates share are), never stricter than the scheduler for any of its pods."""
    from autoscaler.adapters.kubernetes.reader import _gpu_pods_place

    same = [{"affinity": OFF_SPOT}, {"affinity": copy.deepcopy(OFF_SPOT)}]
    selector, _ = _gpu_pods_place(same)
    assert isinstance(selector, NodeSelector) and selector.affinity == TERMS
    differ = [{"affinity": OFF_SPOT}, {}]
    selector, _ = _gpu_pods_place(differ)
    assert type(selector) is dict
