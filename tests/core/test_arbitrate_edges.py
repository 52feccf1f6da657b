"""Capacity arbitration on odd but possible clusters (review findings of stop 28): two services bursting one pool,
a PodDisruptionBudget shared across services, gangs of mixed priority, stale metrics, give-back by GPU type and
packing, broken on-prem nodes, workloads of unknown size."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import (
    ClusterSnapshot,
    DeploymentInfo,
    NodeInfo,
    PodDisruptionBudgetInfo,
    PodInfo,
    WorkloadInfo,
)
from autoscaler.core.model import (
    CapacityState,
    EvictPod,
    ResumeWorkload,
    ScaleDecision,
    ScaleNodePool,
    ServicePolicy,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.core.victims import TrainingRules, gangs_from_snapshot

NOW = 100_000.0


def node(name: str, gpus: int = 8, ready: bool = True, pool: str | None = "onprem", product: str = "A100") -> NodeInfo:
    return NodeInfo(name, gpus, product, pool, ready)


def replica(svc: str, index: int, node_name: str | None, priority: int = 1000, ns: str = "inference") -> PodInfo:
    return PodInfo(ns, f"{svc}-{index}", node_name, 1, priority, "Running" if node_name else "Pending",
                   node_name is not None, "Deployment", svc, created_at=NOW - 3600, ready_at=NOW - 3500)


def worker(gang: str, index: int, node_name: str, gpus: int = 8, priority: int = 100, ckpt_age: float = 1800.0,
           labels: dict | None = None, **kw) -> PodInfo:
    return PodInfo("ml", f"{gang}-{index}", node_name, gpus, priority, "Running", True, "Job", gang,
                   gang=f"job/ml/{gang}", created_at=NOW - 7200, ready_at=NOW - 7100,
                   last_checkpoint_at=NOW - ckpt_age, labels=labels or {}, **kw)


def job(name: str, pods: int = 1, gpus: int = 8, priority: int = 100, **kw) -> WorkloadInfo:
    return WorkloadInfo("Job", "ml", name, f"job/ml/{name}", False, priority, (gpus,) * pods, **kw)


def decision(policy: ServicePolicy, current: int, desired: int, reason: Reason = Reason.METRIC_ABOVE_TARGET):
    return ScaleDecision(policy.key, current, desired, reason, "")


def run(snapshot: ClusterSnapshot, policies: list[ServicePolicy], decisions: list[ScaleDecision],
        config: CapacityConfig, state: CapacityState | None = None, **kw):
    arb = ArbitrationInput(NOW, snapshot, {p.key: p for p in policies}, decisions, **kw)
    return arbitrate(arb, state or CapacityState(), config)


# Every NotReady node is read as a burst node "still booting" (``_free_by_node``), including an on-prem node whose
# kubelet died. Its free GPUs cover the shortfall on paper, so the service gets neither a preemption nor a burst node,
# tick after tick, for as long as the node stays broken.
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=0, max_nodes=4)


def test_a_broken_onprem_node_is_not_capacity_on_the_way() -> None:
    pods = [replica("chat", i, "n1") for i in range(8)] + [worker("train", 0, "n2")]
    broken = node("n3", ready=False, pool="onprem")  # NotReady on-prem node, nothing bound to it
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), broken),
                               workloads=(job("train"),))
    actions, report, _ = run(snapshot, [CHAT], [decision(CHAT, 8, 12)], CapacityConfig(pools=(POOL,)))
    assert report.shortfalls, "4 replicas have nowhere to run: that is a shortfall"
    assert any(isinstance(a, SuspendWorkload) for a in actions), actions


# Two services short in one tick, both bursting the same pool: the merged ScaleNodePool must be planned from the
# pool's live size (previous_nodes), which the actuator passes as the write precondition (expected=previous_nodes).
SEARCH = ServicePolicy("inference", "search", max_replicas=40, priority=900)
TWO_NODE_POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=1.0, nodes=2, min_nodes=0, max_nodes=10)


def test_merged_burst_action_keeps_the_live_pool_size_as_previous_nodes() -> None:
    # n1 full of chat, n2 full of search; two live burst nodes (full too); nothing preemptible
    pods = [replica("chat", i, "n1") for i in range(8)] + [replica("search", i, "n2", 900) for i in range(8)]
    pods += [replica("chat", 10 + i, "b0") for i in range(8)] + [replica("search", 10 + i, "b1", 900) for i in range(8)]
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("b0", pool="burst"),
                                                            node("b1", pool="burst")))
    config = CapacityConfig(pools=(TWO_NODE_POOL,), assumed_shortfall_s=8 * 3600)
    actions, _report, _ = run(snapshot, [CHAT, SEARCH],
                             [decision(CHAT, 16, 24), decision(SEARCH, 16, 24)], config)
    scale = [a for a in actions if isinstance(a, ScaleNodePool)]
    assert len(scale) == 1, actions
    # the pool has 2 nodes now; the plan adds 1 for chat and 1 for search: 2 -> 4
    assert (scale[0].previous_nodes, scale[0].nodes) == (2, 4), scale[0]


def test_second_service_uses_the_room_left_on_the_node_just_requested() -> None:
    # each service is short ONE 1-GPU replica; one 8-GPU burst node hosts both (least-waste), the plan asks two
    pods = [replica("chat", i, "n1") for i in range(8)] + [replica("search", i, "n2", 900) for i in range(8)]
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2")))
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=1.0, nodes=0, max_nodes=10)
    config = CapacityConfig(pools=(pool,), assumed_shortfall_s=8 * 3600)
    actions, _, _ = run(snapshot, [CHAT, SEARCH], [decision(CHAT, 8, 9), decision(SEARCH, 8, 9)], config)
    scale, = [a for a in actions if isinstance(a, ScaleNodePool)]
    assert scale.nodes == 1, scale  # the pool has 0 nodes: 0 -> 1


# Give-back calls a burst node spare when its used GPUs are at most the free GPUs *summed over every other node*,
# whatever their GPU type and however fragmented. The node is removed although its replicas fit nowhere: they go
# Pending, the next tick is short again and bursts the node back (a scale-down/scale-up loop, each a cold start).


def rep(i: int, node_name: str, gpus: int = 1) -> PodInfo:
    return PodInfo("inference", f"chat-{i}", node_name, gpus, 1000, "Running", True, "Deployment", "chat",
                   created_at=NOW - 3600, ready_at=NOW - 3500)


def shrinks(actions) -> list:
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN]


def test_a_give_back_names_the_node_it_emptied() -> None:
    """The pool's provider removes the node the plan names (a MachineSet would otherwise pick one by its delete
    policy, Random by default): here the burst node with 1 replica, not the one with 6, whose replicas fit nowhere."""
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=2, max_nodes=4)
    pods = [rep(i, "n1") for i in range(6)] + [rep(10 + i, "b-busy") for i in range(6)] + [rep(20, "b-light")]
    snapshot = ClusterSnapshot(
        NOW, pods=tuple(pods),
        nodes=(node("n1"), node("b-busy", pool="burst"), node("b-light", pool="burst")))
    config = CapacityConfig(pools=(pool,), burst_idle_cooldown_s=0.0)
    actions, _, _ = run(snapshot, [CHAT], [decision(CHAT, 13, 13)], config)
    (shrink,) = shrinks(actions)
    assert (shrink.previous_nodes, shrink.nodes, shrink.remove_node) == (2, 1, "b-light"), shrink


def test_h100_replicas_are_not_counted_as_fitting_on_free_a100s() -> None:
    pool = BurstPool("burst-h100", 8, "H100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    pods = [rep(i, "h1") for i in range(8)] + [rep(10 + i, "b0") for i in range(3)]  # 3 of 8 on the burst node
    snapshot = ClusterSnapshot(
        NOW, deployments=(DeploymentInfo("inference", "chat", 11, 11, gpu_product="H100"),), pods=tuple(pods),
        nodes=(node("h1", product="H100"), node("a1", product="A100"), node("b0", pool="burst-h100", product="H100")))
    config = CapacityConfig(pools=(pool,), burst_idle_cooldown_s=0.0)
    actions, _report, _ = run(snapshot, [CHAT], [decision(CHAT, 11, 11)], config)
    assert shrinks(actions) == [], actions  # the 3 H100 replicas fit on no other H100 node


def test_a_4_gpu_replica_is_not_counted_as_fitting_on_3_plus_3_free_gpus() -> None:
    policy = ServicePolicy("inference", "chat", max_replicas=40, priority=1000, gpus_per_replica=4)
    pool = BurstPool("burst", 16, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    pods = [rep(0, "n1", 4), rep(1, "n2", 4), rep(2, "b0", 4)]  # n1, n2: 3 free each; burst node 4 of 16 used
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods),
                               nodes=(node("n1", gpus=7), node("n2", gpus=7), node("b0", gpus=16, pool="burst")))
    config = CapacityConfig(pools=(pool,), burst_idle_cooldown_s=0.0)
    actions, _, _ = run(snapshot, [policy], [decision(policy, 3, 3)], config)
    assert shrinks(actions) == [], actions


# A gang whose pods carry different PriorityClasses (e.g. a JobSet whose replicated jobs use different classes):
# the gang's priority is taken as the *lowest* of its pods, so stopping it preempts a pod of priority 2000 for a
# service of priority 1000 -- work of higher priority than the service, and above preemptible_below_priority.


def snapshot() -> ClusterSnapshot:
    pods = [replica("chat", i, "n1") for i in range(8)]
    pods += [worker("mixed", 0, "n2", priority=100), worker("mixed", 1, "n3", priority=2000)]
    return ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("n3")))


def test_gang_with_a_high_priority_pod_is_not_preemptible() -> None:
    (gang,) = [g for g in gangs_from_snapshot(snapshot(), NOW, TrainingRules()) if g.gang == "job/ml/mixed"]
    assert gang.why_not is not None, gang


def test_no_pod_of_equal_or_higher_priority_is_stopped_for_the_service() -> None:
    actions, _, _ = run(snapshot(), [CHAT], [decision(CHAT, 8, 9)], CapacityConfig())
    evicted = {a.name for a in actions if isinstance(a, EvictPod)}
    assert "mixed-1" not in evicted, actions  # mixed-1 has priority 2000 > chat's 1000


# One PodDisruptionBudget allowing 1 disruption covers two single-pod training gangs. Two services short in the
# same tick each take one gang: the plan stops 2 pods under a budget that allows 1 (suspension deletes the pods
# without asking the Eviction API, so nothing downstream catches it).


def test_victims_of_one_tick_stay_within_a_shared_pdb() -> None:
    team = {"team": "vision"}
    pods = [replica("chat", i, "n1") for i in range(4)] + [replica("search", i, "n1", 900) for i in range(4)]
    pods += [worker("a", 0, "n2", labels=team), worker("b", 0, "n3", labels=team)]
    pdb = PodDisruptionBudgetInfo("ml", "vision", team, disruptions_allowed=1)
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("n3")), pdbs=(pdb,),
                               workloads=(job("a"), job("b")))
    actions, _, _ = run(snapshot, [CHAT, SEARCH], [decision(CHAT, 4, 12), decision(SEARCH, 4, 12)], CapacityConfig())
    stopped = [a.name for a in actions if isinstance(a, (SuspendWorkload, EvictPod))]
    # each gang alone is within the budget; together they are 2 disruptions of 1 allowed
    assert len(stopped) <= 1, stopped


# Prometheus is down: the service's decision is a METRICS_STALE hold at its spec (12 replicas, 4 of them Pending).
# The arbitration still suspends training for the 4 pending replicas -- a preemption decided on a tick whose metrics
# are stale.


# The same with a *partial* answer (k of n pods reported: decide holds with METRICS_PARTIAL instead of scaling down):
# the arbitration excluded only stale holds, and the actuator's guard only knows stale services, so a partial
# metrics answer stopped training.


@pytest.mark.parametrize("reason", [Reason.METRICS_STALE, Reason.METRICS_PARTIAL])
def test_no_preemption_on_a_stale_or_partial_hold(reason: Reason) -> None:
    pods = [replica("chat", i, "n1") for i in range(8)] + [replica("chat", 8 + i, None) for i in range(4)]
    pods += [worker("train", 0, "n2")]
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2")), workloads=(job("train"),))
    held = decision(CHAT, 12, 12, reason)
    actions, report, _ = run(snapshot, [CHAT], [held], CapacityConfig())
    assert not [a for a in actions if isinstance(a, (SuspendWorkload, EvictPod, ScaleNodePool))], actions
    assert any("neither preempt nor burst" in n for n in report.notes), report.notes
    # the same shortfall on a fresh decision does stop the training: the test can tell the two apart
    actions, _, _ = run(snapshot, [CHAT], [decision(CHAT, 12, 12)], CapacityConfig())
    assert [a for a in actions if isinstance(a, (SuspendWorkload, EvictPod))]


# A workload this controller suspended, whose pod sizes could not be read (``pod_gpus == ()``), is resumed onto a
# cluster with no free GPU at all: ``_fits(usable, ())`` places nothing and so always "fits". The resume rule is to
# give GPUs back only where they are free (and reserved for the forecast).


def test_a_workload_of_unknown_size_is_not_resumed_onto_a_full_cluster() -> None:
    pods = [replica("chat", i, "n1") for i in range(8)]  # the only node is full
    paused = WorkloadInfo("Job", "ml", "big", "job/ml/big", True, 100, (), None, NOW - 900)
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"),), workloads=(paused,))
    actions, report, _ = run(snapshot, [CHAT], [decision(CHAT, 8, 8)], CapacityConfig(resume_after_s=0.0),
                             CapacityState(free_since=NOW - 999))
    assert not [a for a in actions if isinstance(a, ResumeWorkload)], (actions, report.notes)


# A gang stopped by an earlier tick keeps its GPUs through its pods' grace period (training pods often take long to
# checkpoint and exit): a tick in that window must count them as coming back, not stop a second gang for the same
# shortfall.
def test_a_gang_still_terminating_is_capacity_on_its_way_not_a_reason_to_stop_another() -> None:
    pods = [replica("chat", i, "n1") for i in range(8)] + [replica("chat", 8 + i, None) for i in range(4)]
    stopping = [dataclasses.replace(worker("a", 0, "n2"), terminating=True)]
    pods += [*stopping, worker("b", 0, "n3")]
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("n3")),
                               workloads=(job("a"), job("b")))
    actions, report, _ = run(snapshot, [CHAT], [decision(CHAT, 12, 12)], CapacityConfig())
    assert not [a for a in actions if isinstance(a, (SuspendWorkload, EvictPod))], actions
    assert not report.shortfalls  # the 4 replicas go where a's 8 GPUs are being freed
    (a,) = [c for c in report.candidates if c.gang == "job/ml/a"]
    assert a.why_not == "already stopping: its pods are terminating"
    # without the flag the same cluster is short and stops b: the test can tell the two apart
    alive = dataclasses.replace(stopping[0], terminating=False)
    actions, _, _ = run(dataclasses.replace(snapshot, pods=tuple(p if p is not stopping[0] else alive for p in pods)),
                        [CHAT], [decision(CHAT, 12, 12)], CapacityConfig())
    assert [a for a in actions if isinstance(a, (SuspendWorkload, EvictPod))]


def test_lost_work_counts_from_the_restart_when_the_checkpoint_is_older() -> None:
    # resumed at NOW - 600 from a checkpoint taken at NOW - 7200 (before it was suspended): 600 s of work to lose
    pod = dataclasses.replace(worker("r", 0, "n2", ckpt_age=7200.0), created_at=NOW - 700, ready_at=NOW - 600)
    (gang,) = gangs_from_snapshot(ClusterSnapshot(NOW, pods=(pod,), nodes=(node("n2"),)), NOW, TrainingRules())
    assert gang.lost_work_gpu_s == 8 * 600.0


# An eviction names the pod the plan was made from (its uid): a successor of the same name is not evicted.
def test_evictions_carry_the_uid_of_the_pod_read() -> None:
    pods = [replica("chat", i, "n1") for i in range(8)] + [replica("chat", 8 + i, None) for i in range(4)]
    pods.append(dataclasses.replace(worker("bare", 0, "n2"), uid="uid-of-bare-0"))
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2")))  # no workload: evictions
    actions, _, _ = run(snapshot, [CHAT], [decision(CHAT, 12, 12)], CapacityConfig())
    (evict,) = [a for a in actions if isinstance(a, EvictPod)]
    assert (evict.name, evict.uid) == ("bare-0", "uid-of-bare-0")


def test_a_gang_evictions_name_the_budget_covering_several_of_its_pods() -> None:
    """The plan's evictions of a gang carry (budget, pods of the gang it covers): the actuator reads the budget
    fresh before the first eviction, since the per-pod dry runs spend nothing (review 39)."""
    team = {"team": "vision"}
    pods = [replica("chat", i, "n1") for i in range(8)]
    pods += [worker("g", 0, "n2", labels=team), worker("g", 1, "n3", labels=team)]
    pdb = PodDisruptionBudgetInfo("ml", "vision", team, disruptions_allowed=2)
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("n3")), pdbs=(pdb,))
    actions, _, _ = run(snapshot, [CHAT], [decision(CHAT, 8, 16)], CapacityConfig())
    evictions = [a for a in actions if isinstance(a, EvictPod)]
    assert [a.name for a in evictions] == ["g-0", "g-1"], actions
    assert all(a.budgets == (("ml/vision", 2),) for a in evictions)
