"""Defects a review of the supply half (arbitration, victim search, rebalance) found; each case failed before its fix.

- Two burst pools each gave their node back onto the other's free GPUs in the same tick (the room a given-back
  node's pods take, and the node itself, stayed in the free map).
- A pod two PodDisruptionBudgets select was chosen as a victim (and moved by the rebalancer): the Eviction API refuses
  such a pod (HTTP 500), so the same eviction failed at every tick while an evictable gang stayed untouched.
- The victim cost compared lost work per priority tier only: a higher-priority gang checkpointed this instant (0 lost)
  cost the same as taking nothing from its tier, and was taken before a lower-priority gang.
- A workload's own minimum runtime (``gpuautoscaler.dev/min-runtime-seconds``) was read but only resuming used it.
- The rebalancer "moved" opted-in gang pods nothing recreates elsewhere (bare pods, StatefulSet, DaemonSet pods).
- A policy's spec.priority above the PriorityClass its pods run at preempted training the scheduler then put back by
  evicting the replicas (a loop).
- Two pools' consolidations in one tick: the second gave back a node that the first had just counted pods onto (they
  had nowhere to run), and it did not see the PodDisruptionBudget disruptions the first one's victims took.
"""

from __future__ import annotations

import pytest

from autoscaler.actuator import Actuator, GuardContext
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
from autoscaler.core.model import CapacityState, EvictPod, MetricKind, ScaleDecision, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import REBALANCE_LABEL, RebalanceConfig, RebalanceState, plan_rebalance
from autoscaler.core.victims import GpuNeed, TrainingRules, choose_victims, free_gpus_by_node, gangs_from_snapshot
from autoscaler.fakes.cluster import FakeCluster
from forecast.types import Forecast

NOW = 100_000.0
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)


def replica(name: str, node: str, priority: int = 1000) -> PodInfo:
    return PodInfo("inference", name, node, 1, priority, "Running", True, "Deployment", "chat", created_at=NOW - 3600)


def grow(current: int, desired: int) -> list[ScaleDecision]:
    return [ScaleDecision(CHAT.key, current, desired, Reason.METRIC_ABOVE_TARGET, "", False)]


# ---- two burst pools ------------------------------------------------------------------------------------------------


def test_two_half_empty_burst_pools_are_not_given_back_onto_each_other() -> None:
    pools = tuple(BurstPool(f"burst-{x}", 8, "A100", 300.0, 4.0, min_nodes=0, max_nodes=4) for x in "ab")
    nodes = (
        NodeInfo("n1", 8, "A100", "onprem", True),
        NodeInfo("a-0", 8, "A100", "burst-a", True),
        NodeInfo("b-0", 8, "A100", "burst-b", True),
    )
    pods = [replica(f"chat-{i}", "n1") for i in range(8)]  # the cluster's own node is full
    pods += [replica(f"chat-a{i}", "a-0") for i in range(3)] + [replica(f"chat-b{i}", "b-0") for i in range(3)]
    snap = ClusterSnapshot(
        NOW, pods=tuple(pods), nodes=nodes, deployments=(DeploymentInfo("inference", "chat", 14, 14),)
    )
    state = CapacityState()
    given_back = []
    for now in (NOW, NOW + 700):  # past the idle cooldown
        steady = [ScaleDecision(CHAT.key, 14, 14, Reason.WITHIN_TOLERANCE, "", False)]
        arb = ArbitrationInput(now, snap, {CHAT.key: CHAT}, steady, pool_nodes={"burst-a": 1, "burst-b": 1})
        actions, _, state = arbitrate(arb, state, CapacityConfig(pools=pools))
        given_back = [a for a in actions if isinstance(a, ScaleNodePool) and a.nodes < a.previous_nodes]
    # one node's 3 replicas fit on the other's 5 free GPUs; both at once leaves 6 replicas nowhere to run
    assert [a.pool for a in given_back] == ["burst-a"]


# ---- two PodDisruptionBudgets on one pod -----------------------------------------------------------------------------


