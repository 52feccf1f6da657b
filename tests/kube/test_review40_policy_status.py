"""Review 40 of the GPUScalingPolicy adapters (``adapters/kubernetes/policies.py``, ``status.py``, ``crd.py``) and the
HPA import (``adapters/kubernetes/hpa.py``), tests first, against the REST-faithful fake API server.

Defects found: none in these four files. Each behaviour below was compared with upstream (the apiserver's paginated
list and ``410 Expired``, the status subresource with its resourceVersion precondition, ``meta.SetStatusCondition``,
and ``k8s.io/kubernetes`` ``pkg/apis/autoscaling/v2/defaults.go`` for an HPA's behavior) and found to match.

The right behaviour pinned (not pinned elsewhere): policies listed across namespaces in pages whose continue tokens
keep expiring are each served once, an invalid one among them reported and the others served; an invalid policy
deleted between the list and its report gets no write, no Event and no error; one whose status write meets a 409 is
written once after a fresh read, at the generation validated, with one Warning Event, and one whose writes
keep conflicting is a collected error (no Event) while the next invalid policy is still reported; a condition's
``lastTransitionTime`` moves only when its status flips (not on a new reason, message or generation); the status the
merge writes passes the generated CRD's status schema; and an imported HPA keeps the apiserver's behavior defaults
(written out in full, or an empty ``behavior`` block the apiserver fills in), ``minReplicas`` absent is 1, a
``ContainerResource`` metric is named as having no equivalent while a later readable metric is used, and a
``scaleTargetRef`` of another kind is refused naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterWriter, PolicyLoader, WriterConfig
from autoscaler.adapters.kubernetes.crd import generate_crd
from autoscaler.adapters.kubernetes.hpa import HpaImportError, import_hpa
from autoscaler.adapters.kubernetes.policies import LoadedPolicy, validate_policy
from autoscaler.adapters.kubernetes.status import (
    INVALID_SPEC,
    READY,
    ConditionUpdate,
    ForecastRecord,
    LastAction,
    StatusUpdate,
    merge_conditions,
    merge_status,
)
from autoscaler.core.model import DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP, MetricKind, ServicePolicy
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer, validate_structural

NOW = 1_800_000_000.0
API = "gpuautoscaler.dev/v1alpha1"
KIND = "GPUScalingPolicy"


def writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), clock=lambda: NOW, sleep=lambda s: None)


def stored(apiserver: FakeApiServer, name: str, namespace: str) -> dict[str, Any]:
    obj = apiserver.get(API, KIND, name, namespace)
    assert obj is not None
    return obj


def warnings_about(apiserver: FakeApiServer, name: str) -> list[dict[str, Any]]:
    return [e for e in apiserver.objects("events.k8s.io/v1", "Event") if e["regarding"]["name"] == name]


def test_paged_list_with_expiring_tokens_serves_each_policy_once_and_reports_the_invalid(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Pages of one, every continue token expired (410): the pager restarts, then lists in one request; no policy
    is lost or doubled, and the invalid one does not keep the others from being served."""
    policies = [o.gpu_policy(f"svc-{i}", namespace) for i, namespace in enumerate(["a", "b", "c", "a", "b"])]
    apiserver.seed(o.policy_crd(), *policies, o.gpu_policy("broken", "c", minReplicas=9, maxReplicas=2))
    apiserver.continue_ttl_s = 0.0
    loader = PolicyLoader(api_client, page_size=1, sleep=lambda s: None)
    loaded = loader.sync(writer(api_client), NOW)
    assert sorted(p.service.key for p in loaded.valid) == ["a/svc-0", "a/svc-3", "b/svc-1", "b/svc-4", "c/svc-2"]
    assert [(p.name, p.field) for p in loaded.invalid] == [("broken", "spec")]
    assert any(r.status == 410 for r in apiserver.requests)
    conditions = {c["type"]: c for c in stored(apiserver, "broken", "c")["status"]["conditions"]}
    assert conditions[INVALID_SPEC]["status"] == "True" and conditions[READY]["status"] == "False"
    assert len(warnings_about(apiserver, "broken")) == 1


