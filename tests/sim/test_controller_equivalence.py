"""The simulator replays the controller (issue 11): the same short scenario run through ``autoscaler simulate``'s
engine and through the controller's own ``Controller.run_once`` (a fake clock, the in-memory metrics fake, the
simulated cluster as its ClusterReader/ClusterWriter/NodePoolScaler) issues the same sequence of actions."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from autoscaler.controller import Controller
from autoscaler.core.model import DEFAULT_SCALE_DOWN, MetricKind, ServicePolicy
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import PolicyObject
from autoscaler.sim.engine import build_cluster, simulate
from autoscaler.sim.latency import latency_and_share
from autoscaler.sim.policies import CorePolicy, SimService
from autoscaler.sim.scenario import NodePool

STEP_S = 15.0
DELAY_S = 30.0


class _Policies:
    def __init__(self, policy: ServicePolicy) -> None:
        self.objects = [PolicyObject(policy.namespace, f"{policy.name}-policy", policy, generation=1)]

    def list_policies(self) -> list[PolicyObject]:
        return self.objects


def _service(metric: MetricKind, target: float) -> SimService:
    # Quiet, a surge past what the replicas serve (the SLO guard and the metric both scale up), then quiet again
    # (scale-down after the stabilisation window): every kind of decision in 75 minutes.
    rates = np.concatenate([np.full(60, 4.0), np.linspace(4.0, 30.0, 40), np.full(80, 30.0), np.full(120, 6.0)])
    policy = ServicePolicy(
        namespace="ml",
        name="chat",
        metric=metric,
        target=target,
        min_replicas=1,
        max_replicas=20,
        cold_start_s=60.0,
        latency_slo_s=2.5,
        scale_down=dataclasses.replace(DEFAULT_SCALE_DOWN, stabilisation_s=120.0),
    )
    return SimService(policy, rates, throughput=3.5, base_latency_s=1.0, slo_s=2.5, quantile=0.95)


@pytest.mark.parametrize(("metric", "target"), [(MetricKind.REQUEST_RATE, 3.0), (MetricKind.GPU_UTILIZATION, 70.0)])
def test_controller_and_simulator_issue_the_same_actions(metric: MetricKind, target: float) -> None:
    service = _service(metric, target)
    pools = [NodePool(name="fixed", nodes=2, gpusPerNode=8)]
    steps = len(service.rates)

    run = simulate(CorePolicy("reactive"), [service], pools, 0.0, STEP_S, steps, DELAY_S)
    assert run.cluster is not None
    simulated = list(run.cluster.writes)

    # The controller's path: its own tick, ports and actuator; the test plays Prometheus (delayed metrics).
    reference = CorePolicy("reactive")
    initial = reference.reset([service], STEP_S)
    policy = reference.policies[service.policy.key]
    cluster = build_cluster([service], pools, initial, 0.0)
    metrics = FakeMetricsSource()
    controller = Controller(
        metrics=metrics, cluster=cluster, writer=cluster, policies=_Policies(policy),
        node_pools=cluster,
    )
    key = service.policy.key
    latencies, utilisations, readies = [], [], []
    for i in range(steps):
        now = i * STEP_S
        ready, _, _ = cluster.counts(now)[key]
        rate = float(service.rates[i])
        latency, _ = latency_and_share(
            ready, rate, service.throughput, service.base_latency_s, service.quantile, service.slo_s
        )
        latencies.append(latency)
        readies.append(ready)
        utilisations.append(100.0 * min(1.0, rate / (ready * service.throughput)) if ready else 0.0)
        decided_at = now + STEP_S
        seen = max(0, i - round(DELAY_S / STEP_S))
        ready, bound, _ = cluster.counts(decided_at)[key]
        spec = cluster.deployments[key].replicas
        if metric is MetricKind.REQUEST_RATE:
            signal: dict[str, object] = {"metric_total": float(service.rates[seen])}
        else:
            from autoscaler.core.model import PodMetrics

            # the delayed sample covers the pods ready then; pods ready since have no sample from then (missing)
            sampled = min(ready, readies[seen])
            signal = {"pods": PodMetrics(sampled, utilisations[seen] * sampled, ready - sampled, bound - ready)}
        metrics.set_service(
            key,
            spec_replicas=spec,
            ready_replicas=ready,
            latency_s=latencies[seen],
            request_rate=float(service.rates[seen]),
            **signal,  # type: ignore[arg-type]
        )
        controller.run_once(decided_at)

    controlled = list(cluster.writes)
    scale_ups = [w for w in simulated if w[1] == "scale_deployment" and w[2][2] > 1]
    assert len(simulated) >= 4, simulated  # the scenario exercises scale-ups and scale-downs
    assert any(b[2][2] < a[2][2] for a, b in itertools.pairwise(simulated)), "no scale-down"
    assert scale_ups
    assert controlled == simulated


def test_controller_and_simulator_arbitrate_capacity_the_same_way() -> None:
    """With capacity arbitration and a training job on the full cluster: the same writes, suspend and resume
    included, through the simulator's engine and through ``Controller(capacity=...)``."""
    from autoscaler.core.arbitrate import CapacityConfig
    from autoscaler.core.victims import TrainingRules
    from autoscaler.sim.cluster import Scoring, SimJob

    service = _service(MetricKind.REQUEST_RATE, 3.0)
    service = dataclasses.replace(service, policy=dataclasses.replace(service.policy, priority=1000))
    rates = np.concatenate([service.rates, np.full(120, 4.0)])  # long enough to resume after the surge
    service = dataclasses.replace(service, rates=rates)
    pools = [NodePool(name="fixed", nodes=2, gpusPerNode=8)]
    capacity = CapacityConfig(training=TrainingRules(min_runtime_s=0.0), resume_after_s=300.0)
    jobs = [SimJob("ml", "train", 1, 8, 100, 50_000.0, 600.0, 0.0, min_runtime_s=0.0, restart_s=0.0)]
    steps = len(rates)

    run = simulate(CorePolicy("reactive", capacity), [service], pools, 0.0, STEP_S, steps, DELAY_S,
                   scoring=Scoring.MOST_ALLOCATED, jobs=jobs)
    assert run.cluster is not None
    simulated = list(run.cluster.writes)
    ops = [w[1] for w in simulated]
    assert ops.count("suspend_workload") == 1 and ops.count("resume_workload") == 1, ops

    reference = CorePolicy("reactive", capacity)
    initial = reference.reset([service], STEP_S)
    cluster = build_cluster([service], pools, initial, 0.0, Scoring.MOST_ALLOCATED, jobs)
    metrics = FakeMetricsSource()
    controller = Controller(
        metrics=metrics, cluster=cluster, writer=cluster, policies=_Policies(reference.policies[service.policy.key]),
        node_pools=cluster, capacity=capacity,
    )
    key = service.policy.key
    latencies = []
    for i in range(steps):
        now = i * STEP_S
        ready, _, _ = cluster.counts(now)[key]
        rate = float(rates[i])
        latency, _ = latency_and_share(
            ready, rate, service.throughput, service.base_latency_s, service.quantile, service.slo_s
        )
        latencies.append(latency)
        decided_at = now + STEP_S
        seen = max(0, i - round(DELAY_S / STEP_S))
        ready, _, _ = cluster.counts(decided_at)[key]
        metrics.set_service(
            key, spec_replicas=cluster.deployments[key].replicas, ready_replicas=ready, latency_s=latencies[seen],
            request_rate=float(rates[seen]), metric_total=float(rates[seen]),
        )
        controller.run_once(decided_at)
    assert list(cluster.writes) == simulated
    stopped = controller.telemetry.registry.get_sample_value(
        "gpu_autoscaler_training_gangs_stopped_total", {"how": "suspend"}
    )
    assert stopped == 1.0


