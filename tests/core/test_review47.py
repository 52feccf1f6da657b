"""Review 47: where a suspended workload's pods go (its template's nodeSelector and CPU and memory) and kube-scheduler's
NodeResourcesFit rule (only what a pod requests is checked), where the changes left a caller behind."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import CapacityState, ResumeWorkload, ScaleDecision, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance
from tests.core import test_rebalance as reb
from tests.core.test_suspended_workload_placement import _replicas  # the same 1-GPU chat replicas

NOW = 100_000.0
GIB = 2**30
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)


def _suspended(beside: tuple[int, int] = (0, 0), selector: dict[str, str] | None = None) -> WorkloadInfo:
    return WorkloadInfo(
        "Job", "ml", "paused", "job/ml/paused", True, 100, (8,), None, reb.NOW - 900,
        node_selector=selector or {}, pod_beside=beside,
    )  # fmt: skip


# --- the rebalancer's room-making: a resource the pod does not request is not short -----------------------------


def test_make_room_does_not_free_cpu_a_pod_does_not_request() -> None:
    """n2's CPU is over-requested (allocatable shrunk under its pods: -500m free beside its GPUs) and the suspended
    Job asks memory only. kube-scheduler (NodeResourcesFit) does not check CPU for it, nor does ``fits_beside`` since
    765a278; ``_make_room`` still counted the 500m as short and wanted CPU freed that the one replica on n2 (requesting
    none) cannot give: no move, although moving chat-7 to n1 starts the Job on n2."""
    pods = [reb.replica("chat", i, "n1") for i in range(7)] + [reb.replica("chat", 7, "n2")]
    nodes = [reb.node("n1"), replace(reb.node("n2"), free_beside_gpus=(-500, 512 * GIB))]
    snapshot = reb.snap(nodes, pods, workloads=(_suspended(beside=(0, 64 * GIB)),))
    plan, _ = plan_rebalance(snapshot, reb.NOW, RebalanceConfig(), RebalanceState())
    assert reb.evicted(plan) == ["inf/chat-7"]


def test_make_room_for_a_pending_pod_requesting_nothing_beside_its_gpus() -> None:
    """The same for a pending pod that requests neither CPU nor memory: a node's negative CPU is no reason to pass it
    over."""
    pods = [reb.replica("chat", i, "n1") for i in range(7)] + [reb.replica("chat", 7, "n2")]
    waiting = PodInfo("ml", "big-0", None, 8, 100, "Pending", False, "Job", "big")
    nodes = [reb.node("n1"), replace(reb.node("n2"), free_beside_gpus=(-500, -GIB))]
    plan, _ = plan_rebalance(reb.snap(nodes, [*pods, waiting]), reb.NOW, RebalanceConfig(), RebalanceState())
    assert reb.evicted(plan) == ["inf/chat-7"]


# --- the resume: the CPU and memory its pods request, as waiting_for_room and the rebalancer judge it ------------


def _node(name: str, **kw: object) -> NodeInfo:
    return NodeInfo(name, 8, "A100", "onprem", True, **kw)  # type: ignore[arg-type]


def _resumed(nodes: tuple[NodeInfo, ...], workloads: tuple[WorkloadInfo, ...]) -> list[str]:
    snapshot = ClusterSnapshot(NOW, pods=tuple(_replicas("n1", 4)), nodes=nodes, workloads=workloads)
    decision = ScaleDecision(CHAT.key, 4, 4, Reason.METRIC_ABOVE_TARGET, "", False)
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, [decision], {})
    actions, _, _ = arbitrate(arb, CapacityState(free_since=NOW - 999), CapacityConfig(resume_after_s=0.0))
    return [a.name for a in actions if isinstance(a, ResumeWorkload)]


def _paused(name: str, beside: tuple[int, int], gpus: int = 8) -> WorkloadInfo:
    return WorkloadInfo("Job", "ml", name, f"job/ml/{name}", True, 100, (gpus,), None, NOW - 900, pod_beside=beside)


def test_a_resume_needs_the_cpu_its_pods_request_beside_the_free_gpus() -> None:
    """n2 has its 8 GPUs free but 4 CPUs beside them; the Job's pod requests 16. Resumed there, its pod only waits
    Pending (as waiting_for_room judges a queued workload, and as the rebalancer judges this one): not resumed."""
    nodes = (_node("n1"), _node("n2", free_beside_gpus=(4000, 256 * GIB)))
    assert _resumed(nodes, (_paused("paused", (16_000, 0)),)) == []
    assert _resumed(nodes, (_paused("paused", (2000, 0)),)) == ["paused"]


def test_two_resumes_in_one_tick_share_the_cpu_beside_the_gpus() -> None:
    """n2 has 8 GPUs free and 16 CPUs beside them: room for one 4-GPU pod asking 12 CPUs, not two (n1's 4 free GPUs
    have no CPU beside them). The first Job
    resumed onto it takes that CPU (as it takes the GPUs): the second is not counted on the same CPUs."""
    nodes = (_node("n1", free_beside_gpus=(0, 0)), _node("n2", free_beside_gpus=(16_000, 256 * GIB)))
    got = _resumed(nodes, (_paused("a", (12_000, 0), gpus=4), _paused("b", (12_000, 0), gpus=4)))
    assert got == ["a"]


# --- the hole a scale-down would open for lower-priority work: only on a node the work may use -------------------


def test_no_hole_is_opened_for_work_on_a_node_its_selector_rules_out() -> None:
    """chat's 8 replicas fill n1 (pool serve); n2 (pool train) is full of other training. A Kueue workload queued
    for 8 GPUs on pool train waits for room (``waiting_for_room``: its selector is read since c826eea), so the tick
    asks ``hole_node_for_waiting_work`` where a scale-down of chat would make room for it: n1, a node the workload may
    not use -- the contended hold then kept chat's replicas for work that could never take their GPUs. No hole is
    right: none of chat's replicas runs on a train node."""
    from autoscaler.core.cluster import hole_node_for_waiting_work, node_room, waiting_for_room, waiting_gpu_work

    train, serve = {"pool": "train"}, {"pool": "serve"}
    chat = [
        PodInfo("inference", f"chat-{i}", "n1", 1, 1000, "Running", True, "Deployment", "chat", created_at=NOW - 3600)
        for i in range(8)
    ]
    other = [PodInfo("ml", "other-0", "n2", 8, 50, "Running", True, "Job", "other", gang="job/ml/other")]
    queued = WorkloadInfo(
        "Job", "ml", "queued", "job/ml/queued", True, 100, (8,), None, None, queued=True, node_selector=train
    )
    nodes = (_node("n1", labels=serve), _node("n2", labels=train))
    snapshot = ClusterSnapshot(NOW, pods=(*chat, *other), nodes=nodes, workloads=(queued,))
    waiting = waiting_for_room(waiting_gpu_work(snapshot), snapshot)
    assert [w.takes for w in waiting] == [8]
    assert hole_node_for_waiting_work(node_room(snapshot), "inference/chat", waiting) is None
