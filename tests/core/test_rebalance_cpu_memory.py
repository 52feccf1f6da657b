"""The rebalance planner counts CPU and memory beside the GPUs (``NodeInfo.free_beside_gpus``, the pods'
``cpu_milli``/``memory_bytes``), where the nodes say: a moved pod lands only where its CPU and memory fit too, a
waiting pod's home must hold its CPU and memory after the moves (units moved off give theirs back), and a waiting pod
that fits by GPUs on a node without its CPU is no pod that "fits as things are". Without CPU data (the simulator) the
plans are those of GPUs alone.

``test_rebalance``'s BASE: n1 holds a 4-GPU gang and chat-0 (3 free), n2 holds chat-1 alone (7 free), n3 a 6-GPU
gang (2 free); an 8-GPU gang waits. Moving chat-1 off n2 (onto n1 or n3) makes room for it."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.cluster import NodeInfo, PodInfo
from autoscaler.core.rebalance import RebalanceState, plan_rebalance
from tests.core.test_rebalance import BASE_NODES, BASE_PODS, CONFIG, NOW, evicted, gang, node, replica, snap

GI = 1 << 30


def _beside(nodes: list[NodeInfo], room: dict[str, tuple[int, int]]) -> list[NodeInfo]:
    return [replace(n, free_beside_gpus=room.get(n.name)) for n in nodes]


def _with_requests(pods: list[PodInfo], cpu: dict[str, int], memory: dict[str, int] | None = None) -> list[PodInfo]:
    memory = memory or {}
    return [replace(p, cpu_milli=cpu.get(p.name, 0), memory_bytes=memory.get(p.name, 0)) for p in pods]


def test_a_moved_replica_lands_only_where_its_cpu_fits() -> None:
    # chat-1 asks 8 CPUs; n1 has 4 left beside its 3 free GPUs, n3 has 16: it is expected on n3
    pods = _with_requests(BASE_PODS, {"chat-1": 8_000})
    nodes = _beside(BASE_NODES, {"n1": (4_000, 100 * GI), "n2": (40_000, 100 * GI), "n3": (16_000, 100 * GI)})
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]
    (move,) = plan.moves
    assert dict(move.destinations) == {"n3": 1}
    # without the CPU data it goes best fit by GPUs: onto n3 as well (2 free is fuller than 3); so make n3 short
    short = _beside(BASE_NODES, {"n1": (16_000, 100 * GI), "n2": (40_000, 100 * GI), "n3": (4_000, 100 * GI)})
    plan, _ = plan_rebalance(snap(short, pods), NOW, CONFIG, RebalanceState())
    (move,) = plan.moves
    assert dict(move.destinations) == {"n1": 1}
    blind, _ = plan_rebalance(snap(BASE_NODES, pods), NOW, CONFIG, RebalanceState())
    assert dict(blind.moves[0].destinations) == {"n3": 1}


def test_no_move_when_no_node_has_the_cpu_for_the_moved_replica() -> None:
    pods = _with_requests(BASE_PODS, {"chat-1": 8_000})
    nodes = _beside(BASE_NODES, {"n1": (4_000, 100 * GI), "n2": (40_000, 100 * GI), "n3": (4_000, 100 * GI)})
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
    assert any("job/ml/wait" in n and "no bounded set" in n for n in plan.notes), plan.notes


def test_the_waiting_pod_needs_its_cpu_on_its_home() -> None:
    # the waiting gang asks 32 CPUs; n2 has 20 beside chat-1, whose 4 come back when it moves: 24 < 32, no home
    pods = _with_requests(BASE_PODS, {"chat-1": 4_000, "wait-0": 32_000})
    nodes = _beside(BASE_NODES, {"n1": (64_000, 100 * GI), "n2": (20_000, 100 * GI), "n3": (64_000, 100 * GI)})
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
    # with 28 free beside chat-1 its 4 make the 32
    roomy = _beside(BASE_NODES, {"n1": (64_000, 100 * GI), "n2": (28_000, 100 * GI), "n3": (64_000, 100 * GI)})
    plan, _ = plan_rebalance(snap(roomy, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]


def test_a_waiting_pod_whose_gpus_fit_where_its_cpu_does_not_is_moved_for() -> None:
    # an 8-GPU node n4 is empty of GPU pods but a CPU-only pod holds its CPU: the waiting gang does not "fit as
    # things are" there; moving chat-1 off n2 makes it room
    nodes = _beside([*BASE_NODES, node("n4")], {"n2": (40_000, 100 * GI), "n4": (1_000, 100 * GI)})
    pods = _with_requests(BASE_PODS, {"wait-0": 16_000})
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]
    # with n4's CPU free, it fits there: nothing to move
    free_n4 = _beside([*BASE_NODES, node("n4")], {"n2": (40_000, 100 * GI), "n4": (64_000, 100 * GI)})
    plan, _ = plan_rebalance(snap(free_n4, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []


def test_a_replica_is_moved_for_its_cpu_when_the_gpus_are_there() -> None:
    # n2: 7 free GPUs but chat-1's 30 CPUs leave 2; the waiting 4-GPU gang asks 8 CPUs: moving chat-1 (to n1)
    # gives them back. The other nodes have too few GPUs for the gang.
    nodes = [node("n1"), node("n2")]
    pods = [*gang("fixed", ["n1"], gpus=6), replica("chat", 0, "n1"), replica("chat", 1, "n2"), *gang("w", [None], 4)]
    pods = _with_requests(pods, {"chat-1": 30_000, "w-0": 8_000})
    room = _beside(nodes, {"n1": (64_000, 100 * GI), "n2": (2_000, 100 * GI)})
    plan, _ = plan_rebalance(snap(room, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]
    assert dict(plan.moves[0].destinations) == {"n1": 1}
    # without the CPU data the gang fits n2 as things are: nothing to move
    blind, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(blind) == []


def test_emptying_a_burst_node_needs_the_cpu_elsewhere() -> None:
    nodes = [node("n1"), node("b1", pool="burst")]
    pods = _with_requests([replica("chat", 0, "n1"), replica("chat", 1, "b1")], {"chat-1": 8_000})
    plan, _ = plan_rebalance(snap(_beside(nodes, {"n1": (64_000, GI)}), pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]
    plan, _ = plan_rebalance(snap(_beside(nodes, {"n1": (2_000, GI)}), pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
    assert any("b1" in n and "do not fit" in n for n in plan.notes), plan.notes


def test_terminating_pods_give_their_cpu_back() -> None:
    # n4 runs a terminating GPU pod holding 60 CPUs: once gone, the waiting gang's 16 fit there -- no move for it
    nodes = _beside([*BASE_NODES, node("n4")], {"n2": (40_000, 100 * GI), "n4": (4_000, 100 * GI)})
    leaving = replace(replica("old", 0, "n4", gpus=0, ready=False), terminating=True, cpu_milli=60_000, gpus=0)
    pods = [*_with_requests(BASE_PODS, {"wait-0": 16_000}), leaving]
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
    # not leaving, it keeps the CPU: the gang has no room on n4 and chat-1 is moved off n2 for it
    staying = replace(leaving, terminating=False, phase="Running")
    pods = [*_with_requests(BASE_PODS, {"wait-0": 16_000}), staying]
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]


def test_a_pod_being_deleted_is_never_moved_even_if_read_ready() -> None:
    """Review 44 noticed: the planner relied on the Kubernetes reader marking a terminating pod not ready. A snapshot
    that says ready and terminating (another reader, a fake) must not have the pod moved, nor its Deployment's other
    replica (the service is already losing one)."""
    pods = [replace(p, terminating=True) if p.name == "chat-0" else p for p in BASE_PODS]
    plan, _ = plan_rebalance(snap(BASE_NODES, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
    movable = gang("small", ["n2", "n2"], gpus=1, allowed=True, checkpoint_age=60.0)
    pods = [*gang("fixed", ["n1"], gpus=4), *gang("wait", [None]), *movable]
    plan, _ = plan_rebalance(snap([node("n1"), node("n2")], pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["ml/small-0", "ml/small-1"]
    leaving = [replace(p, terminating=True) if p.name == "small-1" else p for p in pods]
    plan, _ = plan_rebalance(snap([node("n1"), node("n2")], leaving), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
