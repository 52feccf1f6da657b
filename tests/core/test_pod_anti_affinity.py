"""A Deployment's required pod anti-affinity in the capacity arbitration (``core.cluster.anti_affinity_barred``,
``spread_domains``; ``core.arbitrate``).

GPU serving is often spread one replica per node (``podAntiAffinity`` on ``kubernetes.io/hostname`` against its own
pods: a node failure takes one replica, and two replicas do not share a node's PCIe and host memory), or one per
zone. kube-scheduler's InterPodAffinity filter then keeps a new replica off every node (zone) where one runs,
whatever its free GPUs. Read as "anywhere" (until stop 49), the arbitration:

- stopped the training gang that lost least on a node that already held a replica -- the freed GPUs could not take
  the Pending replica, which stayed Pending while the gang's work was lost;
- counted a node's free GPUs as room for several replicas that may take one of them at most (a shortfall hidden,
  one gang stopped for two replicas);
- bought one 8-GPU burst node for three 1-GPU replicas that need three nodes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool, nodes_for
from autoscaler.core.cluster import (
    HOSTNAME_LABEL,
    ClusterSnapshot,
    DeploymentInfo,
    LabelTest,
    NodeInfo,
    PodAntiAffinityTerm,
    PodInfo,
    WorkloadInfo,
    anti_affinity_barred,
    place_best_fit,
    spread_domains,
)
from autoscaler.core.model import CapacityState, ScaleDecision, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.victims import GpuNeed, need_met
from tests.core import test_review34_arbitration as r34

NOW = r34.NOW
APP = {"app": "chat"}
ONE_PER_NODE = PodAntiAffinityTerm(APP, HOSTNAME_LABEL, frozenset({"inference"}))
ONE_PER_ZONE = PodAntiAffinityTerm(APP, "zone", frozenset({"inference"}))
SPREAD = DeploymentInfo("inference", "chat", 1, 1, selector=APP, pod_labels=APP, anti_affinity=(ONE_PER_NODE,))
PLAIN = replace(SPREAD, anti_affinity=())
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)


def _node(name: str, zone: str = "a", pool: str | None = "onprem") -> NodeInfo:
    return NodeInfo(name, 8, "A100", pool, True, labels={"zone": zone})


def _replica(index: int, node: str | None) -> PodInfo:
    return replace(r34.replica(index, node), labels=APP)


def _gang(name: str, node: str, gpus: int, checkpoint_age: float) -> PodInfo:
    return replace(r34.gang(name, node, checkpoint_age), gpus=gpus)


def _tick(
    pods: tuple[PodInfo, ...],
    nodes: tuple[NodeInfo, ...],
    deployment: DeploymentInfo,
    want: int,
    config: CapacityConfig = r34.NO_POOL,
    pool_nodes: dict[str, int] | None = None,
):  # type: ignore[no-untyped-def]
    gangs = {p.gang.rsplit("/", 1)[-1]: p.gpus for p in pods if p.gang is not None}
    jobs = tuple(WorkloadInfo("Job", "ml", n, f"job/ml/{n}", False, 100, (g,), None, None) for n, g in gangs.items())
    snapshot = ClusterSnapshot(NOW, deployments=(deployment,), pods=pods, nodes=nodes, workloads=jobs)
    running = sum(1 for p in pods if p.owner_name == "chat" and p.node is not None)
    decision = ScaleDecision(CHAT.key, running, want, Reason.METRIC_ABOVE_TARGET, "")
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, [decision], {}, pool_nodes=pool_nodes)
    return arbitrate(arb, CapacityState(), config)  # fmt: skip


def stopped_for(snapshot: ClusterSnapshot, *wants: tuple[ServicePolicy, int, int]) -> set[str]:
    """The gangs one arbitration tick stops (no burst pool) for the services' (policy, current, desired) replicas."""
    decisions = [ScaleDecision(p.key, now, want, Reason.METRIC_ABOVE_TARGET, "") for p, now, want in wants]
    arb = ArbitrationInput(NOW, snapshot, {p.key: p for p, _, _ in wants}, decisions, {})
    return r34.stopped(arbitrate(arb, CapacityState(), r34.NO_POOL)[0])


# -- the pure rules ----------------------------------------------------------------------------------------------------


def _snapshot(*pods: PodInfo) -> ClusterSnapshot:
    return ClusterSnapshot(NOW, pods=pods, nodes=(_node("n1", "a"), _node("n2", "a"), _node("n3", "b"), _no_zone()))


