"""Review 32 of how GPUScalingPolicies are read and validated: each test here failed on the code before its fix."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterWriter, PolicyLoader, WriterConfig
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.yaml_input import YamlProblem, load_yaml, load_yaml_all
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
API = "gpuautoscaler.dev/v1alpha1"
KIND = "GPUScalingPolicy"


def _writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="t"), clock=lambda: NOW, sleep=lambda s: None)


def _stored(apiserver: FakeApiServer, name: str = "chat", namespace: str = "ml") -> dict[str, Any]:
    obj = apiserver.get(API, KIND, name, namespace)
    assert obj is not None
    return obj


def _events_on(apiserver: FakeApiServer, name: str) -> list[dict[str, Any]]:
    return [e for e in apiserver.objects("events.k8s.io/v1", "Event") if e["regarding"]["name"] == name]


def _policy(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "x", "namespace": "n"}, "spec": {"targetRef": {"name": "d"}, **spec}}


# ---- defect 1: the InvalidSpec condition was written to whatever object had the name --------------------------------


def test_report_does_not_mark_a_policy_recreated_since_the_read_invalid(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The loader read an invalid ``chat``; it was deleted and applied again, fixed, before ``report`` wrote. Before
    the fix the new (valid) object got ``InvalidSpec=True``/``Ready=False`` and a Warning Event about the old spec."""
    bad = o.gpu_policy("chat", "ml", metric={"type": "gpu_utilization", "target": 150})
    bad["metadata"]["generation"] = 3
    apiserver.seed(o.policy_crd(), bad)
    loader, writer = PolicyLoader(api_client), _writer(api_client)
    policies = loader.load()
    assert [p.name for p in policies.invalid] == ["chat"]

    apiserver.delete_object(API, KIND, "chat", "ml")
    apiserver.seed(o.gpu_policy("chat", "ml", metric={"type": "gpu_utilization", "target": 60}))
    new_uid = _stored(apiserver)["metadata"]["uid"]

    assert loader.report(policies, writer, NOW) == []
    new = _stored(apiserver)
    assert new["metadata"]["uid"] == new_uid
    assert not new.get("status"), new.get("status")
    assert _events_on(apiserver, "chat") == []
    assert all(r.status != 409 for r in apiserver.requests if r.method == "PUT")

    # the next load reads the new object: valid, and nothing to clear
    assert [p.name for p in loader.sync(writer, NOW + 15).valid] == ["chat"]
    assert not _stored(apiserver).get("status")


