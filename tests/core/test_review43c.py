"""Review of stop 43c: ``NodeInfo.do_not_disrupt`` (a Node kept from autoscalers by its annotation) in the capacity
arbitration and the rebalancer, and a node whose GPUs all went unhealthy read as broken (``NodeInfo.gpus_unhealthy``).

Pins what was checked and found right; the defects found are pinned by the tests whose docstrings say "Defect"
(fixed by review 43c)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo
from autoscaler.core.model import CapacityState, ResumeWorkload, ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import RebalanceState, plan_rebalance
from tests.core.test_arbitrate import NOW, POOL, _suspended_snapshot, node, replica, run
from tests.core.test_burst_provisioning import full, tick
from tests.core.test_rebalance import CONFIG, evicted, gang, snap
from tests.core.test_rebalance import NOW as REBALANCE_NOW
from tests.core.test_rebalance import node as rnode
from tests.core.test_rebalance import replica as rreplica
from tests.core.test_stuck_burst_node_evicted import broken_node, not_ready_give_backs


def _kept(snapshot: ClusterSnapshot, *names: str) -> ClusterSnapshot:
    return replace(
        snapshot, nodes=tuple(replace(n, do_not_disrupt=True) if n.name in names else n for n in snapshot.nodes)
    )


def _shrinks(actions: list[object]) -> list[tuple[Reason, str | None]]:
    return [(a.reason, a.remove_node) for a in actions if isinstance(a, ScaleNodePool) and a.nodes < a.previous_nodes]


# -- defects ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("burst_nodes", "kept", "resumed"),
    [
        pytest.param(0, (), True, id="no burst node: resumed"),
        pytest.param(1, (), False, id="an idle burst node: given back first, resume waits"),
        pytest.param(1, ("b0",), True, id="its one burst node kept: never given back, resume does not wait for it"),
        pytest.param(2, ("b0", "b1"), True, id="every burst node kept"),
        pytest.param(2, ("b0",), False, id="one of two kept: the other is given back first"),
    ],
)
def test_a_pool_whose_every_node_is_kept_does_not_hold_back_a_resume(
    burst_nodes: int, kept: tuple[str, ...], resumed: bool
) -> None:
    """Defect (62a063a): suspended training waits while a burst pool is above its minimum ("burst nodes are given
    back first"). A pool whose every node is annotated not to be removed can never be given back: the wait was for
    ever (as long as the annotation stands). Such a pool counts as one at its minimum."""
    config = CapacityConfig(
        pools=(replace(POOL, nodes=burst_nodes),) if burst_nodes else (POOL,),
        resume_after_s=0.0,
        burst_idle_cooldown_s=3600.0,
    )
    snapshot = _kept(_suspended_snapshot(NOW, burst_nodes=burst_nodes), *kept)
    actions, report, _ = run(snapshot, 4, config, CapacityState(free_since=NOW - 999))
    assert any(isinstance(a, ResumeWorkload) for a in actions) is resumed
    assert _shrinks(actions) == []
    if kept and resumed:
        assert "burst: its nodes are annotated not to be removed by an autoscaler: not given back" in report.notes


def test_a_kept_node_does_not_reset_the_spare_timer_of_a_pool_whose_other_node_took_moved_pods() -> None:
    """Defect (62a063a): the "annotated" check ran before the "its nodes take pods moved off a node given back this
    tick" one, so a pool whose only other node received the pods of another pool's give-back had its spare timer
    reset (and the note said the annotation held it back): that node waited a whole cooldown more at the next tick."""
    first = BurstPool("first", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, min_nodes=0, max_nodes=4)
    second = replace(first, name="second", nodes=2)
    pods = (
        *(replica(i, "n1") for i in range(8)),  # on-prem full
        replica(8, "f0"),  # the first pool's node: 1 of 8 used, spare
        *(replica(9 + i, "k0") for i in range(8)),  # the second pool's kept node: full
    )
    nodes = (node("n1"), node("f0", pool="first"), node("k0", pool="second"), node("a0", pool="second"))
    snapshot = _kept(ClusterSnapshot(NOW, pods=pods, nodes=nodes), "k0")
    config = CapacityConfig(pools=(first, second), burst_idle_cooldown_s=600.0)
    state = CapacityState(free_since=NOW - 9999, burst_unneeded_since={"first": NOW - 9999, "second": NOW - 100})
    actions, report, after = run(snapshot, 17, config, state)
    assert _shrinks(actions) == [(Reason.BURST_SCALE_DOWN, "f0")]  # its pod counted onto a0
    assert "second: its nodes take pods moved off a node given back this tick: not before the next" in report.notes
    assert after.burst_unneeded_since.get("second") == NOW - 100


def test_the_rebalancer_empties_a_burst_node_onto_a_kept_one() -> None:
    """Defect (62a063a): emptying a burst node, the rebalancer moves nothing onto the emptier burst nodes (they are
    being emptied too) -- a kept one included, which is never emptied nor given back: the underused node stayed,
    billed, though its pods fit on the kept node that stays anyway."""
    pods = [*gang("t", ["n1"], gpus=7), rreplica("chat", 0, "n1"), rreplica("chat", 1, "b1")]  # on-prem full
    nodes = [rnode("n1"), rnode("b1", pool="burst"), replace(rnode("k1", pool="burst"), do_not_disrupt=True)]
    plan, _ = plan_rebalance(snap(nodes, pods), REBALANCE_NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]
    assert plan.moves[0].target == "burst node b1" and plan.moves[0].destinations == {"k1": 1}
    # not annotated, the idle k1 is given back by the arbitration: nothing moves onto it
    plain = [rnode("n1"), rnode("b1", pool="burst"), rnode("k1", pool="burst")]
    plan, _ = plan_rebalance(snap(plain, pods), REBALANCE_NOW, CONFIG, RebalanceState())
    assert plan.actions == ()


# -- pins -----------------------------------------------------------------------------------------------------------


def test_a_kept_node_being_removed_does_not_make_its_pool_all_kept() -> None:
    """The provider no longer counts a node being removed (a removal taint): the pool's one counted node is the
    other, idle one -- given back after its cooldown, not taken as kept."""
    pods = tuple(replica(i, "n1") for i in range(4))
    going = replace(node("k0", pool="burst", ready=False), leaving=True, do_not_disrupt=True)
    snapshot = ClusterSnapshot(NOW, pods=pods, nodes=(node("n1"), going, node("b1", pool="burst")))
    config = CapacityConfig(pools=(replace(POOL, nodes=1),), burst_idle_cooldown_s=600.0)
    state = CapacityState(free_since=NOW - 9999, burst_unneeded_since={"burst": NOW - 9999})
    actions, report, _ = run(snapshot, 4, config, state)
    assert _shrinks(actions) == [(Reason.BURST_SCALE_DOWN, "b1")]
    assert not any("annotated not to be removed" in n for n in report.notes)


def test_a_kept_stuck_node_does_not_stop_another_stuck_node_of_its_pool_being_given_back() -> None:
    older = broken_node(1200.0, name="burst-a", do_not_disrupt=True)
    newer = broken_node(900.0, name="burst-b")
    actions, report, _ = tick(full(older, newer), {"burst": 2}, want=8)
    assert [b.remove_node for b in not_ready_give_backs(actions)] == ["burst-b"]
    assert any(n.startswith("burst-a (burst): broken") and "annotated not to be removed" in n for n in report.notes)


def test_a_kept_node_does_not_stop_an_unregistered_machine_being_given_back() -> None:
    """``remove_unregistered`` removes a Machine without a Node: no annotation to read, none kept."""
    kept = replace(NodeInfo("burst-a", 8, "A100", "burst", True), do_not_disrupt=True)
    state = CapacityState(unregistered_since={"burst": (NOW - 5000.0, 1)})
    actions, _, _ = tick(full(kept, extra_pods=tuple(replica(8 + i, "burst-a") for i in range(4))), {"burst": 2},
                         state=state, want=12)  # fmt: skip
    backs = [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_NODE_NOT_REGISTERED]
    assert [(b.nodes, b.previous_nodes, b.remove_unregistered) for b in backs] == [(1, 2, True)]


@pytest.mark.parametrize(
    ("min_nodes", "kept", "expected"),
    [
        pytest.param(0, (), [(Reason.BURST_SCALE_DOWN, "b0")], id="none kept: the emptiest"),
        pytest.param(0, ("b0",), [(Reason.BURST_SCALE_DOWN, "b1")], id="the emptiest kept: the other"),
        pytest.param(1, ("b0",), [(Reason.BURST_SCALE_DOWN, "b1")], id="min 1, one kept: the other, down to 1"),
        pytest.param(2, (), [], id="at its minimum"),
        pytest.param(0, ("b0", "b1"), [], id="both kept"),
    ],
)
def test_the_idle_give_back_takes_a_node_not_kept_within_the_minimum(
    min_nodes: int, kept: tuple[str, ...], expected: list[tuple[Reason, str]]
) -> None:
    """A kept node's free GPUs are room for another node's pods (b1's replica fits on the kept b0); the minimum
    counts every node, kept ones included."""
    pods = (*(replica(i, "n1") for i in range(8)), replica(8, "b1"))  # on-prem full, b1 1 of 8 used, b0 idle
    nodes = (node("n1"), node("b0", pool="burst"), node("b1", pool="burst"))
    snapshot = _kept(ClusterSnapshot(NOW, pods=pods, nodes=nodes), *kept)
    config = CapacityConfig(pools=(replace(POOL, nodes=2, min_nodes=min_nodes),), burst_idle_cooldown_s=600.0)
    state = CapacityState(free_since=NOW - 9999, burst_unneeded_since={"burst": NOW - 9999})
    actions, _, _ = run(snapshot, 9, config, state)
    assert _shrinks(actions) == expected


def test_a_broken_node_with_unhealthy_gpus_is_given_back_like_a_lost_one() -> None:
    """What the reader makes of every GPU unhealthy (``tests/kube/test_review43c_reader.py``): broken, out of service,
    leaving, since the reader first saw it so -- the arbitration's stuck-node path gives it back past the limit, not
    within it, and not while a GPU pod is on it."""
    sick = replace(broken_node(900.0), gpus_unhealthy=True)
    actions, _, state = tick(full(sick), {"burst": 1}, want=8)
    assert [b.remove_node for b in not_ready_give_backs(actions)] == ["burst-a"]
    assert state.provision_failures == {}
    fresh = replace(broken_node(60.0), gpus_unhealthy=True)  # a device plugin restarting, first read a minute ago
    actions, _, _ = tick(full(fresh), {"burst": 1}, want=8)
    assert not_ready_give_backs(actions) == []
    live = PodInfo("inference", "chat-9", "burst-a", 1, 1000, "Running", False, "Deployment", "chat")
    actions, _, _ = tick(full(sick, extra_pods=(live,)), {"burst": 1}, want=8)
    assert not_ready_give_backs(actions) == []
