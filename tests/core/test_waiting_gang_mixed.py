"""A pending gang whose pods differ in where they may go (``core.cluster.waiting_for_room``).

A training gang often has pods of two kinds -- a launcher or parameter server beside its workers, pods of two
GPU sizes, workers pinned by nodeSelector to one pool and a master to another. The waiting work lists each pending
pod as an entry of its own, with its own spec; the gang starts only when every pod (or the pods its minAvailable
needs) finds a node its own spec allows. Judged on its first entry's spec for every pod (until stop 49), a gang
whose master selects pool a and whose workers select pool b was counted as starting on pool a's free GPUs alone
(so a hole a scale-down could open for it was not held for), and one whose pods fit their own pools was counted as
waiting for a hole it does not need.
"""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, waiting_for_room, waiting_gpu_work


def _node(name: str, pool: str) -> NodeInfo:
    return NodeInfo(name, 8, "A100", None, True, labels={"pool": pool})


def _busy(node: str, gpus: int) -> PodInfo:
    return PodInfo("ml", f"busy-{node}", node, gpus, 5000, "Running", True, "Job", f"busy-{node}")


def _gang_pod(name: str, gpus: int, pool: str, gang: str = "job/ml/g") -> PodInfo:
    return PodInfo("ml", name, None, gpus, 100, "Pending", False, "Job", "g", gang=gang, node_selector={"pool": pool})


def _waits(pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...]) -> list[str]:
    """The gang ids of the waiting entries that wait for room, in their order."""
    snapshot = ClusterSnapshot(0.0, pods=pods, nodes=nodes)
    waiting = waiting_gpu_work(snapshot)
    assert waiting, "the case must have waiting work"
    return [f"{w.gpus}@{w.node_selector.get('pool')}" for w in waiting_for_room(waiting, snapshot)]


def test_a_gang_whose_pods_fit_their_own_pools_does_not_wait() -> None:
    """Master (8 GPUs) on pool a, worker (8) on pool b, one free 8-GPU node in each: it starts as things are."""
    nodes = (_node("a1", "a"), _node("b1", "b"))
    pods = (_gang_pod("master", 8, "a"), _gang_pod("worker", 8, "b"))
    assert _waits(pods, nodes) == []


def test_a_gang_whose_worker_has_no_room_in_its_pool_waits() -> None:
    """Pool a has 16 free GPUs, pool b none: the worker cannot start, so the whole gang waits (judged on the
    master's selector, both pods fitted pool a and it was said to start)."""
    nodes = (_node("a1", "a"), _node("a2", "a"), _node("b1", "b"))
    pods = (_gang_pod("master", 8, "a"), _gang_pod("worker", 8, "b"), _busy("b1", 8))
    assert _waits(pods, nodes) == ["8@a", "8@b"]


def test_pods_of_two_sizes_are_placed_each_with_its_own_size_and_spec() -> None:
    """A 2-GPU master on pool a and two 4-GPU workers on pool b; b's node has 4 free: one worker waits, so the
    gang waits; with 8 free on b it starts."""
    nodes = (_node("a1", "a"), _node("b1", "b"))
    gang = (_gang_pod("master", 2, "a"), _gang_pod("w0", 4, "b"), _gang_pod("w1", 4, "b"))
    assert _waits((*gang, _busy("b1", 4)), nodes) == ["2@a", "4@b", "4@b"]
    assert _waits(gang, nodes) == []


def test_the_room_a_mixed_gang_takes_is_gone_for_the_work_after_it() -> None:
    """The gang (priority 100) starts on a1 and b1; a lower-priority pod for pool b then finds no room and waits."""
    nodes = (_node("a1", "a"), _node("b1", "b"))
    gang = (_gang_pod("master", 8, "a"), _gang_pod("worker", 8, "b"))
    late = replace(_gang_pod("late", 4, "b"), gang=None, priority=10)
    assert _waits((*gang, late), nodes) == ["4@b"]


def test_a_gang_listed_in_part_is_judged_on_its_first_entry_as_before() -> None:
    """Only the master's entry passed in (a caller's subset): its template stands for every pod, as before."""
    nodes = (_node("a1", "a"), _node("a2", "a"), _node("b1", "b"))
    pods = (_gang_pod("master", 8, "a"), _gang_pod("worker", 8, "b"), _busy("b1", 8))
    snapshot = ClusterSnapshot(0.0, pods=pods, nodes=nodes)
    master = [w for w in waiting_gpu_work(snapshot) if w.node_selector.get("pool") == "a"]
    assert waiting_for_room(master, snapshot) == []
