"""Scale from zero through the real Prometheus adapter: a Deployment at 0 replicas with ``minReplicas: 0`` comes back
only when its whole-service signal is read in front of the pods (the policy's override on a gateway's series), which
is why the policy model refuses ``minReplicas: 0`` without that override (tests/test_policy_min_replicas_zero.py).
With the default query there is no pod, so no series: the service is stale and held at zero."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from canned import NOW, Answer, CannedPrometheus, series, vector

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo
from autoscaler.core.decide import decide
from autoscaler.core.model import ControllerState, MetricKind, ServicePolicy
from autoscaler.policy import GPUScalingPolicySpec, QueriesSpec, to_service_policy

GATEWAY = 'sum(rate(gateway_requests_total{namespace="{namespace}", upstream="{name}"}[1m]))'
SPEC = {
    "targetRef": {"name": "chat"},
    "minReplicas": 0,
    "maxReplicas": 8,
    "metric": {"type": "request_rate", "target": 2},
}


@pytest.fixture
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def scaled_to_zero(canned: CannedPrometheus, queries: QueriesSpec | None) -> tuple[ServicePolicy, int, tuple[str, ...]]:
    """One tick's decision for ml/chat at 0 replicas (no pod), the gateway seeing 7 requests/s."""
    canned.answers = {"override": Answer(vector(series({"autoscaler_service": "ml/chat"}, "7")))}  # app series: none
    policy = ServicePolicy("ml", "chat", min_replicas=0, max_replicas=8, metric=MetricKind.REQUEST_RATE, target=2.0)
    source = PrometheusMetricsSource(
        PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5),
        service_queries={policy.key: queries} if queries is not None else {},
    )
    cluster = ClusterSnapshot(time=NOW, deployments=(DeploymentInfo("ml", "chat", 0, 0, status_replicas=0),), pods=())
    obs = source.observe([policy], NOW, cluster=cluster)
    plan, _ = decide(obs, ControllerState(), {policy.key: policy}, NOW)
    return policy, plan.decisions[0].desired_replicas, obs.services[policy.key].stale_reasons


def test_the_gateway_override_brings_the_service_back(canned: CannedPrometheus) -> None:
    spec = GPUScalingPolicySpec.model_validate({**SPEC, "queries": {"requestRate": GATEWAY}})
    assert to_service_policy("ml", "p", spec).min_replicas == 0  # the policy model accepts it
    _, desired, stale = scaled_to_zero(canned, spec.queries)
    assert stale == ()
    assert desired == 4  # ceil(7 / 2) with no pod created: upstream's GetExternalPerPodMetricReplicas
    assert any('upstream="chat"' in q for _, q in canned.queries), canned.queries


def test_without_it_the_service_would_stay_at_zero(canned: CannedPrometheus) -> None:
    """What the model's refusal prevents: the default query reads the pods' own series, and there is no pod."""
    with pytest.raises(ValueError, match=r"needs spec\.queries\.requestRate"):
        GPUScalingPolicySpec.model_validate(SPEC)
    _, desired, stale = scaled_to_zero(canned, None)
    assert desired == 0 and stale, stale