def test_report_writes_the_generation_it_validated(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """The spec was fixed (generation 3 -> 4) between the read of the invalid generation 3 and the condition write.
    Before the fix the condition said ``observedGeneration: 4``, i.e. that the fixed spec was invalid, and the next
    load, seeing the condition current, only cleared it: the status claimed generation 4 had been found invalid."""
    bad = o.gpu_policy("chat", "ml", minReplicas=5, maxReplicas=2)
    bad["metadata"]["generation"] = 3
    apiserver.seed(o.policy_crd(), bad)
    loader, writer = PolicyLoader(api_client), _writer(api_client)
    policies = loader.load()
    assert [(p.name, p.generation) for p in policies.invalid] == [("chat", 3)]

    fixed = _stored(apiserver)
    fixed["spec"]["minReplicas"] = 1
    fixed["metadata"]["generation"] = 4
    apiserver.update_object(fixed)

    assert loader.report(policies, writer, NOW) == []
    status = _stored(apiserver)["status"]
    assert status["observedGeneration"] == 3
    assert {c["type"]: c["observedGeneration"] for c in status["conditions"]} == {"InvalidSpec": 3, "Ready": 3}


# ---- defect 2: a namespace configured twice made every policy in it contest its own Deployment -------------------


def test_a_namespace_listed_twice_does_not_make_a_policy_contest_itself(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """``AUTOSCALER_NAMESPACES=ml,ml`` (the settings accept it): each policy was listed twice, and its second copy was
    invalid, "already scaled by GPUScalingPolicy 'chat'" -- by itself -- and got InvalidSpec and a Warning Event."""
    apiserver.seed(o.policy_crd(), o.gpu_policy("chat", "ml"), o.gpu_policy("embed", "ml"))
    loader = PolicyLoader(api_client, namespaces=["ml", "ml"])
    policies = loader.sync(_writer(api_client), NOW)
    assert sorted(p.name for p in policies.valid) == ["chat", "embed"]
    assert policies.invalid == ()
    assert loader.namespaces == ("ml",)
    assert apiserver.request_count("GET", r"/namespaces/ml/gpuscalingpolicies$") == 1
    assert not _stored(apiserver).get("status") and _events_on(apiserver, "chat") == []


# ---- defect 3: owning one Deployment at the previous load counted as owning every Deployment ----------------------


def test_an_owner_retargeted_onto_another_owners_deployment_does_not_take_it(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """``chat-a`` scales ``chat``, ``chat-b`` scales ``embed``. ``chat-a`` is edited to target ``embed``. Before the
    fix the loader put every previous owner first, whatever it owned, so the older ``chat-a`` took ``embed`` from
    ``chat-b``, which had been scaling it: a newcomer to that Deployment took it over."""
    a = o.gpu_policy("chat-a", "ml", target="chat")
    a["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    b = o.gpu_policy("chat-b", "ml", target="embed")
    b["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    apiserver.seed(o.policy_crd(), a, b)
    loader = PolicyLoader(api_client)
    assert sorted(p.service.key for p in loader.load().valid) == ["ml/chat", "ml/embed"]

    edited = _stored(apiserver, "chat-a")
    edited["spec"]["targetRef"]["name"] = "embed"
    edited["metadata"]["generation"] = 2
    apiserver.update_object(edited)
    for _ in range(2):  # and it stays so
        policies = loader.load()
        assert [(p.name, p.service.key) for p in policies.valid] == [("chat-b", "ml/embed")]
        assert [(p.name, p.field) for p in policies.invalid] == [("chat-a", "spec.targetRef.name")]
        assert "already scaled by GPUScalingPolicy 'chat-b'" in policies.invalid[0].message


def test_after_a_restart_a_retargeted_policy_does_not_take_another_owners_deployment(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The same after a controller restart (no memory): both statuses say Ready, but ``chat-a``'s says so of an
    earlier generation (the one that targeted ``chat``): ``chat-b``, acting on its current spec, keeps ``embed``."""

    def ready(generation: int) -> dict[str, Any]:
        cond = {
            "type": "Ready",
            "status": "True",
            "reason": "SpecValid",
            "message": "",
            "observedGeneration": generation,
        }
        return {"observedGeneration": generation, "conditions": [cond]}

    a = o.gpu_policy("chat-a", "ml", target="embed")  # edited: it targeted chat at generation 1
    a["metadata"].update(creationTimestamp="2025-01-01T00:00:00Z", generation=2)
    a["status"] = ready(1)
    b = o.gpu_policy("chat-b", "ml", target="embed")
    b["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    b["status"] = ready(1)
    apiserver.seed(o.policy_crd(), a, b)
    policies = PolicyLoader(api_client).load()
    assert [p.name for p in policies.valid] == ["chat-b"]
    assert [p.name for p in policies.invalid] == ["chat-a"]


# ---- defect 4: a !!map (or !!set) tag on a sequence or a scalar escaped the YAML loader as a TypeError ------------


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: !!map [1]\n", 1),
        ("a: 1\nb: !!map [[1, 2]]\n", 2),
        ("a: !!set [1]\n", 1),
        ("!!map [1, 2]\n", 1),
        ("a: !!map x\n", 1),  # was a ValueError: "not enough values to unpack (expected 2, got 1)", no position
    ],
)
def test_a_mapping_tag_on_another_node_is_a_yaml_problem_with_its_position(text: str, line: int) -> None:
    with pytest.raises(YamlProblem) as err:
        load_yaml(text)
    assert "expected a mapping node" in str(err.value) and err.value.line == line
    with pytest.raises(YamlProblem):
        load_yaml_all(text)


# ---- defect 5: the model accepted strings and booleans where the CRD's schema refuses them ------------------------


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        ({"minReplicas": "5"}, "spec.minReplicas", "valid integer (got '5')"),
        ({"maxReplicas": True}, "spec.maxReplicas", "valid integer (got True)"),
        ({"priority": "100"}, "spec.priority", "valid integer"),
        ({"gpusPerReplica": "2"}, "spec.gpusPerReplica", "valid integer"),
        (
            {"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": "4", "periodSeconds": 15}]}}},
            "spec.behavior.scaleUp.policies[0].value",
            "valid integer",
        ),
        (
            {"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": "15"}]}}},
            "spec.behavior.scaleUp.policies[0].periodSeconds",
            "valid integer",  # whole seconds, as the HPA's
        ),
        ({"metric": {"type": "request_rate", "target": "70"}}, "spec.metric.target", "valid number (got '70')"),
        ({"metric": {"type": "request_rate", "target": True}}, "spec.metric.target", "valid number"),
        ({"coldStartSeconds": "90"}, "spec.coldStartSeconds", "valid number"),
        ({"latency": {"sloSeconds": "1"}}, "spec.latency.sloSeconds", "valid number"),
        ({"latency": {"sloSeconds": 1, "guard": "false"}}, "spec.latency.guard", "valid boolean"),
        ({"latency": {"sloSeconds": 1, "guard": 0}}, "spec.latency.guard", "valid boolean"),
        ({"behavior": {"hpaWithoutBehavior": "true"}}, "spec.behavior.hpaWithoutBehavior", "valid boolean"),
        ({"behavior": {"scaleDown": {"tolerance": "0.1"}}}, "spec.behavior.scaleDown.tolerance", "valid number"),
        ({"forecast": {"mode": "shadow", "quantile": "0.9"}}, "spec.forecast.quantile", "valid number"),
        # what the apiserver does accept keeps working: integral floats for integers, integers for numbers
        ({"minReplicas": 2.0, "maxReplicas": 5}, None, None),
        ({"metric": {"type": "request_rate", "target": 12}, "latency": {"sloSeconds": 2, "guard": False}}, None, None),
    ],
)
def test_the_model_refuses_what_the_crd_schema_refuses(
    spec: dict[str, Any], field: str | None, problem: str | None
) -> None:
    """The CRD's ``integer``/``number``/``boolean`` types refuse ``"5"`` and ``true`` for a number; pydantic's lax mode
    turned them into 5 and 1, so a scenario or ``autoscaler observe --policy`` file the apiserver would refuse ran."""
    result = validate_policy(_policy(spec))
    if field is None:
        assert isinstance(result, LoadedPolicy), result
        return
    assert isinstance(result, InvalidPolicy), result
    assert result.field == field and problem is not None and problem in result.message, result.text


WINDOW = "spec.behavior.scaleDown.stabilizationWindowSeconds"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"behavior": {"scaleDown": {"stabilizationWindowSeconds": "300"}}}, f"{WINDOW}"),
        ({"forecast": {"mode": "active", "ratePerReplica": "5"}}, "spec.forecast.ratePerReplica"),
        ({"behavior": {"scaleDown": {"stabilizationWindowSeconds": -1}}}, f"{WINDOW}"),
        ({"forecast": {"mode": "active", "ratePerReplica": 1e-7}}, "spec.forecast.ratePerReplica"),
    ],
)
def test_optional_numbers_refuse_strings_and_keep_their_bounds(spec: dict[str, Any], field: str) -> None:
    result = validate_policy(_policy(spec))
    assert isinstance(result, InvalidPolicy) and result.field == field, result
    ok = {"behavior": {"scaleDown": {"stabilizationWindowSeconds": None}}, "forecast": {"ratePerReplica": None}}
    assert isinstance(validate_policy({"metadata": {}, "spec": {"targetRef": {"name": "d"}, **ok}}), LoadedPolicy)
