"""A training gang annotated against voluntary disruption is not preempted by this autoscaler either.

``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` and ``karpenter.sh/do-not-disrupt: "true"`` are what a
team puts on a long training run so that no autoscaler stops it; the rebalancer and the burst-node consolidation
already honoured them (stop 34), the victim search did not: the gang was evicted for an inference shortfall. The
team's explicit consent to this controller (``gpuautoscaler.dev/preemptible: "true"`` on every pod) still wins."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo
from autoscaler.core.model import CapacityState, EvictPod, ScaleDecision, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.victims import TrainingRules, gangs_from_snapshot

NOW = 100_000.0
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)


def trainer(index: int, do_not_disrupt: bool = False, labels: dict[str, str] | None = None) -> PodInfo:
    return PodInfo(
        "ml", f"train-{index}", "n2", 4, 100, "Running", True, gang="pg/ml/train",
        created_at=NOW - 7200, ready_at=NOW - 7000, last_checkpoint_at=NOW - 600,
        do_not_disrupt=do_not_disrupt, labels=labels or {},
    )  # fmt: skip


def replica(index: int) -> PodInfo:
    return PodInfo(
        "inference", f"chat-{index}", "n1", 1, 1000, "Running", True, "Deployment", "chat", created_at=NOW - 3600
    )


def snapshot(*training: PodInfo) -> ClusterSnapshot:
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), NodeInfo("n2", 8, "A100", "onprem", True))
    return ClusterSnapshot(NOW, pods=(*(replica(i) for i in range(8)), *training), nodes=nodes)


YES = {"gpuautoscaler.dev/preemptible": "true"}


@pytest.mark.parametrize(
    ("pods", "eligible"),
    [
        ((trainer(0), trainer(1)), True),
        ((trainer(0, True), trainer(1)), False),  # one annotated pod protects the gang
        ((trainer(0, True, YES), trainer(1, False, YES)), True),  # every pod opted in: consent wins
        ((trainer(0, True, YES), trainer(1)), False),  # consent from part of the gang is not consent
    ],
)
def test_a_gang_with_a_do_not_disrupt_pod_is_not_a_victim_unless_opted_in(
    pods: tuple[PodInfo, ...], eligible: bool
) -> None:
    gangs = gangs_from_snapshot(snapshot(*pods), NOW, TrainingRules(protected=frozenset({CHAT.key})))
    (gang,) = [g for g in gangs if g.gang == "pg/ml/train"]
    assert (gang.why_not is None) is eligible
    if not eligible:
        assert "do-not-disrupt" in (gang.why_not or "")


def test_the_arbitration_does_not_evict_an_annotated_gang_for_a_shortfall() -> None:
    decision = ScaleDecision(CHAT.key, 8, 12, Reason.METRIC_ABOVE_TARGET, "")
    config = CapacityConfig()

    def evictions(*pods: PodInfo) -> list[EvictPod]:
        arb = ArbitrationInput(NOW, snapshot(*pods), {CHAT.key: CHAT}, [decision], {})
        actions, _, _ = arbitrate(arb, CapacityState(), config)
        return [a for a in actions if isinstance(a, EvictPod)]

    assert len(evictions(trainer(0), trainer(1))) == 2  # the same gang without the annotation is stopped
    assert evictions(trainer(0, True), trainer(1)) == []
    assert evictions(replace(trainer(0, True), labels=YES), replace(trainer(1), labels=YES)) != []
