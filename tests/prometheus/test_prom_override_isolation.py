"""Per-service query overrides (GPUScalingPolicy spec.queries) must not reach other services.

The adapter runs every service's override for one family in a few batched queries, each override wrapped as
``label_replace((<override>), "autoscaler_service", "<ns>/<name>", "", "")`` and joined with ``or``. An override
that closes that wrapper could add a series tagged as another tenant's service (which then reads 0 and scales
down); one that fails at evaluation must leave only its own service stale. Real Prometheus (empty TSDB: only
``vector()`` is needed).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from canned import NOW
from promserver import PrometheusServer

from autoscaler.adapters.prometheus import PrometheusMetricsSource, validate_service_query
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.adapters.promql import PromQLError
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.policy import QueriesSpec

VICTIM = ServicePolicy("team-b", "chat", metric=MetricKind.REQUEST_RATE, target=1.0)
ATTACKER = ServicePolicy("team-a", "evil", metric=MetricKind.REQUEST_RATE, target=1.0)
# Balanced quotes, no placeholders: the old validation accepted it. It closes the adapter's label_replace((...))
# wrapper and adds a series tagged as the victim's service.
INJECTION = 'vector(0)), "autoscaler_service", "team-b/chat", "", "") or label_replace((vector(1)'


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (INJECTION, "unbalanced ')'"),
        ("sum(rate(x[2m])", "unclosed '('"),
        ("sum(rate(x[2m)))", "unbalanced ')'"),
        ('x{a="1"', "unclosed '{'"),
        ('vector(1) # "autoscaler_service"', "comments"),
        ("vector(1)\nor vector(2)", "one line"),
    ],
)
def test_override_that_could_escape_its_wrapper_is_rejected(query: str, message: str) -> None:
    with pytest.raises(PromQLError, match=re.escape(message)):
        validate_service_query(query)
    source = PrometheusMetricsSource(PrometheusSettings(url="http://127.0.0.1:9"))
    with pytest.raises(ValueError, match=r"team-a/evil: spec\.queries\.requestRate"):
        source.set_service_queries({ATTACKER.key: QueriesSpec(requestRate=query)})


@pytest.mark.parametrize(
    "query",
    [
        'sum(rate(x{namespace="{namespace}",pod=~"{name}-[a-z0-9]{5}"}[{window}]))',
        'sum(x{a=")"}) + sum(x{b="(\\")"}) + sum(x{c=`#(`})',  # brackets and # inside literals do not count
        'histogram_quantile({quantile}, sum by (le) (rate(x_bucket{namespace="{namespace}"}[2m])))',
    ],
)
def test_self_contained_overrides_are_accepted(query: str) -> None:
    validate_service_query(query)


def test_injected_override_cannot_zero_another_service(
    start_prometheus: Callable[..., PrometheusServer],
) -> None:
    prom = start_prometheus()
    # The constructor takes overrides without validation: the adapter checks them again before batching them.
    source = PrometheusMetricsSource(
        PrometheusSettings(url=prom.url, retries=0, timeout_seconds=5),
        service_queries={
            ATTACKER.key: QueriesSpec(requestRate=INJECTION),
            VICTIM.key: QueriesSpec(requestRate="vector(50)"),
        },
    )
    obs = source.observe([ATTACKER, VICTIM], NOW)
    victim = obs.services[VICTIM.key]
    assert victim.stale_reasons == () and victim.metric_total == pytest.approx(50.0), victim
    attacker = obs.services[ATTACKER.key]
    assert attacker.metric_total is None and any("unbalanced" in r for r in attacker.stale_reasons), attacker


def test_evaluation_error_of_one_override_leaves_its_neighbours_usable(
    start_prometheus: Callable[..., PrometheusServer],
) -> None:
    prom = start_prometheus()
    good = ServicePolicy("team-b", "chat", metric=MetricKind.REQUEST_RATE, target=1.0)
    bad = ServicePolicy("team-a", "other", metric=MetricKind.REQUEST_RATE, target=1.0)
    # parses (so validation and a 400 do not catch it), fails at evaluation: many-to-many matching, HTTP 422
    many_to_many = 'vector(1) + on() (vector(1) or label_replace(vector(2), "x", "y", "", ""))'
    source = PrometheusMetricsSource(PrometheusSettings(url=prom.url, retries=0, timeout_seconds=5))
    source.set_service_queries(
        {bad.key: QueriesSpec(requestRate=many_to_many), good.key: QueriesSpec(requestRate="vector(50)")}
    )
    obs = source.observe([bad, good], NOW)
    assert any("422" in r for r in obs.services[bad.key].stale_reasons), obs.services[bad.key]
    seen = obs.services[good.key]
    assert seen.stale_reasons == () and seen.metric_total == pytest.approx(50.0), seen
