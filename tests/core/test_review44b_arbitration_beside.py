"""Review 44b: the arbitration's CPU and memory beside the GPUs within one tick.

What this tick counts onto a node -- the pods of a burst node given back -- takes that node's CPU and memory as it
takes its GPUs: a second burst node given back in the same tick does not count its pods onto the same CPU."""

from __future__ import annotations

import dataclasses

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.model import CapacityState, ScaleDecision, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from tests.core.test_arbitrate import gang_pods
from tests.core.test_cpu_memory_beside_gpus import CHAT, GI, NOW, chat_replica, node


def run(snapshot: ClusterSnapshot, replicas: int, config: CapacityConfig):
    decisions = [ScaleDecision(CHAT.key, replicas, replicas, Reason.METRIC_ABOVE_TARGET, "")]
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, decisions)
    return arbitrate(arb, CapacityState(), config)


def _give_backs(actions) -> list[str]:
    return sorted(
        a.remove_node or "" for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN
    )


def test_two_burst_nodes_given_back_in_one_tick_do_not_share_the_cpu_of_one_replica() -> None:
    """b0 and c0 (two burst pools) each run one chat replica (1 GPU, 16 CPUs). n2 runs six and has 2 free GPUs
    (the fullest node: the moved replicas are counted there first) but 16 free CPUs: room for one of them. One
    node is given back; the other waits (given back, its replica would be Pending and the next short tick buy a
    node again)."""
    pools = tuple(
        BurstPool(name, 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
        for name in ("burst-a", "burst-b")
    )
    pods = [chat_replica(i, "n1") for i in range(8)] + [chat_replica(8 + i, "n2") for i in range(6)]
    pods += [chat_replica(20, "b0"), chat_replica(21, "c0")]
    nodes = (
        node("n1", (0, 0)),
        node("n2", (16_000, 500 * GI)),
        node("b0", (100_000, 500 * GI), pool="burst-a"),
        node("c0", (100_000, 500 * GI), pool="burst-b"),
    )
    deployment = DeploymentInfo("inference", "chat", 16, 16, cpu_milli_per_pod=16_000, memory_bytes_per_pod=64 * GI)
    snapshot = ClusterSnapshot(NOW, deployments=(deployment,), pods=tuple(pods), nodes=nodes)
    actions, _, _ = run(snapshot, 16, CapacityConfig(pools=pools, burst_idle_cooldown_s=0.0))
    assert len(_give_backs(actions)) == 1, actions
    # with the CPU for both on n2, both are given back (as by GPUs alone)
    roomy = (*nodes[:1], node("n2", (32_000, 500 * GI)), *nodes[2:])
    actions, _, _ = run(
        ClusterSnapshot(NOW, deployments=(deployment,), pods=tuple(pods), nodes=roomy),
        16,
        CapacityConfig(pools=pools, burst_idle_cooldown_s=0.0),
    )
    assert _give_backs(actions) == ["b0", "c0"], actions


def _busy_burst_with_pending(n2_cpu: int, n3_cpu: int) -> tuple[ArbitrationInput, CapacityConfig]:
    """b0 (burst) runs 5 chat replicas of 1 GPU and 1 CPU each: busy, emptied only by consolidation. n1 is full of
    chat; n2 has 8 free GPUs and ``n2_cpu`` free CPU; n3 runs gang g (8 GPUs, checkpointed 225 s ago: cheaper to
    stop than keeping b0). This tick a 14th chat replica is Pending and counted onto n2 (GPUs and CPU)."""
    from dataclasses import replace as _replace

    from autoscaler.core.cluster import WorkloadInfo
    from autoscaler.core.model import MetricKind
    from forecast.types import Forecast

    def replica(i: int, node_name: str) -> PodInfo:
        return PodInfo("inference", f"chat-{i}", node_name, 1, 1000, "Running", True, "Deployment", "chat",
                       created_at=NOW - 3600, cpu_milli=1000)  # fmt: skip

    pods = [replica(i, "n1") for i in range(8)] + [replica(10 + i, "b0") for i in range(5)]
    pods += [dataclasses.replace(p, cpu_milli=1000) for p in gang_pods("g", ["n3"], checkpoint_age=225)]
    nodes = (
        node("n1", (0, GI)),
        node("n2", (n2_cpu, 500 * GI)),
        node("n3", (n3_cpu, 500 * GI)),
        node("b0", (0, 500 * GI), pool="burst"),  # its CPU all taken: the Pending replica goes to n2
    )
    deployment = DeploymentInfo("inference", "chat", 14, 13, cpu_milli_per_pod=1000)
    snapshot = ClusterSnapshot(NOW, deployments=(deployment,), pods=tuple(pods), nodes=nodes,
                               workloads=(WorkloadInfo("Job", "ml", "g", "job/ml/g", False, 100, (8,)),))  # fmt: skip
    policy = _replace(CHAT, metric=MetricKind.REQUEST_RATE, target=1.0)
    flat = Forecast(start=NOW, step_s=60.0, quantiles={0.5: (8.0,) * 60, 0.99: (8.0,) * 60}, model="flat")
    decisions = [ScaleDecision(policy.key, 13, 14, Reason.METRIC_ABOVE_TARGET, "")]
    arb = ArbitrationInput(NOW, snapshot, {policy.key: policy}, decisions, {policy.key: (flat, 0.99, 90.0)})
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    return arb, CapacityConfig(pools=(pool,), burst_idle_cooldown_s=0.0, consolidate_horizon_s=1800.0)


def test_consolidation_counts_the_cpu_this_ticks_pending_replicas_took() -> None:
    """n2 had 5.5 CPUs free, the Pending replica took one: 4 of b0's 5 replicas fit there, not 5. The victim search
    must see that and stop g (n3 has the CPU), as the check made before the stops does -- not find "nothing to stop"
    on the snapshot's CPU and then give up on the node ("would not fit once the stops are made")."""
    from autoscaler.core.model import SuspendWorkload

    arb, config = _busy_burst_with_pending(n2_cpu=5_500, n3_cpu=16_000)
    actions, report, _ = arbitrate(arb, CapacityState(), config)
    assert [a.name for a in actions if isinstance(a, SuspendWorkload)] == ["g"], report.notes
    assert _give_backs(actions) == ["b0"], report.notes


def test_consolidation_with_the_cpu_for_all_stops_nothing() -> None:
    """The control: with n2's CPU for the Pending replica and all five moved ones, nothing is stopped."""
    arb, config = _busy_burst_with_pending(n2_cpu=6_000, n3_cpu=16_000)
    actions, report, _ = arbitrate(arb, CapacityState(), config)
    assert _give_backs(actions) == ["b0"], report.notes
    assert [a for a in actions if not isinstance(a, ScaleNodePool)] == [], actions


def _returning(n2_cpu: int) -> ClusterSnapshot:
    """n1 is full of chat (16 CPUs a replica); on n2 a stopped gang's pod (8 GPUs, 1 CPU) is terminating: its GPUs
    are on their way back, with ``n2_cpu`` free beside them (CPU-only pods hold the rest); n3 runs gang "old"."""
    pods = [chat_replica(i, "n1") for i in range(8)]
    pods.append(
        PodInfo(
            "ml",
            "gone-0",
            "n2",
            8,
            100,
            "Running",
            True,
            "Job",
            "gone",
            gang="job/ml/gone",
            created_at=NOW - 7200,
            cpu_milli=1000,
            terminating=True,
        )
    )
    pods += [dataclasses.replace(p, cpu_milli=1000) for p in gang_pods("old", ["n3"], checkpoint_age=600)]
    nodes = (node("n1", (0, 0)), node("n2", (n2_cpu, 500 * GI)), node("n3", (100_000, 500 * GI)))
    from autoscaler.core.cluster import WorkloadInfo

    deployment = DeploymentInfo("inference", "chat", 8, 8, cpu_milli_per_pod=16_000, memory_bytes_per_pod=64 * GI)
    workloads = (WorkloadInfo("Job", "ml", "old", "job/ml/old", False, 100, (8,)),)
    return ClusterSnapshot(NOW, deployments=(deployment,), pods=tuple(pods), nodes=nodes, workloads=workloads)


def test_returning_gpus_without_the_cpu_beside_them_are_no_room() -> None:
    """n2's 8 GPUs come back with 2 + 1 CPUs beside them: no room for a replica of 16 CPUs. The shortfall is seen
    and met on n3 (as free GPUs without the CPU are no room), not waited on until the pod is gone."""
    from autoscaler.core.model import SuspendWorkload

    decisions = [ScaleDecision(CHAT.key, 8, 9, Reason.METRIC_ABOVE_TARGET, "")]
    arb = ArbitrationInput(NOW, _returning(2_000), {CHAT.key: CHAT}, decisions)
    actions, report, _ = arbitrate(arb, CapacityState(), CapacityConfig(pools=()))
    assert report.shortfalls and report.shortfalls[0].replicas == 1, report
    assert [a.name for a in actions if isinstance(a, SuspendWorkload)] == ["old"], actions


def test_returning_gpus_with_the_cpu_their_pods_give_back_are_room() -> None:
    """The control: 15 CPUs free and the terminating pod's 1 coming back hold the replica (16): it waits for them."""
    decisions = [ScaleDecision(CHAT.key, 8, 9, Reason.METRIC_ABOVE_TARGET, "")]
    arb = ArbitrationInput(NOW, _returning(15_000), {CHAT.key: CHAT}, decisions)
    actions, report, _ = arbitrate(arb, CapacityState(), CapacityConfig(pools=()))
    assert actions == [] and (not report.shortfalls or report.shortfalls[0].replicas == 0), (actions, report)


def test_a_replica_counted_onto_returning_gpus_takes_the_cpu_beside_them() -> None:
    """n2: 3 free GPUs and 4 coming back (a terminating 4-GPU pod of 1 CPU), 9 CPUs free. Chat's Pending replica
    (4 GPUs, 8 CPUs) is counted onto the returning GPUs and takes 8 of the 10 CPUs there; search's (1 GPU, 8 CPUs,
    a lower priority) then has no room on n2's free GPUs: its shortfall is seen."""
    search = ServicePolicy("inference", "search", max_replicas=40, priority=500)
    gone = PodInfo("ml", "gone-0", "n2", 4, 100, "Running", True, "Job", "gone", gang="job/ml/gone",
                   created_at=NOW - 7200, cpu_milli=1000, terminating=True)  # fmt: skip
    nodes = (node("n1", (0, 0)), node("n2", (9_000, 500 * GI)))
    pods = [
        PodInfo("inference", f"chat-{i}", "n1", 1, 1000, "Running", True, "Deployment", "chat", created_at=NOW - 3600)
        for i in range(8)
    ]
    deployments = (
        DeploymentInfo("inference", "chat", 8, 8, cpu_milli_per_pod=8_000),
        DeploymentInfo("inference", "search", 0, 0, cpu_milli_per_pod=8_000),
    )
    snapshot = ClusterSnapshot(NOW, deployments=deployments, pods=(*pods, gone), nodes=nodes)
    decisions = [
        ScaleDecision(CHAT.key, 8, 9, Reason.METRIC_ABOVE_TARGET, ""),
        ScaleDecision(search.key, 0, 1, Reason.METRIC_ABOVE_TARGET, ""),
    ]
    chat = dataclasses.replace(CHAT, gpus_per_replica=4)
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: chat, search.key: search}, decisions)
    _, report, _ = arbitrate(arb, CapacityState(), CapacityConfig(pools=()))
    short = {s.service: s.replicas for s in report.shortfalls}
    assert short.get(search.key) == 1, report.shortfalls
    assert not short.get(CHAT.key), report.shortfalls
