"""The GPUScalingPolicy CustomResourceDefinition, generated from the pydantic models (single source of truth).

``GPUScalingPolicySpec`` (autoscaler/policy.py) and ``GPUScalingPolicyStatus`` (status.py) become a *structural*
openAPIV3Schema: ``$ref`` inlined, ``Optional`` as ``nullable``, numeric ``exclusiveMinimum`` as the OpenAPI v3.0
boolean form, no ``additionalProperties: false`` (structural schemas prune unknown fields instead; ``kubectl``'s
default strict field validation turns them into errors). ``deploy/generate_crd.py`` writes the YAML; a test fails
when the committed file differs from what this module generates.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import yaml
from pydantic import BaseModel

from autoscaler.adapters.kubernetes.status import GPUScalingPolicyStatus
from autoscaler.core.model import MetricKind
from autoscaler.policy import (
    API_GROUP,
    API_VERSION,
    ENGINE_ACTIVE_TARGET_MESSAGE,
    GPU_UTILIZATION_TARGET_MESSAGE,
    HPA_WITHOUT_BEHAVIOR_MESSAGE,
    HPA_WITHOUT_BEHAVIOR_WINDOW_MESSAGE,
    KIND,
    MIN_REPLICAS_ZERO_MESSAGE,
    MIN_REPLICAS_ZERO_QUERY_MESSAGE,
    PLURAL,
    SCALE_FROM_ZERO_QUERY,
    WHOLE_SERVICE_METRICS,
    GPUScalingPolicySpec,
)

SINGULAR = KIND.lower()
SHORT_NAMES = ["gsp"]
CRD_NAME = f"{PLURAL}.{API_GROUP}"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name", "description": "scaled Deployment"},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
    {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas"},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.currentReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {
        "name": "Stale",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="MetricsStale")].status',
        "priority": 1,
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": ".status.lastAction.reason",
        "description": "reason of the last action",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_SPEC_METRIC_TYPE = "(has(self.metric) && has(self.metric.type) ? self.metric.type : 'gpu_utilization')"
_WHOLE_SERVICE = ", ".join(f"'{kind.value}'" for kind in WHOLE_SERVICE_METRICS)
_BEFORE_METRIC, _AFTER_METRIC = MIN_REPLICAS_ZERO_MESSAGE.split("{metric}")
# The override each whole-service metric needs to come back from zero, as a CEL expression of the metric's type.
_SPEC_ZERO_QUERY = (
    "".join(f"({_SPEC_METRIC_TYPE} == '{kind.value}' ? '{query}' : " for kind, query in SCALE_FROM_ZERO_QUERY.items())
    + "''"
    + ")" * len(SCALE_FROM_ZERO_QUERY)
)
_HAS_ZERO_QUERY = " || ".join(
    f"({_SPEC_METRIC_TYPE} == '{kind.value}' && has(self.queries.{query}) && self.queries.{query} != '')"
    for kind, query in SCALE_FROM_ZERO_QUERY.items()
)
_QUERY_PARTS = re.split(r"\{metric\}|\{query\}", MIN_REPLICAS_ZERO_QUERY_MESSAGE)

# Cross-field rules the apiserver can enforce at admission (CEL), the same as the pydantic validators of
# autoscaler/policy.py (with their messages): what the apiserver stores, its defaults applied, the controller accepts.
# The controller still re-checks everything and reports what slips through (an object stored before a rule existed)
# as the InvalidSpec condition. An absent field is read as its pydantic default, as the parser reads it.
SPEC_VALIDATIONS = [
    {
        "rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
        "message": "minReplicas must be <= maxReplicas",
        "fieldPath": ".minReplicas",
    },
    # GPUScalingPolicySpec._scale_to_zero_needs_a_whole_service_metric. An absent minReplicas is 1 and an absent
    # metric (or metric.type) gpu_utilization, as the parser reads them.
    {
        "rule": f"!has(self.minReplicas) || self.minReplicas != 0 || {_SPEC_METRIC_TYPE} in [{_WHOLE_SERVICE}]",
        # the parser's message names the metric; the static one is what the apiserver says if the expression fails
        "messageExpression": f"'{_BEFORE_METRIC}' + {_SPEC_METRIC_TYPE} + '{_AFTER_METRIC}'",
        "message": MIN_REPLICAS_ZERO_MESSAGE.format(
            metric=" or ".join(kind.value for kind in MetricKind if kind not in WHOLE_SERVICE_METRICS)
        ),
        "fieldPath": ".minReplicas",
    },
    # the second half of the same validator: a whole-service metric is read in front of the pods by its override
    {
        "rule": f"!has(self.minReplicas) || self.minReplicas != 0 || !({_SPEC_METRIC_TYPE} in [{_WHOLE_SERVICE}]) "
        f"|| (has(self.queries) && ({_HAS_ZERO_QUERY}))",
        "messageExpression": f"'{_QUERY_PARTS[0]}' + {_SPEC_METRIC_TYPE} + '{_QUERY_PARTS[1]}' + {_SPEC_ZERO_QUERY} "
        f"+ '{_QUERY_PARTS[2]}'",
        "message": MIN_REPLICAS_ZERO_QUERY_MESSAGE.format(
            metric=" or ".join(kind.value for kind in SCALE_FROM_ZERO_QUERY),
            query=" or ".join(SCALE_FROM_ZERO_QUERY.values()),
        ),
        "fieldPath": ".minReplicas",
    },
]

_METRIC_TYPE = "(has(self.type) ? self.type : 'gpu_utilization')"
# spec.metric (MetricTarget._target_in_range); the target's default (70) is a gpu_utilization percentage
METRIC_VALIDATIONS = [
    {
        "rule": f"!has(self.target) || {_METRIC_TYPE} != 'gpu_utilization' || self.target <= 100.0",
        "message": GPU_UTILIZATION_TARGET_MESSAGE,
        "fieldPath": ".target",
    },
    {
        "rule": f"{_METRIC_TYPE} != 'engine_active' || (has(self.target) ? self.target : 70.0) <= 1.0",
        "message": ENGINE_ACTIVE_TARGET_MESSAGE,
        "fieldPath": ".target",
    },
]


def _default_rules(direction: str) -> str:
    """CEL: ``self.<direction>`` (a ScalingRulesSpec) has no rate policies and selectPolicy Max."""
    rules = f"self.{direction}"
    return f"!has({rules}) || (!has({rules}.policies) && (!has({rules}.selectPolicy) || {rules}.selectPolicy == 'Max'))"


_WITHOUT_BEHAVIOR = "has(self.hpaWithoutBehavior) && self.hpaWithoutBehavior"
# spec.behavior (BehaviorSpec._no_policies_without_behavior)
BEHAVIOR_VALIDATIONS = [
    *(
        {
            "rule": f"!({_WITHOUT_BEHAVIOR}) || {_default_rules(direction)}",
            "message": HPA_WITHOUT_BEHAVIOR_MESSAGE.format(direction=direction),
            "fieldPath": f".{direction}",
        }
        for direction in ("scaleUp", "scaleDown")
    ),
    {
        "rule": f"!({_WITHOUT_BEHAVIOR}) || !has(self.scaleUp) || !has(self.scaleUp.stabilizationWindowSeconds) || "
        "self.scaleUp.stabilizationWindowSeconds == 0",  # an integer (as the HPA's): CEL has no int == double
        "message": HPA_WITHOUT_BEHAVIOR_WINDOW_MESSAGE,
        "fieldPath": ".scaleUp.stabilizationWindowSeconds",
    },
]

_DROP = {"title", "$defs", "additionalProperties"}


class SchemaError(ValueError):
    """The pydantic model uses a construct a structural schema cannot express."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema (by alias) rewritten as a Kubernetes structural openAPIV3Schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    return _convert(raw, defs, "")


