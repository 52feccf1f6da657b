"""Review 49b: hard topology spread constraints in the capacity arbitration (``core.topology_spread``,
``core.arbitrate``, ``core.victims``, ``core.rebalance``) -- cases where it disagreed with kube-scheduler's
PodTopologySpread filter."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, WorkloadInfo
from autoscaler.core.model import ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from tests.core import test_review34_arbitration as r34
from tests.core import test_topology_spread as tsc
from tests.core.test_pod_anti_affinity import stopped_for

# -- two give-backs in one tick --------------------------------------------------------------------------------------


def test_two_pools_do_not_each_give_back_a_node_whose_replica_may_go_only_where_the_other_went() -> None:
    """chat (spread by zone, maxSkew 1) runs one replica in a (a1, 7 GPUs free), one in c (c1, full) and two in b,
    each alone on a burst node of its own pool (b0: burst, s0: spot; b1 is full). Either give-back alone is sound:
    b keeps one, and the replica goes to a1 (a two, b one). Not both: b would hold none, and neither replacement may
    go to a -- two ahead of b. Each was judged on the snapshot's counts, not on those the other give-back left."""
    burst = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    spot = replace(burst, name="spot")
    config = CapacityConfig(pools=(burst, spot), burst_idle_cooldown_s=0.0)
    nodes = (tsc._node("a1", "a"), tsc._node("b1", "b"), tsc._node("c1", "c"), tsc._node("b0", "b", pool="burst"),
             tsc._node("s0", "b", pool="spot"))  # fmt: skip
    pods = (tsc._replica(0, "a1"), tsc._gang("full", "b1", 8, 60.0), tsc._replica(1, "c1"),
            tsc._gang("fill-c", "c1", 7, 60.0), tsc._replica(2, "b0"), tsc._replica(3, "s0"))  # fmt: skip

    def given_back(deployment):  # type: ignore[no-untyped-def]
        actions, _, _ = tsc._tick(pods, nodes, deployment, 4, config, {"burst": 1, "spot": 1})
        return sorted(
            a.remove_node for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN
        )

    assert given_back(tsc.PLAIN) == ["b0", "s0"], "sanity: unspread, both replicas fit a1"
    assert given_back(tsc.SPREAD) == ["b0"]


# -- the domains counted: only nodes with every constraint's key ----------------------------------------------------

RACK = "example.com/rack"


def test_a_node_without_one_constraints_key_counts_in_none_of_its_domains() -> None:
    """chat is spread by zone and by rack (rack: minDomains 3); one replica runs on each of a1 (zone a, rack r1), b1
    (zone b, rack r2) and x1 (rack r3, no zone label). kube-scheduler counts only the nodes that carry every
    constraint's key (PreFilter: nodeLabelsMatchSpreadConstraints): two racks, fewer than minDomains, so the fewest
    is taken as 0 and a third replica in r1 or r2 is two ahead -- refused everywhere. Counted with x1's rack, three
    racks made the fewest 1 and let it onto a1 and b1: a gang stopped there for a replica left Pending."""
    by_rack = replace(tsc.BY_ZONE, topology_key=RACK, min_domains=3)
    deployment = replace(tsc.SPREAD, spread_constraints=(tsc.BY_ZONE, by_rack))
    nodes = (
        replace(tsc._node("a1", "a"), labels={tsc.ZONE: "a", RACK: "r1"}),
        replace(tsc._node("b1", "b"), labels={tsc.ZONE: "b", RACK: "r2"}),
        replace(tsc._node("x1", None), labels={RACK: "r3"}),
    )
    pods = (tsc._replica(0, "a1"), tsc._replica(1, "b1"), tsc._replica(2, "x1"))
    skew = tsc._skew(pods, nodes, deployment)
    assert {n.name for n in nodes if skew.allows(n.name)} == set()
    assert skew.placeable({"a1": 8, "b1": 8}, 1) == 0


# -- two services in a tick: a constraint counting another Deployment's pods ------------------------------------------

LLM = {"tier": "llm"}


def test_no_gang_is_stopped_in_a_zone_an_earlier_service_s_replica_puts_ahead_this_tick() -> None:
    """chat (priority 1000) and code (900) both serve tier llm; code is spread by zone over every llm pod (maxSkew 1),
    none runs yet. chat's new replica is counted on a1's one free GPU (zone a). code's rule, read from the snapshot,
    let its replica into zone a too, and stopping ``cheap`` on a2 lost least -- but once chat's replica is bound, a is
    one ahead of b and code's may only go to b: the gang stopped for nothing, code Pending. ``dear`` in b is stopped."""
    nodes = (tsc._node("a1", "a"), tsc._node("a2", "a"), tsc._node("b1", "b"))
    pods = (tsc._gang("busy", "a1", 7, 6000.0), tsc._gang("cheap", "a2", 8, 60.0), tsc._gang("dear", "b1", 8, 3000.0))
    jobs = tuple(
        WorkloadInfo("Job", "ml", n, f"job/ml/{n}", False, 100, (g,), None, None)
        for n, g in (("busy", 7), ("cheap", 8), ("dear", 8))
    )
    chat = DeploymentInfo("inference", "chat", 1, 0, selector={"app": "chat"}, pod_labels={"app": "chat", **LLM})
    code_policy = ServicePolicy("inference", "code", max_replicas=40, priority=900)

    def stopped(selecting: dict[str, str]) -> set[str]:
        by_zone = replace(tsc.BY_ZONE, selector=selecting)
        code = DeploymentInfo("inference", "code", 1, 0, selector={"app": "code"}, pod_labels={"app": "code", **LLM},
                              spread_constraints=(by_zone,))  # fmt: skip
        snapshot = ClusterSnapshot(r34.NOW, deployments=(chat, code), pods=pods, nodes=nodes, workloads=jobs)
        return stopped_for(snapshot, (tsc.CHAT, 0, 1), (code_policy, 0, 1))

    assert stopped({"app": "code"}) == {"cheap"}, "sanity: counting its own pods only, zone a is as good as b"
    assert stopped(LLM) == {"dear"}


# -- a burst pool whose nodes are all in the zone ahead (found by review 49b, fixed after) -----------------------------


def test_no_node_is_bought_in_a_pool_whose_nodes_are_all_in_the_zone_ahead() -> None:
    """chat (spread by zone) runs one replica in a, none in b; b1 is full, no preemption. The burst pool's only node
    is in zone a, so a node bought there comes up in a too, as its nodes' labels show (the rule review 49 applies to a
    zone anti-affinity keeps a replica out of): the replica may not go there, and each tick of the boot and after
    bought one more."""
    pool = replace(r34.POOL, nodes=1)
    config = CapacityConfig(pools=(pool,), assumed_shortfall_s=8 * 3600, preempt=False)
    nodes = (tsc._node("a1", "a"), tsc._node("b1", "b"), tsc._node("ba0", "a", pool="burst"))
    pods = (tsc._replica(0, "a1"), tsc._gang("busy", "a1", 7, 60.0), tsc._gang("full", "b1", 8, 60.0),
            tsc._gang("full-a", "ba0", 8, 60.0))  # fmt: skip

    def bought(deployment: DeploymentInfo) -> int:
        actions, _, _ = tsc._tick(pods, nodes, deployment, 2, config, {"burst": 1})
        return sum(
            a.nodes - a.previous_nodes
            for a in actions
            if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_UP
        )

    assert bought(tsc.PLAIN) == 1, "sanity: unspread, the node bought takes the replica"
    assert bought(tsc.SPREAD) == 0
