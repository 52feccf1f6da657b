"""The simulated cluster behind the controller's ports (issue 11): placement by the scheduler's filter and score,
pod start after bind + cold start, booting nodes, pending pods placed when capacity frees."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.ports import EvictionOutcome
from autoscaler.sim.cluster import Scoring, SimCluster, SimDeployment, SimPool


def deployment(replicas: int, gpus: int = 1, cold_start_s: float = 90.0) -> SimDeployment:
    return SimDeployment("ml", "chat", replicas, gpus_per_replica=gpus, cold_start_s=cold_start_s)


def test_a_4_gpu_pod_is_never_placed_on_a_node_with_3_free_gpus() -> None:
    cluster = SimCluster()
    cluster.add_node("n0", 8)
    cluster.add_training_pod("train", "t0", 5, 10, gang="jobset/train/t", node="n0")  # 3 left on n0
    cluster.add_deployment(deployment(1, gpus=4))
    snap = cluster.snapshot(0.0)
    (replica,) = [p for p in snap.pods if p.owner_name == "chat"]
    assert replica.node is None and replica.phase == "Pending"
    cluster.add_node("n1", 4)
    snap = cluster.snapshot(1.0)
    (replica,) = [p for p in snap.pods if p.owner_name == "chat"]
    assert replica.node == "n1"


def test_a_booting_node_holds_no_pods_and_a_pod_is_ready_a_cold_start_after_bind() -> None:
    cluster = SimCluster()
    cluster.add_pool(SimPool("burst", gpus_per_node=8, gpu_product="H100", boot_s=300.0))
    cluster.add_deployment(deployment(2, cold_start_s=90.0))
    cluster.scale("burst", 1)
    for t in (0.0, 100.0, 299.0):
        snap = cluster.snapshot(t)
        assert all(p.node is None for p in snap.pods), t
        assert [n.ready for n in snap.nodes] == [False]
    snap = cluster.snapshot(300.0)
    assert {p.node for p in snap.pods} == {"burst-0"}
    assert snap.deployments[0].ready_replicas == 0
    assert cluster.snapshot(389.0).deployments[0].ready_replicas == 0
    assert cluster.snapshot(390.0).deployments[0].ready_replicas == 2


def test_pending_pods_are_placed_when_capacity_frees() -> None:
    cluster = SimCluster()
    cluster.add_node("n0", 8)
    cluster.add_training_pod("train", "w0", 4, 10, gang="jobset/train/big", node="n0")
    cluster.add_training_pod("train", "w1", 4, 10, gang="jobset/train/big", node="n0")
    cluster.add_deployment(deployment(2, gpus=2))
    assert all(p.node is None for p in cluster.snapshot(0.0).pods if p.owner_name)
    cluster.advance(15.0)
    cluster.suspend_workload("JobSet", "train", "big")
    snap = cluster.snapshot(15.0)
    assert [p.node for p in snap.pods] == ["n0", "n0"]
    assert cluster.lost_training_gpu_s == 8 * 15.0  # both workers ran from t=0 without a checkpoint


def test_scoring_spreads_by_default_and_bin_packs_with_most_allocated() -> None:
    for scoring, expected in ((Scoring.LEAST_ALLOCATED, {"a", "b"}), (Scoring.MOST_ALLOCATED, {"a"})):
        cluster = SimCluster(scoring)
        cluster.add_node("a", 8)
        cluster.add_node("b", 8)
        cluster.add_deployment(deployment(2))
        assert {p.node for p in cluster.snapshot(0.0).pods} == expected, scoring


def test_scale_down_removes_pending_then_not_ready_then_newest() -> None:
    cluster = SimCluster()
    cluster.add_node("n0", 2)
    cluster.add_deployment(deployment(2, cold_start_s=10.0))
    cluster.advance(20.0)  # both ready
    cluster.scale_deployment("ml", "chat", 4)  # two more: pending (no room)
    cluster.scale_deployment("ml", "chat", 2)
    snap = cluster.snapshot(20.0)
    assert len(snap.pods) == 2 and all(p.ready for p in snap.pods)


def test_an_evicted_replica_is_replaced_and_a_missing_pod_is_gone() -> None:
    cluster = SimCluster()
    cluster.add_node("n0", 2)
    cluster.add_deployment(deployment(1))
    (pod,) = cluster.snapshot(0.0).pods
    assert cluster.evict_pod("ml", pod.name) is EvictionOutcome.EVICTED
    (again,) = cluster.snapshot(1.0).pods
    assert again.name != pod.name and again.node == "n0"
    assert cluster.evict_pod("ml", pod.name) is EvictionOutcome.GONE


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 8), min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 10)), max_size=12),
    st.sampled_from(list(Scoring)),
)
def test_no_node_is_ever_over_committed(
    node_sizes: list[int], requests: list[tuple[int, int]], scoring: Scoring
) -> None:
    cluster = SimCluster(scoring)
    for i, gpus in enumerate(node_sizes):
        cluster.add_node(f"n{i}", gpus)
    for i, (gpus, priority) in enumerate(requests):
        cluster.add_deployment(SimDeployment("ml", f"s{i}", 1, gpus_per_replica=gpus, priority=priority))
    snap = cluster.snapshot(0.0)
    for node in snap.nodes:
        assert sum(p.gpus for p in snap.pods if p.node == node.name) <= node.allocatable_gpus
    # and nothing that fits is left pending: a pending pod is larger than every node's free GPUs
    free = {n.name: n.allocatable_gpus - sum(p.gpus for p in snap.pods if p.node == n.name) for n in snap.nodes}
    for pod in snap.pods:
        if pod.node is None:
            assert all(pod.gpus > f for f in free.values())


def test_the_scenario_chooses_the_simulated_schedulers_gpu_scoring(make_scenario: Any) -> None:
    from autoscaler.sim.run import run_scenario
    from autoscaler.sim.scenario import load_scenario

    used = {}
    for scoring in ("LeastAllocated", "MostAllocated"):
        scenario, base = load_scenario(make_scenario([20.0] * 10, step_s=60.0, gpuScoring=scoring))
        result = run_scenario(scenario, base, policy_names=("static",))
        cluster = result.runs["static"].cluster
        assert cluster is not None and cluster.scoring.value == scoring
        # 2 fixed nodes of 8 GPUs: spread puts replicas on both nodes, bin-packing fills one first
        used[scoring] = sum(1 for node in cluster.nodes if cluster.free_gpus(node) < cluster.nodes[node].gpus)
    assert used == {"LeastAllocated": 2, "MostAllocated": 1}
