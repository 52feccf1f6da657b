"""The symmetric check on a running pod's *own* required anti-affinity (stop 50), whoever owns the pod.

kube-scheduler's InterPodAffinity filter keeps a new pod off the domains of every running pod whose own required
anti-affinity selects it -- a StatefulSet's pod, a Job's, a bare pod, read from the pod's spec. Until stop 50 the
controller read those terms from Deployment templates only: a serving StatefulSet (or a training pod) keeping away
from chat's replicas was invisible, so the victim search could stop the gang beside it, freeing GPUs the replica
may not take. ``PodInfo.anti_affinity`` is the pod's own terms as read (None: not read, the template's then count).
"""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.cluster import (
    ClusterSnapshot,
    PodAntiAffinityTerm,
    PodInfo,
    WorkloadInfo,
    anti_affinity_barred,
    pods_with_own_anti_affinity,
)
from tests.core.test_pod_anti_affinity import (
    AWAY_FROM_CODE,
    CODE,
    CODE_LABELS,
    CODE_POLICY,
    NOW,
    PLAIN,
    _gang,
    _node,
    _replica,
    _snapshot,
    stopped_for,
)


def _stateful(node: str, terms: tuple[PodAntiAffinityTerm, ...] | None) -> PodInfo:
    """A GPU pod of a StatefulSet ``embed`` on ``node``, with its own terms as read."""
    return replace(
        _replica(7, node), name="embed-0", owner_kind="StatefulSet", owner_name="embed", labels={"app": "embed"},
        anti_affinity=terms,
    )  # fmt: skip


def test_a_pod_of_another_owner_keeps_the_replica_off_with_its_own_terms() -> None:
    snapshot = replace(_snapshot(_stateful("n1", (AWAY_FROM_CODE,))), deployments=(PLAIN, CODE))
    assert anti_affinity_barred(CODE, snapshot) == {"n1"}
    by_zone = _stateful("n1", (replace(AWAY_FROM_CODE, topology_key="zone"),))
    assert anti_affinity_barred(CODE, replace(snapshot, pods=(by_zone,))) == {"n1", "n2"}
    assert anti_affinity_barred(CODE, replace(snapshot, pods=(by_zone,)), wide_only=True) == {"n1", "n2"}
    assert anti_affinity_barred(CODE, snapshot, wide_only=True) == set(), "a per-host term is not a wide one"
    # terms that select other pods, or none read, keep nothing
    other = replace(AWAY_FROM_CODE, selector={"app": "chat"})
    assert anti_affinity_barred(CODE, replace(snapshot, pods=(_stateful("n1", (other,)),))) == set()
    assert anti_affinity_barred(CODE, replace(snapshot, pods=(_stateful("n1", None),))) == set()
    assert anti_affinity_barred(CODE, replace(snapshot, pods=(_stateful("n1", ()),))) == set()
    # a finished pod keeps nothing; a terminating one until it is gone
    done = replace(_stateful("n1", (AWAY_FROM_CODE,)), phase="Succeeded")
    assert anti_affinity_barred(CODE, replace(snapshot, pods=(done,))) == set()
    leaving = replace(_stateful("n1", (AWAY_FROM_CODE,)), terminating=True)
    assert anti_affinity_barred(CODE, replace(snapshot, pods=(leaving,))) == {"n1"}


def test_a_deployment_pods_own_terms_rule_over_its_template() -> None:
    """The pod runs with the spec it was created from: during a rollout the template may differ. Read terms are the
    pod's; a pod read without them (None) is judged by its template, as before."""
    chat = replace(PLAIN, anti_affinity=(AWAY_FROM_CODE,))
    read_without = replace(_replica(0, "n1"), anti_affinity=())
    assert anti_affinity_barred(CODE, replace(_snapshot(read_without), deployments=(chat, CODE))) == set()
    not_read = _replica(0, "n1")
    assert anti_affinity_barred(CODE, replace(_snapshot(not_read), deployments=(chat, CODE))) == {"n1"}
    read_with = replace(_replica(0, "n1"), anti_affinity=(AWAY_FROM_CODE,))
    assert anti_affinity_barred(CODE, replace(_snapshot(read_with), deployments=(PLAIN, CODE))) == {"n1"}


def test_no_gang_is_stopped_beside_a_statefulset_pod_that_keeps_the_replica_away() -> None:
    nodes = (_node("n1"), _node("n2"))
    guard = _stateful("n1", (AWAY_FROM_CODE,))
    pods = (guard, _gang("cheap", "n1", 7, 60.0), _gang("dear", "n2", 8, 3000.0))
    jobs = tuple(
        WorkloadInfo("Job", "ml", name, f"job/ml/{name}", False, 100, (gpus,), None, None)
        for name, gpus in (("cheap", 7), ("dear", 8))
    )

    def stopped(pods_now: tuple[PodInfo, ...]) -> set[str]:
        snapshot = ClusterSnapshot(NOW, deployments=(PLAIN, CODE), pods=pods_now, nodes=nodes, workloads=jobs)
        return stopped_for(snapshot, (CODE_POLICY, 0, 1))

    assert stopped((replace(guard, anti_affinity=()), *pods[1:])) == {"cheap"}, "sanity: the pod keeps nothing"
    assert stopped(pods) == {"dear"}


def test_the_rebalancer_keeps_a_replica_off_a_pod_of_another_owner_and_where_one_lands() -> None:
    from autoscaler.core.rebalance import RebalanceConfig, _Cluster

    code_pod = replace(_replica(5, "n2"), owner_name="code", labels=CODE_LABELS)
    snapshot = replace(_snapshot(_stateful("n1", (AWAY_FROM_CODE,)), code_pod), deployments=(PLAIN, CODE))
    cluster = _Cluster(snapshot, RebalanceConfig())
    assert not cluster.allowed("n1", None, False, [code_pod])
    assert cluster.allowed("n3", None, False, [code_pod])
    # a waiting pod of another owner, keeping away from code, expected on n3: code may not be moved there now
    waiting = replace(_stateful("n1", (AWAY_FROM_CODE,)), name="embed-1", node=None, phase="Pending")
    cluster.lands([waiting], ["n3"])
    assert not cluster.allowed("n3", None, False, [code_pod])


def test_the_pods_with_terms_are_found_once_per_snapshot() -> None:
    pods = (_stateful("n1", (AWAY_FROM_CODE,)), _replica(0, "n2"), _stateful("n3", ()))
    first = pods_with_own_anti_affinity(pods)
    assert [p.name for p in first] == ["embed-0"]
    assert pods_with_own_anti_affinity(pods) is first, "the same pods: the same answer, not a new pass"
    other = (_replica(0, "n2"),)
    assert pods_with_own_anti_affinity(other) == ()
    # an equal but new tuple is a new snapshot's: looked at afresh
    again = tuple(list(pods))
    assert again is not pods
    assert pods_with_own_anti_affinity(again) == first


def test_interleaved_pod_tuples_are_each_remembered() -> None:
    """The arbitration alternates the snapshot's pods and the pods with this tick's counted replicas added."""
    first = (_stateful("n1", (AWAY_FROM_CODE,)),)
    second = (*first, _replica(0, "n2"))
    a, b = pods_with_own_anti_affinity(first), pods_with_own_anti_affinity(second)
    assert pods_with_own_anti_affinity(first) is a and pods_with_own_anti_affinity(second) is b
