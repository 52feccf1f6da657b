"""The rebalancer and the required pod anti-affinity of pods no Deployment owns (review 50's found-not-fixed item).

A training pod (moved with its gang, or waiting for room) is placed by kube-scheduler's InterPodAffinity filter like
any pod: not where a pod its own required terms select runs, nor beside a pod whose terms (or Deployment template)
select it, and a gang whose workers keep one per node is not two workers on one node. Until stop 50 the rebalancer
checked anti-affinity for Deployment replicas only: it could move a gang onto a node the scheduler refuses (its pods
Pending, its work restarted for nothing) or make room for a waiting gang where its pods may not go.
"""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.cluster import (
    HOSTNAME_LABEL,
    ClusterSnapshot,
    NodeInfo,
    PodAntiAffinityTerm,
    PodInfo,
    pod_anti_affinity_barred,
)
from autoscaler.core.rebalance import RebalanceConfig, _Cluster
from tests.core.test_pod_anti_affinity import APP, NOW, PLAIN, _node, _replica

AWAY_FROM_CHAT = PodAntiAffinityTerm(APP, HOSTNAME_LABEL, frozenset({"inference"}))
TRAINING = {"role": "training"}
AWAY_FROM_TRAINING = PodAntiAffinityTerm(TRAINING, HOSTNAME_LABEL, frozenset({"ml"}))
WORKERS_APART = PodAntiAffinityTerm({"job": "t"}, HOSTNAME_LABEL, frozenset({"ml"}))


def _worker(index: int, node: str | None, terms: tuple[PodAntiAffinityTerm, ...] | None = ()) -> PodInfo:
    """Worker ``index`` of the training gang "t" (1 GPU, namespace ml), with its own terms as read."""
    return PodInfo(
        "ml", f"t-{index}", node, 1, 100, "Running" if node else "Pending", node is not None, "Job", "t",
        gang="job/ml/t", labels={**TRAINING, "job": "t"}, anti_affinity=terms, created_at=NOW - 3600,
    )  # fmt: skip


def _cluster(*pods: PodInfo, nodes: tuple[NodeInfo, ...] | None = None) -> _Cluster:
    nodes = nodes or (_node("n1", "a"), _node("n2", "a"), _node("n3", "b"))
    return _Cluster(ClusterSnapshot(NOW, deployments=(PLAIN,), pods=pods, nodes=nodes), RebalanceConfig())


def test_a_training_pods_own_terms_keep_it_off_the_node_of_a_pod_they_select() -> None:
    worker = _worker(0, "n2", (AWAY_FROM_CHAT,))
    cluster = _cluster(_replica(0, "n1"), worker)
    assert not cluster.allowed("n1", None, True, [worker])
    assert cluster.allowed("n3", None, True, [worker])
    plain = replace(worker, anti_affinity=())
    assert _cluster(_replica(0, "n1"), plain).allowed("n1", None, True, [plain]), "sanity: without its terms"


def test_a_running_pod_keeping_training_away_keeps_the_training_pod_off() -> None:
    worker = _worker(0, "n2")
    # chat's replica read with its own terms
    chat = replace(_replica(0, "n1"), labels=APP, anti_affinity=(AWAY_FROM_TRAINING,))
    assert not _cluster(chat, worker).allowed("n1", None, True, [worker])
    # ... or read without them (None), its Deployment's template keeping training away
    template = replace(PLAIN, anti_affinity=(AWAY_FROM_TRAINING,))
    snapshot = ClusterSnapshot(
        NOW, deployments=(template,), pods=(_replica(0, "n1"), worker), nodes=(_node("n1"), _node("n3", "b"))
    )
    cluster = _Cluster(snapshot, RebalanceConfig())
    assert not cluster.allowed("n1", None, True, [worker])
    assert cluster.allowed("n3", None, True, [worker])


def test_a_moved_gangs_own_workers_do_not_keep_it_off_the_nodes_they_leave() -> None:
    workers = [_worker(0, "n1", (WORKERS_APART,)), _worker(1, "n2", (WORKERS_APART,))]
    cluster = _cluster(*workers)
    assert cluster.allowed("n1", None, True, [workers[0]])
    assert cluster.allowed("n2", None, True, [workers[0]])
    assert pod_anti_affinity_barred(workers[0], cluster._snapshot) == frozenset()


def test_a_waiting_gang_whose_workers_keep_apart_is_placed_one_per_node() -> None:
    workers = [_worker(0, None, (WORKERS_APART,)), _worker(1, None, (WORKERS_APART,))]
    cluster = _cluster(*workers)
    free = {"n1": 8, "n2": 0, "n3": 0}
    assert cluster.place(dict(free), [1, 1], None, True, pods=workers) is None, "one node with room: not both there"
    free = {"n1": 8, "n2": 8, "n3": 0}
    placed = cluster.place(free, [1, 1], None, True, pods=workers)
    assert placed == {"n1": 1, "n2": 1}
    # without the terms, best fit puts both on one node
    plain = [replace(w, anti_affinity=()) for w in workers]
    assert _cluster(*plain).place({"n1": 8, "n2": 0, "n3": 0}, [1, 1], None, True, pods=plain) == {"n1": 2}


def test_a_pod_expected_to_land_keeps_a_training_pod_off_its_node() -> None:
    worker = _worker(0, "n2", (AWAY_FROM_CHAT,))
    cluster = _cluster(_replica(0, "n1"), worker)
    assert cluster.allowed("n3", None, True, [worker])
    cluster.lands([_replica(1, None)], ["n3"])
    assert not cluster.allowed("n3", None, True, [worker])
    # and a landing pod whose own terms keep training away
    other = _cluster(_replica(0, "n1"), _worker(0, "n2"))
    assert other.allowed("n3", None, True, [_worker(0, "n2")])
    other.lands([replace(_replica(2, None), anti_affinity=(AWAY_FROM_TRAINING,))], ["n3"])
    assert not other.allowed("n3", None, True, [_worker(0, "n2")])


def test_no_terms_anywhere_changes_nothing() -> None:
    worker = _worker(0, "n2", ())
    cluster = _cluster(_replica(0, "n1"), worker)
    assert not cluster._terms_anywhere
    assert all(cluster.allowed(n, None, True, [worker]) for n in ("n1", "n2", "n3"))
