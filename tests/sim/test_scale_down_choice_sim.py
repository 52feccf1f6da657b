"""The simulated cluster honours the deletion-cost marks a scale-down's chooser writes (``SimCluster
.set_pod_deletion_cost``): its snapshot shows them, its ReplicaSet deletes the marked replicas first, as the real
ReplicaSet controller does, and the core's chosen order is the one the simulated scale-down then follows."""

from __future__ import annotations

import pytest

from autoscaler.core.cluster import (
    CHOSEN_DELETION_COST,
    DELETION_COST_BY_US,
    deployment_pods,
    node_room,
    waiting_gpu_work,
)
from autoscaler.core.model import ScaleDeployment, ServicePolicy, SetPodDeletionCost
from autoscaler.core.reasons import Reason
from autoscaler.core.scale_down_choice import choosing, mark_scale_downs
from autoscaler.ports import ChangedSinceRead, WriteOutcome
from autoscaler.sim.cluster import Scoring, SimCluster, SimDeployment, SimJob


def _cluster() -> SimCluster:
    cluster = SimCluster(Scoring.LEAST_ALLOCATED)
    for i in range(3):
        cluster.add_node(f"n{i}", 8)
    cluster.add_deployment(SimDeployment("ml", "chat", 9, 1, 30.0, priority=1000), warm=True)
    cluster.advance(100.0)
    return cluster


def _by_node(cluster: SimCluster) -> dict[str | None, list[str]]:
    out: dict[str | None, list[str]] = {}
    for (_, name), pod in sorted(cluster.pods.items()):
        if pod.owner == "ml/chat":
            out.setdefault(pod.node, []).append(name)
    return out


def test_the_snapshot_shows_a_mark_and_the_replicaset_deletes_it_first() -> None:
    cluster = _cluster()
    victim = _by_node(cluster)["n1"][0]
    assert cluster.set_pod_deletion_cost("ml", victim, CHOSEN_DELETION_COST) is WriteOutcome.WROTE
    assert cluster.set_pod_deletion_cost("ml", victim, CHOSEN_DELETION_COST) is WriteOutcome.ALREADY
    [info] = [p for p in cluster.snapshot(cluster.now).pods if p.name == victim]
    assert (info.deletion_cost, info.deletion_cost_by) == (CHOSEN_DELETION_COST, DELETION_COST_BY_US)
    cluster.scale_deployment("ml", "chat", 8)
    assert victim not in {name for names in _by_node(cluster).values() for name in names}
    assert cluster.set_pod_deletion_cost("ml", victim, None) is WriteOutcome.GONE


def test_a_cost_somebody_else_set_is_not_touched() -> None:
    cluster = _cluster()
    name = _by_node(cluster)["n0"][0]
    cluster.pods[("ml", name)].deletion_cost, cluster.pods[("ml", name)].deletion_cost_by = 4, ""
    with pytest.raises(ChangedSinceRead):
        cluster.set_pod_deletion_cost("ml", name, None)
    assert cluster.pods[("ml", name)].deletion_cost == 4


def test_the_chosen_replicas_are_the_ones_the_simulated_scale_down_deletes() -> None:
    """Spread 3/3/3 over three 8-GPU nodes, a 4-GPU gang on one of them (1 GPU free there) and an 8-GPU pod
    waiting: the chooser takes one of the two others (5 free each) whole; the simulated ReplicaSet deletes exactly
    those, and the hole opens for the waiting pod."""
    cluster = _cluster()
    cluster.add_job(SimJob("train", "small", 1, 4, 0, 3600.0, 600.0, 0.0))
    cluster.add_job(SimJob("train", "big", 1, 8, 0, 3600.0, 600.0, 0.0))
    cluster.advance(200.0)
    layout = _by_node(cluster)
    snapshot = cluster.snapshot(cluster.now)
    assert any(w.gpus == 8 for w in waiting_gpu_work(snapshot)), layout
    pods = deployment_pods(snapshot)
    policy = ServicePolicy("ml", "chat", priority=1000)
    chosen = choosing({"ml/chat": policy}, pods, waiting_gpu_work(snapshot))
    room = node_room(snapshot, chosen)
    scale = ScaleDeployment("ml", "chat", 6, 9, Reason.METRIC_BELOW_TARGET, "")
    actions = mark_scale_downs((scale,), pods, chosen, room.free)
    marked = [a.name for a in actions if isinstance(a, SetPodDeletionCost)]
    assert len(marked) == 3 and len({cluster.pods[("ml", n)].node for n in marked}) == 1  # one node, whole
    for name in marked:
        cluster.set_pod_deletion_cost("ml", name, CHOSEN_DELETION_COST)
    cluster.scale_deployment("ml", "chat", 6)
    left = {name for names in _by_node(cluster).values() for name in names}
    assert left.isdisjoint(marked) and len(left) == 6
    cluster.advance(cluster.now + 1.0)
    assert cluster.jobs["job/train/big"].admitted and any(
        p.node is not None for p in cluster.pods.values() if p.gang == "job/train/big"
    )
