"""A Deployment's hard topology spread constraints in the capacity arbitration (``core.topology_spread``).

Serving spread over zones (``topologySpreadConstraints``: ``maxSkew: 1``, ``topologyKey: topology.kubernetes.io/zone``,
``whenUnsatisfiable: DoNotSchedule``) gets its next replica only in a zone within ``maxSkew`` of the zone with the
fewest. Read as "anywhere" (until stop 49), the victim search stopped the gang that lost least in a zone already
ahead -- the freed GPUs could not take the replica, which stayed Pending -- and a zone with no GPU free, which holds
every other zone back, was not seen.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import (
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodInfo,
    Taint,
    TopologySpreadConstraint,
)
from autoscaler.core.model import ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.topology_spread import TopologySkew
from tests.core import test_review34_arbitration as r34
from tests.core.test_pod_anti_affinity import _tick  # the one-service arbitration tick both files drive

NOW = r34.NOW
ZONE = "topology.kubernetes.io/zone"
APP = {"app": "chat"}
BY_ZONE = TopologySpreadConstraint(1, ZONE, APP)
SPREAD = DeploymentInfo("inference", "chat", 1, 1, selector=APP, pod_labels=APP, spread_constraints=(BY_ZONE,))
PLAIN = replace(SPREAD, spread_constraints=())
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)


def _node(name: str, zone: str | None, pool: str | None = "onprem", product: str = "A100", **kw: object) -> NodeInfo:
    labels = {ZONE: zone} if zone is not None else {}
    return NodeInfo(name, 8, product, pool, True, labels=labels, **kw)  # type: ignore[arg-type]


def _replica(index: int, node: str | None, **kw: object) -> PodInfo:
    return replace(r34.replica(index, node), labels=APP, **kw)  # type: ignore[arg-type]


def _gang(name: str, node: str, gpus: int, checkpoint_age: float) -> PodInfo:
    return replace(r34.gang(name, node, checkpoint_age), gpus=gpus)


def _skew(pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...], deployment: DeploymentInfo = SPREAD) -> TopologySkew:
    skew = TopologySkew.of(deployment, ClusterSnapshot(NOW, deployments=(deployment,), pods=pods, nodes=nodes))
    assert skew is not None
    return skew


# -- the rule --------------------------------------------------------------------------------------------------------

A, B, C = _node("a1", "a"), _node("b1", "b"), _node("c1", "c")


@pytest.mark.parametrize(
    ("pods", "nodes", "constraint", "allowed"),
    [
        pytest.param((_replica(0, "a1"), _replica(1, "a1"), _replica(2, "b1"), _replica(3, "c1")), (A, B, C), BY_ZONE,
                     {"b1", "c1"}, id="a is one ahead: b or c"),
        pytest.param((_replica(0, "a1"), _replica(1, "b1")), (A, B, C), BY_ZONE, {"c1"},
                     id="c has none: it holds a and b back"),
        pytest.param((_replica(0, "a1"), _replica(1, "b1")), (A, B, C, _node("x1", None)), BY_ZONE, {"c1"},
                     id="a node without the zone label: never"),
        pytest.param((_replica(0, "a1"), _replica(1, "b1", terminating=True)), (A, B), BY_ZONE, {"b1"},
                     id="a terminating pod is not counted"),
        pytest.param((_replica(0, "a1"), replace(_replica(1, "b1"), namespace="other")), (A, B), BY_ZONE, {"b1"},
                     id="nor a pod of another namespace"),
        pytest.param((_replica(0, "a1"),), (A, B), replace(BY_ZONE, max_skew=2), {"a1", "b1"}, id="maxSkew 2"),
        pytest.param((_replica(0, "a1"), _replica(1, "b1")), (A, B), replace(BY_ZONE, min_domains=3), set(),
                     id="fewer zones than minDomains: the fewest is 0"),
        pytest.param((_replica(0, "a1"), _replica(1, "b1")), (A, B, _node("c1", "c", product="H100")), BY_ZONE,
                     {"a1", "b1", "c1"},
                     id="zone c has only nodes of another GPU type: not counted (nodeAffinityPolicy; c1 is barred by "
                        "its type, not by this rule)"),
        pytest.param((_replica(0, "a1"), _replica(1, "b1")), (A, B, _node("c1", "c", product="H100")),
                     replace(BY_ZONE, honor_node_affinity=False), {"c1"}, id="... counted with Ignore"),
        pytest.param((_replica(0, "a1"), _replica(1, "b1")),
                     (A, B, _node("c1", "c", taints=(Taint("maintenance", "", "NoSchedule"),))),
                     replace(BY_ZONE, honor_taints=True), {"a1", "b1", "c1"},
                     id="zone c tainted, nodeTaintsPolicy Honor: not counted (c1 barred by its taint)"),
        pytest.param((_replica(0, "a1"),), (A, B), replace(BY_ZONE, selector={"app": "other"}), {"a1", "b1"},
                     id="a constraint counting other pods: the replica adds nothing"),
    ],
)  # fmt: skip
def test_where_the_next_replica_may_go(
    pods: tuple[PodInfo, ...], nodes: tuple[NodeInfo, ...], constraint: TopologySpreadConstraint, allowed: set[str]
) -> None:
    deployment = replace(SPREAD, spread_constraints=(constraint,), gpu_product="A100")
    skew = _skew(pods, nodes, deployment)
    assert {n.name for n in nodes if skew.allows(n.name)} == allowed


def test_each_placement_moves_the_counts() -> None:
    skew = _skew((_replica(0, "a1"),), (A, B))
    assert not skew.allows("a1") and skew.allows("b1")
    skew.add("b1")
    assert skew.allows("a1") and skew.allows("b1")
    skew.remove("a1")
    assert skew.allows("a1") and not skew.allows("b1")
    assert skew.allows("burst (requested 1)"), "a node not registered yet: its labels are not known"


def test_placeable_fills_the_fewest_first_and_leaves_the_rule_alone() -> None:
    skew = _skew((_replica(0, "a1"),), (A, B))
    assert skew.placeable({"a1": 8, "b1": 1}, 3) == 2  # b, then a; a again would be two ahead of b
    assert skew.placeable({"a1": 8, "b1": 8}, 5) == 5
    assert skew.placeable({"a1": 8}, 1) == 0
    assert not skew.allows("a1")


# -- the arbitration -------------------------------------------------------------------------------------------------


def test_the_gang_in_the_zone_ahead_is_not_stopped_for_the_next_replica() -> None:
    """chat has two replicas in zone a (a1, beside ``fill-a``), one in b (b1, beside ``fill-b``); ``cheap`` holds a2
    in zone a, ``dear`` b2 in zone b. The next replica may only go to b: a gang of zone b is stopped, however little
    the ones in zone a would lose."""
    nodes = (_node("a1", "a"), _node("a2", "a"), _node("b1", "b"), _node("b2", "b"))
    pods = (_replica(0, "a1"), _replica(1, "a1"), _gang("fill-a", "a1", 6, 60.0), _replica(2, "b1"),
            _gang("fill-b", "b1", 7, 60.0), _gang("cheap", "a2", 8, 60.0), _gang("dear", "b2", 8, 3000.0))  # fmt: skip
    assert r34.stopped(_tick(pods, nodes, PLAIN, 4)[0]) == {"fill-a"}, "sanity: unspread, the cheapest 8 GPUs"
    assert r34.stopped(_tick(pods, nodes, SPREAD, 4)[0]) == {"fill-b"}, "the cheapest gang in zone b"


def test_a_zone_without_free_gpus_holds_the_others_back() -> None:
    """chat runs one replica in a and one in b; zone c has none and no GPU free (``dear``). a and b have GPUs free,
    but the next replica may only go to c: ``dear`` is stopped."""
    nodes = (_node("a1", "a"), _node("b1", "b"), _node("c1", "c"))
    pods = (_replica(0, "a1"), _replica(1, "b1"), _gang("dear", "c1", 8, 3000.0))
    assert r34.stopped(_tick(pods, nodes, SPREAD, 3)[0]) == {"dear"}
    assert r34.stopped(_tick(pods, nodes, PLAIN, 3)[0]) == set(), "sanity: unspread, a1's free GPUs take it"


def test_free_gpus_on_a_node_without_the_zone_label_are_no_room() -> None:
    nodes = (_node("a1", "a"), _node("x1", None), _node("b1", "b"))
    pods = (_replica(0, "a1"), _gang("fill-a", "a1", 7, 60.0), _gang("dear", "b1", 8, 3000.0))
    assert r34.stopped(_tick(pods, nodes, SPREAD, 2)[0]) == {"dear"}
    assert r34.stopped(_tick(pods, nodes, PLAIN, 2)[0]) == set()


def test_a_burst_node_is_not_given_back_when_its_replica_may_not_go_to_the_other_zone() -> None:
    """chat-0 runs in zone a, chat-1 on burst node b0 in zone b; a1 has 7 GPUs free, b's other node is full. Given
    back, chat-1's replacement could only go to a -- two ahead of b: it would wait Pending."""
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    config = CapacityConfig(pools=(pool,), burst_idle_cooldown_s=0.0)
    nodes = (_node("a1", "a"), _node("b1", "b"), _node("b0", "b", pool="burst"))
    pods = (_replica(0, "a1"), _gang("full", "b1", 8, 60.0), _replica(1, "b0"))

    def given_back(deployment: DeploymentInfo) -> list[str | None]:
        actions, _, _ = _tick(pods, nodes, deployment, 2, config, {"burst": 1})
        return [a.remove_node for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN]

    assert given_back(PLAIN) == ["b0"], "sanity: unspread, chat-1 fits a1"
    assert given_back(SPREAD) == []


