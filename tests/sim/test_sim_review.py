"""Review of the simulator: reproductions of defects in the simulated cluster, the engine and the report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoscaler.core.model import MetricKind, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.ports import EvictionOutcome
from autoscaler.sim.cluster import SimCluster, SimDeployment, SimJob, SimPdb, SimPool
from autoscaler.sim.engine import _observe, node_autoscaler_plan, simulate
from autoscaler.sim.policies import SimService
from autoscaler.sim.registry import make_policy
from autoscaler.sim.scenario import NodePool


def _job(name: str, pods: int, gpus_per_pod: int, priority: int = 100) -> SimJob:
    return SimJob("train", name, pods, gpus_per_pod, priority, work_s=1e6, checkpoint_s=600.0, submit_at=0.0,
                  restart_s=0.0)


# ---- scheduler preemption: each victim goes once ---------------------------------------------------------------


def test_preempting_two_pods_of_one_gang_on_a_node_stops_the_gang_once() -> None:
    cluster = SimCluster(preemption=True)
    cluster.add_node("n0", 8)
    job = _job("big", pods=2, gpus_per_pod=4)
    cluster.add_job(job)
    cluster.advance(0.0)
    assert all(p.node == "n0" for p in cluster.pods.values())
    cluster.advance(1000.0)
    cluster.add_deployment(SimDeployment("ml", "chat", 1, gpus_per_replica=8, priority=1000))
    chat = [p for p in cluster.pods.values() if p.owner == "ml/chat"]
    assert [p.node for p in chat] == ["n0"]
    assert job.stops == 1  # one gang stopped (the kube-scheduler evicted two of its pods)
    assert cluster.scheduler_preemptions == 2
    # the work since the last checkpoint (1000 s, checkpoint at 600 s) is lost once: 400 s x 8 GPUs
    assert cluster.lost_training_gpu_s == pytest.approx(400.0 * 8)
    assert job.lost_gpu_s == pytest.approx(400.0 * 8)


def test_preemption_whose_first_victim_is_replaced_counts_every_victim_once() -> None:
    """Losing a Deployment's victim makes its ReplicaSet create a replacement, which runs a scheduling pass while
    the first preemption is still evicting its victims: a victim must not be evicted (and counted) twice."""
    cluster = SimCluster(preemption=True)
    cluster.add_node("n0", 8)
    # the replica is the first victim (the higher of the two priorities): its replacement's scheduling pass runs
    # while the stray pod is still to be evicted
    cluster.add_deployment(SimDeployment("ml", "low", 1, gpus_per_replica=4, priority=20), warm=True)
    cluster.add_training_pod("train", "stray", 4, 10, node="n0")  # a bare pod (no Job), running since 0
    cluster.advance(100.0)
    cluster.add_deployment(SimDeployment("ml", "high", 1, gpus_per_replica=8, priority=1000))
    high = [p for p in cluster.pods.values() if p.owner == "ml/high"]
    assert [p.node for p in high] == ["n0"]
    assert cluster.scheduler_preemptions == 2
    assert cluster.lost_training_gpu_s == pytest.approx(4 * 100.0)  # the stray pod's 100 s on 4 GPUs, once
    assert ("train", "stray") not in cluster.pods
    low = [p for p in cluster.pods.values() if p.owner == "ml/low"]
    assert len(low) == 1 and low[0].node is None


# ---- scheduler preemption: the node with the smallest sum of victim priorities (kube-scheduler's offset) -----------


@pytest.mark.parametrize(
    ("a_priorities", "b_priorities", "expected"),
    [
        # the same highest victim priority: the kube-scheduler adds MaxInt32 + 1 to each priority before summing,
        # so two victims of priority -5 cost more than one (it never prefers more victims for negative priorities)
        ((-5, -5), (-5,), "b"),
        ((-100, -5), (-5,), "b"),
        # positive priorities: the same answer with or without the offset
        ((0, 5), (5,), "b"),
        ((5,), (0, 5), "a"),
        # a lower highest victim priority wins first
        ((-5, -5), (0,), "a"),
    ],
)
def test_preemption_picks_the_node_by_the_kube_schedulers_sum_of_priorities(
    a_priorities: tuple[int, ...], b_priorities: tuple[int, ...], expected: str
) -> None:
    cluster = SimCluster(preemption=True)
    for node, priorities in (("a", a_priorities), ("b", b_priorities)):
        cluster.add_node(node, 4)
        for index, priority in enumerate(priorities):
            cluster.add_training_pod("batch", f"{node}-{index}", 4 // len(priorities), priority, node=node)
    cluster.advance(10.0)
    cluster.add_deployment(SimDeployment("ml", "chat", 1, gpus_per_replica=4, priority=1000))
    (chat,) = [p for p in cluster.pods.values() if p.owner == "ml/chat"]
    assert chat.node == expected
    gone = {name for (_, name) in [("batch", f"{n}-{i}") for n, ps in (("a", a_priorities), ("b", b_priorities))
                                   for i in range(len(ps))] if ("batch", name) not in cluster.pods}
    assert gone == {f"{expected}-{i}" for i in range(len(a_priorities if expected == "a" else b_priorities))}


# ---- node pools: a scale-down by several nodes removes them together ----------------------------------------------


def test_scaling_a_pool_down_by_two_nodes_does_not_move_pods_onto_the_second_node_removed() -> None:
    cluster = SimCluster()
    cluster.add_pool(SimPool("pool", gpus_per_node=8, gpu_product=None, boot_s=0.0), nodes=1)
    job = _job("g", pods=1, gpus_per_pod=4)
    cluster.add_job(job)
    cluster.add_deployment(SimDeployment("ml", "chat", 1, gpus_per_replica=1, priority=1000), warm=True)
    cluster.advance(0.0)
    assert {p.node for p in cluster.pods.values()} == {"pool-0"}  # the gang's pod and the replica
    cluster.scale("pool", 3, expected=1)
    cluster.add_training_pod("batch", "keep", 6, 10, node="pool-2")  # pool-1 stays empty
    cluster.advance(100.0)
    # pool-0 (named) and the emptiest other node, pool-1, go together: nothing lands on pool-1 in between
    cluster.scale("pool", 1, expected=3, remove_node="pool-0")
    assert cluster.pools["pool"].nodes == ["pool-2"]
    assert job.stops == 1  # stopped once with pool-0, not again with pool-1
    assert cluster.lost_training_gpu_s == pytest.approx(4 * 100.0)
    assert {p.node for p in cluster.pods.values()} == {None, "pool-2"}


def test_a_runs_initial_replicas_show_a_cold_start_not_zero() -> None:
    """The initial replicas were created and ready at the run's start: the controller read a 0 s cold start, and
    forecast for now + 0 (holding no scale-down over a cold start) until a replica it made itself came up."""
    from autoscaler.core.cluster import cold_starts_by_service

    cluster = SimCluster()
    cluster.add_pool(SimPool("pool", gpus_per_node=8, gpu_product=None, boot_s=0.0), nodes=1)
    cluster.add_deployment(SimDeployment("ml", "chat", 3, gpus_per_replica=1, cold_start_s=90.0), warm=True)
    snapshot = cluster.snapshot(0.0)
    assert all(p.ready for p in snapshot.pods)
    assert cold_starts_by_service(snapshot) == {"ml/chat": [90.0, 90.0, 90.0]}


# ---- what the controller sees: the queue-depth metric is a finite number of requests ----------------------------


def _queue_service(min_replicas: int = 1, slo_guard: bool = False, rates: list[float] | None = None) -> SimService:
    policy = ServicePolicy(
        namespace="ml", name="chat", min_replicas=min_replicas, max_replicas=40, cold_start_s=30.0,
        metric=MetricKind.QUEUE_DEPTH, target=2.0, latency_slo_s=2.0, slo_guard=slo_guard,
    )
    return SimService(policy, np.asarray(rates or [1.0], dtype=float), throughput=5.0, base_latency_s=1.0,
                      slo_s=2.0, quantile=0.95)


@pytest.mark.parametrize(
    ("ready", "rate", "low", "high"),
    [
        (0, 0.0, 0.0, 0.0),  # scaled to zero, no demand: nothing waits
        (2, 0.0, 0.0, 0.0),
        (2, 5.0, 0.0, 1.0),  # half loaded: a little queueing
        (0, 3.0, 1.0, math.inf),  # scaled to zero, demand: the requests wait
        (2, 10.0, 0.0, math.inf),  # exactly saturated: the queue builds up
        (2, 30.0, 100.0, math.inf),  # overloaded: 20 req/s more than the replicas complete
    ],
)
def test_the_queue_depth_the_controller_sees_is_finite(ready: int, rate: float, low: float, high: float) -> None:
    obs = _observe(_queue_service(), MetricKind.QUEUE_DEPTH, ready, ready, 0, rate, 0.0, 1.0, step_s=15.0)
    assert obs.metric_total is not None
    assert math.isfinite(obs.metric_total)
    assert low <= obs.metric_total <= high


def test_a_queue_depth_service_scales_up_when_overloaded_without_the_slo_guard() -> None:
    """Overloaded, the queue grows: the controller must see a deep queue and scale up (an infinite depth is an
    invalid sample to it, so it held: metrics stale, for as long as the overload lasted)."""
    rates = [4.0] * 4 + [40.0] * 36
    run = simulate(make_policy("reactive"), [_queue_service(rates=rates)], [NodePool(name="fixed", nodes=2)], 0.0,
                   15.0, len(rates), 0.0)
    assert run.reasons.get(Reason.METRICS_STALE.value, 0) == 0
    assert run.timelines[0].spec.max() >= 8  # 40 req/s at 5 req/s per replica


def test_a_queue_depth_service_scales_from_zero_when_demand_arrives() -> None:
    """minReplicas 0: no demand scales the service to zero (after the 300 s window); demand then must bring a
    replica back (with no ready replica the depth was infinite: metrics stale, held at zero for good)."""
    rates = [0.0] * 40 + [4.0] * 20
    run = simulate(make_policy("reactive"), [_queue_service(min_replicas=0, rates=rates)],
                   [NodePool(name="fixed", nodes=1)], 0.0, 15.0, len(rates), 0.0)
    spec, ready = run.timelines[0].spec, run.timelines[0].ready
    assert spec[39] == 0
    assert ready[-1] >= 1
    assert run.reasons.get(Reason.METRICS_STALE.value, 0) == 0


# ---- minutes within the SLO: whole minutes of the clock, whatever the step ----------------------------------------


@pytest.mark.parametrize(
    ("step_s", "steps", "failing", "minutes", "within"),
    [
        (15.0, 8, {5}, 2, 1),  # 4 steps a minute: as before
        (40.0, 6, {1}, 4, 2),  # step 1 is [40 s, 80 s): it spans minutes 0 and 1
        (25.0, 12, {2}, 5, 3),  # step 2 is [50 s, 75 s): minutes 0 and 1
        (90.0, 4, {1}, 6, 4),  # step 1 is [90 s, 180 s): minutes 1 and 2
        (300.0, 2, {0}, 10, 5),  # a step of 5 minutes
        (45.0, 3, set(), 3, 3),  # 135 s: the last, partial minute counts
    ],
)
def test_minutes_within_slo_are_minutes_of_the_clock(
    step_s: float, steps: int, failing: set[int], minutes: int, within: int
) -> None:
    policy = ServicePolicy(namespace="ml", name="chat", min_replicas=2, max_replicas=2, cold_start_s=60.0)
    rates = [50.0 if i in failing else 5.0 for i in range(steps)]  # 2 replicas complete 20 req/s
    service = SimService(policy, np.asarray(rates), throughput=10.0, base_latency_s=1.0, slo_s=1.5, quantile=0.95)
    run = simulate(make_policy("static"), [service], [NodePool(name="fixed", nodes=1)], 0.0, step_s, steps, 0.0)
    assert [not ok for ok in run.timelines[0].within_slo.tolist()] == [i in failing for i in range(steps)]
    assert (run.minutes, run.minutes_within_slo) == (minutes, within)


# ---- the Cluster-Autoscaler-like loop: a burst node goes only when each of its pods fits on another node -----------


@pytest.mark.parametrize(
    ("replica_gpus", "removable"),
    [
        (1, True),  # 1 GPU: fits in the 2 free GPUs of either on-prem node
        (2, True),
        (3, False),  # 4 GPUs free in all, but 2 on each node: a 3-GPU pod fits on neither
    ],
)
def test_a_burst_node_is_removed_only_when_its_pods_fit_elsewhere(replica_gpus: int, removable: bool) -> None:
    pools = [
        NodePool(name="fixed", nodes=2, gpusPerNode=8),
        NodePool(name="burst", nodes=0, burst=True, maxNodes=1, gpusPerNode=8, bootSeconds=0,
                 scaleDownUnneededSeconds=60),
    ]
    cluster = SimCluster()
    cluster.add_pool(SimPool("fixed", 8, None, 0.0, 2, 2), nodes=2)
    cluster.add_pool(SimPool("burst", 8, None, 0.0, 0, 1), nodes=1)
    cluster.add_training_pod("batch", "a", 6, 10, node="fixed-0")
    cluster.add_training_pod("batch", "b", 6, 10, node="fixed-1")
    cluster.add_deployment(SimDeployment("ml", "chat", 1, gpus_per_replica=replica_gpus), warm=True)
    assert [p.node for p in cluster.pods.values() if p.owner] == ["burst-0"]
    unneeded: dict[str, float] = {}
    assert node_autoscaler_plan(cluster.snapshot(0.0), pools, unneeded, 0.0).actions == ()
    actions = node_autoscaler_plan(cluster.snapshot(120.0), pools, unneeded, 120.0).actions
    expected = [("burst", 0, "burst-0")] if removable else []  # the node found unneeded is the one named
    assert [(a.pool, a.nodes, a.remove_node) for a in actions if isinstance(a, ScaleNodePool)] == expected


# ---- training done: the work up to the end of the run, whatever else happened ------------------------------------


@pytest.mark.parametrize("other_event", [False, True])
def test_training_gpu_seconds_count_the_work_up_to_now(other_event: bool) -> None:
    """A gang trains from t=0 (restart 0 s) with no checkpoint before 1,800 s of work: at t=1,000 s it has done
    1,000 s x 8 GPUs, whether or not anything else in the cluster changed since it started."""
    cluster = SimCluster()
    cluster.add_node("n0", 16)
    job = _job("g", pods=1, gpus_per_pod=8)
    job.checkpoint_s = 1800.0
    cluster.add_job(job)
    cluster.advance(0.0)
    for t in range(15, 1001, 15):
        cluster.advance(float(t))
        if other_event and t == 990:
            cluster.add_training_pod("batch", "other", 1, 10)  # a write: the cluster recomputes its state
    cluster.advance(1000.0)
    kept, lost = cluster.training_gpu_seconds()
    assert kept == pytest.approx(1000.0 * 8)
    assert lost == 0.0


# ---- the Eviction API and PodDisruptionBudgets: pods that are not healthy -----------------------------------------


@pytest.mark.parametrize(
    ("min_available", "which", "outcome"),
    [
        (2, "ready", EvictionOutcome.BLOCKED),  # 2 healthy, 2 wanted: no disruption allowed
        (1, "ready", EvictionOutcome.EVICTED),
        # not ready (still starting): it is not one of the healthy ones, and the budget is met (2 >= 2): the
        # API server evicts it (unhealthyPodEvictionPolicy IfHealthyBudget, the default)
        (2, "starting", EvictionOutcome.EVICTED),
        (3, "starting", EvictionOutcome.BLOCKED),  # the budget is not met (2 < 3): refused
        # Pending (not bound to a node): the Eviction API does not consult the budget (canIgnorePDB)
        (3, "pending", EvictionOutcome.EVICTED),
    ],
)
def test_evicting_a_pod_that_is_not_healthy_under_a_pdb(
    min_available: int, which: str, outcome: EvictionOutcome
) -> None:
    cluster = SimCluster()
    cluster.add_node("n0", 3)
    cluster.add_deployment(SimDeployment("ml", "chat", 4, gpus_per_replica=1, cold_start_s=90.0))
    pods = sorted((p for p in cluster.pods.values() if p.owner == "ml/chat"), key=lambda p: p.name)
    cluster.place_pod("ml", pods[0].name, "n0", ready=True)
    cluster.place_pod("ml", pods[1].name, "n0", ready=True)
    cluster.place_pod("ml", pods[2].name, "n0", ready=False)
    assert pods[3].node is None
    cluster.add_pdb(SimPdb("ml", "chat", {"app": "chat"}, min_available=min_available))
    cluster.advance(10.0)
    target = {"ready": pods[0], "starting": pods[2], "pending": pods[3]}[which]
    assert cluster.evict_pod("ml", target.name) is outcome
    assert (("ml", target.name) in cluster.pods) is (outcome is EvictionOutcome.BLOCKED)


def test_a_replica_that_waited_for_a_node_shows_its_cold_start_not_the_wait() -> None:
    """Bound when the node booted (300 s), ready 90 s later: 90 s of cold start, not 390 s from its creation (the
    lead adds a node boot by itself when GPUs are short)."""
    from autoscaler.core.cluster import cold_starts_by_service

    cluster = SimCluster()
    cluster.add_pool(SimPool("pool", gpus_per_node=1, gpu_product=None, boot_s=300.0), nodes=1)
    cluster.add_deployment(SimDeployment("ml", "chat", 1, gpus_per_replica=1, cold_start_s=90.0), warm=True)
    cluster.scale_deployment("ml", "chat", 2)
    cluster.scale("pool", 2, expected=1)
    for now in range(15, 421, 15):  # the engine's 15 s steps: bound at 300 s, ready at 390 s
        cluster.advance(float(now))
    snapshot = cluster.snapshot(420.0)
    assert [p.scheduled_at for p in snapshot.pods if p.created_at == 0.0] == [300.0]
    assert cold_starts_by_service(snapshot) == {"ml/chat": [90.0, 90.0]}