def test_a_pod_under_two_budgets_is_not_a_victim_and_an_evictable_gang_is_taken_instead() -> None:
    pods = [replica(f"chat-{i}", "n1") for i in range(8)]
    pods.append(PodInfo("ml", "a-0", "n2", 8, 100, "Running", True, None, None, created_at=NOW - 7200,
                        last_checkpoint_at=NOW - 600, labels={"app": "a", "team": "ml"}))  # fmt: skip
    pods.append(PodInfo("ml", "b-0", "n3", 8, 100, "Running", True, None, None, created_at=NOW - 7200,
                        last_checkpoint_at=NOW - 900, labels={"app": "b"}))  # fmt: skip
    pdbs = [
        PodDisruptionBudgetInfo("ml", "pdb-a", {"app": "a"}, 1),
        PodDisruptionBudgetInfo("ml", "pdb-team", {"team": "ml"}, 1),
    ]
    fake = FakeCluster(pods=pods, nodes=[NodeInfo(n, 8, "A100", "onprem", True) for n in ("n1", "n2", "n3")], pdbs=pdbs)
    fake.add_deployment("inference", "chat", 8)
    actions, report, _ = arbitrate(
        ArbitrationInput(NOW, fake.snapshot(NOW), {CHAT.key: CHAT}, grow(8, 12)), CapacityState(), CapacityConfig()
    )
    assert [(type(a).__name__, a.name) for a in actions] == [("EvictPod", "b-0")]
    why = {c.gang: c.why_not for c in report.candidates}
    assert "2 PodDisruptionBudgets" in (why["pod/ml/a-0"] or "")
    results = Actuator(fake).apply(actions, GuardContext(NOW, {CHAT.key: CHAT}))
    assert [r.result for r in results] == ["applied"]


def test_the_rebalancer_does_not_move_a_replica_two_budgets_select() -> None:
    nodes = (NodeInfo("n1", 8, "A100", None, True), NodeInfo("n2", 8, "A100", None, True))
    labels = {"app": "chat"}
    pods = (
        PodInfo("inference", "chat-0", "n1", 4, 1000, "Running", True, "Deployment", "chat", labels=labels),
        PodInfo("inference", "chat-1", "n2", 4, 1000, "Running", True, "Deployment", "chat", labels=labels),
        PodInfo("ml", "big", None, 8, 100, "Pending", False, "Job", "big", gang="job/ml/big"),
    )
    deployments = (DeploymentInfo("inference", "chat", 2, 2),)
    one = (PodDisruptionBudgetInfo("inference", "chat", labels, 1),)
    two = (
        *one,
        PodDisruptionBudgetInfo("inference", "all", {}, 1),
        PodDisruptionBudgetInfo("inference", "c2", labels, 1),
    )
    moved = []
    for pdbs in (one, two):
        snap = ClusterSnapshot(NOW, pods=pods, nodes=nodes, deployments=deployments, pdbs=pdbs)
        plan, _ = plan_rebalance(snap, NOW, RebalanceConfig(max_moves_per_pass=4), RebalanceState())
        moved.append([a.name for a in plan.actions])
    assert len(moved[0]) == 1  # one budget with room: a replica moves to make a whole node for the 8-GPU pod
    assert moved[1] == []


# ---- the victim cost -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("skew_s", [0.0, 5.0])
def test_a_higher_priority_gang_with_nothing_to_lose_is_not_taken_before_a_lower_one(skew_s: float) -> None:
    def worker(gang: str, node: str, priority: int, checkpoint: float) -> PodInfo:
        return PodInfo("train", f"{gang}-0", node, 8, priority, "Running", True, "JobSet", gang,
                       gang=f"jobset/train/{gang}", created_at=NOW - 7200, last_checkpoint_at=checkpoint)  # fmt: skip

    snap = ClusterSnapshot(
        NOW,
        nodes=(NodeInfo("n0", 8, "H100", None, True), NodeInfo("n1", 8, "H100", None, True)),
        pods=(worker("important", "n0", 500, NOW + skew_s), worker("low", "n1", 100, NOW - 60)),
    )
    gangs = gangs_from_snapshot(snap, NOW, TrainingRules())
    choice = choose_victims(GpuNeed(1, 8), free_gpus_by_node(snap), gangs, {"n0": "H100", "n1": "H100"})
    assert [v.gang for v in choice.victims] == ["jobset/train/low"]