# -- the rebalancer: a moved replica lands only where the skew allows once it has left -------------------------------


@pytest.mark.parametrize(
    ("n3_gang", "spread", "moved", "landing"),
    [
        pytest.param(4, False, ["inf/chat-1"], {"n1"}, id="not spread: n1, the fuller (best fit)"),
        pytest.param(4, True, ["inf/chat-1"], {"n3"}, id="spread by zone: not into zone a, two ahead of b"),
        pytest.param(8, True, [], set(), id="n3 full, spread: nowhere it may land, no eviction"),
    ],
)  # fmt: skip
def test_a_moved_replica_is_expected_only_where_the_skew_lets_it_land(
    n3_gang: int, spread: bool, moved: list[str], landing: set[str]
) -> None:
    """tests/core/test_rebalance's world (a pending 8-GPU gang; chat-0 on n1 beside a 4-GPU gang, chat-1 alone on n2,
    n3 holding a gang) with n1 in zone a, n2 and n3 in zone b. Moving chat-1 empties n2 for the waiting gang."""
    from autoscaler.core.rebalance import RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    pods = [
        *reb.gang("fixed", ["n1"], gpus=4), reb.replica("chat", 0, "n1"), reb.replica("chat", 1, "n2"),
        *reb.gang("big", ["n3"], gpus=n3_gang), *reb.gang("wait", [None]),
    ]  # fmt: skip
    nodes = [replace(n, labels={ZONE: zone}) for n, zone in zip(reb.BASE_NODES, ("a", "b", "b"), strict=True)]
    (chat,) = reb.deployments(pods)
    if spread:
        chat = replace(chat, pod_labels={"app": "chat"}, spread_constraints=(BY_ZONE,))
    plan, _ = plan_rebalance(reb.snap(nodes, pods, deps=(chat,)), reb.NOW, reb.CONFIG, RebalanceState())
    assert reb.evicted(plan) == moved
    landed = {n for m in plan.moves for n in m.destinations}
    assert landed <= landing and bool(landed) == bool(moved)