def test_an_invalid_policy_deleted_before_its_report_gets_no_write_and_no_event(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.policy_crd(), o.gpu_policy("broken", "ml", minReplicas=9, maxReplicas=2))
    loaded = PolicyLoader(api_client).load()
    apiserver.delete_object(API, KIND, "broken", "ml")
    assert PolicyLoader.report(loaded, writer(api_client), NOW) == []
    assert apiserver.request_count("PUT") == 0
    assert warnings_about(apiserver, "broken") == []


def test_an_invalid_policy_written_after_a_conflict_keeps_the_generation_validated(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Another client writes the object between the writer's read and its PUT: 409, a fresh read, one write with
    ``observedGeneration`` the generation that was validated, and one Warning Event."""
    broken = o.gpu_policy("broken", "ml", minReplicas=9, maxReplicas=2)
    broken["metadata"]["generation"] = 4
    apiserver.seed(o.policy_crd(), broken)
    loaded = PolicyLoader(api_client).load()
    w = writer(api_client)
    original = w._custom.get_namespaced_custom_object
    reads = {"n": 0}

    def raced(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        reads["n"] += 1
        if reads["n"] == 1:
            live = stored(apiserver, "broken", "ml")
            apiserver.update_object(dict(live, metadata=dict(live["metadata"], labels={"team": "ml"})))
        return result

    w._custom.get_namespaced_custom_object = raced  # type: ignore[method-assign]
    assert PolicyLoader.report(loaded, w, NOW) == []
    assert [r.status for r in apiserver.requests if r.method == "PUT"] == [409, 200]
    status = stored(apiserver, "broken", "ml")["status"]
    assert status["observedGeneration"] == 4
    assert {c["type"]: c["observedGeneration"] for c in status["conditions"]} == {INVALID_SPEC: 4, READY: 4}
    assert len(warnings_about(apiserver, "broken")) == 1


def test_last_transition_time_moves_only_when_the_status_flips() -> None:
    first = merge_conditions([], [ConditionUpdate(READY, True, "Active", "scaling")], generation=1, now=NOW)
    assert first[0]["lastTransitionTime"] == "2027-01-15T08:00:00Z"
    reworded = merge_conditions(
        first, [ConditionUpdate(READY, True, "RecommendOnly", "recommending")], generation=2, now=NOW + 60
    )
    assert reworded[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert (reworded[0]["reason"], reworded[0]["message"], reworded[0]["observedGeneration"]) == (
        "RecommendOnly",
        "recommending",
        2,
    )
    flipped = merge_conditions(
        reworded, [ConditionUpdate(READY, False, "InvalidSpec", "bad")], generation=3, now=NOW + 120
    )
    assert flipped[0]["lastTransitionTime"] == "2027-01-15T08:02:00Z"
    assert first[0]["reason"] == "Active"  # the input is not changed in place


def test_the_merged_status_passes_the_generated_crd_schema() -> None:
    update = StatusUpdate(
        current_replicas=2,
        desired_replicas=5,
        last_action=LastAction("ScaleDeployment", "metric_above_target", "above target", NOW, "x", False, 2, 5),
        last_forecast=ForecastRecord(None, 90.0, 0.9, mode="active", headroom_state="learning", headroom_ratio=0.75),
        conditions=(
            ConditionUpdate(READY, True, "Active", "scaling ml/chat in mode active"),
            ConditionUpdate("AtMaxReplicas", False, "BelowMaxReplicas", ""),
            ConditionUpdate(INVALID_SPEC, False, "SpecValid", "the spec is valid"),
        ),
    )
    status = merge_status({}, update, generation=3, now=NOW)
    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    checked, errors = validate_structural(status, schema)
    assert errors == [] and checked == status
    assert status["lastScaleTime"] == status["lastAction"]["time"]
    assert merge_status(status, update, generation=3, now=NOW + 15) == status  # re-applied: a no-op


def hpa(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
        "maxReplicas": 10,
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "DCGM_FI_DEV_GPU_UTIL"},
                    "target": {"type": "AverageValue", "averageValue": "70"},
                },
            }
        ],
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat", "namespace": "ml"},
        "spec": {**body, **spec},
    }


def service(manifest: dict[str, Any]) -> ServicePolicy:
    result = validate_policy(manifest)
    assert isinstance(result, LoadedPolicy)
    return result.service


#: What ``kubectl get hpa -o yaml`` shows of a behavior block the apiserver defaulted (GenerateHPAScaleUpRules,
#: GenerateHPAScaleDownRules; the scale-down window is the controller's 300 s default).
SERVED_DEFAULTS = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15},
        ],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    },
}


@pytest.mark.parametrize("behavior", [SERVED_DEFAULTS, {}], ids=["served-in-full", "empty-block"])
def test_an_hpa_behavior_of_defaults_is_the_policy_defaults(behavior: dict[str, Any]) -> None:
    policy = service(import_hpa(hpa(behavior=behavior)).manifest)
    assert policy.behavior is True
    assert (policy.scale_up.stabilisation_s, set(policy.scale_up.policies)) == (
        DEFAULT_SCALE_UP.stabilisation_s,
        set(DEFAULT_SCALE_UP.policies),
    )
    assert (policy.scale_down.stabilisation_s, set(policy.scale_down.policies)) == (
        DEFAULT_SCALE_DOWN.stabilisation_s,
        set(DEFAULT_SCALE_DOWN.policies),
    )
    assert (policy.min_replicas, policy.max_replicas) == (1, 10)  # minReplicas absent: the apiserver's 1


def test_a_container_resource_metric_is_named_and_a_later_readable_one_used() -> None:
    imported = import_hpa(
        hpa(
            metrics=[
                {
                    "type": "ContainerResource",
                    "containerResource": {
                        "name": "cpu",
                        "container": "server",
                        "target": {"type": "Utilization", "averageUtilization": 60},
                    },
                },
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "vllm:num_requests_waiting"},
                        "target": {"type": "AverageValue", "averageValue": "3"},
                    },
                },
            ]
        )
    )
    assert imported.manifest["spec"]["metric"] == {"type": MetricKind.QUEUE_DEPTH.value, "target": 3.0}
    assert imported.notes == [
        "spec.metrics[0]: ContainerResource cpu: no equivalent (this controller scales on GPU and application "
        "signals; use --metric)"
    ]


@pytest.mark.parametrize(
    "ref",
    [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "chat"},
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "chat"},
    ],
)
def test_a_scale_target_of_another_kind_is_refused_naming_the_field(ref: dict[str, Any]) -> None:
    with pytest.raises(HpaImportError, match=rf"^spec\.scaleTargetRef: '{ref['kind']}' 'chat': only Deployments"):
        import_hpa(hpa(scaleTargetRef=ref))


def test_a_status_write_that_keeps_conflicting_is_an_error_and_the_others_are_still_reported(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Every read of ``contested`` is followed by another client's write: its PUTs all answer 409, the bounded
    retries give up with an error (collected, no Event), and ``broken`` is still given its condition and Event."""
    apiserver.seed(
        o.policy_crd(),
        o.gpu_policy("contested", "ml", minReplicas=9, maxReplicas=2),
        o.gpu_policy("broken", "ml", maxReplicas=0),
    )
    loaded = PolicyLoader(api_client).load()
    w = writer(api_client)
    original = w._custom.get_namespaced_custom_object

    def always_raced(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if "contested" in args:
            live = stored(apiserver, "contested", "ml")
            apiserver.update_object(
                dict(live, metadata=dict(live["metadata"], labels={"n": live["metadata"]["resourceVersion"]}))
            )
        return result

    w._custom.get_namespaced_custom_object = always_raced  # type: ignore[method-assign]
    errors = PolicyLoader.report(loaded, w, NOW)
    assert [getattr(e, "status", None) for e in errors] == [409]
    assert "status" not in stored(apiserver, "contested", "ml") and warnings_about(apiserver, "contested") == []
    conditions = {c["type"]: c["status"] for c in stored(apiserver, "broken", "ml")["status"]["conditions"]}
    assert conditions == {INVALID_SPEC: "True", READY: "False"}
    assert len(warnings_about(apiserver, "broken")) == 1