def _no_zone() -> NodeInfo:
    return NodeInfo("n4", 8, "A100", "onprem", True)


@pytest.mark.parametrize(
    ("term", "pods", "barred"),
    [
        pytest.param(ONE_PER_NODE, (_replica(0, "n1"),), {"n1"}, id="one per node: the node holding a replica"),
        pytest.param(ONE_PER_ZONE, (_replica(0, "n1"),), {"n1", "n2"}, id="one per zone: every node of its zone"),
        pytest.param(
            ONE_PER_ZONE, (_replica(0, "n4"),), set(), id="a pod on a node without the zone label bars no zone"
        ),
        pytest.param(
            ONE_PER_NODE, (replace(_replica(0, "n1"), namespace="other"),), set(),
            id="a pod of another namespace than the term's",
        ),
        pytest.param(
            replace(ONE_PER_NODE, namespaces=None), (replace(_replica(0, "n1"), namespace="other"),), {"n1"},
            id="a namespaceSelector: every namespace",
        ),
        pytest.param(ONE_PER_NODE, (replace(_replica(0, "n1"), phase="Succeeded"),), set(), id="a finished pod"),
        pytest.param(
            ONE_PER_NODE, (replace(_replica(0, "n1"), terminating=True),), {"n1"},
            id="a terminating pod still counts (kube-scheduler's does until it is gone)",
        ),
        pytest.param(ONE_PER_NODE, (_replica(0, None),), set(), id="a Pending replica is on no node"),
        pytest.param(replace(ONE_PER_NODE, selector={}), (_replica(0, "n1"),), set(), id="a null selector"),
        pytest.param(
            replace(ONE_PER_NODE, selector={"app": LabelTest((("In", frozenset({"chat", "code"})),))}),
            (_replica(0, "n2"),), {"n2"}, id="matchExpressions",
        ),
    ],
)  # fmt: skip
def test_the_nodes_a_term_keeps_the_next_replica_off(
    term: PodAntiAffinityTerm, pods: tuple[PodInfo, ...], barred: set[str]
) -> None:
    deployment = replace(SPREAD, anti_affinity=(term,))
    assert anti_affinity_barred(deployment, _snapshot(*pods)) == barred


def test_only_a_term_selecting_its_own_pods_spreads_its_replicas() -> None:
    nodes = _snapshot().nodes
    spread = spread_domains(SPREAD, nodes)
    assert spread is not None and spread["n1"] == (f"{HOSTNAME_LABEL}=n1",)
    by_zone = spread_domains(replace(SPREAD, anti_affinity=(ONE_PER_ZONE,)), nodes)
    assert by_zone is not None and by_zone["n1"] == by_zone["n2"] == ("zone=a",) and by_zone["n4"] == ()
    away_from_others = PodAntiAffinityTerm({"app": "batch"}, HOSTNAME_LABEL, frozenset({"inference"}))
    assert spread_domains(replace(SPREAD, anti_affinity=(away_from_others,)), nodes) is None
    assert spread_domains(PLAIN, nodes) is None


def test_a_spread_need_counts_one_replica_per_domain() -> None:
    spread = spread_domains(SPREAD, _snapshot().nodes)
    types = {"n1": "A100", "n2": "A100"}
    assert need_met({"n1": 8}, GpuNeed(2, 1), types)
    assert not need_met({"n1": 8}, GpuNeed(2, 1, spread=spread), types)
    assert need_met({"n1": 8, "n2": 1}, GpuNeed(2, 1, spread=spread), types)
    free = {"n1": 8, "n2": 2}
    assert place_best_fit(free, 3, 1, spread=spread) == 2 and free == {"n1": 7, "n2": 1}


def test_a_node_bought_for_replicas_spread_one_per_node_hosts_one() -> None:
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.5, nodes=0, min_nodes=0, max_nodes=4)
    assert nodes_for(pool, 3, 1) == 1
    assert nodes_for(pool, 3, 1, one_per_node=True) == 3
    assert nodes_for(pool, 3, 8, one_per_node=True) == 3


# -- the arbitration ---------------------------------------------------------------------------------------------------


