"""A policy whose spec.queries override the Prometheus adapter would refuse at every tick (a selector not pinned to
the policy's namespace, a placeholder overrides are not given) is InvalidSpec from the tick that loads it: the
condition and one Warning Event name ``spec.queries.<field>``, and its neighbours keep scaling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.controller import Controller
from autoscaler.core.model import ServicePolicy
from autoscaler.policy import QueriesSpec
from autoscaler.ports import PolicyObject
from autoscaler.telemetry import Telemetry

T0 = 1_800_000_000.0
CONFINED = 'sum(rate(x{namespace="{namespace}"}[1m]))'


class OverridesLoadedByTheAdapter(FakeMetrics):
    """Observations made up by the test; the overrides go through the Prometheus adapter, as in production."""

    def __init__(self, cluster: FakeCluster, settings: PrometheusSettings) -> None:
        super().__init__(cluster)
        self.adapter = PrometheusMetricsSource(settings)

    def set_service_queries(self, service_queries: Mapping[str, Any]) -> None:
        self.adapter.set_service_queries(service_queries)


def policy(namespace: str, override: str | None) -> PolicyObject:
    service = ServicePolicy(namespace, "chat", min_replicas=1, max_replicas=20, target=70.0)
    queries = QueriesSpec(requestRate=override) if override else None
    return PolicyObject(namespace, "chat-policy", service, generation=1, queries=queries)


def run(objects: list[PolicyObject], **settings: Any) -> tuple[Controller, FakeCluster, FakeStatus]:
    cluster = FakeCluster(deployments={f"{o.namespace}/chat": [2, 2] for o in objects})
    metrics = OverridesLoadedByTheAdapter(cluster, PrometheusSettings(url="http://127.0.0.1:9", **settings))
    for o in objects:
        metrics.util[f"{o.namespace}/chat"] = 140.0
    status = FakeStatus()
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies(objects),
        status_writer=status,
        telemetry=Telemetry(identity="test"),
    )
    controller.run_once(T0)
    return controller, cluster, status


def conditions(status: FakeStatus, namespace: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.status[(namespace, "chat-policy")]["conditions"]}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('sum(rate(x{namespace="team-b"}[1m]))', 'spec.queries.requestRate: selector x{namespace="team-b"} does not'),
        ("sum(rate(x[1m]))", 'spec.queries.requestRate: selector x does not select namespace="bad"'),
        ('info(x{namespace="{namespace}"})', "spec.queries.requestRate: info() may not be used in an override"),
        ('sum(rate(x{namespace="{namespace}"}[1m])) by ({pod_label})', "spec.queries.requestRate: unknown placeholder"),
    ],
)
def test_an_override_the_tick_would_refuse_makes_the_policy_invalid(override: str, message: str) -> None:
    c, cluster, status = run([policy("bad", override), policy("good", CONFINED)])
    invalid = [e for e in cluster.events if e["reason"] == "InvalidSpec"]
    assert [(e["namespace"], e["name"]) for e in invalid] == [("bad", "chat-policy")], cluster.events
    assert invalid[0]["message"] == f"invalid policy: {conditions(status, 'bad')['InvalidSpec']['message']}"
    assert invalid[0]["message"].startswith(f"invalid policy: {message}"), invalid[0]
    bad = conditions(status, "bad")
    assert bad["InvalidSpec"]["status"] == "True" and bad["InvalidSpec"]["message"].startswith(message), bad
    assert bad["Ready"]["status"] == "False" and bad["Ready"]["reason"] == "InvalidSpec", bad
    assert c.telemetry.registry.get_sample_value("gpu_autoscaler_invalid_policies") == 1
    # the neighbour with a confined override is loaded and scales
    assert [w.args for w in cluster.writes if w.op == "scale"] == [("good", "chat", 4)]
    assert conditions(status, "good")["InvalidSpec"]["status"] == "False"


def test_turned_off_an_unconfined_override_is_loaded() -> None:
    _, cluster, status = run(
        [policy("open", 'sum(rate(x{namespace="team-b"}[1m]))')], confine_overrides_to_namespace=False
    )
    assert not [e for e in cluster.events if e["reason"] == "InvalidSpec"], cluster.events
    assert conditions(status, "open")["InvalidSpec"]["status"] == "False"