def test_plan_says_why_a_pool_in_the_zone_ahead_is_not_grown() -> None:
    """The burst pool's only node is in zone a, which the spread refuses now: the burst option says its pods'
    topology spread keeps them off the pool's nodes (the operator sees why free money buys nothing)."""
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.5, nodes=1, min_nodes=0, max_nodes=4)
    config = CapacityConfig(pools=(pool,), assumed_shortfall_s=8 * 3600, preempt=False)
    nodes = (_node("a1", "a"), _node("b1", "b"), _node("ba0", "a", pool="burst"))
    pods = (_replica(0, "a1"), _gang("busy", "a1", 7, 60.0), _gang("full", "b1", 8, 60.0),
            _gang("full-a", "ba0", 8, 60.0))  # fmt: skip
    _, report, _ = _tick(pods, nodes, SPREAD, 2, config, {"burst": 1})
    (burst,) = [o for o in report.options if o.kind == "burst"]
    assert not burst.chosen and "topology spread" in burst.detail and "burst" in burst.detail, burst.detail


def test_plan_names_the_free_gpus_the_topology_spread_refuses() -> None:
    nodes = (_node("a1", "a"), _node("b1", "b"), _node("c1", "c"))
    pods = (_replica(0, "a1"), _replica(1, "b1"), _gang("dear", "c1", 8, 3000.0))
    _, report, _ = _tick(pods, nodes, SPREAD, 3)
    (preempt,) = [o for o in report.options if o.kind == "preempt"]
    assert "GPUs free on a1, b1, where its pod anti-affinity or topology spread keeps it off" in preempt.detail