def test_the_gang_beside_a_replica_is_not_stopped_for_the_next_one() -> None:
    """chat runs one replica on n1 beside ``cheap`` (7 GPUs, just checkpointed) and wants a second; ``dear`` holds n2.
    Stopping ``cheap`` loses least, but the replica may not join its sibling on n1: ``dear`` is stopped."""
    nodes = (_node("n1"), _node("n2"))
    pods = (_replica(0, "n1"), _gang("cheap", "n1", 7, 60.0), _gang("dear", "n2", 8, 3000.0))
    assert r34.stopped(_tick(pods, nodes, SPREAD, 2)[0]) == {"dear"}
    assert r34.stopped(_tick(pods, nodes, PLAIN, 2)[0]) == {"cheap"}, "sanity: without the spread, cheap"


def test_free_gpus_beside_a_replica_do_not_hide_the_shortfall() -> None:
    """n1 has 3 GPUs free beside the replica: no room for a second one, so ``dear`` (n2) is stopped for it."""
    nodes = (_node("n1"), _node("n2"))
    pods = (_replica(0, "n1"), _gang("cheap", "n1", 4, 60.0), _gang("dear", "n2", 8, 3000.0))
    assert r34.stopped(_tick(pods, nodes, SPREAD, 2)[0]) == {"dear"}
    assert r34.stopped(_tick(pods, nodes, PLAIN, 2)[0]) == set(), "sanity: without the spread, n1's 3 free GPUs"


def test_two_replicas_spread_one_per_node_need_two_nodes_freed() -> None:
    nodes = (_node("n1"), _node("n2"))
    pods = (_gang("cheap", "n1", 8, 60.0), _gang("dear", "n2", 8, 3000.0))
    assert r34.stopped(_tick(pods, nodes, SPREAD, 2)[0]) == {"cheap", "dear"}
    assert r34.stopped(_tick(pods, nodes, PLAIN, 2)[0]) == {"cheap"}


def test_one_per_zone_keeps_the_replica_off_the_whole_zone() -> None:
    """The replica runs in zone a (n1); ``cheap`` holds n2, also zone a; ``dear`` holds n3 in zone b."""
    nodes = (_node("n1", "a"), _node("n2", "a"), _node("n3", "b"))
    pods = (_replica(0, "n1"), _gang("cheap", "n2", 8, 60.0), _gang("dear", "n3", 8, 3000.0))
    by_zone = replace(SPREAD, anti_affinity=(ONE_PER_ZONE,))
    assert r34.stopped(_tick(pods, nodes, by_zone, 2)[0]) == {"dear"}


BURSTING = CapacityConfig(pools=(r34.POOL,), assumed_shortfall_s=8 * 3600, preempt=False)


def _bought(actions) -> int:  # type: ignore[no-untyped-def]
    return sum(a.nodes - a.previous_nodes for a in actions if isinstance(a, ScaleNodePool))


def test_a_burst_buys_a_node_per_replica_spread_one_per_node() -> None:
    nodes = (_node("n1"),)
    pods = (_replica(0, "n1"), _gang("busy", "n1", 7, 60.0))
    assert _bought(_tick(pods, nodes, SPREAD, 4, BURSTING)[0]) == 3
    assert _bought(_tick(pods, nodes, PLAIN, 4, BURSTING)[0]) == 1


def test_a_pool_whose_every_node_holds_a_replica_is_not_closed_to_it() -> None:
    """The pool's one registered node runs a replica: anti-affinity keeps the next off that node, not off the pool
    (a pool is closed to a service when its nodes' labels or taints refuse its pods)."""
    pool = replace(r34.POOL, nodes=1)
    config = replace(BURSTING, pools=(pool,))
    nodes = (_node("n1"), _node("b1", pool="burst"))
    pods = (_replica(0, "b1"), _gang("busy", "n1", 8, 60.0))
    assert _bought(_tick(pods, nodes, SPREAD, 2, config, {"burst": 1})[0]) == 1


# -- the rebalancer: a moved replica lands only where its anti-affinity lets it ----------------------------------------