@pytest.mark.parametrize(("put_back_checks", "evictions"), [(0, 5), (3, 4)], ids=["no put-back hold", "put-back hold"])
def test_controller_and_simulator_rebalance_the_same_way(put_back_checks: int, evictions: int) -> None:
    """With the rebalancer on (two services spread by LeastAllocated, two 8-GPU training pods waiting): the same
    writes, evictions included, through the simulator's engine and through ``Controller(rebalance=...)`` whose
    rebalance job runs when the simulator's pass is due. The put-back hold (stop 48) stops the futile moves after
    three refilled rooms: the same four evictions both ways."""
    from autoscaler.core.rebalance import RebalanceConfig
    from autoscaler.sim.cluster import Scoring, SimJob

    def constant(name: str) -> SimService:
        policy = ServicePolicy("ml", name, metric=MetricKind.REQUEST_RATE, target=3.0, min_replicas=2,
                               max_replicas=2, cold_start_s=60.0, priority=1000)
        return SimService(policy, np.full(240, 4.0), throughput=3.5, base_latency_s=1.0, slo_s=2.5, quantile=0.95)

    services = [constant("a"), constant("b")]
    pools = [NodePool(name="fixed", nodes=4, gpusPerNode=8)]
    config = RebalanceConfig(
        interval_s=60.0, max_moves_per_pass=2, max_moves_per_hour=5, retry_after_s=300.0, spare_replicas_only=False,
        put_back_checks=put_back_checks,
    )
    jobs = [SimJob("ml", f"train-{k}", 1, 8, 100, 50_000.0, 600.0, 0.0, min_runtime_s=0.0, restart_s=0.0)
            for k in range(2)]
    steps = 240

    run = simulate(CorePolicy("reactive"), services, pools, 0.0, STEP_S, steps, DELAY_S,
                   scoring=Scoring.LEAST_ALLOCATED, jobs=jobs, rebalance=config)
    assert run.cluster is not None
    simulated = list(run.cluster.writes)
    assert sum(1 for w in simulated if w[1] == "evict_pod") >= evictions, simulated

    class Both:
        def __init__(self, policies: list[ServicePolicy]) -> None:
            self.objects = [PolicyObject(p.namespace, f"{p.name}-policy", p, generation=1) for p in policies]

        def list_policies(self) -> list[PolicyObject]:
            return self.objects

    reference = CorePolicy("reactive")
    initial = reference.reset(services, STEP_S)
    cluster = build_cluster(services, pools, initial, 0.0, Scoring.LEAST_ALLOCATED, jobs)
    metrics = FakeMetricsSource()
    controller = Controller(
        metrics=metrics, cluster=cluster, writer=cluster, policies=Both(list(reference.policies.values())),
        node_pools=cluster, rebalance=config,
    )
    last_pass = None
    for i in range(steps):
        decided_at = i * STEP_S + STEP_S
        for service in services:
            key = service.policy.key
            ready, _, _ = cluster.counts(decided_at)[key]
            metrics.set_service(key, spec_replicas=cluster.deployments[key].replicas, ready_replicas=ready,
                                latency_s=1.5, request_rate=4.0, metric_total=4.0)
        controller.run_once(decided_at)
        if last_pass is None or decided_at - last_pass >= config.interval_s:  # the runtime's job, on its interval
            report = controller.rebalance(decided_at)
            assert report is not None and report.result == "ok", report
            last_pass = decided_at
    assert list(cluster.writes) == simulated
