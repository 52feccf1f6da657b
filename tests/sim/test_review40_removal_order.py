"""The ReplicaSet's scale-down order, as the core predicts it and as the simulated cluster applies it (stop 40).

The core's contended hold asks how many of a service's replicas a scale-down must remove before a node has room for
the waiting training (``core.cluster.hole_for_waiting_work``); the answer depends on which pods the ReplicaSet deletes
(``ActivePodsWithRanks``: unscheduled, not ready, doubled up on a crowded node, latest ready, newest). Until stop 40
the core assumed the scale-down could take every replica from the node where a hole opens soonest, and the simulator
deleted the newest replicas wherever they ran; both now follow the ReplicaSet. These seeded random walks pin that the
two agree pod for pod, and that the hole the core predicts is the one the simulated scale-down opens.
"""

from __future__ import annotations

import copy
import random

import pytest

from autoscaler.core.cluster import NodeRoom, WaitingGpuWork, hole_for_waiting_work, node_room, replica_removal_order
from autoscaler.sim.cluster import Scoring, SimCluster, SimDeployment


def _walk(seed: int) -> tuple[SimCluster, random.Random]:
    rng = random.Random(seed)
    cluster = SimCluster(rng.choice(list(Scoring)))
    for i in range(rng.randint(2, 5)):
        cluster.add_node(f"n{i}", rng.choice((4, 8)))
    gpus = rng.choice((1, 2))
    cluster.add_deployment(SimDeployment("ml", "chat", rng.randint(1, 4), gpus, rng.choice((0.0, 30.0, 90.0))))
    now = 0.0
    for _ in range(rng.randint(3, 12)):
        now += rng.choice((5.0, 20.0, 60.0, 200.0))
        cluster.advance(now)
        cluster.scale_deployment("ml", "chat", rng.randint(1, 14))
    now += rng.choice((0.0, 10.0, 100.0))
    cluster.advance(now)
    return cluster, rng


@pytest.mark.parametrize("seed", range(60))
def test_the_core_predicts_the_pods_a_simulated_scale_down_deletes(seed: int) -> None:
    cluster, rng = _walk(seed)
    snapshot = cluster.snapshot(cluster.now)
    pods = [p for p in snapshot.pods if p.owner_name == "chat"]
    keep = rng.randint(0, len(pods))
    predicted = {p.name for p in replica_removal_order(pods)[: len(pods) - keep]}
    cluster.scale_deployment("ml", "chat", keep)
    left = {name for (_, name), p in cluster.pods.items() if p.owner == "ml/chat"}
    # new pods replace nothing on a scale-down: what is left is what was not predicted to go
    assert {p.name for p in pods} - left == predicted, seed


def _largest_free(room: NodeRoom) -> int:
    return max(room.free.values(), default=0)


@pytest.mark.parametrize("seed", range(60))
def test_the_hole_the_core_predicts_is_the_one_the_simulated_scale_down_opens(seed: int) -> None:
    cluster, rng = _walk(seed)
    snapshot = cluster.snapshot(cluster.now)
    room = node_room(snapshot)
    replicas = sum(1 for p in snapshot.pods if p.owner_name == "chat")
    size = rng.randint(_largest_free(room) + 1, 9)
    hole = hole_for_waiting_work(room, "ml/chat", [WaitingGpuWork(0, size)])
    if hole is None:
        # no scale-down opens one: even with every replica gone, no node has room for the waiting pod
        cluster.scale_deployment("ml", "chat", 0)
        assert all(cluster.free_gpus(n) < size for n in cluster.nodes), seed
        return
    removed, waiting = hole
    assert waiting == size
    before = _free_after_scale_down(cluster, replicas - (removed - 1))
    assert max(before.values()) < size, (seed, removed, before)
    after = _free_after_scale_down(cluster, replicas - removed)
    assert max(after.values()) >= size, (seed, removed, after)


def _free_after_scale_down(cluster: SimCluster, replicas: int) -> dict[str, int]:
    """The free GPUs per node once the Deployment is scaled down to ``replicas`` (on a copy: the cluster itself is
    left as it was)."""
    trial = copy.deepcopy(cluster)
    trial.scale_deployment("ml", "chat", replicas)
    return {n: trial.free_gpus(n) for n in trial.nodes}