@pytest.mark.parametrize(
    ("n3_gang", "spread", "moved", "landing"),
    [
        pytest.param(4, False, ["inf/chat-1"], {"n1"}, id="not spread: n1, the fuller (best fit)"),
        pytest.param(4, True, ["inf/chat-1"], {"n3"}, id="spread one per node: not beside chat-0 on n1"),
        pytest.param(8, False, ["inf/chat-1"], {"n1"}, id="n3 full, not spread: n1"),
        pytest.param(8, True, [], set(), id="n3 full, spread: nowhere it may land, no eviction"),
    ],
)  # fmt: skip
def test_a_moved_replica_is_expected_only_where_its_anti_affinity_lets_it_land(
    n3_gang: int, spread: bool, moved: list[str], landing: set[str]
) -> None:
    """tests/core/test_rebalance's world: a pending 8-GPU gang; chat-0 on n1 beside a 4-GPU gang, chat-1 alone on n2;
    n3 holds a gang. Moving chat-1 empties n2 for the waiting gang."""
    from autoscaler.core.rebalance import RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    pods = [
        *reb.gang("fixed", ["n1"], gpus=4), reb.replica("chat", 0, "n1"), reb.replica("chat", 1, "n2"),
        *reb.gang("big", ["n3"], gpus=n3_gang), *reb.gang("wait", [None]),
    ]  # fmt: skip
    (chat,) = reb.deployments(pods)
    term = PodAntiAffinityTerm({"app": "chat"}, HOSTNAME_LABEL, frozenset({"inf"}))
    if spread:
        chat = replace(chat, pod_labels={"app": "chat"}, anti_affinity=(term,))
    plan, _ = plan_rebalance(reb.snap(reb.BASE_NODES, pods, deps=(chat,)), reb.NOW, reb.CONFIG, RebalanceState())
    assert reb.evicted(plan) == moved
    landed = {n for m in plan.moves for n in m.destinations}
    assert landed <= landing and bool(landed) == bool(moved)


def test_two_waiting_replicas_spread_one_per_node_are_not_both_counted_on_one_free_node() -> None:
    """chat-2 and chat-3 wait; n1 is empty, n2 holds chat-0 beside a gang, n3 a full gang. Spread one per node, only
    one of them fits as things are (n1); the other fits nowhere -- counted on n1 too, it would have been left as
    "fits as things are"."""
    from autoscaler.core.rebalance import RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    pods = [
        reb.replica("chat", 0, "n2"), reb.replica("chat", 1, "n3"), *reb.gang("beside", ["n2"], gpus=7),
        *reb.gang("full", ["n3"], gpus=7), reb.replica("chat", 2, None), reb.replica("chat", 3, None),
    ]  # fmt: skip
    (chat,) = reb.deployments(pods)
    term = PodAntiAffinityTerm({"app": "chat"}, HOSTNAME_LABEL, frozenset({"inf"}))
    spread = replace(chat, pod_labels={"app": "chat"}, anti_affinity=(term,))
    for deployment, waits in ((chat, False), (spread, True)):
        world = reb.snap(reb.BASE_NODES, pods, deps=(deployment,))
        plan, _ = plan_rebalance(world, reb.NOW, reb.CONFIG, RebalanceState())
        assert reb.evicted(plan) == []
        assert any("chat-3" in n and "do not fit" in n for n in plan.notes) is waits, plan.notes


def test_a_burst_node_is_not_given_back_when_its_replica_may_only_join_a_sibling() -> None:
    """chat-2 runs alone on burst node b0; n2 has 7 GPUs free beside chat-1, n1 is full. Given back, chat-2's
    replacement could not join chat-1 on n2: it would wait Pending and the next short tick buy the node again."""
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    config = CapacityConfig(pools=(pool,), burst_idle_cooldown_s=0.0)
    nodes = (_node("n1"), _node("n2"), _node("b0", pool="burst"))
    pods = (_replica(0, "n1"), _gang("busy", "n1", 7, 60.0), _replica(1, "n2"), _replica(2, "b0"))

    def given_back(deployment: DeploymentInfo) -> list[str | None]:
        actions, _, _ = _tick(pods, nodes, deployment, 3, config, {"burst": 1})
        return [a.remove_node for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN]

    assert given_back(PLAIN) == ["b0"], "sanity: without the spread chat-2 fits n2"
    assert given_back(SPREAD) == []


# -- the symmetric check: a running pod's own anti-affinity keeps the new replica off its domain --------------------

CODE_LABELS = {"app": "code"}
CODE = DeploymentInfo("inference", "code", 1, 1, selector=CODE_LABELS, pod_labels=CODE_LABELS)
CODE_POLICY = ServicePolicy("inference", "code", max_replicas=40, priority=1000)
AWAY_FROM_CODE = PodAntiAffinityTerm(CODE_LABELS, HOSTNAME_LABEL, frozenset({"inference"}))


