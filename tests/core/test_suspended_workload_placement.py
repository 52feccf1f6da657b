"""Where a suspended workload's pods may go: its pod template's nodeSelector and CPU and memory (stop 47).

Until stop 46 a suspended workload (one this controller suspended, or one queued in Kueue for quota) carried only its
pods' GPUs and GPU type: its resume counted free GPUs on nodes its nodeSelector rules out (resumed there, its pods
only wait Pending while the GPUs they were counted on stay free), and ``waiting_for_room`` judged a queued workload
to start on such nodes (so it was not counted as waiting for a hole), and the rebalancer moved pods to gather
room for it there. The template's tolerations are not kept:
admission adds some it never shows (a Kueue flavor's, a webhook's), so a taint rules nothing out for it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.cluster import (
    ClusterSnapshot,
    NodeInfo,
    PodInfo,
    Taint,
    WorkloadInfo,
    waiting_for_room,
    waiting_gpu_work,
)
from autoscaler.core.model import CapacityState, ResumeWorkload, ScaleDecision, ServicePolicy
from autoscaler.core.reasons import Reason

NOW = 100_000.0
GIB = 2**30
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
TRAIN = {"pool": "train"}


def _node(name: str, labels: dict[str, str] | None = None, **kw: object) -> NodeInfo:
    return NodeInfo(name, 8, "A100", "onprem", True, labels=labels or {}, **kw)  # type: ignore[arg-type]


def _replicas(node: str, count: int) -> list[PodInfo]:
    return [
        PodInfo("inference", f"chat-{node}-{i}", node, 1, 1000, "Running", True, "Deployment", "chat",
                created_at=NOW - 3600)
        for i in range(count)
    ]  # fmt: skip


def _workload(
    selector: dict[str, str] | None = None, beside: tuple[int, int] = (0, 0), by_us: float | None = NOW - 900
) -> WorkloadInfo:
    return WorkloadInfo(
        "Job", "ml", "paused", "job/ml/paused", True, 100, (8,), None, by_us,
        queued=by_us is None, node_selector=selector or {}, pod_beside=beside,
    )  # fmt: skip


def _resumes(nodes: tuple[NodeInfo, ...], workload: WorkloadInfo) -> tuple[bool, list[str]]:
    """n1 holds 4 chat replicas; the other nodes are empty. Whether the workload is resumed, and the notes."""
    snapshot = ClusterSnapshot(NOW, pods=tuple(_replicas("n1", 4)), nodes=nodes, workloads=(workload,))
    decision = ScaleDecision(CHAT.key, 4, 4, Reason.METRIC_ABOVE_TARGET, "", False)
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, [decision], {})
    actions, report, _ = arbitrate(arb, CapacityState(free_since=NOW - 999), CapacityConfig(resume_after_s=0.0))
    return any(isinstance(a, ResumeWorkload) for a in actions), list(report.notes)


@pytest.mark.parametrize(
    ("nodes", "selector", "resumed"),
    [
        pytest.param((_node("n1"), _node("n2")), None, True, id="no selector: the free node n2 takes it"),
        pytest.param(
            (_node("n1"), _node("n2", {"pool": "serve"})), TRAIN, False,
            id="its selector rules the one free node out: not resumed onto it",
        ),
        pytest.param(
            (_node("n1"), _node("n2", {"pool": "serve"}), _node("n3", TRAIN)), TRAIN, True,
            id="a free node its selector allows: resumed",
        ),
        pytest.param(
            (_node("n1", TRAIN), _node("n2")), TRAIN, False,
            id="its selector's node has only 4 free: not resumed onto the other",
        ),
    ],
)  # fmt: skip
def test_resume_counts_only_the_nodes_its_template_selects(
    nodes: tuple[NodeInfo, ...], selector: dict[str, str] | None, resumed: bool
) -> None:
    got, notes = _resumes(nodes, _workload(selector))
    assert got is resumed
    if not resumed:
        assert any("do not fit" in n for n in notes)


def test_a_taint_does_not_keep_a_suspended_workload_from_its_resume() -> None:
    """Tolerations are not read from the template (admission adds some): a tainted free node is still counted."""
    nodes = (_node("n1"), _node("n2", TRAIN, taints=(Taint("dedicated", "training"),)))
    assert _resumes(nodes, _workload(TRAIN))[0] is True


QUEUED_NODES = (_node("n1"), _node("n2", {"pool": "serve"}, free_beside_gpus=(4000, 32 * GIB)))


@pytest.mark.parametrize(
    ("workload", "waits"),
    [
        pytest.param(_workload(by_us=None), False, id="queued, fits the free n2: waits for quota, not room"),
        pytest.param(_workload(TRAIN, by_us=None), True, id="queued, its selector rules n2 out: waits for room"),
        pytest.param(
            _workload(beside=(8000, 0), by_us=None), True, id="queued, its pods ask 8 CPUs, n2 has 4 beside its GPUs"
        ),
        pytest.param(_workload(beside=(2000, 16 * GIB), by_us=None), False, id="queued, its CPU and memory fit n2"),
    ],
)
def test_a_queued_workload_starts_only_where_its_template_allows(workload: WorkloadInfo, waits: bool) -> None:
    snapshot = ClusterSnapshot(NOW, pods=tuple(_replicas("n1", 4)), nodes=QUEUED_NODES, workloads=(workload,))
    waiting = waiting_gpu_work(snapshot)
    assert [w.takes for w in waiting] == [8]
    assert bool(waiting_for_room(waiting, snapshot)) is waits


def _rebalance_world(n2_labels: dict[str, str], selector: dict[str, str], beside: tuple[int, int] = (0, 0)):
    """chat: 7 replicas on n1, 1 on n2 (8 GPUs free, 1 + 7); a suspended 8-GPU Job fits on neither node as is."""
    from tests.core import test_rebalance as reb

    pods = [reb.replica("chat", i, "n1") for i in range(7)] + [reb.replica("chat", 7, "n2")]
    nodes = [reb.node("n1"), replace(reb.node("n2"), labels=n2_labels, free_beside_gpus=(64_000, 512 * GIB))]
    return reb.snap(nodes, pods, workloads=(_workload(selector, beside),))


@pytest.mark.parametrize(
    ("n2_labels", "selector", "beside", "moved"),
    [
        pytest.param({}, {}, (0, 0), ["inf/chat-7"], id="no selector: chat-7 moves to n1, n2 emptied for the Job"),
        pytest.param(TRAIN, TRAIN, (0, 0), ["inf/chat-7"], id="n2 is what its selector asks for: the same move"),
        pytest.param({}, TRAIN, (0, 0), [], id="no node its selector allows: emptying n2 would not start it"),
        pytest.param({}, {}, (96_000, 0), [], id="its pods ask 96 CPUs, n2 has 64 beside its GPUs: no move"),
    ],
)  # fmt: skip
def test_the_rebalancer_gathers_room_for_a_suspended_workload_only_where_it_may_run(
    n2_labels: dict[str, str], selector: dict[str, str], beside: tuple[int, int], moved: list[str]
) -> None:
    from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    plan, _ = plan_rebalance(
        _rebalance_world(n2_labels, selector, beside), reb.NOW, RebalanceConfig(), RebalanceState()
    )
    assert reb.evicted(plan) == moved


def test_no_training_is_stopped_while_a_workload_kind_could_not_be_read() -> None:
    """Review 47b, then degraded (stop 47): a suspendable kind's list refused after it answered leaves its training
    unknown (``ClusterSnapshot.training_unread``). The arbitration stops no training that tick -- the gang below
    would be preempted for chat's shortfall otherwise -- and says why; it still sees the shortfall."""
    from tests.core.test_arbitrate import CHAT, full_cluster, run

    config = CapacityConfig()
    stopping, _, _ = run(full_cluster(), 12, config)
    assert any(type(a).__name__ in ("SuspendWorkload", "EvictPod") for a in stopping)  # the premise
    unread = replace(full_cluster(), training_unread=("jobs.batch",))
    actions, report, _ = run(unread, 12, config)
    assert not any(type(a).__name__ in ("SuspendWorkload", "EvictPod") for a in actions), actions
    assert report.shortfalls and report.shortfalls[0].service == CHAT.key
    assert any("no training stopped" in n and "jobs.batch" in n for n in report.notes), report.notes