# ---- a workload's own minimum runtime -------------------------------------------------------------------------------


@pytest.mark.parametrize(("own_s", "taken"), [(7200.0, False), (None, True), (300.0, True)])
def test_a_workloads_own_minimum_runtime_keeps_it_from_being_preempted(own_s: float | None, taken: bool) -> None:
    pods = [replica(f"chat-{i}", "n1") for i in range(8)]
    pods.append(PodInfo("ml", "train-0", "n2", 8, 100, "Running", True, "Job", "train", gang="job/ml/train",
                        created_at=NOW - 900, ready_at=NOW - 900))  # fmt: skip
    workload = WorkloadInfo("Job", "ml", "train", "job/ml/train", False, 100, (8,), None, None, min_runtime_s=own_s)
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), NodeInfo("n2", 8, "A100", "onprem", True))
    snap = ClusterSnapshot(NOW, pods=tuple(pods), nodes=nodes, workloads=(workload,))
    actions, report, _ = arbitrate(
        ArbitrationInput(NOW, snap, {CHAT.key: CHAT}, grow(8, 12)), CapacityState(), CapacityConfig()
    )
    assert bool(actions) is taken  # running 900 s: past the default 600 s, inside its own 7,200 s
    if not taken:
        assert "minimum runtime 7200s" in (report.candidates[0].why_not or "")


# ---- rebalancing gangs nothing recreates -----------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "owner", "moved"), [
    (None, None, False), ("StatefulSet", "trainer", False), ("DaemonSet", "ds", False), ("Job", "pg", True),
])  # fmt: skip
def test_the_rebalancer_moves_only_gangs_a_training_controller_recreates(
    kind: str | None, owner: str | None, moved: bool
) -> None:
    opt_in = {REBALANCE_LABEL: "allowed"}
    nodes = (NodeInfo("n1", 8, "A100", None, True), NodeInfo("n2", 8, "A100", None, True))
    group = [
        PodInfo("ml", f"pg-{i}", "n1", 2, 100, "Running", True, kind, owner, gang="kueue/ml/pg",
                last_checkpoint_at=NOW - 60, labels=opt_in)
        for i in range(2)
    ]  # fmt: skip
    pods = (
        *group,
        PodInfo("ml", "other", "n2", 4, 100, "Running", True, "Job", "other", gang="job/ml/other"),
        PodInfo("ml", "big", None, 8, 100, "Pending", False, "Job", "big", gang="job/ml/big"),
    )
    plan, _ = plan_rebalance(ClusterSnapshot(NOW, pods=pods, nodes=nodes), NOW, RebalanceConfig(max_moves_per_pass=4),
                             RebalanceState())  # fmt: skip
    assert bool(plan.actions) is moved
    if not moved:
        assert any("kueue/ml/pg" in note and "not moved" in note for note in plan.notes)


# ---- the priority a service preempts at ------------------------------------------------------------------------------


@pytest.mark.parametrize(("pod_priority", "evicted"), [(0, False), (1000, True)])
def test_a_service_preempts_no_higher_than_its_pods_run(pod_priority: int, evicted: bool) -> None:
    pods = [replica(f"chat-{i}", "n1", priority=pod_priority) for i in range(8)]
    pods += [PodInfo("ml", f"vc-{i}", "n2", 4, 500, "Running", True, None, None, gang="volcano/ml/vc",
                     created_at=NOW - 7200, ready_at=NOW - 7000) for i in range(2)]  # fmt: skip
    nodes = (NodeInfo("n1", 8, "A100", None, True), NodeInfo("n2", 8, "A100", None, True))
    snap = ClusterSnapshot(NOW, pods=tuple(pods), nodes=nodes)
    chat = ServicePolicy("inference", "chat", max_replicas=40, priority=900)
    actions, report, _ = arbitrate(
        ArbitrationInput(NOW, snap, {chat.key: chat}, grow(8, 10)), CapacityState(), CapacityConfig()
    )
    assert any(isinstance(a, EvictPod) for a in actions) is evicted
    if not evicted:
        assert any("run at priority 0" in note for note in report.notes)


