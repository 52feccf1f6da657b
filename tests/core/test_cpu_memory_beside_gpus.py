"""Capacity arbitration counts a node's CPU and memory beside its GPUs (``NodeInfo.free_beside_gpus``,
``DeploymentInfo.cpu_milli_per_pod``/``memory_bytes_per_pod``): GPUs freed on a node whose CPU or memory is taken by
pods that stay host no replica, so no training is stopped for them; free GPUs without the CPU or memory beside them
are no room, so the replica's shortfall is seen (and met elsewhere) instead of waited on forever. Nodes whose CPU and
memory are not known are room by their GPUs alone, as before."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import CapacityState, ScaleDecision, ScaleNodePool, ServicePolicy, SuspendWorkload
from autoscaler.core.reasons import Reason
from autoscaler.core.victims import GangCandidate, GpuNeed, TrainingRules, choose_victims, gangs_from_snapshot, need_met

NOW = 100_000.0
GI = 1 << 30


def gang(name: str, node: str, gpus: int = 8, cpu: int = 0, memory: int = 0, lost: float = 100.0) -> GangCandidate:
    return GangCandidate(
        gang=f"job/ml/{name}", priority=100, gpus_by_node={node: gpus}, pods=(("ml", f"{name}-0"),),
        started_at=NOW - 7200, lost_work_gpu_s=lost, beside_by_node={node: (cpu, memory)} if cpu or memory else {},
    )  # fmt: skip


TYPES = {"n1": "A100", "n2": "A100"}


@pytest.mark.parametrize(
    ("free", "beside", "need", "met"),
    [
        # GPUs alone: 2 replicas of 1 GPU on n1
        ({"n1": 2}, None, GpuNeed(2, 1), True),
        # each replica asks 8 CPUs; n1 has 12 free: one replica
        ({"n1": 2}, {"n1": (12_000, 100 * GI)}, GpuNeed(2, 1, None, 8_000), False),
        ({"n1": 2}, {"n1": (16_000, 100 * GI)}, GpuNeed(2, 1, None, 8_000), True),
        # memory is the bound: 64 Gi free, 40 Gi a replica
        ({"n1": 2}, {"n1": (64_000, 64 * GI)}, GpuNeed(2, 1, None, 0, 40 * GI), False),
        # a node whose CPU and memory are not known is room by its GPUs
        ({"n1": 2}, {"n2": (0, 0)}, GpuNeed(2, 1, None, 8_000, 40 * GI), True),
        # a need asking no CPU or memory ignores them
        ({"n1": 2}, {"n1": (0, 0)}, GpuNeed(2, 1), True),
        # over-committed (negative) room holds nothing
        ({"n1": 2}, {"n1": (-4_000, 10 * GI)}, GpuNeed(1, 1, None, 1_000), False),
        # two nodes: one replica each
        ({"n1": 1, "n2": 1}, {"n1": (8_000, GI), "n2": (8_000, GI)}, GpuNeed(2, 1, None, 8_000, GI), True),
    ],
)
def test_need_met_counts_cpu_and_memory_where_known(free, beside, need, met) -> None:
    assert need_met(free, need, TYPES, beside) is met


def test_the_cheaper_gang_is_passed_over_when_its_node_has_no_cpu_left() -> None:
    # a: cheap to stop, on n1, where a CPU-hungry pod that stays leaves 4 CPUs (a's own 8 come back: 12 < 16);
    # b: dearer, on n2, with room beside it
    a = gang("a", "n1", cpu=8_000, lost=10.0)
    b = gang("b", "n2", cpu=8_000, lost=500.0)
    need = GpuNeed(1, 8, None, 16_000, 0)
    beside = {"n1": (4_000, 200 * GI), "n2": (40_000, 200 * GI)}
    choice = choose_victims(need, {"n1": 0, "n2": 0}, [a, b], TYPES, beside=beside)
    assert choice.met and [v.gang for v in choice.victims] == ["job/ml/b"]
    # without the CPU the cheap one is taken (as before)
    blind = choose_victims(GpuNeed(1, 8), {"n1": 0, "n2": 0}, [a, b], TYPES, beside=beside)
    assert [v.gang for v in blind.victims] == ["job/ml/a"]


def test_no_gang_is_stopped_when_none_frees_the_cpu_a_replica_needs() -> None:
    a = gang("a", "n1", cpu=2_000)
    b = gang("b", "n2", cpu=2_000)
    need = GpuNeed(1, 8, None, 32_000, 0)
    beside = {"n1": (1_000, GI), "n2": (1_000, GI)}
    choice = choose_victims(need, {"n1": 0, "n2": 0}, [a, b], TYPES, beside=beside)
    assert not choice.met and choice.victims == ()


def test_the_victims_cpu_and_memory_together_make_the_room() -> None:
    # two 4-GPU gangs on n1, each holding 8 CPUs; 2 CPUs free: one replica of 8 GPUs and 16 CPUs needs both gone
    a = gang("a", "n1", gpus=4, cpu=8_000, lost=10.0)
    b = gang("b", "n1", gpus=4, cpu=8_000, lost=20.0)
    choice = choose_victims(GpuNeed(1, 8, None, 16_000), {"n1": 0}, [a, b], {"n1": "A100"},
                            beside={"n1": (2_000, GI)})  # fmt: skip
    assert choice.met and {v.gang for v in choice.victims} == {"job/ml/a", "job/ml/b"}


def test_the_search_is_minimal_with_cpu() -> None:
    # three gangs on n1, the GPUs of any one are enough but the CPU of two is needed
    gangs = [gang(x, "n1", gpus=8, cpu=4_000, lost=float(i)) for i, x in enumerate("abc")]
    free_gpus = {"n1": 0}
    choice = choose_victims(GpuNeed(1, 8, None, 8_000), free_gpus, gangs, {"n1": "A100"}, beside={"n1": (0, GI)})
    assert choice.met and [v.gang for v in choice.victims] == ["job/ml/a", "job/ml/b"]


# ---------------------------------------------------------------------------------------------------------------------
# Through the arbitration

CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=0, max_nodes=4)


def node(name: str, free_beside: tuple[int, int] | None, pool: str | None = "onprem") -> NodeInfo:
    return NodeInfo(name, 8, "A100", pool, True, free_beside_gpus=free_beside)


def chat_replica(i: int, node_name: str | None) -> PodInfo:
    return PodInfo("inference", f"chat-{i}", node_name, 1, 1000, "Running" if node_name else "Pending",
                   node_name is not None, "Deployment", "chat", created_at=NOW - 3600, ready_at=NOW - 3500,
                   cpu_milli=16_000, memory_bytes=64 * GI)  # fmt: skip


def trainer(name: str, node_name: str, lost_age: float = 1800.0) -> PodInfo:
    return PodInfo("ml", f"{name}-0", node_name, 8, 100, "Running", True, "Job", name, gang=f"job/ml/{name}",
                   created_at=NOW - 7200, ready_at=NOW - 7100, last_checkpoint_at=NOW - lost_age,
                   cpu_milli=8_000, memory_bytes=32 * GI)  # fmt: skip


def chat_deployment(replicas: int) -> DeploymentInfo:
    return DeploymentInfo("inference", "chat", replicas, replicas, cpu_milli_per_pod=16_000,
                          memory_bytes_per_pod=64 * GI)  # fmt: skip


def run(snapshot: ClusterSnapshot, desired: int, current: int, config: CapacityConfig):
    decisions = [ScaleDecision(CHAT.key, current, desired, Reason.METRIC_ABOVE_TARGET, "")]
    arb = ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT}, decisions)
    return arbitrate(arb, CapacityState(), config)


def _cluster(n1_beside: tuple[int, int] | None, n2_beside: tuple[int, int] | None) -> ClusterSnapshot:
    # n1: 8 chat replicas (full); n2: one 8-GPU training gang, the newest checkpointed (cheapest); n3: gang "old"
    pods = [chat_replica(i, "n1") for i in range(8)]
    pods += [trainer("fresh", "n2", lost_age=60.0), trainer("old", "n3", lost_age=3000.0)]
    nodes = (node("n1", (0, 0)), node("n2", n2_beside), node("n3", (200_000, 1000 * GI)))
    workloads = tuple(WorkloadInfo("Job", "ml", n, f"job/ml/{n}", False, 100, (8,)) for n in ("fresh", "old"))
    return ClusterSnapshot(NOW, deployments=(chat_deployment(8),), pods=tuple(pods), nodes=nodes, workloads=workloads)


def _suspended(actions) -> list[str]:
    return [a.name for a in actions if isinstance(a, SuspendWorkload)]


def test_a_gang_on_a_node_without_cpu_for_the_replica_is_not_stopped() -> None:
    # n2's CPU is taken by pods that stay: stopping "fresh" gives back 8 CPUs, 4 + 8 < 16 -- the replica could not
    # start there; "old" (more work lost) is stopped instead, on n3, which has the CPU
    snapshot = _cluster(None, (4_000, 500 * GI))
    actions, _, _ = run(snapshot, desired=9, current=8, config=CapacityConfig(pools=()))
    assert _suspended(actions) == ["old"], actions
    # with n2's CPU unknown the cheaper gang is taken, as before
    blind = _cluster(None, None)
    actions, _, _ = run(blind, desired=9, current=8, config=CapacityConfig(pools=()))
    assert _suspended(actions) == ["fresh"], actions


def test_no_gang_is_stopped_when_no_node_would_have_the_memory() -> None:
    # both training nodes lack memory even with their gang gone: nothing is stopped, a burst node is bought
    pods = [chat_replica(i, "n1") for i in range(8)] + [trainer("fresh", "n2"), trainer("old", "n3")]
    nodes = (node("n1", (0, 0)), node("n2", (100_000, 8 * GI)), node("n3", (100_000, 16 * GI)))
    workloads = tuple(WorkloadInfo("Job", "ml", n, f"job/ml/{n}", False, 100, (8,)) for n in ("fresh", "old"))
    snapshot = ClusterSnapshot(NOW, deployments=(chat_deployment(8),), pods=tuple(pods), nodes=nodes,
                               workloads=workloads)  # fmt: skip
    config = CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600)
    actions, report, _ = run(snapshot, desired=9, current=8, config=config)
    assert _suspended(actions) == []
    assert any(isinstance(a, ScaleNodePool) for a in actions), actions
    (preempt,) = [o for o in report.options if o.kind == "preempt"]
    assert "frees enough (GPUs with 16 CPU and 64 GiB memory beside them, per replica)" in preempt.detail


def test_free_gpus_without_cpu_beside_them_are_no_room() -> None:
    # n2 has 8 free GPUs but 2 free CPUs: the replica cannot start there. Before, the arbitration counted it placed
    # and did nothing, tick after tick; now the shortfall is met on n3 by stopping the gang there
    pods = [chat_replica(i, "n1") for i in range(8)] + [trainer("old", "n3")]
    nodes = (node("n1", (0, 0)), node("n2", (2_000, 500 * GI)), node("n3", (200_000, 1000 * GI)))
    workloads = (WorkloadInfo("Job", "ml", "old", "job/ml/old", False, 100, (8,)),)
    snapshot = ClusterSnapshot(NOW, deployments=(chat_deployment(8),), pods=tuple(pods), nodes=nodes,
                               workloads=workloads)  # fmt: skip
    actions, report, _ = run(snapshot, desired=9, current=8, config=CapacityConfig(pools=()))
    assert report.shortfalls and report.shortfalls[0].replicas == 1
    assert _suspended(actions) == ["old"], actions
    # with the CPU there, the free GPUs hold it: nothing to do
    roomy = dataclasses.replace(snapshot, nodes=(nodes[0], node("n2", (64_000, 500 * GI)), nodes[2]))
    actions, report, _ = run(roomy, desired=9, current=8, config=CapacityConfig(pools=()))
    assert not report.shortfalls and _suspended(actions) == []


def test_the_gangs_carry_their_cpu_and_memory_by_node() -> None:
    pods = (trainer("a", "n2"), dataclasses.replace(trainer("a", "n3"), name="a-1"))
    snapshot = ClusterSnapshot(NOW, pods=pods, nodes=(node("n2", None), node("n3", None)))
    (candidate,) = gangs_from_snapshot(snapshot, NOW, TrainingRules())
    assert candidate.beside_by_node == {"n2": (8_000, 32 * GI), "n3": (8_000, 32 * GI)}


def test_a_burst_node_is_not_given_back_when_its_replicas_lack_cpu_elsewhere() -> None:
    """Its one replica fits the free GPUs of n2 but not its CPU: given back, the replica would wait Pending and the
    next short tick buy the node again. With the CPU there it is given back, as before."""
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    pods = [chat_replica(i, "n1") for i in range(8)] + [chat_replica(10, "b0")]
    config = CapacityConfig(pools=(pool,), burst_idle_cooldown_s=0.0)

    def give_backs(n2_beside: tuple[int, int]) -> list[ScaleNodePool]:
        nodes = (node("n1", (0, 0)), node("n2", n2_beside), node("b0", (100_000, 500 * GI), pool="burst"))
        snapshot = ClusterSnapshot(NOW, deployments=(chat_deployment(9),), pods=tuple(pods), nodes=nodes)
        actions, _, _ = run(snapshot, desired=9, current=9, config=config)
        return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN]

    assert give_backs((8_000, 500 * GI)) == []
    assert give_backs((8_000, 32 * GI)) == []  # nor with too little memory
    (shrink,) = give_backs((64_000, 500 * GI))
    assert shrink.remove_node == "b0"
