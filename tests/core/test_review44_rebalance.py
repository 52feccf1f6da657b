"""Review 44 of the rebalance planner (``core/rebalance.py``): the defects the property tests of
``test_review44_rebalance_properties`` found, reduced to small explicit cases on ``test_rebalance``'s cluster.

BASE: n1 holds a 4-GPU gang and chat-0, n2 holds chat-1 alone (7 free), n3 a 6-GPU gang; an 8-GPU gang waits.
Moving chat-1 off n2 (onto n1 or n3) makes room for it.
"""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.rebalance import REBALANCE_LABEL, RebalanceState, plan_rebalance
from tests.core.test_rebalance import BASE_NODES, BASE_PODS, CONFIG, NOW, evicted, gang, node, snap

ALLOWED = {REBALANCE_LABEL: "allowed"}


def test_a_deployment_without_a_policy_moves_only_when_every_pod_opts_in() -> None:
    """Fixed (was a strict xfail).

    WRONG: chat has no valid policy (``managed`` leaves it out); only chat-1 carries
    ``gpuautoscaler.dev/rebalance=allowed`` -- and chat-1 is moved: the planner reads the label on the replica it
    moves, not on every replica of the Deployment (with the labelled one on n1 instead nothing moves, by chance).
    RIGHT: as the module says ("a Deployment no valid policy scales moves only when its owner opted it in, on every
    pod") and the README ("only when every one of its pods is labelled"): nothing moves until chat-0 is labelled
    too."""
    pods = [replace(p, labels={**p.labels, **ALLOWED}) if p.name == "chat-1" else p for p in BASE_PODS]
    plan, _ = plan_rebalance(snap(BASE_NODES, pods), NOW, CONFIG, RebalanceState(), managed=set())
    assert evicted(plan) == []
    both = [replace(p, labels={**p.labels, **ALLOWED}) if p.owner_name == "chat" else p for p in BASE_PODS]
    plan, _ = plan_rebalance(snap(BASE_NODES, both), NOW, CONFIG, RebalanceState(), managed=set())
    assert evicted(plan) == ["inf/chat-1"]


def test_no_replica_moves_off_a_kept_node() -> None:
    """Fixed (was a strict xfail).

    WRONG: n2 is annotated not to be disrupted by an autoscaler (``NodeInfo.do_not_disrupt``: Cluster Autoscaler's
    scale-down-disabled, Karpenter's do-not-disrupt -- a person investigating it, a node kept on purpose); the
    rebalancer evicts chat-1 off it to make room there for the waiting gang. Neither of those autoscalers ever evicts
    a pod off such a node, and the rebalancer does not empty one (burst nodes). RIGHT: the pods of a kept node stay;
    the node still takes pods moved onto it and waiting pods that fit."""
    kept = [replace(n, do_not_disrupt=True) if n.name == "n2" else n for n in BASE_NODES]
    plan, _ = plan_rebalance(snap(kept, BASE_PODS), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
    assert any("job/ml/wait" in n and "no bounded set" in n for n in plan.notes)


def test_no_gang_moves_off_a_kept_node() -> None:
    """Fixed (was a strict xfail). ``test_rebalance``'s movable gang (two 1-GPU pods on n1, allowed, checkpointed a
    minute ago) makes room for the waiting 8-GPU gang on n1; with n1 kept it stays, and the plan says why."""
    nodes = [replace(node("n1"), do_not_disrupt=True), node("n2")]
    pods = [
        *gang("fixed", ["n2"], gpus=4),
        *gang("wait", [None]),
        *gang("small", ["n1", "n1"], gpus=1, allowed=True, checkpoint_age=60.0),
    ]
    plan, _ = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert evicted(plan) == []
    assert any("job/ml/small" in n and "n1" in n and "not to be disrupted" in n for n in plan.notes), plan.notes
