"""The ReplicaSet's scale-down order honours ``controller.kubernetes.io/pod-deletion-cost`` (``ActivePodsWithRanks``
step 4: after unscheduled / phase / not ready, before doubled up) and, after the ready time, the restart counts
(step 7). A cost somebody set (a person, another tool) decides which GPUs a scale-down frees: the contended hold's
hole prediction (``hole_for_waiting_work``) must read it. The reader parses the annotation as the ReplicaSet controller
does (``GetDeletionCostFromPodAnnotations``)."""

from __future__ import annotations

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes.reader import POD_DELETION_COST_ANNOTATION, deletion_cost
from autoscaler.core.cluster import (
    ClusterSnapshot,
    NodeInfo,
    PodInfo,
    WaitingGpuWork,
    hole_for_waiting_work,
    node_room,
    replica_removal_order,
)
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def _pod(name: str, node: str | None = "n0", **kw: object) -> PodInfo:
    kw.setdefault("ready", True)
    kw.setdefault("phase", "Running")
    kw.setdefault("ready_at", 100.0)
    return PodInfo("ml", name, node, 1, 1000, owner_kind="Deployment", owner_name="chat", created_at=10.0,
                   **kw)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "first"),
    [
        # the cost beats doubled up: a lone pod of cost -5 goes before the three crowded on n0
        ([_pod("a"), _pod("b"), _pod("c"), _pod("d", node="n1", deletion_cost=-5)], "d"),
        # a higher cost protects a pod that would otherwise go first (doubled up)
        ([_pod("a", deletion_cost=100), _pod("b", deletion_cost=100), _pod("c", node="n1")], "c"),
        # not ready still goes before any cost
        ([_pod("a", deletion_cost=-100), _pod("b", ready=False, ready_at=None, deletion_cost=50)], "b"),
        # unscheduled before scheduled whatever the cost
        ([_pod("a", deletion_cost=-100), _pod("b", node=None, phase="Pending", ready=False, ready_at=None)], "b"),
        # between two not-ready pods the cost decides (upstream compares it for any pair past step 3)
        ([_pod("a", ready=False, ready_at=None, deletion_cost=3), _pod("b", ready=False, ready_at=None)], "b"),
        # equal cost, placement and ready time: more restarts first
        ([_pod("a"), _pod("b", restarts=2)], "b"),
        # without any cost: doubled up first, as before
        ([_pod("a", node="n1"), _pod("b"), _pod("c")], "c"),
    ],
)
def test_the_removal_order_reads_the_deletion_cost(pods: list[PodInfo], first: str) -> None:
    assert replica_removal_order(pods)[0].name == first


def test_the_hole_prediction_follows_the_cost() -> None:
    """4 replicas on n0 (full, 4 GPUs) and 1 on n1 (4 GPUs, 3 free); a 4-GPU job waits. Without a cost the
    ReplicaSet takes a doubled-up replica from n0 first: a whole node frees only after 4 removals. With the lone
    replica on n1 costed lowest, one removal opens n1."""
    nodes = (NodeInfo("n0", 4, "A100", "p", True), NodeInfo("n1", 4, "A100", "p", True))
    waiting = [WaitingGpuWork(0, 4, "A100")]

    def hole(cost: int) -> tuple[int, int] | None:
        pods = (*(_pod(f"r{i}") for i in range(4)), _pod("lone", node="n1", deletion_cost=cost))
        return hole_for_waiting_work(node_room(ClusterSnapshot(NOW, pods=pods, nodes=nodes)), "ml/chat", waiting)

    assert hole(0) == (4, 4)
    assert hole(-1) == (1, 4)


@pytest.mark.parametrize(
    ("value", "cost"),
    [("5", 5), ("-7", -7), ("0", 0), ("2147483647", 2**31 - 1), ("-2147483648", -(2**31)),
     ("+10", 0), ("008", 0), (" 5", 0), ("2147483648", 0), ("1e3", 0), ("", 0), (None, 0)],
)  # fmt: skip
def test_the_annotation_is_read_as_the_replicaset_controller_reads_it(value: str | None, cost: int) -> None:
    annotations = {} if value is None else {POD_DELETION_COST_ANNOTATION: value}
    assert deletion_cost(annotations) == cost


def test_the_reader_carries_the_cost(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    costed = o.deployment_pod("chat", 0, "inference", annotations={POD_DELETION_COST_ANNOTATION: "-10"})
    plain = o.deployment_pod("chat", 1, "inference")
    apiserver.seed(o.node("gpu-0"), o.deployment("chat", "inference"), costed, plain)
    snap = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    assert {p.name[-1]: p.deletion_cost for p in snap.pods} == {"0": -10, "1": 0}
