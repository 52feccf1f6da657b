"""spec.latency.quantile (the quantile the SLO applies to) reaches the latency query: an SLO on P99 compared with
a P95 under-reports latency and keeps the SLO guard quiet."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from canned import HEALTHY, NOW, Answer, CannedPrometheus, series, vector

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.model import ServicePolicy
from autoscaler.policy import GPUScalingPolicySpec, QueriesSpec, to_service_policy


@pytest.fixture
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    server.answers = {k: Answer(v) for k, v in copy.deepcopy(HEALTHY).items()}
    yield server
    server.stop()


def source_for(canned: CannedPrometheus) -> PrometheusMetricsSource:
    return PrometheusMetricsSource(PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5))


def latency_queries(canned: CannedPrometheus) -> list[str]:
    return [q for family, q in canned.queries if family == "latency"]


def test_policy_carries_the_quantile() -> None:
    spec = GPUScalingPolicySpec.model_validate({"targetRef": {"name": "chat"}, "latency": {"sloSeconds": 1.0}})
    assert to_service_policy("ml", "p", spec).latency_quantile == 0.95
    spec = GPUScalingPolicySpec.model_validate({"targetRef": {"name": "chat"}})
    assert to_service_policy("ml", "p", spec).latency_quantile is None


def test_service_latency_quantile_is_used(canned: CannedPrometheus) -> None:
    spec = GPUScalingPolicySpec.model_validate(
        {"targetRef": {"name": "chat"}, "latency": {"sloSeconds": 1.0, "quantile": 0.99}}
    )
    policy = to_service_policy("ml", "chat-policy", spec)
    source_for(canned).observe([policy], NOW)
    queries = latency_queries(canned)
    assert queries and all("histogram_quantile(0.99," in q for q in queries), queries


def test_one_latency_query_per_quantile(canned: CannedPrometheus) -> None:
    p99 = ServicePolicy("ml", "chat", latency_slo_s=1.0, latency_quantile=0.99)
    default = ServicePolicy("ml", "other", latency_slo_s=1.0)
    canned.answers["latency"] = Answer(
        vector(
            series({"namespace": "ml", "deployment": "chat"}, "0.5"),
            series({"namespace": "ml", "deployment": "other"}, "0.2"),
        )
    )
    obs = source_for(canned).observe([p99, default, ServicePolicy("ml", "third", latency_quantile=0.99)], NOW)
    queries = latency_queries(canned)
    assert sorted(q.split(",")[0] for q in queries) == ["histogram_quantile(0.95", "histogram_quantile(0.99"]
    assert obs.services[p99.key].latency_s == 0.5 and obs.services[default.key].latency_s == 0.2


def test_quantile_placeholder_of_an_override_and_history_use_the_service_quantile(canned: CannedPrometheus) -> None:
    policy = ServicePolicy("ml", "chat", latency_slo_s=1.0, latency_quantile=0.9)
    source = source_for(canned)
    override = 'histogram_quantile({quantile}, sum by (le) (rate(x_bucket{namespace="{namespace}"}[2m])))'
    source.set_service_queries({policy.key: QueriesSpec(latency=override)})
    source.observe([policy], NOW)
    overrides = [q for family, q in canned.queries if family == "override"]
    assert overrides and all("histogram_quantile(0.9," in q for q in overrides), overrides
    assert source.history_query(policy, "latency").startswith("histogram_quantile(0.9,")
    source.set_service_queries({})
    assert source.history_query(policy, "latency").startswith("histogram_quantile(0.9,")
    assert source.history_query(ServicePolicy("ml", "chat"), "latency").startswith("histogram_quantile(0.95,")
