"""A suspended workload's pods' own required anti-affinity, at its resume and in the waiting work (stop 52).

Until stop 51 a suspended workload carried its pods' GPUs, GPU type, nodeSelector and CPU and memory, but not their
labels or required pod anti-affinity terms: the capacity arbitration resumed a 2-pod gang whose workers keep one per
node onto one node's free GPUs (kube-scheduler binds one, the other waits Pending, and with it the gang), or onto a
node beside a pod its terms keep it away from; ``waiting_for_room`` judged a queued workload so bound to start on the
free GPUs (so not waiting for a hole). Now each of its pods is matched as a stand-in (``workload_pod``: its template's
labels and terms) against the running pods both ways (``pod_anti_affinity_barred``), and its pods whose terms select
each other are placed one per domain (``KeptApart``).
"""

from __future__ import annotations

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.cluster import (
    ClusterSnapshot,
    KeptApart,
    NodeInfo,
    PodAntiAffinityTerm,
    PodInfo,
    WorkloadInfo,
    waiting_for_room,
    waiting_gpu_work,
    workload_pod,
)
from autoscaler.core.model import CapacityState, ResumeWorkload, ScaleDecision, ServicePolicy
from autoscaler.core.reasons import Reason

NOW = 100_000.0
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
JOB_LABELS = {"batch.kubernetes.io/job-name": "paused", "team": "ml"}


def _apart(key: str = HOST) -> PodAntiAffinityTerm:
    """Its workers one per domain of ``key``: a term selecting its own pods."""
    return PodAntiAffinityTerm({"batch.kubernetes.io/job-name": "paused"}, key, frozenset({"ml"}))


def _away_from_chat() -> PodAntiAffinityTerm:
    return PodAntiAffinityTerm({"app": "chat"}, HOST, frozenset({"inference"}))


def _node(name: str, zone: str | None = None) -> NodeInfo:
    return NodeInfo(name, 8, "A100", "onprem", True, labels={ZONE: zone} if zone else {})


def _replicas(node: str, count: int) -> list[PodInfo]:
    return [
        PodInfo("inference", f"chat-{node}-{i}", node, 1, 1000, "Running", True, "Deployment", "chat",
                created_at=NOW - 3600, labels={"app": "chat"})
        for i in range(count)
    ]  # fmt: skip


def _workload(
    pods: tuple[int, ...],
    terms: tuple[PodAntiAffinityTerm, ...] = (),
    by_us: float | None = NOW - 900,
    name: str = "paused",
) -> WorkloadInfo:
    return WorkloadInfo(
        "Job", "ml", name, f"job/ml/{name}", True, 100, pods, None, by_us, queued=by_us is None,
        pod_labels=JOB_LABELS, pod_anti_affinity=terms,
    )  # fmt: skip


def _resumes(nodes: tuple[NodeInfo, ...], pods: list[PodInfo], workload: WorkloadInfo) -> tuple[bool, list[str]]:
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=nodes, workloads=(workload,))
    ready = sum(1 for p in pods if p.owner_name == "chat")
    decision = ScaleDecision(CHAT.key, ready, ready, Reason.METRIC_ABOVE_TARGET, "", False)
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, [decision], {})
    actions, report, _ = arbitrate(arb, CapacityState(free_since=NOW - 999), CapacityConfig(resume_after_s=0.0))
    return any(isinstance(a, ResumeWorkload) for a in actions), list(report.notes)


