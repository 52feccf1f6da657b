"""GPUScalingPolicy objects: validated one by one; an invalid one gets a condition and an Event, others keep working."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterWriter, PolicyLoader, WriterConfig
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.core.model import MetricKind
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
GROUP = "gpuautoscaler.dev/v1alpha1"


def _writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="t"), clock=lambda: NOW, sleep=lambda s: None)


def test_invalid_policy_gets_condition_and_event_while_others_work(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    # Seeded as stored objects: a CRD upgrade, or a schema that cannot express the rule, lets them in.
    apiserver.seed(
        o.policy_crd(),
        o.gpu_policy("chat", "ml", minReplicas=2, maxReplicas=8, metric={"type": "request_rate", "target": 12}),
        o.gpu_policy("embed", "ml", metric={"type": "gpu_utilization", "target": 150}),
        o.gpu_policy("search", "ml", minReplicas=5, maxReplicas=2),
        o.gpu_policy("rank", "other"),
    )
    loader = PolicyLoader(api_client)
    writer = _writer(api_client)
    policies = loader.sync(writer, NOW)
    assert sorted(p.service.key for p in policies.valid) == ["ml/chat", "other/rank"]
    chat = next(p for p in policies.valid if p.name == "chat")
    assert (chat.service.min_replicas, chat.service.max_replicas, chat.service.metric) == (
        2,
        8,
        MetricKind.REQUEST_RATE,
    )
    bad = {p.name: p for p in policies.invalid}
    assert bad["embed"].field == "spec.metric"
    assert "gpu_utilization is a percentage" in bad["embed"].message
    assert bad["search"].field == "spec" and "minReplicas (5) must be <= maxReplicas (2)" in bad["search"].message

    status = apiserver.get(GROUP, "GPUScalingPolicy", "embed", "ml")["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["InvalidSpec"]["status"] == "True" and conditions["Ready"]["status"] == "False"
    assert conditions["InvalidSpec"]["message"].startswith("spec.metric: ")
    events = [e for e in apiserver.objects("events.k8s.io/v1", "Event") if e["regarding"]["name"] == "embed"]
    assert len(events) == 1 and events[0]["type"] == "Warning" and "spec.metric" in events[0]["note"]
    assert "status" not in apiserver.get(GROUP, "GPUScalingPolicy", "chat", "ml")  # valid: untouched

    # Steady state: nothing written again
    apiserver.clear_requests()
    loader.sync(writer, NOW + 15)
    assert apiserver.request_count("PUT") == 0 and apiserver.request_count("POST") == 0

    # Fixed: the condition flips back, no new Warning
    fixed = apiserver.get(GROUP, "GPUScalingPolicy", "embed", "ml")
    fixed["spec"]["metric"]["target"] = 60
    fixed["metadata"]["generation"] = 2
    apiserver.update_object(fixed)
    policies = loader.sync(writer, NOW + 30)
    assert "ml/embed" in {p.service.key for p in policies.valid}
    conditions = {c["type"]: c for c in apiserver.get(GROUP, "GPUScalingPolicy", "embed", "ml")["status"]["conditions"]}
    assert conditions["InvalidSpec"]["status"] == "False"


def test_two_policies_for_one_deployment(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    older = o.gpu_policy("chat-a", "ml", target="chat")
    newer = o.gpu_policy("chat-b", "ml", target="chat")
    newer["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    apiserver.seed(o.policy_crd(), newer, older)
    policies = PolicyLoader(api_client).load()
    assert [p.name for p in policies.valid] == ["chat-a"]
    assert policies.invalid[0].name == "chat-b" and policies.invalid[0].field == "spec.targetRef.name"


def test_a_newcomer_never_takes_over_an_established_policy(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Issue 17, defect 3: a policy applied later whose name sorts first (and, worse, whose creation time ties or
    even looks older, as with a re-applied manifest) must not take the Deployment from the one scaling it."""
    established = o.gpu_policy("chat-z", "ml", target="chat")
    apiserver.seed(o.policy_crd(), established)
    loader, writer = PolicyLoader(api_client), _writer(api_client)
    assert [p.name for p in loader.sync(writer, NOW).valid] == ["chat-z"]

    newcomer = o.gpu_policy("chat-a", "ml", target="chat")
    newcomer["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"  # "older" than the established one
    apiserver.seed(newcomer)
    policies = loader.sync(writer, NOW + 15)
    assert [p.name for p in policies.valid] == ["chat-z"]
    assert [(p.name, p.field) for p in policies.invalid] == [("chat-a", "spec.targetRef.name")]
    assert "already scaled by GPUScalingPolicy 'chat-z'" in policies.invalid[0].message

    # A controller restart (a new loader, no memory): the status it wrote says who was acting.
    status = {"conditions": [{"type": "Ready", "status": "True", "reason": "SpecValid", "message": ""}]}
    current = apiserver.get(GROUP, "GPUScalingPolicy", "chat-z", "ml")
    apiserver.update_object({**current, "status": status})
    restarted = PolicyLoader(api_client).load()
    assert [p.name for p in restarted.valid] == ["chat-z"]
    assert [p.name for p in restarted.invalid] == ["chat-a"]


def test_namespaces_and_pagination(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.policy_crd(), [o.gpu_policy(f"s{i}", "a") for i in range(5)], o.gpu_policy("x", "b"))
    loader = PolicyLoader(api_client, namespaces=["a"], page_size=2)
    assert len(loader.load().valid) == 5
    assert loader.api_calls == 3
    assert apiserver.request_count("GET", r"/namespaces/a/gpuscalingpolicies$") == 3


def test_validate_policy_names_the_field() -> None:
    missing = validate_policy({"metadata": {"name": "x", "namespace": "n"}, "spec": {"maxReplicas": 3}})
    assert missing.field == "spec.targetRef" and "required" in missing.message.lower()  # type: ignore[union-attr]
    typo = validate_policy({"metadata": {"name": "x"}, "spec": {"targetRef": {"name": "d"}, "maxReplica": 3}})
    assert typo.field == "spec.maxReplica"  # type: ignore[union-attr]
    nested = validate_policy(
        {
            "metadata": {"name": "x"},
            "spec": {
                "targetRef": {"name": "d"},
                "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 15}]}},
            },
        }
    )
    assert nested.field == "spec.behavior.scaleUp.policies[0].value"  # type: ignore[union-attr]
    assert "(got 0)" in nested.message  # type: ignore[union-attr]
    no_spec = validate_policy({"metadata": {"name": "x"}})
    assert no_spec.field == "spec"  # type: ignore[union-attr]


# ---- input-handling defects: a malformed policy names the field and the problem -----------------------------------

EMPTY_POLICIES = "at least one rate policy (omit it for the defaults, or selectPolicy: Disabled)"
INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        # An empty rate-policy list allowed no change at all (the HPA API refuses it: "must specify at least one
        # Policy"); selectPolicy: Disabled does not make it valid either, as in the HPA API.
        ({"behavior": {"scaleUp": {"policies": []}}}, "spec.behavior.scaleUp.policies", EMPTY_POLICIES),
        ({"behavior": {"scaleDown": {"policies": []}}}, "spec.behavior.scaleDown.policies", EMPTY_POLICIES),
        (
            {"behavior": {"scaleDown": {"selectPolicy": "Disabled", "policies": []}}},
            "spec.behavior.scaleDown.policies",
            EMPTY_POLICIES,
        ),
        ({"behavior": {"scaleUp": {"selectPolicy": "Disabled"}}}, None, None),  # the way to stop a direction
        ({"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}]}}}, None, None),
        # Replica counts, rate-policy values and priorities are int32 in Kubernetes.
        ({"maxReplicas": 10**30}, "spec.maxReplicas", f"less than or equal to {INT32_MAX}"),
        ({"maxReplicas": INT32_MAX + 1}, "spec.maxReplicas", f"less than or equal to {INT32_MAX}"),
        ({"minReplicas": INT32_MAX + 1, "maxReplicas": INT32_MAX}, "spec.minReplicas", "less than or equal to"),
        ({"minReplicas": INT32_MAX, "maxReplicas": INT32_MAX}, None, None),
        ({"priority": 10**40}, "spec.priority", f"less than or equal to {INT32_MAX}"),
        ({"priority": -(2**31) - 1}, "spec.priority", f"greater than or equal to {-(2**31)}"),
        ({"priority": INT32_MAX}, None, None),
        ({"priority": -(2**31)}, None, None),
        (
            {"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": INT32_MAX + 1, "periodSeconds": 15}]}}},
            "spec.behavior.scaleUp.policies[0].value",
            "less than or equal to",
        ),
        # A value too large to print (repr of an integer of > 4,300 digits raises) is still reported, by its size.
        ({"maxReplicas": 10**5000}, "spec.maxReplicas", "(got an integer of about 5,000 digits)"),
        ({"metric": {"type": "request_rate", "target": float("inf")}}, "spec.metric.target", "finite number"),
        # A target or rate that small asked for an unbounded replica count; x untrustedTargetRatio 0.5 it rounded to
        # 0.0 and the tick divided by zero. At least 1e-06 (as the simulator already required), the ratio 0.01.
        (
            {"metric": {"type": "gpu_utilization", "target": 5e-324}, "forecast": {"mode": "active"}},
            "spec.metric.target",
            "greater than or equal to 0.000001 (got 5e-324)",
        ),
        ({"metric": {"type": "request_rate", "target": 1e-6}}, None, None),
        (
            {"forecast": {"mode": "active", "ratePerReplica": 5e-324}},
            "spec.forecast.ratePerReplica",
            "greater than or equal to 0.000001",
        ),
        (
            {"forecast": {"mode": "active", "untrustedTargetRatio": 5e-324}},
            "spec.forecast.untrustedTargetRatio",
            "greater than or equal to 0.01",
        ),
        # the target's default (70) is a gpu_utilization percentage: engine_active must give its own
        ({"metric": {"type": "engine_active"}}, "spec.metric", "metric.target defaults to 70"),
        ({"metric": {"type": "engine_active", "target": 0.7}}, None, None),
        # a Deployment's name is a DNS-1123 subdomain: "a: b" or "x/y" names none, and folded into the service key
        # (namespace/name) it broke the lookup of every service's query overrides
        ({"targetRef": {"name": "a: b"}}, "spec.targetRef.name", "should match pattern"),
        ({"targetRef": {"name": "x/y"}}, "spec.targetRef.name", "should match pattern"),
        ({"targetRef": {"name": "Chat"}}, "spec.targetRef.name", "should match pattern"),
        ({"targetRef": {"name": "chat.v2-0"}}, None, None),
    ],
)
def test_validate_policy_refuses_what_could_never_scale(
    spec: dict[str, Any], field: str | None, problem: str | None
) -> None:
    obj = {"metadata": {"name": "x", "namespace": "n"}, "spec": {"targetRef": {"name": "d"}, **spec}}
    result = validate_policy(obj)
    if field is None:
        assert isinstance(result, LoadedPolicy), result
        return
    assert isinstance(result, InvalidPolicy), result
    assert result.field == field and problem is not None and problem in result.message, result.text
    assert len(result.text) < 300  # it goes into a condition and an Event


