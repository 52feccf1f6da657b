"""The two validators of a GPUScalingPolicy, the CRD's (schema and CEL, run by kube-apiserver at ``kubectl apply``) and
the controller's (``validate_policy``: the pydantic model), must say the same about every document.

A policy the apiserver admits but the parser refuses gets ``InvalidSpec`` only when the controller loads it (the user
got no error at apply); a policy the parser accepts but the apiserver refuses is a feature no one can use. This file
holds the differential corpus -- a table of documents with the verdict both must give (``CASES``), the differences
that are meant to be there with their reasons (``EXPECTED_DIFFERENCES``) and a corpus generated from the CRD's schema
(``generated_corpus``) -- and checks the parser's half of it with no cluster. tests/realkube/test_crd_parity_real.py
submits every document to a real kube-apiserver as well, reads back what it stored and parses that.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from autoscaler.adapters.kubernetes.crd import generate_crd
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.policy import (
    API_GROUP,
    API_VERSION,
    KIND,
    MAX_PERIOD_SECONDS,
    MAX_STABILIZATION_WINDOW_SECONDS,
    GPUScalingPolicySpec,
)
from autoscaler.yaml_input import load_yaml

NAMESPACE = "parity"
GATEWAY = 'sum(rate(gateway_requests_total{namespace="{namespace}"}[1m]))'
PODS = {"type": "Pods", "value": 4, "periodSeconds": 15}
#: ``spec`` of a document with no spec at all (a case of its own: the apiserver and the parser both require one)
NO_SPEC = object()


@dataclass(frozen=True)
class Case:
    """One document. ``spec`` is laid over ``{"targetRef": {"name": <the object's name>}}`` (a spec that is not a
    mapping replaces it). ``field``: the field the apiserver names when both refuse it, None when both accept it.
    ``yaml``: the spec written as YAML text (indented under ``spec:``) instead of JSON, as ``kubectl apply`` and the
    simulator's scenario files read it; the apiserver then decodes YAML (``application/yaml``) and the parser's
    side is ``autoscaler.yaml_input.load_yaml``. ``field_validation``: the apiserver's unknown-field handling,
    ``Strict`` as ``kubectl apply`` asks by default."""

    spec: Any = None
    field: str | None = None
    yaml: str | None = None
    field_validation: str = "Strict"


def document(case: Case, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The parsed document as a client sends it (metadata with the namespace, as the controller lists it)."""
    body: dict[str, Any] = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": name}}
    if case.yaml is not None:
        loaded = load_yaml(yaml_text(case, name))
        body = dict(loaded)
    elif case.spec is not NO_SPEC:
        spec = case.spec if case.spec is not None else {}
        body["spec"] = {"targetRef": {"name": name}, **spec} if isinstance(spec, dict) else spec
    return {**body, "metadata": {"name": name, "namespace": namespace}}


def yaml_text(case: Case, name: str) -> str:
    assert case.yaml is not None
    spec = "".join(f"  {line}\n" for line in case.yaml.splitlines())
    return f"apiVersion: {API_GROUP}/{API_VERSION}\nkind: {KIND}\nmetadata:\n  name: {name}\nspec:\n{spec}"


def policies(*items: dict[str, Any]) -> dict[str, Any]:
    return {"behavior": {"scaleUp": {"policies": list(items)}}}


def window(value: Any, **more: Any) -> dict[str, Any]:
    return {"behavior": {"scaleUp": {"stabilizationWindowSeconds": value}, **more}}


ZERO_REQUEST_RATE = {"minReplicas": 0, "metric": {"type": "request_rate", "target": 5}}

#: Both validators give the same verdict, naming the same field. Explicit nulls: the apiserver keeps the null of a
#: ``nullable`` field (an Optional one of the model), prunes any other and applies the default -- the parser reads
#: that null as absent too.
CASES: dict[str, Case] = {
    # -- explicit nulls --
    "null/scaleUp.policies": Case({"behavior": {"scaleUp": {"policies": None}}}),
    "null/stabilizationWindowSeconds": Case(window(None)),
    "null/window-with-hpaWithoutBehavior": Case(window(None, hpaWithoutBehavior=True)),
    "null/policies-with-hpaWithoutBehavior": Case(
        {"behavior": {"hpaWithoutBehavior": True, "scaleDown": {"policies": None, "selectPolicy": None}}}
    ),
    "null/queries.requestRate": Case({"queries": {"requestRate": None}}),
    "null/requestRate-of-a-zero-minimum": Case(
        {**ZERO_REQUEST_RATE, "queries": {"requestRate": None}}, "spec.minReplicas"
    ),
    "null/queries": Case({"queries": None}),
    "null/minReplicas": Case({"minReplicas": None}),
    "null/minReplicas-over-the-default-max": Case({"minReplicas": 20, "maxReplicas": None}, "spec.minReplicas"),
    "null/metric": Case({"metric": None}),
    "null/metric.type": Case({"metric": {"type": None, "target": 50}}),
    "null/metric.type-over-100": Case({"metric": {"type": None, "target": 500}}, "spec.metric.target"),
    "null/engine_active-target-is-the-default-70": Case(
        {"metric": {"type": "engine_active", "target": None}}, "spec.metric.target"
    ),
    "null/behavior": Case({"behavior": None}),
    "null/scaleUp": Case({"behavior": {"scaleUp": None}}),
    "null/latency": Case({"latency": None}),
    "null/latency.sloSeconds": Case({"latency": {"sloSeconds": None}}, "spec.latency.sloSeconds"),
    "null/latency.guard": Case({"latency": {"sloSeconds": 1, "guard": None}}),
    "null/adoptHpa": Case({"adoptHpa": None}),
    "null/forecast.ratePerReplica": Case({"forecast": {"mode": "active", "ratePerReplica": None}}),
    "null/targetRef": Case({"targetRef": None}, "spec.targetRef"),
    "null/targetRef.name": Case({"targetRef": {"name": None}}, "spec.targetRef.name"),
    "null/targetRef.apiVersion": Case({"targetRef": {"name": "web", "apiVersion": None}}),
    "null/policy-period": Case(
        policies({**PODS, "periodSeconds": None}), "spec.behavior.scaleUp.policies[0].periodSeconds"
    ),
    "null/spec": Case(NO_SPEC, "spec"),
    "null/unknown-field": Case({"replicas": None}, "spec.replicas"),
    "yaml/empty-value-is-null": Case(yaml="targetRef: {name: web}\nminReplicas:\nmetric:\n"),
    # -- targetRef.apiVersion: Deployments are served as apps/v1 only, and the controller reads them so --
    "apiVersion/apps-v1": Case({"targetRef": {"name": "web", "apiVersion": "apps/v1"}}),
    "apiVersion/any-string": Case({"targetRef": {"name": "web", "apiVersion": "foo"}}, "spec.targetRef.apiVersion"),
    "apiVersion/empty": Case({"targetRef": {"name": "web", "apiVersion": ""}}, "spec.targetRef.apiVersion"),
    "apiVersion/no-group": Case({"targetRef": {"name": "web", "apiVersion": "v1"}}, "spec.targetRef.apiVersion"),
    "apiVersion/removed-beta": Case(
        {"targetRef": {"name": "web", "apiVersion": "apps/v1beta2"}}, "spec.targetRef.apiVersion"
    ),
    "apiVersion/extensions": Case(
        {"targetRef": {"name": "web", "apiVersion": "extensions/v1beta1"}}, "spec.targetRef.apiVersion"
    ),
    # -- behavior, as the HPA's validation (pkg/apis/autoscaling/validation): whole seconds, periods 1-1800, windows
    # 0-3600, values > 0, at least one policy (no most), selectPolicy Max/Min/Disabled --
    "period/1": Case(policies({**PODS, "periodSeconds": 1})),
    "period/1800": Case(policies({**PODS, "periodSeconds": MAX_PERIOD_SECONDS})),
    "period/0": Case(policies({**PODS, "periodSeconds": 0}), "spec.behavior.scaleUp.policies[0].periodSeconds"),
    "period/0.5": Case(policies({**PODS, "periodSeconds": 0.5}), "spec.behavior.scaleUp.policies[0].periodSeconds"),
    "period/15.5": Case(policies({**PODS, "periodSeconds": 15.5}), "spec.behavior.scaleUp.policies[0].periodSeconds"),
    "period/1801": Case(policies({**PODS, "periodSeconds": 1801}), "spec.behavior.scaleUp.policies[0].periodSeconds"),
    "period/string": Case(policies({**PODS, "periodSeconds": "15"}), "spec.behavior.scaleUp.policies[0].periodSeconds"),
    "period/missing": Case(policies({"type": "Pods", "value": 4}), "spec.behavior.scaleUp.policies[0].periodSeconds"),
    "value/0": Case(policies({**PODS, "value": 0}), "spec.behavior.scaleUp.policies[0].value"),
    "value/1.5": Case(policies({**PODS, "value": 1.5}), "spec.behavior.scaleUp.policies[0].value"),
    "policy-type/lower-case": Case(policies({**PODS, "type": "pods"}), "spec.behavior.scaleUp.policies[0].type"),
    "policies/empty": Case(policies(), "spec.behavior.scaleUp.policies"),
    "policies/fifty": Case(policies(*[PODS] * 50)),
    "policies/an-object": Case({"behavior": {"scaleUp": {"policies": PODS}}}, "spec.behavior.scaleUp.policies"),
    "window/0": Case(window(0)),
    "window/3600": Case(window(MAX_STABILIZATION_WINDOW_SECONDS)),
    "window/0.5": Case(window(0.5), "spec.behavior.scaleUp.stabilizationWindowSeconds"),
    "window/-1": Case(window(-1), "spec.behavior.scaleUp.stabilizationWindowSeconds"),
    "window/3601": Case(window(3601), "spec.behavior.scaleUp.stabilizationWindowSeconds"),
    "window/string": Case(window("30"), "spec.behavior.scaleUp.stabilizationWindowSeconds"),
    "window/0-with-hpaWithoutBehavior": Case(window(0, hpaWithoutBehavior=True)),
    "window/30-with-hpaWithoutBehavior": Case(
        window(30, hpaWithoutBehavior=True), "spec.behavior.scaleUp.stabilizationWindowSeconds"
    ),
    "selectPolicy/lower-case": Case(
        {"behavior": {"scaleUp": {"selectPolicy": "max"}}}, "spec.behavior.scaleUp.selectPolicy"
    ),
    "selectPolicy/Disabled": Case({"behavior": {"scaleDown": {"selectPolicy": "Disabled"}}}),
    # the HPA API bounds a tolerance below only (upstream's own tests use 2.0: a 200 % scale-up tolerance)
    "tolerance/1": Case({"behavior": {"scaleUp": {"tolerance": 1}}}),
    "tolerance/2": Case({"behavior": {"scaleDown": {"tolerance": 2}}}),
    "tolerance/negative": Case({"behavior": {"scaleUp": {"tolerance": -0.1}}}, "spec.behavior.scaleUp.tolerance"),
    "tolerance/minus-0": Case({"behavior": {"scaleUp": {"tolerance": -0.0}}}),
    # -- integers, numbers, booleans: 3, 3.0, "3" --
    "integer/fraction": Case({"minReplicas": 2.5}, "spec.minReplicas"),
    "integer/string": Case({"minReplicas": "2"}, "spec.minReplicas"),
    "integer/boolean": Case({"maxReplicas": True}, "spec.maxReplicas"),
    "integer/integral-float-no-CEL-reads": Case({"priority": 3.0, "gpusPerReplica": 2.0}),
    "integer/integral-float-of-a-policy": Case(policies({**PODS, "value": 4.0, "periodSeconds": 15.0})),
    "integer/over-int32": Case({"priority": 2**31}, "spec.priority"),
    "integer/over-int64": Case({"priority": 2**63}, "spec.priority"),
    "integer/10^30": Case({"priority": 10**30}, "spec.priority"),
    "yaml/integral-float-minReplicas": Case(yaml="targetRef: {name: web}\nminReplicas: 2.0\nmaxReplicas: 5.0"),
    "yaml/integral-float-window": Case(
        yaml="targetRef: {name: web}\nbehavior: {hpaWithoutBehavior: true, scaleUp: {stabilizationWindowSeconds: 0.0}}"
    ),
    "number/integer": Case({"coldStartSeconds": 90, "metric": {"type": "engine_active", "target": 1}}),
    "number/string": Case({"metric": {"target": "70"}}, "spec.metric.target"),
    "number/boolean": Case({"forecast": {"untrustedTargetRatio": True}}, "spec.forecast.untrustedTargetRatio"),
    "number/minus-0-target": Case({"metric": {"type": "request_rate", "target": -0.0}}, "spec.metric.target"),
    "number/integer-0-under-a-fractional-minimum": Case(
        {"metric": {"type": "request_rate", "target": 0}}, "spec.metric.target"
    ),
    "number/over-maximum": Case({"coldStartSeconds": 3600.5}, "spec.coldStartSeconds"),
    "boolean/string": Case({"behavior": {"hpaWithoutBehavior": "true"}}, "spec.behavior.hpaWithoutBehavior"),
    "boolean/integer": Case({"latency": {"sloSeconds": 1, "guard": 1}}, "spec.latency.guard"),
    # YAML 1.2 numbers, as kubectl reads them (autoscaler/yaml_input.py; PyYAML alone reads these as strings)
    "yaml/exponent-without-a-dot": Case(yaml="targetRef: {name: web}\nmetric: {type: request_rate, target: 1e-6}"),
    "yaml/exponent-as-a-name": Case(yaml="targetRef: {name: 1e3}", field="spec.targetRef.name"),
    "yaml/octal-0o": Case(yaml="targetRef: {name: web}\npriority: 0o17"),
    "yaml/boolean-yes": Case(yaml="targetRef: {name: web}\nlatency: {sloSeconds: 1, guard: yes}"),
    "yaml/forecast-mode-off-unquoted": Case(
        yaml="targetRef: {name: web}\nforecast: {mode: off}", field="spec.forecast.mode"
    ),
    # -- strings: empty, length, pattern --
    "name/empty": Case({"targetRef": {"name": ""}}, "spec.targetRef.name"),
    "name/upper-case": Case({"targetRef": {"name": "Web"}}, "spec.targetRef.name"),
    "name/trailing-newline": Case({"targetRef": {"name": "web\n"}}, "spec.targetRef.name"),
    "name/slash": Case({"targetRef": {"name": "team/web"}}, "spec.targetRef.name"),
    "name/253": Case({"targetRef": {"name": "a" * 253}}),
    "name/254": Case({"targetRef": {"name": "a" * 254}}, "spec.targetRef.name"),
    "name/dotted": Case({"targetRef": {"name": "web.v2"}}),
    "name/number": Case({"targetRef": {"name": 7}}, "spec.targetRef.name"),
    "adoptHpa/name": Case({"adoptHpa": "web-hpa"}),
    "adoptHpa/empty": Case({"adoptHpa": ""}, "spec.adoptHpa"),
    "adoptHpa/not-a-name": Case({"adoptHpa": "Web HPA"}, "spec.adoptHpa"),
    "adoptHpa/254": Case({"adoptHpa": "h" * 254}, "spec.adoptHpa"),
    "queries/empty-string": Case({"queries": {"latency": ""}}),
    "queries/number": Case({"queries": {"latency": 1.5}}, "spec.queries.latency"),
    "queries/empty-requestRate-of-a-zero-minimum": Case(
        {**ZERO_REQUEST_RATE, "queries": {"requestRate": ""}}, "spec.minReplicas"
    ),
    "queries/zero-minimum-read-in-front-of-the-pods": Case({**ZERO_REQUEST_RATE, "queries": {"requestRate": GATEWAY}}),
    # -- unknown fields: kubectl's strict field validation refuses them, as the model's extra=forbid --
    "unknown/top-level": Case({"minReplica": 1}, "spec.minReplica"),
    "unknown/nested": Case({"metric": {"typ": "gpu_utilization"}}, "spec.metric.typ"),
    "unknown/in-a-policy": Case(policies({**PODS, "extra": 1}), "spec.behavior.scaleUp.policies[0].extra"),
    # -- enums are case-sensitive --
    "enum/kind": Case({"targetRef": {"name": "web", "kind": "deployment"}}, "spec.targetRef.kind"),
    "enum/kind-StatefulSet": Case({"targetRef": {"name": "web", "kind": "StatefulSet"}}, "spec.targetRef.kind"),
    "enum/mode": Case({"mode": "Active"}, "spec.mode"),
    "enum/metric.type": Case({"metric": {"type": "GPU_UTILIZATION"}}, "spec.metric.type"),
    "enum/forecast.mode": Case({"forecast": {"mode": "Off"}}, "spec.forecast.mode"),
    "enum/recommend-only": Case({"mode": "recommend-only"}),
    # -- minReplicas/maxReplicas, absent ones read as their defaults (1, 10) on both sides --
    "replicas/min-over-the-default-max": Case({"minReplicas": 20}, "spec.minReplicas"),
    "replicas/max-under-the-default-min": Case({"maxReplicas": 1}),
    "replicas/equal": Case({"minReplicas": 3, "maxReplicas": 3}),
    "replicas/max-0": Case({"maxReplicas": 0}, "spec.maxReplicas"),
    "replicas/min-negative": Case({"minReplicas": -1}, "spec.minReplicas"),
    "replicas/zero-per-pod-metric": Case({"minReplicas": 0}, "spec.minReplicas"),
    # -- shapes --
    "shape/spec-a-list": Case([], "spec"),
    "shape/metric-a-string": Case({"metric": "gpu_utilization"}, "spec.metric"),
    "shape/latency-empty": Case({"latency": {}}, "spec.latency.sloSeconds"),
    "shape/latency-quantile-1": Case({"latency": {"sloSeconds": 1, "quantile": 1}}, "spec.latency.quantile"),
    "shape/gpusPerReplica-65": Case({"gpusPerReplica": 65}, "spec.gpusPerReplica"),
}


@dataclass(frozen=True)
class Difference:
    """A document the two validators disagree on, on purpose: ``apiserver`` and ``parser`` are each verdict
    (``"accept"``, or the field named in the refusal), ``reason`` why it stays so."""

    case: Case
    apiserver: str
    parser: str
    reason: str


_JSON_FLOAT = (
    "an integral float sent as JSON (5.0) into an integer that a CEL rule reads: the schema takes it, the rule fails "
    "on it ('invalid data, expected int, got float64'). The parser reads 5.0 as 5, as kubectl apply does -- YAML's "
    "5.0 reaches the apiserver as 5 (the yaml/integral-float cases) -- and the refusal comes at admission, never at "
    "run time. Only JSON clients (client libraries, curl) see it; sending 5 works"
)

#: Every difference between the two verdicts that is meant to be there. A new difference fails
#: tests/realkube/test_crd_parity_real.py, and so does one of these that is gone (move it to CASES then).
EXPECTED_DIFFERENCES: dict[str, Difference] = {
    "json-integral-float/minReplicas": Difference(Case({"minReplicas": 2.0}), "spec", "accept", _JSON_FLOAT),
    "json-integral-float/maxReplicas": Difference(Case({"maxReplicas": 5.0}), "spec", "accept", _JSON_FLOAT),
    "json-integral-float/window-with-hpaWithoutBehavior": Difference(
        Case(window(0.0, hpaWithoutBehavior=True)), "spec.behavior", "accept", _JSON_FLOAT
    ),
    "unknown-field-without-strict-validation": Difference(
        Case({"minReplica": 1}, field_validation="Warn"),
        "accept",
        "spec.minReplica",
        "without kubectl's strict field validation (fieldValidation=Warn, the API's default for other clients) the "
        "apiserver prunes an unknown field with a warning; what it stores, without the field, the parser accepts. "
        "The parser reads files as kubectl apply does, strictly: a misspelt field is an error, not a default",
    ),
}


# ---- the generated corpus: every field of the CRD's schema, mutated one at a time in a valid document ----------

#: A valid spec with every field of the schema given (generated_corpus mutates each leaf of it in turn).
FULL_SPEC: dict[str, Any] = {
    "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
    "gpusPerReplica": 2,
    "minReplicas": 1,
    "maxReplicas": 8,
    "metric": {"type": "request_rate", "target": 5},
    "latency": {"sloSeconds": 2, "quantile": 0.9, "guard": True},
    "queries": {
        "requestRate": GATEWAY,
        "queueDepth": 'sum(queue_depth{namespace="{namespace}"})',
        "latency": 'max(latency_seconds{namespace="{namespace}"})',
    },
    "priority": 10,
    "coldStartSeconds": 60,
    "mode": "active",
    "behavior": {
        "scaleUp": {"stabilizationWindowSeconds": 0, "tolerance": 0.1, "selectPolicy": "Max", "policies": [PODS]},
        "scaleDown": {
            "stabilizationWindowSeconds": 300,
            "tolerance": 0.05,
            "selectPolicy": "Min",
            "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}],
        },
        "hpaWithoutBehavior": False,
    },
    "forecast": {"mode": "shadow", "quantile": 0.9, "ratePerReplica": 5, "untrustedTargetRatio": 0.75},
    "adoptHpa": "web-hpa",
}

_ABSENT = object()


def spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


def schema_nodes(
    schema: dict[str, Any], path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(path, schema) of every property under ``schema`` (an array's items at index 0), depth first."""
    for key, sub in schema.get("properties", {}).items():
        yield (*path, key), sub
        yield from schema_nodes(sub, (*path, key))
    if "items" in schema:
        yield (*path, 0), schema["items"]
        yield from schema_nodes(schema["items"], (*path, 0))


def _fractional_bound(node: dict[str, Any], op: str) -> float | None:
    for rule in node.get("x-kubernetes-validations", []):
        if rule["rule"].startswith(f"self {op} "):
            return float(rule["rule"].split()[-1])
    return None


def mutations(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(label, value) variants of one field's value: null, absent, wrong types, each side of each bound."""
    yield "null", None
    yield "absent", _ABSENT
    kind = node["type"]
    if kind != "string":
        yield "string", "1"
    if kind != "boolean":
        yield "true", True
    if kind in ("integer", "number"):
        if kind == "integer":
            yield "fraction", 2.5
        low, high = node.get("minimum"), node.get("maximum")
        if low is not None:
            yield "minimum", low if not node.get("exclusiveMinimum") else low + (1 if kind == "integer" else 1e-3)
            yield "under-minimum", low if node.get("exclusiveMinimum") else low - 1
        if high is not None:
            yield "maximum", high if not node.get("exclusiveMaximum") else high - (1 if kind == "integer" else 1e-3)
            yield "over-maximum", high if node.get("exclusiveMaximum") else high + 1
        for op in (">=", "<="):
            bound = _fractional_bound(node, op)
            if bound is not None:
                yield f"cel{op}bound", bound
                yield f"cel{op}beyond", bound / 2 if op == ">=" else bound * 2
        if low is None and high is None:
            yield "negative", -1
            yield "large", 1e12
    elif kind == "string":
        yield "number", 1
        yield "empty", ""
        for value in node.get("enum", []):
            yield f"enum-{value}", value
            yield f"enum-{value}-upper", value.upper()
        if "enum" in node:
            yield "not-in-enum", "nope"
        if "maxLength" in node:
            yield "max-length", "a" * node["maxLength"]
            yield "over-max-length", "a" * (node["maxLength"] + 1)
        if "pattern" in node:
            yield "not-the-pattern", "Not_A_Name"
    elif kind == "boolean":
        yield "false", False
        yield "true", True
        yield "integer", 1
    elif kind == "array":
        yield "empty", []
        yield "an-object", {}
    elif kind == "object":
        yield "a-string", "x"
        yield "a-list", []
        yield "empty", {}
        yield "unknown-field", {"unknownField": 1}


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    parent: Any = doc
    for key in path[:-1]:
        parent = parent[key]
    if value is _ABSENT:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


def generated_corpus() -> dict[str, Case]:
    """One document per mutation of one field of FULL_SPEC (a few hundred), named by the field's path."""
    corpus: dict[str, Case] = {}
    for path, node in schema_nodes(spec_schema()):
        for label, value in mutations(node):
            spec = copy.deepcopy(FULL_SPEC)
            _set(spec, path, value if value is _ABSENT else copy.deepcopy(value))
            where = ".".join(str(p) for p in path)
            corpus[f"{where}={label}"] = Case(spec)
    return corpus


# ---- verdicts ----------------------------------------------------------------------------------------------------


def related(parser_field: str, field: str) -> bool:
    """The parser's field is the apiserver's, or an object that holds it (the parser names the model of a cross-field
    rule, ``spec.metric``; the apiserver the rule's fieldPath, ``spec.metric.target``)."""
    return field == parser_field or field.startswith((f"{parser_field}.", f"{parser_field}["))


def parser_fields(doc: dict[str, Any]) -> list[str]:
    """Every field the parser finds at fault (``validate_policy`` names the first): where the apiserver stops at the
    first stage that fails (an unknown field ends decoding), the parser may list a missing field of the same object
    first."""
    result = validate_policy(doc)
    if isinstance(result, LoadedPolicy):
        return []
    try:
        GPUScalingPolicySpec.model_validate(doc.get("spec"))
    except ValidationError as exc:
        return [
            "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
            for error in exc.errors()
        ]
    return [result.field]


def parser_verdict(case: Case, name: str = "p") -> LoadedPolicy | InvalidPolicy:
    return validate_policy(document(case, name))


def verdict_text(result: LoadedPolicy | InvalidPolicy) -> str:
    return "accept" if isinstance(result, LoadedPolicy) else result.field


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_parser_gives_the_verdict_of_the_table(name: str) -> None:
    """The parser's half of the differential test (the apiserver's: tests/realkube/test_crd_parity_real.py)."""
    case = CASES[name]
    result = parser_verdict(case)
    if case.field is None:
        assert isinstance(result, LoadedPolicy), result
        return
    assert isinstance(result, InvalidPolicy), f"accepted, the apiserver refuses it naming {case.field}"
    assert related(result.field, case.field), (result.text, case.field)
    assert result.text.startswith(f"{result.field}: "), result.text  # the message names the field


@pytest.mark.parametrize("name", sorted(EXPECTED_DIFFERENCES))
def test_the_parser_side_of_each_expected_difference(name: str) -> None:
    difference = EXPECTED_DIFFERENCES[name]
    assert verdict_text(parser_verdict(difference.case)) == difference.parser
    assert (difference.apiserver == "accept") != (difference.parser == "accept"), "not a difference"
    assert difference.reason


def test_the_generated_corpus_mutates_every_field_of_the_schema() -> None:
    """A field added to the model gets into FULL_SPEC (and so into the differential corpus), or this fails."""
    corpus = generated_corpus()
    fields = {".".join(str(p) for p in path) for path, _ in schema_nodes(spec_schema())}
    missing = sorted(f for f in fields if not any(name.startswith(f"{f}=") for name in corpus))
    assert not missing
    assert isinstance(validate_policy({"metadata": {}, "spec": FULL_SPEC}), LoadedPolicy)
    assert len(corpus) > 200


def _nodes_by_nullability() -> list[Any]:
    return [
        pytest.param(".".join(str(p) for p in path), path, bool(node.get("nullable")), id=".".join(map(str, path)))
        for path, node in schema_nodes(spec_schema())
        if not isinstance(path[-1], int)
    ]


@pytest.mark.parametrize(("where", "path", "nullable"), _nodes_by_nullability())
def test_an_explicit_null_reads_as_the_apiserver_stores_it(where: str, path: tuple[Any, ...], nullable: bool) -> None:
    """The apiserver keeps the null of a nullable field and prunes any other (then defaults it): the parser reads a
    null as absent unless the field is Optional, where it is None -- the same policy either way."""
    with_null, without = copy.deepcopy(FULL_SPEC), copy.deepcopy(FULL_SPEC)
    _set(with_null, path, None)
    _set(without, path, _ABSENT)
    null = validate_policy({"metadata": {}, "spec": with_null})
    absent = validate_policy({"metadata": {}, "spec": without})
    if isinstance(absent, InvalidPolicy):  # a required field (its null: missing, as the apiserver says) or a rule
        assert isinstance(null, InvalidPolicy) and null.text == absent.text, (where, null, absent)
        assert nullable or where.endswith(("targetRef", "name", "sloSeconds", "type", "value", "periodSeconds"))
        return
    assert isinstance(null, LoadedPolicy), (where, null.text)
    assert null.spec == absent.spec, where
    if nullable:  # kept by the apiserver: the model's None
        assert GPUScalingPolicySpec.model_validate(with_null) == GPUScalingPolicySpec.model_validate(without)


def test_the_behavior_bounds_are_the_hpas() -> None:
    """k8s.io/kubernetes pkg/apis/autoscaling/validation: MaxPeriodSeconds 1800, MaxStabilizationWindowSeconds 3600,
    both int32, periodSeconds > 0; the CRD says the same in its schema."""
    assert (MAX_PERIOD_SECONDS, MAX_STABILIZATION_WINDOW_SECONDS) == (1800, 3600)
    rules = spec_schema()["properties"]["behavior"]["properties"]["scaleUp"]["properties"]
    period = rules["policies"]["items"]["properties"]["periodSeconds"]
    assert (period["type"], period["minimum"], period["maximum"]) == ("integer", 1, 1800)
    assert "exclusiveMinimum" not in period
    window_schema = rules["stabilizationWindowSeconds"]
    assert (window_schema["type"], window_schema["minimum"], window_schema["maximum"]) == ("integer", 0, 3600)
    target_ref = spec_schema()["properties"]["targetRef"]["properties"]
    assert target_ref["apiVersion"]["enum"] == ["apps/v1"] and target_ref["kind"]["enum"] == ["Deployment"]
    adopt = spec_schema()["properties"]["adoptHpa"]
    assert adopt["pattern"] == target_ref["name"]["pattern"] and adopt["maxLength"] == 253