GUARD = PodInfo(
    "ml", "guard", "n2", 0, 0, "Running", True, labels={"role": "guard"},
    anti_affinity=(PodAntiAffinityTerm({"team": "ml"}, HOST, frozenset({"ml"})),),
)  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "pods", "workload", "resumed"),
    [
        pytest.param(
            (_node("n1"), _node("n2")), _replicas("n1", 8), _workload((4, 4)), True,
            id="no terms: both 4-GPU pods on n2's 8 free",
        ),
        pytest.param(
            (_node("n1"), _node("n2")), _replicas("n1", 8), _workload((4, 4), (_apart(),)), False,
            id="workers one per node, one node free: not resumed (one would wait Pending)",
        ),
        pytest.param(
            (_node("n1"), _node("n2")), _replicas("n1", 4), _workload((4, 4), (_apart(),)), True,
            id="workers one per node, 4 free on n1 and 8 on n2: one on each",
        ),
        pytest.param(
            (_node("n1", "a"), _node("n2", "a"), _node("n3", "a")), _replicas("n1", 4),
            _workload((4, 4), (_apart(ZONE),)), False, id="one per zone, every node in zone a: not resumed",
        ),
        pytest.param(
            (_node("n1", "a"), _node("n2", "b")), _replicas("n1", 4), _workload((4, 4), (_apart(ZONE),)),
            True, id="one per zone, 4 free in a and 8 in b: resumed",
        ),
        pytest.param(
            (_node("n1"), _node("n2")), _replicas("n1", 4) + _replicas("n2", 1), _workload((4,), (_away_from_chat(),)),
            False, id="its terms keep it from chat, which runs on both nodes: not resumed",
        ),
        pytest.param(
            (_node("n1"), _node("n2")), _replicas("n1", 4), _workload((4,), (_away_from_chat(),)), True,
            id="its terms keep it from chat: n2, without chat, takes it",
        ),
        pytest.param(
            (_node("n1"), _node("n2")), [*_replicas("n1", 8), GUARD], _workload((4,)), False,
            id="a running pod's own terms keep team ml off n2, the only free node: not resumed",
        ),
        pytest.param(
            (_node("n1"), _node("n2"), _node("n3")), [*_replicas("n1", 8), GUARD], _workload((4,)), True,
            id="the guard keeps it off n2: n3 takes it",
        ),
    ],
)  # fmt: skip
def test_resume_places_its_pods_where_anti_affinity_lets_them(
    nodes: tuple[NodeInfo, ...], pods: list[PodInfo], workload: WorkloadInfo, resumed: bool
) -> None:
    got, notes = _resumes(nodes, pods, workload)
    assert got is resumed
    if not resumed:
        assert any("do not fit" in n for n in notes)


def test_kept_apart_learns_each_placement_per_domain() -> None:
    nodes = {n.name: n for n in (_node("n1", "a"), _node("n2", "a"), _node("n3", "b"))}
    rule = KeptApart(workload_pod(_workload((4, 4), (_apart(ZONE),))), nodes)
    assert rule.binds
    assert all(rule.allows(n) for n in nodes)
    rule.add("n1")
    assert [n for n in nodes if rule.allows(n)] == ["n3"]
    assert rule.allows("n9 (not a node)")  # its domain unknown: allowed
    # a term selecting other pods only keeps nothing apart
    assert not KeptApart(workload_pod(_workload((4, 4), (_away_from_chat(),))), nodes).binds


def test_a_node_without_the_topology_label_keeps_none_of_its_siblings_off() -> None:
    """kube-scheduler's InterPodAffinity: a node without the term's key is in no domain of it."""
    nodes = {n.name: n for n in (_node("n1"), _node("n2", "a"))}
    rule = KeptApart(workload_pod(_workload((4, 4), (_apart(ZONE),))), nodes)
    rule.add("n1")
    assert rule.allows("n1") and rule.allows("n2")


@pytest.mark.parametrize(
    ("terms", "waits"),
    [
        pytest.param((), False, id="queued, both pods fit n2's 8 free: waits for quota, not room"),
        pytest.param((_apart(),), True, id="queued, one per node, one node free: waits for room"),
        pytest.param((_away_from_chat(),), False, id="queued, kept from chat: n2 has none"),
    ],
)
def test_a_queued_workload_starts_only_where_its_pods_terms_allow(
    terms: tuple[PodAntiAffinityTerm, ...], waits: bool
) -> None:
    workload = _workload((4, 4), terms, by_us=None)
    snapshot = ClusterSnapshot(
        NOW, pods=tuple(_replicas("n1", 8)), nodes=(_node("n1"), _node("n2")), workloads=(workload,)
    )
    waiting = waiting_gpu_work(snapshot)
    assert [w.takes for w in waiting] == [8]
    assert bool(waiting_for_room(waiting, snapshot)) is waits


