"""A Node annotated not to be removed by an autoscaler (stop 43): ``cluster-autoscaler.kubernetes.io/scale-down-
disabled: "true"`` or ``karpenter.sh/do-not-disrupt: "true"`` (``NodeInfo.do_not_disrupt``). The Cluster Autoscaler
and Karpenter never remove such a node; this controller gave back burst nodes without reading it -- an idle one
after its cooldown, a busy one by stopping training to empty it, a broken one a person was investigating. Now none
of them is given back, emptied or consolidated, and the rebalancer does not empty it either."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import CapacityState, ScaleNodePool, SuspendWorkload
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import RebalanceState, plan_rebalance
from tests.core.test_arbitrate import BUSY_POOL, NOW, POOL, _busy_burst, _give_back_over, node, replica, run
from tests.core.test_burst_provisioning import full, tick
from tests.core.test_rebalance import CONFIG, evicted, gang, snap
from tests.core.test_rebalance import NOW as REBALANCE_NOW
from tests.core.test_rebalance import node as rnode
from tests.core.test_rebalance import replica as rreplica
from tests.core.test_stuck_burst_node_evicted import broken_node, not_ready_give_backs


def _kept(snapshot: ClusterSnapshot, name: str) -> ClusterSnapshot:
    return replace(
        snapshot, nodes=tuple(replace(n, do_not_disrupt=True) if n.name == name else n for n in snapshot.nodes)
    )


@pytest.mark.parametrize("kept", [False, True])
def test_a_busy_burst_node_kept_by_its_annotation_is_not_emptied(kept: bool) -> None:
    """The consolidation case of ``test_arbitrate`` (stopping the on-prem gang costs less than the node): with the
    node annotated, nothing is stopped and nothing given back."""
    config = CapacityConfig(pools=(BUSY_POOL,), burst_idle_cooldown_s=600.0, consolidate_horizon_s=1800.0)
    snapshot = _busy_burst(checkpoint_age=225.0)
    got = _give_back_over(_kept(snapshot, "b0") if kept else snapshot, config, 12)
    if kept:
        assert got == []
    else:
        kinds = [type(a) for _, a in got]
        assert kinds == [SuspendWorkload, ScaleNodePool]


def test_of_two_idle_burst_nodes_the_one_not_kept_is_given_back() -> None:
    """Two idle burst nodes, chat on the on-prem node only: with the node given back first annotated, the other one
    goes instead, and the annotated one never."""
    pods = tuple(replica(i, "n1") for i in range(4))
    snapshot = ClusterSnapshot(0.0, pods=pods, nodes=(node("n1"), node("b0", pool="burst"), node("b1", pool="burst")))
    config = CapacityConfig(pools=(replace(POOL, nodes=2),), burst_idle_cooldown_s=600.0)

    def shrinks(snap: ClusterSnapshot) -> list[tuple[Reason, str | None]]:
        state, out = CapacityState(), []
        for minute in range(12):  # chat wants the 4 it runs: both burst nodes idle
            now = NOW + 60 * minute
            actions, _, state = run(replace(snap, time=now), 4, config, state, now=now, demand=4.0)
            out += [(a.reason, a.remove_node) for a in actions if isinstance(a, ScaleNodePool)]
        return out

    plain = shrinks(snapshot)
    assert plain and plain[0][0] is Reason.BURST_SCALE_DOWN
    first = plain[0][1]
    assert first is not None
    other = "b1" if first == "b0" else "b0"
    kept = shrinks(_kept(snapshot, first))
    assert kept[:1] == [(Reason.BURST_SCALE_DOWN, other)]
    assert all(name != first for _, name in kept)


def test_a_burst_pool_all_of_whose_idle_nodes_are_kept_says_so() -> None:
    pods = tuple(replica(i, "n1") for i in range(4))
    snapshot = _kept(ClusterSnapshot(0.0, pods=pods, nodes=(node("n1"), node("b0", pool="burst"))), "b0")
    config = CapacityConfig(pools=(replace(POOL, nodes=1),), burst_idle_cooldown_s=600.0)
    state = CapacityState()
    for minute in range(12):
        now = NOW + 60 * minute
        actions, report, state = run(replace(snapshot, time=now), 4, config, state, now=now, demand=4.0)
        assert not any(isinstance(a, ScaleNodePool) for a in actions)
    assert "burst: its nodes are annotated not to be removed by an autoscaler: not given back" in report.notes


def test_a_broken_burst_node_kept_by_its_annotation_is_not_given_back() -> None:
    """A person investigating a broken node keeps it with the annotation: no give-back, and the report says why."""
    actions, report, state = tick(full(broken_node(900.0, do_not_disrupt=True)), {"burst": 1}, want=8)
    assert not_ready_give_backs(actions) == []
    assert any("annotated not to be removed by an autoscaler" in n for n in report.notes)
    assert state.provision_failures == {}


def test_the_rebalancer_does_not_empty_a_kept_burst_node() -> None:
    """``test_rebalance``'s underused burst node, emptied onto the on-prem node; annotated, it is left alone."""
    pods = [*gang("t", ["n1"], gpus=4), rreplica("chat", 0, "n1"), rreplica("chat", 1, "b1")]
    nodes = [rnode("n1"), rnode("b1", pool="burst")]
    plan, _ = plan_rebalance(snap(nodes, pods), REBALANCE_NOW, CONFIG, RebalanceState())
    assert evicted(plan) == ["inf/chat-1"]
    kept = [rnode("n1"), replace(rnode("b1", pool="burst"), do_not_disrupt=True)]
    plan, _ = plan_rebalance(snap(kept, pods), REBALANCE_NOW, CONFIG, RebalanceState())
    assert plan.actions == ()
    assert "burst node b1: annotated not to be removed by an autoscaler, not emptied" in plan.notes
