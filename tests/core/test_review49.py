"""Review 49: required pod anti-affinity in the capacity arbitration (``core.arbitrate``, ``core.cluster``,
``core.victims``, ``core.rebalance``) -- cases where it disagreed with kube-scheduler's InterPodAffinity filter."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import (
    HOSTNAME_LABEL,
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodAntiAffinityTerm,
    WorkloadInfo,
)
from autoscaler.core.model import CapacityState, ScaleDecision, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from tests.core import test_pod_anti_affinity as paa
from tests.core import test_review34_arbitration as r34

BY_ZONE = replace(paa.SPREAD, anti_affinity=(paa.ONE_PER_ZONE,))


def _bought(actions) -> int:  # type: ignore[no-untyped-def]
    return sum(
        a.nodes - a.previous_nodes
        for a in actions
        if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_UP
    )


# -- a node requested, not registered yet ------------------------------------------------------------------------------


def test_a_node_requested_before_this_tick_hosts_one_replica_spread_one_per_node() -> None:
    """A node the provider counts but that has not registered yet ("burst (requested, not registered 1)") hosts one
    replica of a Deployment spread one per node, as a node requested this tick does: counted as room for all three,
    the two more nodes they need were bought only once it registered, a boot later."""
    pool = replace(r34.POOL, nodes=1)
    config = replace(paa.BURSTING, pools=(pool,))
    nodes = (paa._node("n1"),)
    pods = (paa._replica(0, "n1"), paa._gang("busy", "n1", 7, 60.0))
    assert _bought(paa._tick(pods, nodes, paa.SPREAD, 4, config, {"burst": 1})[0]) == 2
    assert _bought(paa._tick(pods, nodes, paa.PLAIN, 4, config, {"burst": 1})[0]) == 0, "sanity: not spread"


# -- one per zone, and a pool whose nodes are all in the zone a replica holds ----------------------------------------


def test_no_node_is_bought_in_a_pool_whose_nodes_are_all_in_a_zone_a_replica_holds() -> None:
    """chat, spread one per zone, runs in zone a; the burst pool's nodes are all in zone a (its node b1 full). A node
    bought there comes up in zone a too, as its nodes' labels show (the rule that closes a pool to a nodeSelector its
    nodes do not meet): the replica could not go there, and each tick of the boot bought one more."""
    pool = replace(r34.POOL, nodes=1)
    config = replace(paa.BURSTING, pools=(pool,))
    nodes = (paa._node("n1", "a"), paa._node("b1", "a", pool="burst"))
    pods = (paa._replica(0, "n1"), paa._gang("busy", "n1", 7, 60.0), paa._gang("full", "b1", 8, 60.0))
    assert _bought(paa._tick(pods, nodes, BY_ZONE, 2, config, {"burst": 1})[0]) == 0
    # b1 in zone b: a node of the pool may take it
    in_b = (nodes[0], paa._node("b1", "b", pool="burst"))
    assert _bought(paa._tick(pods, in_b, BY_ZONE, 2, config, {"burst": 1})[0]) == 1
    # one per node: a new node is a host of its own
    assert _bought(paa._tick(pods, nodes, paa.SPREAD, 2, config, {"burst": 1})[0]) == 1


def test_a_booting_node_in_the_zone_a_replica_holds_does_not_buy_another_each_tick() -> None:
    """The node bought registered (not ready yet) in zone a, where the replica runs: it is no room for the next one,
    and a second node of the same pool would come up there too."""
    pool = replace(r34.POOL, nodes=2)
    config = replace(paa.BURSTING, pools=(pool,))
    booting = NodeInfo("b2", 8, "A100", "burst", False, labels={"zone": "a"})
    nodes = (paa._node("n1", "a"), paa._node("b1", "a", pool="burst"), booting)
    pods = (paa._replica(0, "n1"), paa._gang("busy", "n1", 7, 60.0), paa._gang("full", "b1", 8, 60.0))
    assert _bought(paa._tick(pods, nodes, BY_ZONE, 2, config, {"burst": 2})[0]) == 0


# -- the give-back: two pools' nodes in one tick ----------------------------------------------------------------------


def test_two_pools_do_not_each_give_back_a_node_whose_replica_lands_on_the_same_free_node() -> None:
    """chat (one per node) runs chat-2 alone on b0 (pool burst) and chat-3 alone on c0 (pool spot); n2 is empty,
    n1 full. Each give-back alone is sound (its replica goes to n2), but not both: the second replica may not join
    the first on n2 (the nodes kept off were those of the snapshot, not of the pods moved this tick), it would wait
    Pending and the next short tick buy a node again."""
    burst = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    spot = replace(burst, name="spot")
    config = CapacityConfig(pools=(burst, spot), burst_idle_cooldown_s=0.0)
    nodes = (paa._node("n1"), paa._node("n2"), paa._node("b0", pool="burst"), paa._node("c0", pool="spot"))
    pods = (paa._replica(0, "n1"), paa._gang("busy", "n1", 7, 60.0), paa._replica(2, "b0"), paa._replica(3, "c0"))

    def given_back(deployment):  # type: ignore[no-untyped-def]
        actions, _, _ = paa._tick(pods, nodes, deployment, 3, config, {"burst": 1, "spot": 1})
        return sorted(
            a.remove_node for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN
        )

    assert given_back(paa.SPREAD) == ["b0"]
    assert given_back(paa.PLAIN) == ["b0"], "sanity: without the spread chat-2 goes to c0, which is kept"


# -- the replicas reserved for a give-back (the metric's, a rate limit holds back) -------------------------------------


def test_a_burst_node_is_not_given_back_when_the_reserved_replicas_spread_one_per_node_need_it() -> None:
    """chat (one per node) runs chat-0 on n1 beside a 7-GPU gang and wants 1 replica but its metric asks for 3 (a rate
    limit holds 2 back): n2 and the empty burst node b0 are the room for those two. Counted by GPUs, n2's 8 free held
    both, and b0 was given back -- the second would wait Pending and the next tick buy a node again."""
    burst = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    config = CapacityConfig(pools=(burst,), burst_idle_cooldown_s=0.0)
    nodes = (paa._node("n1"), paa._node("n2"), paa._node("b0", pool="burst"))
    pods = (paa._replica(0, "n1"), paa._gang("busy", "n1", 7, 60.0))

    def given_back(deployment):  # type: ignore[no-untyped-def]
        snapshot = ClusterSnapshot(r34.NOW, deployments=(deployment,), pods=pods, nodes=nodes)
        decision = ScaleDecision(paa.CHAT.key, 1, 1, Reason.METRIC_ABOVE_TARGET, "", recommended_replicas=3)
        arb = ArbitrationInput(r34.NOW, snapshot, {paa.CHAT.key: paa.CHAT}, [decision], {}, pool_nodes={"burst": 1})
        actions, _, _ = arbitrate(arb, CapacityState(), config)
        return [a.remove_node for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN]

    assert given_back(paa.PLAIN) == ["b0"], "sanity: not spread, both fit n2"
    assert given_back(paa.SPREAD) == []


# -- two services in one tick -----------------------------------------------------------------------------------------

CODE_APP = {"app": "code"}
AWAY_FROM_CHAT = PodAntiAffinityTerm(paa.APP, HOSTNAME_LABEL, frozenset({"inference"}))
CODE = DeploymentInfo(
    "inference", "code", 0, 0, selector=CODE_APP, pod_labels=CODE_APP, anti_affinity=(AWAY_FROM_CHAT,)
)
CODE_POLICY = ServicePolicy("inference", "code", max_replicas=40, priority=900)


def test_no_gang_is_stopped_for_a_replica_beside_one_an_earlier_service_is_placed_beside_this_tick() -> None:
    """chat (priority 1000) wants a second replica: it is counted on n2's one free GPU, beside the cheap gang. code
    (900) keeps away from chat's pods and wants one replica: stopping the cheap gang on n2 loses least, but chat's
    replica takes n2 first and code's may not join it there -- the gang stopped for nothing, code Pending. The dear
    gang on n3 is stopped instead."""
    nodes = (paa._node("n1"), paa._node("n2"), paa._node("n3"))
    pods = (
        paa._replica(0, "n1"),
        paa._gang("busy", "n1", 7, 6000.0),
        paa._gang("cheap", "n2", 7, 60.0),
        paa._gang("dear", "n3", 8, 3000.0),
    )
    jobs = tuple(
        WorkloadInfo("Job", "ml", n, f"job/ml/{n}", False, 100, (g,), None, None)
        for n, g in (("busy", 7), ("cheap", 7), ("dear", 8))
    )
    chat = replace(paa.PLAIN, spec_replicas=2)

    def stopped(code: DeploymentInfo) -> set[str]:
        snapshot = ClusterSnapshot(r34.NOW, deployments=(chat, code), pods=pods, nodes=nodes, workloads=jobs)
        return paa.stopped_for(snapshot, (paa.CHAT, 1, 2), (CODE_POLICY, 0, 1))

    assert stopped(replace(CODE, anti_affinity=())) == {"cheap"}, "sanity: not kept away, code joins n2"
    assert stopped(CODE) == {"dear"}


# -- the rebalancer: a moved replica and the replicas moved before it in the pass -------------------------------------


def test_a_replica_is_not_moved_beside_a_pod_its_anti_affinity_selects_moved_there_in_the_same_pass() -> None:
    """Two waiting 8-GPU gangs; code-0 alone on n1 and chat-0 alone on n2 are moved off for them, n3 (a 6-GPU gang)
    the room. chat keeps away from code's pods: once code-0 is expected on n3, chat-0 may not land there -- its
    replacement would wait Pending, a serving replica lost for a move the scheduler refuses."""
    from autoscaler.core.rebalance import RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    nodes = [reb.node("n1"), reb.node("n2"), reb.node("n3"), reb.node("n4")]
    pods = [
        reb.replica("code", 0, "n1"), reb.replica("chat", 0, "n2"), *reb.gang("g3", ["n3"], gpus=6),
        reb.replica("code", 1, "n4"), reb.replica("chat", 1, "n4"), *reb.gang("g4", ["n4"], gpus=6),
        *reb.gang("a-wait", [None]), *reb.gang("b-wait", [None]),
    ]  # fmt: skip
    chat, code = reb.deployments(pods)
    away = PodAntiAffinityTerm({"app": "code"}, HOSTNAME_LABEL, frozenset({"inf"}))

    def moved(deployment: DeploymentInfo) -> list[str]:
        world = reb.snap(nodes, pods, deps=(deployment, code))
        plan, _ = plan_rebalance(world, reb.NOW, reb.CONFIG, RebalanceState())
        return reb.evicted(plan)

    assert moved(chat) == ["inf/chat-0", "inf/code-0"], "sanity: not kept away, both land on n3"
    assert moved(replace(chat, pod_labels={"app": "chat"}, anti_affinity=(away,))) == ["inf/code-0"]