def test_a_bound_workload_that_waits_says_nothing_of_another_of_its_shape() -> None:
    """Work of a shape that did not start is not placed again (the room only shrinks) -- unless it failed only for
    its terms: a workload of the same GPUs without them, after it, still starts."""
    bound = _workload((4, 4), (_apart(),), by_us=None, name="apart")
    free = _workload((4, 4), by_us=None, name="together")
    snapshot = ClusterSnapshot(
        NOW, pods=tuple(_replicas("n1", 8)), nodes=(_node("n1"), _node("n2")), workloads=(bound, free)
    )
    waiting = waiting_gpu_work(snapshot)
    assert [w.template_pod.name if w.template_pod else None for w in waiting] == [
        "Job/apart (not created)",
        "Job/together (not created)",
    ]
    still = waiting_for_room(waiting, snapshot)
    assert [w.template_pod.owner_name for w in still if w.template_pod] == ["apart"]


def test_the_stand_in_carries_the_workloads_labels_terms_and_gang() -> None:
    workload = _workload((8, 4), (_apart(),))
    pod = workload_pod(workload)
    assert (pod.namespace, pod.node, pod.gpus, pod.gang) == ("ml", None, 8, "job/ml/paused")
    assert pod.labels == JOB_LABELS and pod.anti_affinity == (_apart(),)


@pytest.mark.parametrize(
    ("terms", "moved"),
    [
        pytest.param((), ["inf/chat-7"], id="no terms: chat-7 moves to n1, n2's 8 free take both pods"),
        pytest.param((_apart(),), [], id="one per node: n2 emptied holds one pod, n1 none -- no move"),
        pytest.param(
            (PodAntiAffinityTerm({"app": "chat"}, HOST, frozenset({"inf"})),), [],
            id="kept from chat, on both nodes: none moved for it (a node kept off only by pods a move takes away is "
            "not lifted -- fewer moves, never one the scheduler refuses)",
        ),
    ],
)  # fmt: skip
def test_the_rebalancer_gathers_room_for_a_suspended_workload_as_its_pods_terms_allow(
    terms: tuple[PodAntiAffinityTerm, ...], moved: list[str]
) -> None:
    """chat: 7 replicas on n1, 1 on n2 (1 + 7 free); a suspended Job of two 4-GPU pods fits as is on neither."""
    from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    pods = [reb.replica("chat", i, "n1") for i in range(7)] + [reb.replica("chat", 7, "n2")]
    world = reb.snap([reb.node("n1"), reb.node("n2")], pods, workloads=(_workload((4, 4), terms),))
    plan, _ = plan_rebalance(world, reb.NOW, RebalanceConfig(), RebalanceState())
    assert reb.evicted(plan) == moved


def _away_from_team() -> PodAntiAffinityTerm:
    """Every pod of team ml one per node (its own siblings and the other job's pods alike)."""
    return PodAntiAffinityTerm({"team": "ml"}, HOST, frozenset({"ml"}))


@pytest.mark.parametrize(
    ("nodes", "resumed"),
    [
        pytest.param((_node("n1"), _node("n2")), ["job-a"], id="one free node: the second would land beside the first"),
        pytest.param((_node("n1"), _node("n2"), _node("n3")), ["job-a", "job-b"], id="two free nodes: one job on each"),
    ],
)  # fmt: skip
def test_two_workloads_resumed_in_one_tick_keep_each_other_off_as_their_terms_say(
    nodes: tuple[NodeInfo, ...], resumed: list[str]
) -> None:
    """Two suspended 1-pod Jobs of team ml whose terms keep team ml one per node; chat fills n1. Their pods are not
    bound within the tick, so the first one resumed is counted where it was placed: the second may not join it."""
    jobs = tuple(_workload((4,), (_away_from_team(),), name=name) for name in ("job-a", "job-b"))
    snapshot = ClusterSnapshot(NOW, pods=tuple(_replicas("n1", 8)), nodes=nodes, workloads=jobs)
    decision = ScaleDecision(CHAT.key, 8, 8, Reason.METRIC_ABOVE_TARGET, "", False)
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, [decision], {})
    actions, _, _ = arbitrate(arb, CapacityState(free_since=NOW - 999), CapacityConfig(resume_after_s=0.0))
    assert sorted(a.name for a in actions if isinstance(a, ResumeWorkload)) == resumed
