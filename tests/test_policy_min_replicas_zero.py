"""minReplicas 0 only with a whole-service metric (request_rate, queue_depth) read in front of the pods.

A per-pod metric (gpu_utilization, engine_active) is an average over ready pods: scaled to zero there is no pod, so
no sample, and the core holds the service at zero for good ("no samples" is stale). A whole-service total can have a
value with no pod, and ``replicas_for_total_metric`` brings the service back -- but only when it is read in front of
the pods: the default queries read the pods' own series, which end with the last pod ("no series": stale, held at
zero). So the policy's override for its metric (queries.requestRate, queries.queueDepth) must be there. Upstream's
HPA refuses the first half the same way (HPAScaleToZero: minReplicas 0 needs an Object or External metric).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from autoscaler.adapters.kubernetes.crd import SPEC_VALIDATIONS
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.policy import MIN_REPLICAS_ZERO_MESSAGE, MIN_REPLICAS_ZERO_QUERY_MESSAGE, GPUScalingPolicySpec

TARGET_REF = {"name": "chat"}


def _per_pod(metric: str) -> str:
    return MIN_REPLICAS_ZERO_MESSAGE.format(metric=metric)


def _no_query(metric: str, query: str) -> str:
    return MIN_REPLICAS_ZERO_QUERY_MESSAGE.format(metric=metric, query=query)


GATEWAY_RATE = 'sum(rate(gateway_requests_total{namespace="{namespace}", service="{name}"}[1m]))'
GATEWAY_QUEUE = 'sum(gateway_queue_length{namespace="{namespace}", service="{name}"})'

# (spec without targetRef, the refusal's message, or None when the spec is accepted)
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "zero-gpu_utilization": (
        {"minReplicas": 0, "metric": {"type": "gpu_utilization", "target": 60}},
        _per_pod("gpu_utilization"),
    ),
    "zero-engine_active": (
        {"minReplicas": 0, "metric": {"type": "engine_active", "target": 0.7}},
        _per_pod("engine_active"),
    ),
    # metric.type defaults to gpu_utilization: a per-pod metric nobody wrote down
    "zero-metric-without-type": ({"minReplicas": 0, "metric": {"target": 60}}, _per_pod("gpu_utilization")),
    "zero-no-metric": ({"minReplicas": 0}, _per_pod("gpu_utilization")),
    # the default queries read the pods' own series: nothing to read with no pod
    "zero-request_rate": (
        {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}},
        _no_query("request_rate", "requestRate"),
    ),
    "zero-queue_depth": (
        {"minReplicas": 0, "metric": {"type": "queue_depth", "target": 2}},
        _no_query("queue_depth", "queueDepth"),
    ),
    "zero-request_rate-with-the-other-query": (
        {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}, "queries": {"queueDepth": GATEWAY_QUEUE}},
        _no_query("request_rate", "requestRate"),
    ),
    "zero-request_rate-with-an-empty-query": (
        {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}, "queries": {"requestRate": ""}},
        _no_query("request_rate", "requestRate"),
    ),
    "zero-queue_depth-with-queueDepth-query": (
        {"minReplicas": 0, "metric": {"type": "queue_depth", "target": 2}, "queries": {"queueDepth": GATEWAY_QUEUE}},
        None,
    ),
    # a query override changes where a whole-service signal is read, not which signal is scaled on
    "zero-gpu_utilization-with-requestRate-query": (
        {
            "minReplicas": 0,
            "metric": {"type": "gpu_utilization", "target": 60},
            "queries": {"requestRate": 'sum(rate(http_requests_total{namespace="{namespace}"}[1m]))'},
        },
        _per_pod("gpu_utilization"),
    ),
    "zero-engine_active-with-queueDepth-query": (
        {"minReplicas": 0, "metric": {"type": "engine_active", "target": 0.5}, "queries": {"queueDepth": "q"}},
        _per_pod("engine_active"),
    ),
    "zero-request_rate-with-requestRate-query": (
        {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}, "queries": {"requestRate": GATEWAY_RATE}},
        None,
    ),
    "one-gpu_utilization": ({"minReplicas": 1, "metric": {"type": "gpu_utilization", "target": 60}}, None),
    "one-engine_active": ({"minReplicas": 1, "metric": {"type": "engine_active", "target": 0.7}}, None),
    "one-request_rate": ({"minReplicas": 1, "metric": {"type": "request_rate", "target": 5}}, None),
    "one-queue_depth": ({"minReplicas": 1, "metric": {"type": "queue_depth", "target": 2}}, None),
    "three-no-metric": ({"minReplicas": 3}, None),
    "default-minReplicas-no-metric": ({}, None),
    "default-minReplicas-engine_active": ({"metric": {"type": "engine_active", "target": 0.7}}, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_min_replicas_zero_needs_a_whole_service_metric(case: str) -> None:
    spec, refusal = CASES[case]
    body = {"targetRef": TARGET_REF, **spec}
    if refusal is None:
        parsed = GPUScalingPolicySpec.model_validate(body)
        assert parsed.min_replicas == spec.get("minReplicas", 1)
        return
    with pytest.raises(ValidationError) as err:
        GPUScalingPolicySpec.model_validate(body)
    message = err.value.errors()[0]["msg"]
    assert refusal in message
    # the user reads which field to change, and which metric makes it wrong
    assert message.startswith("Value error, minReplicas 0")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_controller_reports_the_refusal_as_an_invalid_spec(case: str) -> None:
    spec, refusal = CASES[case]
    obj = {"metadata": {"namespace": "ml", "name": "p"}, "spec": {"targetRef": TARGET_REF, **spec}}
    result = validate_policy(obj)
    if refusal is None:
        assert isinstance(result, LoadedPolicy), result
        return
    assert isinstance(result, InvalidPolicy)
    assert result.field == "spec"
    assert result.message == refusal


def test_the_message_names_the_field_and_both_whole_service_metrics() -> None:
    message = MIN_REPLICAS_ZERO_MESSAGE.format(metric="gpu_utilization")
    assert message == (
        "minReplicas 0 needs a whole-service metric (request_rate or queue_depth): a per-pod metric "
        "(gpu_utilization) has no samples with no pod, so the service would never scale back up"
    )


def test_the_crd_carries_the_rule_on_min_replicas() -> None:
    """The rule's CEL is run by the real apiserver in tests/realkube/test_min_replicas_zero_real.py; here, that the
    CRD carries it on the field the parser's message names, with the parser's message."""
    rules = [r for r in SPEC_VALIDATIONS if "queue_depth" in r["rule"] and "queries" not in r["rule"]]
    assert len(rules) == 1
    rule = rules[0]
    assert rule["fieldPath"] == ".minReplicas"
    # an absent minReplicas is 1 (allowed), an absent metric or metric.type is gpu_utilization (refused with 0)
    assert "!has(self.minReplicas)" in rule["rule"]
    assert "has(self.metric)" in rule["rule"] and "has(self.metric.type)" in rule["rule"]
    assert rule["message"] == MIN_REPLICAS_ZERO_MESSAGE.format(metric="gpu_utilization or engine_active")
    # the apiserver's message names the policy's metric, as the parser's does
    before, after = MIN_REPLICAS_ZERO_MESSAGE.split("{metric}")
    assert rule["messageExpression"].startswith(f"'{before}' + ")
    assert rule["messageExpression"].endswith(f" + '{after}'")
    assert "'" not in MIN_REPLICAS_ZERO_MESSAGE  # it is spliced into CEL string literals as it is


def test_the_crd_carries_the_override_rule_on_min_replicas() -> None:
    """The second half: a whole-service metric needs its override; run by the real apiserver in
    tests/realkube/test_min_replicas_zero_real.py."""
    rules = [r for r in SPEC_VALIDATIONS if "self.queries.requestRate" in r["rule"]]
    assert len(rules) == 1
    rule = rules[0]
    assert rule["fieldPath"] == ".minReplicas"
    assert "self.queries.queueDepth" in rule["rule"] and "has(self.queries)" in rule["rule"]
    assert "'" not in MIN_REPLICAS_ZERO_QUERY_MESSAGE  # spliced into CEL string literals as it is
    first = MIN_REPLICAS_ZERO_QUERY_MESSAGE.split("{metric}")[0]
    assert rule["messageExpression"].startswith(f"'{first}' + ")
