"""``status.replicas`` (pods created, not terminating) from the simulator, the fakes and the controller's merge of
the cluster into the observation: the HPA divides a per-pod External metric by it
(tests/core/test_hpa_status_replicas.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from autoscaler.controller import Controller
from autoscaler.core.model import DEFAULT_SCALE_DOWN, MetricKind, ServicePolicy
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import PolicyObject
from autoscaler.sim.engine import _observe, build_cluster
from autoscaler.sim.policies import SimService
from autoscaler.sim.scenario import NodePool

T0 = 1_800_000_000.0
POLICY = ServicePolicy(
    namespace="ml", name="chat", metric=MetricKind.REQUEST_RATE, target=10.0, min_replicas=1, max_replicas=30,
    scale_down=dataclasses.replace(DEFAULT_SCALE_DOWN, stabilisation_s=0.0),
)  # fmt: skip


class _Policies:
    def list_policies(self) -> list[PolicyObject]:
        return [PolicyObject(POLICY.namespace, "chat-policy", POLICY, generation=1)]


def _service() -> SimService:
    return SimService(POLICY, np.full(10, 50.0), throughput=10.0, base_latency_s=0.5, slo_s=4.0, quantile=0.95)


def test_the_simulated_deployment_counts_every_pod_it_created() -> None:
    """Pending pods (no room on the nodes) are created pods: status.replicas follows spec at once, ready lags."""
    pool = NodePool.model_validate({"name": "fixed", "nodes": 1, "gpusPerNode": 4})
    cluster = build_cluster([_service()], [pool], [2], T0)
    cluster.scale_deployment("ml", "chat", 7)
    snap = cluster.snapshot(T0 + 1.0)
    (dep,) = snap.deployments
    ready, bound, pending = cluster.counts(T0 + 1.0)["ml/chat"]
    assert (dep.spec_replicas, dep.status_replicas) == (7, 7)
    assert (ready, bound, pending) == (2, 4, 3) and dep.ready_replicas == 2
    cluster.scale_deployment("ml", "chat", 3)
    (dep,) = cluster.snapshot(T0 + 2.0).deployments
    assert (dep.spec_replicas, dep.status_replicas) == (3, 3)


def test_the_engine_observation_carries_the_created_pods() -> None:
    obs = _observe(_service(), MetricKind.REQUEST_RATE, 10, 6, 2, 85.0, 0.0, 1.0, 15.0, created=8)
    assert (obs.spec_replicas, obs.ready_replicas, obs.status_replicas) == (10, 6, 8)
    assert _observe(_service(), MetricKind.REQUEST_RATE, 10, 6, 2, 85.0, 0.0, 1.0, 15.0).status_replicas == 10


def test_fake_cluster_status_replicas() -> None:
    cluster = FakeCluster(ready_follows_spec=False)
    assert cluster.add_deployment("ml", "chat", 10, ready=6).status_replicas == 10
    cluster.add_deployment("ml", "embed", 10, ready=6, created=8)
    cluster.scale_deployment("ml", "embed", 12)
    embed = next(d for d in cluster.snapshot(T0).deployments if d.name == "embed")
    assert (embed.spec_replicas, embed.ready_replicas, embed.status_replicas) == (12, 6, 12)


def test_fake_metrics_keep_status_replicas_through_staleness_and_outage() -> None:
    metrics = FakeMetricsSource()
    metrics.set_service("ml/chat", spec_replicas=10, ready_replicas=6, metric_total=85.0, status_replicas=8)
    assert metrics.observe([POLICY], T0).services["ml/chat"].status_replicas == 8
    metrics.outage()
    assert metrics.observe([POLICY], T0).services["ml/chat"].status_replicas == 8
    metrics.restore()
    metrics.set_stale("ml/chat")
    assert metrics.observe([POLICY], T0).services["ml/chat"].status_replicas == 8


def test_the_controller_takes_status_replicas_from_the_cluster() -> None:
    """Controller._merge: the cluster is the authority on replicas, status.replicas included. 85 req/s over 8
    created pods is within tolerance of a target of 10 each: upstream's HPA recommends those 8 (spec 10)."""
    cluster = FakeCluster()
    cluster.add_deployment("ml", "chat", 10, ready=8, created=8)
    metrics = FakeMetricsSource()
    # the metrics source knows no better: the merge replaces its replicas with the cluster's
    metrics.set_service("ml/chat", spec_replicas=10, ready_replicas=8, metric_total=85.0, request_rate=85.0)
    controller = Controller(metrics=metrics, cluster=cluster, writer=cluster, policies=_Policies())
    plan = controller.run_once(T0)
    (decision,) = plan.decisions
    assert (decision.current_replicas, decision.desired_replicas) == (10, 8), decision
    assert "over 8 created" in decision.detail