@pytest.mark.parametrize(
    ("obj", "field", "generation"),
    [
        ({"metadata": [1], "spec": {"targetRef": {"name": "d"}}}, None, 0),
        ({"metadata": {"name": "x", "generation": "abc"}, "spec": {"targetRef": {"name": "d"}}}, None, 0),
        ({"metadata": {"name": "x", "generation": 3}, "status": [1], "spec": {"targetRef": {"name": "d"}}}, None, 3),
        ({"metadata": {"name": 5}, "spec": [1]}, "spec", 0),
        ({"metadata": {"name": "x"}, "spec": None}, "spec", 0),
    ],
)
def test_validate_policy_never_raises_on_odd_metadata(obj: dict[str, Any], field: str | None, generation: int) -> None:
    result = validate_policy(obj)
    assert result.generation == generation and isinstance(result.status, Mapping)
    if field is None:
        assert isinstance(result, LoadedPolicy)
    else:
        assert isinstance(result, InvalidPolicy) and result.field == field


@pytest.mark.parametrize("namespaces", [(), ("ml",)])
def test_a_missing_crd_is_named_in_the_list_error(
    apiserver: FakeApiServer, api_client: client.ApiClient, namespaces: tuple[str, ...]
) -> None:
    """The API server's 404 for a resource it does not serve says only that it could not find it: the controller's
    log and /readyz should say what to check (operators met it as "HTTP 404 NotFound" and nothing else)."""
    from autoscaler.adapters.kubernetes._api import KubeApiError

    loader = PolicyLoader(api_client, namespaces=namespaces)
    with pytest.raises(KubeApiError) as caught:
        loader.load()
    assert caught.value.status == 404
    assert "is the GPUScalingPolicy CRD installed? kubectl get crd gpuscalingpolicies.gpuautoscaler.dev" in str(
        caught.value
    )