def test_a_running_pods_own_anti_affinity_keeps_the_new_replica_off_its_node() -> None:
    """chat's template keeps it away from code's pods; code has no term. kube-scheduler refuses code's next replica
    on chat's node all the same (InterPodAffinity's symmetric check)."""
    chat = replace(PLAIN, anti_affinity=(AWAY_FROM_CODE,))
    snapshot = replace(_snapshot(_replica(0, "n1")), deployments=(chat, CODE))
    assert anti_affinity_barred(CODE, snapshot) == {"n1"}
    assert anti_affinity_barred(CODE, replace(snapshot, deployments=(PLAIN, CODE))) == set()
    by_zone = replace(chat, anti_affinity=(replace(AWAY_FROM_CODE, topology_key="zone"),))
    assert anti_affinity_barred(CODE, replace(snapshot, deployments=(by_zone, CODE))) == {"n1", "n2"}
    assert anti_affinity_barred(CODE, snapshot, wide_only=True) == set(), "a per-host term is not a wide one"
    elsewhere = replace(chat, anti_affinity=(replace(AWAY_FROM_CODE, namespaces=frozenset({"other"})),))
    assert anti_affinity_barred(CODE, replace(snapshot, deployments=(elsewhere, CODE))) == set()


def test_no_gang_is_stopped_beside_a_pod_that_keeps_the_replica_away() -> None:
    """chat-0 runs on n1 beside ``cheap``; code wants one replica and ``dear`` holds n2. chat keeps away from code:
    stopping ``cheap`` would free GPUs code's replica may not take."""
    nodes = (_node("n1"), _node("n2"))
    pods = (_replica(0, "n1"), _gang("cheap", "n1", 7, 60.0), _gang("dear", "n2", 8, 3000.0))
    gangs = {p.gang.rsplit("/", 1)[-1]: p.gpus for p in pods if p.gang is not None}
    jobs = tuple(WorkloadInfo("Job", "ml", n, f"job/ml/{n}", False, 100, (g,), None, None) for n, g in gangs.items())

    def stopped(chat: DeploymentInfo) -> set[str]:
        snapshot = ClusterSnapshot(NOW, deployments=(chat, CODE), pods=pods, nodes=nodes, workloads=jobs)
        return stopped_for(snapshot, (CODE_POLICY, 0, 1))

    assert stopped(PLAIN) == {"cheap"}, "sanity: chat keeps away from nothing"
    assert stopped(replace(PLAIN, anti_affinity=(AWAY_FROM_CODE,))) == {"dear"}


def test_the_rebalancer_keeps_a_replica_off_where_a_pod_keeping_it_away_is_expected() -> None:
    """A replica of chat (which keeps away from code's pods) is expected on n3 in this pass: code's replicas may not
    be moved there (the symmetric check), nor onto n1 where chat-0 runs now."""
    from autoscaler.core.rebalance import RebalanceConfig, _Cluster

    chat = replace(PLAIN, anti_affinity=(AWAY_FROM_CODE,))
    code_pod = replace(_replica(5, "n2"), owner_name="code", labels=CODE_LABELS)
    snapshot = replace(_snapshot(_replica(0, "n1"), code_pod), deployments=(chat, CODE))
    cluster = _Cluster(snapshot, RebalanceConfig())
    assert not cluster.allowed("n1", None, False, [code_pod])
    assert cluster.allowed("n3", None, False, [code_pod])
    cluster.lands([_replica(1, None)], ["n3"])
    assert not cluster.allowed("n3", None, False, [code_pod])


def test_plan_names_the_free_gpus_the_anti_affinity_refuses() -> None:
    """n1 has 3 GPUs free beside chat-0: the shortfall's text says they are there and why they are no room."""
    nodes = (_node("n1"), _node("n2"))
    pods = (_replica(0, "n1"), _gang("cheap", "n1", 4, 60.0), _gang("dear", "n2", 8, 3000.0))
    _, report, _ = _tick(pods, nodes, SPREAD, 2)
    (preempt,) = [o for o in report.options if o.kind == "preempt"]
    assert "GPUs free on n1, where its pod anti-affinity or topology spread keeps it off" in preempt.detail
    _, plain, _ = _tick(pods, nodes, PLAIN, 2)
    assert not any("keeps it off" in o.detail for o in plain.options)