def _convert(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        siblings = {k: v for k, v in node.items()}
        node = dict(copy.deepcopy(target))
        # The field's own description beats the referenced type's docstring.
        node.update(siblings)
    nullable = False
    if "anyOf" in node:
        options = node.pop("anyOf")
        non_null = [o for o in options if o.get("type") != "null"]
        if len(non_null) != 1:
            raise SchemaError(f"{where or '<root>'}: union of several types is not structural")
        nullable = len(non_null) < len(options)
        inner = _convert(non_null[0], defs, where)
        inner.update({k: v for k, v in node.items() if k not in _DROP})
        node = inner
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out["properties"] = {name: _convert(sub, defs, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs, f"{where}[]")
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        elif key == "default" and value is None:
            continue  # "absent" already means None to pydantic; an explicit null default only adds noise
        elif key == "description":
            out[key] = " ".join(str(value).split())
        else:
            out[key] = value
    if nullable:
        out["nullable"] = True
    if "type" not in out:
        if "properties" in out:
            out["type"] = "object"
        elif "enum" in out and all(isinstance(v, str) for v in out["enum"]):
            out["type"] = "string"
        else:
            raise SchemaError(f"{where or '<root>'}: no type (structural schemas need one everywhere)")
    if out.get("type") == "integer" and isinstance(out.get("default"), float):
        out["default"] = int(out["default"])
    if out.get("type") == "number":
        _fractional_bounds_as_cel(out)
    return out


def _fractional_bounds_as_cel(node: dict[str, Any]) -> None:
    """An inclusive fractional ``minimum``/``maximum`` of a number (``ge=1e-06``) as a CEL rule, the schema keeping
    the exclusive integer bound around it (``minimum: 0, exclusiveMinimum: true``). The apiserver compares a value
    written as an integer with a fractional bound truncated to an integer (``target: 0`` passed ``minimum: 1e-06``),
    and a bound such as 1e-06 is rendered by kustomize as ``1e-06``, which YAML 1.1 readers take for a string."""
    rules = []
    for key, op, says, whole in (("minimum", ">=", "greater", math.floor), ("maximum", "<=", "less", math.ceil)):
        bound = node.get(key)
        exclusive = f"exclusive{key.capitalize()}"
        if isinstance(bound, float) and not bound.is_integer() and node.get(exclusive) is not True:
            node[key], node[exclusive] = whole(bound), True
            rules.append({"rule": f"self {op} {bound!r}", "message": f"should be {says} than or equal to {bound:g}"})
    if rules:
        node["x-kubernetes-validations"] = rules


def _without_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def openapi_schema() -> dict[str, Any]:
    spec = structural_schema(GPUScalingPolicySpec)
    spec.pop("description", None)
    spec["description"] = f"The scaling policy of one GPU inference service ({KIND} spec)."
    spec["x-kubernetes-validations"] = SPEC_VALIDATIONS
    spec["properties"]["metric"]["x-kubernetes-validations"] = METRIC_VALIDATIONS
    spec["properties"]["behavior"]["x-kubernetes-validations"] = BEHAVIOR_VALIDATIONS
    # No defaults in the status schema: the apiserver would add them to what the writer stores, the next merge
    # would differ from the stored status, and every tick would write again.
    status = _without_defaults(structural_schema(GPUScalingPolicyStatus))
    status["description"] = "What the controller last saw and did (written through the status subresource)."
    return {
        "type": "object",
        "description": "Per-service GPU autoscaling policy: target Deployment, replicas bounds, scaling signal, "
        "latency SLO, priority and cold start.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def generate_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "gpu-autoscaler", "app.kubernetes.io/part-of": "gpu-autoscaler"},
        },
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["gpuautoscaler"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = (
    "# GENERATED by deploy/generate_crd.py from autoscaler/policy.py and autoscaler/adapters/kubernetes/status.py.\n"
    "# Do not edit by hand: change the pydantic models and run `python deploy/generate_crd.py`.\n"
)


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(generate_crd(), sort_keys=False, width=120)