# ---- two pools' consolidations in one tick ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("on_b", "budget", "stopped", "shrunk"),
    [
        # burst-a's 5 replicas are placed best fit: 3 on b-0's 3 free GPUs, 2 on n2 (where g2 stopped). b-0 must not
        # then be given back in the same tick on the strength of its own 5 pods: the 3 moved there would have nowhere
        # to run (it was, with nothing stopped for it).
        (5, 2, ["g2"], ["burst-a"]),
        # b-0 full: a's replicas all go to n2; b's 8 need g3 stopped too, but the one budget over g2 and g3 allows a
        # single disruption and a's consolidation spent it (both gangs were stopped: 2 disruptions under 1).
        (8, 1, ["g2"], ["burst-a"]),
        # a budget of 2: both nodes go, each with its own gang stopped
        (8, 2, ["g2", "g3"], ["burst-a", "burst-b"]),
    ],
)
def test_two_pools_consolidated_in_one_tick(on_b: int, budget: int, stopped: list[str], shrunk: list[str]) -> None:
    pools = tuple(BurstPool(f"burst-{x}", 8, "A100", 300.0, 4.0, min_nodes=0, max_nodes=4) for x in "ab")
    nodes = tuple(NodeInfo(n, 8, "A100", "onprem", True) for n in ("n1", "n2", "n3"))
    nodes += (NodeInfo("a-0", 8, "A100", "burst-a", True), NodeInfo("b-0", 8, "A100", "burst-b", True))
    pods = [replica(f"chat-{i}", "n1") for i in range(8)]
    pods += [replica(f"chat-a{i}", "a-0") for i in range(5)] + [replica(f"chat-b{i}", "b-0") for i in range(on_b)]
    for gang, where in (("g2", "n2"), ("g3", "n3")):
        pods.append(PodInfo("ml", f"{gang}-0", where, 8, 100, "Running", True, "Job", gang, gang=f"job/ml/{gang}",
                            created_at=NOW - 7200, last_checkpoint_at=NOW - 225, labels={"team": "ml"}))  # fmt: skip
    workloads = tuple(WorkloadInfo("Job", "ml", g, f"job/ml/{g}", False, 100, (8,), None, None) for g in ("g2", "g3"))
    pdbs = (PodDisruptionBudgetInfo("ml", "training", {"team": "ml"}, budget),)
    policy = ServicePolicy("inference", "chat", max_replicas=40, priority=1000, metric=MetricKind.REQUEST_RATE,
                           target=1.0)  # fmt: skip
    bound = 13 + on_b
    config = CapacityConfig(pools=pools, burst_idle_cooldown_s=600.0, consolidate_horizon_s=1800.0,
                            slo_risk_per_gpu_hour=10.0)  # fmt: skip
    state = CapacityState()
    for minute in range(11):  # the idle cooldown is over at minute 10
        now = NOW + 60 * minute
        snap = ClusterSnapshot(now, pods=tuple(pods), nodes=nodes, workloads=workloads, pdbs=pdbs,
                               deployments=(DeploymentInfo("inference", "chat", bound, bound),))  # fmt: skip
        flat = Forecast(start=now, step_s=60.0, quantiles={0.5: (8.0,) * 60, 0.99: (8.0,) * 60}, model="flat")
        steady = [ScaleDecision(policy.key, bound, bound, Reason.WITHIN_TOLERANCE, "", False)]
        arb = ArbitrationInput(now, snap, {policy.key: policy}, steady, {policy.key: (flat, 0.99, 90.0)},
                               pool_nodes={"burst-a": 1, "burst-b": 1})  # fmt: skip
        actions, report, state = arbitrate(arb, state, config)
    assert [a.name for a in actions if not isinstance(a, ScaleNodePool)] == stopped, (actions, report.notes)
    assert [a.pool for a in actions if isinstance(a, ScaleNodePool)] == shrunk, (actions, report.notes)
    # each give-back names the stops its move needs (the actuator gives the node back only once they are made), and
    # every stop is needed by exactly one give-back
    needs = [stop for a in actions if isinstance(a, ScaleNodePool) for stop in a.needs]
    assert sorted(needs, key=repr) == sorted((a for a in actions if not isinstance(a, ScaleNodePool)), key=repr)
