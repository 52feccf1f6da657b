"""Burst-node draining in plan_rebalance claimed to empty nodes it could not empty (review findings)."""
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo
from autoscaler.core.rebalance import REBALANCE_LABEL, RebalanceConfig, RebalanceState, plan_rebalance

NOW = 1_000_000.0


def test_gang_spanning_nodes_masks_an_unmovable_pod_on_the_burst_node() -> None:
    # b1 (burst, 8 GPUs) holds one pod of a movable 2-pod gang and a bare pod (never movable); the gang's other pod
    # is on n1. 2 GPUs used < 4: an emptying candidate. The bare pod stays, so b1 can never be emptied this pass.
    config = RebalanceConfig(burst_pools=frozenset({"burst"}))
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), NodeInfo("b1", 8, "A100", "burst", True))
    allowed = {REBALANCE_LABEL: "allowed"}
    pods = (
        PodInfo("ml", "g-0", "b1", 1, 100, "Running", True, "Job", "g", gang="job/ml/g",
                last_checkpoint_at=NOW - 60, labels=allowed),
        PodInfo("ml", "g-1", "n1", 1, 100, "Running", True, "Job", "g", gang="job/ml/g",
                last_checkpoint_at=NOW - 60, labels=allowed),
        PodInfo("inf", "bare", "b1", 1, 1000, "Running", True),  # a bare pod: not recreated, may not move
    )
    plan, _ = plan_rebalance(ClusterSnapshot(NOW, pods=pods, nodes=nodes), NOW, config, RebalanceState())
    left_on_b1 = {p.name for p in pods if p.node == "b1"} - {name for _, name in
                                                              ((a.namespace, a.name) for a in plan.actions)}
    # a move "for burst node b1" is only worth its disruption if b1 ends up empty
    assert not any(m.target == "burst node b1" for m in plan.moves), (
        f"moved {[a.name for a in plan.actions]} to 'empty' b1, yet {sorted(left_on_b1)} stays on it"
    )


def test_a_node_emptied_in_the_same_pass_is_not_a_destination_of_another_move() -> None:
    # An 8-GPU gang waits; moving d1-1 off n2 makes room. d1 (A100-only) can only land on the A100 burst node b1,
    # which holds d2-0 (1 GPU) and is then under half used: the burst step "empties" b1 by moving d2-0 to h1 --
    # while the plan's own first move lands d1-1 on b1. b1 is not emptied; d2-0's eviction buys nothing.
    config = RebalanceConfig(burst_pools=frozenset({"burst"}), training_excluded_pools=frozenset({"burst"}))
    nodes = (
        NodeInfo("n1", 8, "A100", "onprem", True),
        NodeInfo("n2", 8, "A100", "onprem", True),
        NodeInfo("h1", 8, "H100", "onprem", True),
        NodeInfo("b1", 8, "A100", "burst", True),
    )

    def rep(dep: str, i: int, node: str) -> PodInfo:
        return PodInfo("inf", f"{dep}-{i}", node, 1, 1000, "Running", True, "Deployment", dep, labels={"app": dep})

    pods = (
        PodInfo("ml", "fixed-0", "n1", 6, 100, "Running", True, "Job", "fixed", gang="job/ml/fixed"),
        rep("d1", 0, "n1"),
        rep("d1", 1, "n2"),
        rep("d2", 0, "b1"),
        rep("d2", 1, "n1"),
        PodInfo("ml", "h-0", "h1", 7, 100, "Running", True, "Job", "h", gang="job/ml/h"),
        PodInfo("ml", "wait-0", None, 8, 100, "Pending", False, "Job", "wait", gang="job/ml/wait",
                gpu_product="A100"),
    )
    deps = (
        DeploymentInfo("inf", "d1", 2, 2, {"app": "d1"}, gpu_product="A100"),
        DeploymentInfo("inf", "d2", 2, 2, {"app": "d2"}),
    )
    snapshot = ClusterSnapshot(NOW, deployments=deps, pods=pods, nodes=nodes)
    plan, _ = plan_rebalance(snapshot, NOW, config, RebalanceState())
    emptied = {m.target.removeprefix("burst node ") for m in plan.moves if m.target.startswith("burst node ")}
    landing = {n for m in plan.moves for n in m.destinations}
    assert not (emptied & landing), [(m.pods, m.target, dict(m.destinations)) for m in plan.moves]


def test_a_move_names_the_pod_it_read_by_uid() -> None:
    config = RebalanceConfig(burst_pools=frozenset({"burst"}))
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), NodeInfo("b1", 8, "A100", "burst", True))
    pods = tuple(
        PodInfo("inf", f"d-{i}", node, 1, 1000, "Running", True, "Deployment", "d", labels={"app": "d"}, uid=f"u{i}")
        for i, node in enumerate(("n1", "n1", "b1"))
    )
    deps = (DeploymentInfo("inf", "d", 3, 3, {"app": "d"}),)
    plan, _ = plan_rebalance(ClusterSnapshot(NOW, deployments=deps, pods=pods, nodes=nodes), NOW, config,
                             RebalanceState(), managed={"inf/d"})  # fmt: skip
    assert [(a.name, a.uid) for a in plan.actions] == [("d-2", "u2")], plan.notes
