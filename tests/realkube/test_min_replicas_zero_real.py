"""The CRD's CEL rules on spec.minReplicas, run by the real kube-apiserver: minReplicas 0 only with a whole-service
metric (request_rate, queue_depth) read by the policy's own override in front of the pods, as the parser
(autoscaler/policy.py) refuses it, with the parser's message.

A per-pod metric has no sample while the Deployment has no pod: a policy scaled to zero on one would never scale
back up. The rule reads an absent metric (or metric.type) as gpu_utilization and an absent minReplicas as 1, as the
parser does; the cases without them check that the CEL's ``has()`` guards say the same as the parser's defaults.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.policy import (
    API_GROUP,
    API_VERSION,
    MIN_REPLICAS_ZERO_MESSAGE,
    MIN_REPLICAS_ZERO_QUERY_MESSAGE,
    PLURAL,
)
from tests.realkube.control_plane import ApiError, ControlPlane
from tests.realkube.test_faults_real import install_crd

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

POLICIES = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{ns}}/{PLURAL}"

PER_POD = MIN_REPLICAS_ZERO_MESSAGE.format
NO_QUERY = MIN_REPLICAS_ZERO_QUERY_MESSAGE.format
GATEWAY = 'sum(rate(gateway_requests_total{namespace="{namespace}"}[1m]))'

# (spec without targetRef, the refusal's message, or None when the apiserver and the parser both accept it)
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "zero-gpu_utilization": (
        {"minReplicas": 0, "metric": {"type": "gpu_utilization", "target": 60}},
        PER_POD(metric="gpu_utilization"),
    ),
    "zero-engine_active": (
        {"minReplicas": 0, "metric": {"type": "engine_active", "target": 0.7}},
        PER_POD(metric="engine_active"),
    ),
    "zero-no-metric": ({"minReplicas": 0}, PER_POD(metric="gpu_utilization")),
    "zero-metric-without-type": ({"minReplicas": 0, "metric": {"target": 60}}, PER_POD(metric="gpu_utilization")),
    "zero-gpu_utilization-with-requestRate-query": (
        {"minReplicas": 0, "metric": {"type": "gpu_utilization", "target": 60}, "queries": {"requestRate": GATEWAY}},
        PER_POD(metric="gpu_utilization"),
    ),
    "zero-request_rate": (
        {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}},
        NO_QUERY(metric="request_rate", query="requestRate"),
    ),
    "zero-queue_depth-with-requestRate-query": (
        {"minReplicas": 0, "metric": {"type": "queue_depth", "target": 2}, "queries": {"requestRate": GATEWAY}},
        NO_QUERY(metric="queue_depth", query="queueDepth"),
    ),
    "zero-request_rate-with-empty-query": (
        {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}, "queries": {"requestRate": ""}},
        NO_QUERY(metric="request_rate", query="requestRate"),
    ),
    "zero-request_rate-with-requestRate-query": (
        {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}, "queries": {"requestRate": GATEWAY}},
        None,
    ),
    "one-gpu_utilization": ({"minReplicas": 1, "metric": {"type": "gpu_utilization", "target": 60}}, None),
    "absent-minReplicas-no-metric": ({}, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_apiserver_refuses_min_replicas_zero_with_a_per_pod_metric(
    control_plane: ControlPlane, namespace: str, case: str
) -> None:
    cp = control_plane
    install_crd(cp)  # the CRD as deploy/ ships it, left installed for the session's other tests
    spec, refusal = CASES[case]
    name = f"p-{secrets.token_hex(3)}"
    body = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": name},
        "spec": {"targetRef": {"name": name}, **spec},
    }
    parsed = validate_policy({**body, "metadata": {"name": name, "namespace": namespace}})
    if refusal is None:
        stored = cp.request("POST", POLICIES.format(ns=namespace), body)
        assert stored["spec"]["minReplicas"] == spec.get("minReplicas", 1)
        # what the apiserver stored, its defaults applied, the controller accepts
        assert isinstance(validate_policy(stored), LoadedPolicy), stored["spec"]
        assert isinstance(parsed, LoadedPolicy), parsed
        return
    with pytest.raises(ApiError) as err:
        cp.request("POST", POLICIES.format(ns=namespace), body)
    assert err.value.status == 422, err.value
    causes = err.value.body["details"]["causes"]
    message = refusal
    # the apiserver names the field and says what the controller says (messageExpression fills in the metric)
    assert any(c.get("field") == "spec.minReplicas" and message in c.get("message", "") for c in causes), causes
    assert isinstance(parsed, InvalidPolicy) and parsed.message == message, parsed
