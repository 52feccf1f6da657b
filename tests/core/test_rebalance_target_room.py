"""A waiting pod that fits as things are is not counted against the room the plan's moves expect to land in."""
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo
from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance

NOW = 1_000_000.0


def test_moves_do_not_expect_to_land_in_room_a_higher_priority_waiting_pod_takes() -> None:
    # n1 full; n2 holds only chat-1 (7 free); n3 has 4 free. Two pods wait: "urgent" (4 GPUs, priority 1000), which
    # fits n3 as things are, and an 8-GPU gang (priority 100) that needs n2 emptied. The plan moves chat-1 and expects
    # it on n3 -- the 4 GPUs "urgent" is about to take (the scheduler serves it first: higher priority). chat-1's
    # replacement then has nowhere to go but back to n2, and the gang still does not fit.
    nodes = tuple(NodeInfo(n, 8, "A100", "onprem", True) for n in ("n1", "n2", "n3"))

    def chat(i: int, node: str) -> PodInfo:
        return PodInfo("inf", f"chat-{i}", node, 1, 500, "Running", True, "Deployment", "chat", labels={"app": "chat"})

    pods = (
        PodInfo("ml", "fixed-0", "n1", 7, 100, "Running", True, "Job", "fixed", gang="job/ml/fixed"),
        chat(0, "n1"),
        chat(1, "n2"),
        PodInfo("ml", "half-0", "n3", 4, 100, "Running", True, "Job", "half", gang="job/ml/half"),
        PodInfo("inf", "urgent", None, 4, 1000, "Pending", False),
        PodInfo("ml", "wait-0", None, 8, 100, "Pending", False, "Job", "wait", gang="job/ml/wait"),
    )
    snapshot = ClusterSnapshot(NOW, deployments=(DeploymentInfo("inf", "chat", 2, 2, {"app": "chat"}),),
                               pods=pods, nodes=nodes)
    plan, _ = plan_rebalance(snapshot, NOW, RebalanceConfig(), RebalanceState())
    # after "urgent" takes n3's 4 GPUs nothing is left there
    assert all("n3" not in m.destinations for m in plan.moves), [(m.pods, dict(m.destinations)) for m in plan.moves]
