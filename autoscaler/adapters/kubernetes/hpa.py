"""HorizontalPodAutoscaler objects translated into a GPUScalingPolicy (``autoscaler import-hpa``). The reader lists
them too (``KubeClusterReader``), so that the controller never writes a scale subresource an HPA also writes.

The translation keeps everything the HPA's arithmetic depends on: min/max replicas, the behaviour block (windows,
rate policies, select policy, per-direction tolerance), or its absence (``hpaWithoutBehavior: true``, upstream's
behaviour-less path: max(2 x current, 4) per sync, no rate limit, the 300 s scale-down window). Given the same
observations, the policy then recommends what the HPA would. What has no equivalent is said, field by field:

- a GPUScalingPolicy scales on one metric (plus the latency guard); an HPA takes the highest recommendation of all its
  metrics. The first metric this controller can read is used, the others are listed;
- CPU and memory (``Resource``/``ContainerResource``), ``Object`` metrics and ``External`` metrics with a total
  ``Value`` target have no equivalent: this controller scales GPU inference on DCGM and application signals.
  ``--metric gpu_utilization=70`` (or another kind) supplies one;
- ``Pods``/``External`` metrics are recognised by name: ``DCGM_FI_DEV_GPU_UTIL`` (gpu_utilization),
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (engine_active), a name with ``requests_waiting`` or ``queue``
  (queue_depth), a name with ``request`` and ``rate``, ``per_second``, ``rps`` or ``total`` (request_rate).
  The controller reads these signals with its own PromQL (``spec.queries`` overrides it), not through the metrics
  adapter the HPA used.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity as k8s_parse

from autoscaler.adapters.kubernetes.policies import InvalidPolicy, validate_policy
from autoscaler.core.model import MetricKind
from autoscaler.policy import API_GROUP, API_VERSION, KIND

HPA_API_VERSIONS = ("autoscaling/v2", "autoscaling/v1")

_BY_NAME: tuple[tuple[MetricKind, tuple[str, ...], tuple[str, ...]], ...] = (
    # kind, every one of these must appear, one of these must appear
    (MetricKind.GPU_UTILIZATION, ("dcgm_fi_dev_gpu_util",), ("",)),
    (MetricKind.ENGINE_ACTIVE, ("dcgm_fi_prof_gr_engine_active",), ("",)),
    (MetricKind.QUEUE_DEPTH, ("",), ("requests_waiting", "queue")),
    (MetricKind.REQUEST_RATE, ("request",), ("rate", "per_second", "rps", "total")),
)


class HpaImportError(ValueError):
    """The object cannot be imported; the message names the field."""


@dataclass
class ImportedPolicy:
    """A GPUScalingPolicy manifest and what of the HPA it could not carry over."""

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)


_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 4


def _show(value: object) -> str:
    """``repr(value)``, bounded: a YAML value can be huge (or a tree of aliases that ``repr`` would expand)."""
    text = _REPR.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _text(value: object) -> str:
    """A name for a message: a string as it is (bounded), anything else as :func:`_show` gives it."""
    if isinstance(value, str) and len(value) <= 60:
        return value
    return _show(value)


def _not(value: object) -> str:
    """``not a list ([1])``: what a value of the wrong type is, for a message."""
    return "not null" if value is None else f"not {_type_name(value)} ({_show(value)})"


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def _object(value: object, where: str) -> Mapping[str, Any]:
    """``value`` when it is a mapping, ``{}`` when absent (null); otherwise the error names the field."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise HpaImportError(f"{where}: must be an object, {_not(value)}")
    return value


def _array(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise HpaImportError(f"{where}: must be a list, {_not(value)}")
    return value


def _string(value: object, where: str) -> str | None:
    """An optional string field: ``None`` when absent."""
    if value is None or isinstance(value, str):
        return value
    raise HpaImportError(f"{where}: must be a string, {_not(value)}")


def parse_quantity(value: object, where: str) -> float:
    """A Kubernetes quantity (``500m``, ``1k``, ``10Mi``, ``1.5``, ``1e3``) as a float."""
    if isinstance(value, bool):
        raise HpaImportError(f"{where}: {_show(value)} is not a quantity")
    try:
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            number = float(k8s_parse(value.strip()))
        else:
            raise HpaImportError(f"{where}: {_show(value)} is not a quantity")
    except OverflowError:  # an integer beyond float64, e.g. 10**400
        raise HpaImportError(f"{where}: {_show(value)} is not finite") from None
    except (ValueError, InvalidOperation, TypeError) as exc:
        if isinstance(exc, HpaImportError):
            raise
        raise HpaImportError(f"{where}: {_show(value)} is not a quantity ({exc})") from None
    if not math.isfinite(number):
        raise HpaImportError(f"{where}: {_show(value)} is not finite")
    return number


def metric_kind_for(name: str) -> MetricKind | None:
    lowered = name.lower()
    for kind, all_of, any_of in _BY_NAME:
        if all(part in lowered for part in all_of) and any(part in lowered for part in any_of):
            return kind
    return None


def _metric(index: int, metric: Mapping[str, Any], notes: list[str]) -> tuple[MetricKind, float] | None:
    """One HPA metric as (our kind, per-replica target), or None with a note saying why not."""
    where = f"spec.metrics[{index}]"
    kind = metric.get("type")
    if kind in ("Resource", "ContainerResource"):
        field = "resource" if kind == "Resource" else "containerResource"
        source = _object(metric.get(field), f"{where}.{field}")
        notes.append(
            f"{where}: {kind} {_text(source.get('name', '?'))}: no equivalent (this controller scales "
            "on GPU and application signals; use --metric)"
        )
        return None
    if kind == "Object":
        source = _object(metric.get("object"), f"{where}.object")
        described_object = _object(source.get("describedObject"), f"{where}.object.describedObject")
        described = _text(described_object.get("kind", "?"))
        notes.append(f"{where}: Object metric on a {described}: no equivalent")
        return None
    if kind not in ("Pods", "External"):
        notes.append(f"{where}: metric type {_show(kind)}: no equivalent")
        return None
    field = "pods" if kind == "Pods" else "external"
    source = _object(metric.get(field), f"{where}.{field}")
    identifier = _object(source.get("metric"), f"{where}.{field}.metric")
    name = _string(identifier.get("name"), f"{where}.{field}.metric.name") or ""
    target = _object(source.get("target"), f"{where}.{field}.target")
    if identifier.get("selector"):
        notes.append(f"{where}: the metric's label selector is not carried over (spec.queries can filter)")
    ours = metric_kind_for(name)
    if ours is None:
        notes.append(f"{where}: {kind} metric {_show(name)}: not a signal this controller reads")
        return None
    if target.get("type") != "AverageValue" or target.get("averageValue") is None:
        notes.append(
            f"{where}: {kind} metric {_show(name)} with a {_text(target.get('type'))} target: no "
            "equivalent (a GPUScalingPolicy target is an average per ready replica)"
        )
        return None
    value = parse_quantity(target["averageValue"], f"{where}.{field}.target.averageValue")
    if value <= 0:
        raise HpaImportError(f"{where}.{field}.target.averageValue: must be > 0")
    return ours, value


def _rules(value: object, where: str) -> dict[str, Any]:
    spec = _object(value, where)
    if not spec:
        return {}
    out: dict[str, Any] = {}
    if spec.get("stabilizationWindowSeconds") is not None:
        out["stabilizationWindowSeconds"] = spec["stabilizationWindowSeconds"]
    if spec.get("selectPolicy") is not None:
        out["selectPolicy"] = spec["selectPolicy"]
    if spec.get("policies") is not None:
        policies = [
            _object(p, f"{where}.policies[{i}]") for i, p in enumerate(_array(spec["policies"], f"{where}.policies"))
        ]
        out["policies"] = [
            {"type": p.get("type"), "value": p.get("value"), "periodSeconds": p.get("periodSeconds")} for p in policies
        ]
    if spec.get("tolerance") is not None:
        out["tolerance"] = parse_quantity(spec["tolerance"], f"{where}.tolerance")
    return out


def import_hpa(obj: Mapping[str, Any], metric_override: tuple[MetricKind, float] | None = None) -> ImportedPolicy:
    """The GPUScalingPolicy equivalent to one HorizontalPodAutoscaler (autoscaling/v2 or v1)."""
    if not isinstance(obj, Mapping):
        raise HpaImportError("not an object")
    if obj.get("kind") != "HorizontalPodAutoscaler" or obj.get("apiVersion") not in HPA_API_VERSIONS:
        raise HpaImportError(
            f"kind/apiVersion: {_show(obj.get('kind'))} {_show(obj.get('apiVersion'))} is not a "
            f"HorizontalPodAutoscaler ({' or '.join(HPA_API_VERSIONS)})"
        )
    meta = _object(obj.get("metadata"), "metadata")
    spec = _object(obj.get("spec"), "spec")
    name = _string(meta.get("name"), "metadata.name")
    namespace = _string(meta.get("namespace"), "metadata.namespace") or "default"
    if not name:
        raise HpaImportError("metadata.name: required")
    ref = _object(spec.get("scaleTargetRef"), "spec.scaleTargetRef")
    if ref.get("kind") != "Deployment" or not ref.get("name"):
        raise HpaImportError(
            f"spec.scaleTargetRef: {_show(ref.get('kind'))} {_show(ref.get('name'))}: only Deployments can be imported"
        )
    target_name = _string(ref["name"], "spec.scaleTargetRef.name")
    target_api = _string(ref.get("apiVersion"), "spec.scaleTargetRef.apiVersion") or "apps/v1"
    if not isinstance(spec.get("maxReplicas"), int) or isinstance(spec.get("maxReplicas"), bool):
        raise HpaImportError("spec.maxReplicas: required integer")
    notes: list[str] = []
    metrics: list[tuple[MetricKind, float]] = []
    if obj.get("apiVersion") == "autoscaling/v1":
        cpu = spec.get("targetCPUUtilizationPercentage")
        notes.append(
            f"spec.targetCPUUtilizationPercentage {_show(cpu) if cpu is not None else 80}: CPU has no equivalent "
            "(use --metric)"
        )
    else:
        raw = spec.get("metrics")
        if raw is None:
            notes.append("spec.metrics absent: the HPA defaults to CPU at 80 %, which has no equivalent (use --metric)")
        for index, metric in enumerate(_array(raw, "spec.metrics")):
            if not isinstance(metric, Mapping):  # null included: an HPA metric is an object with a type
                raise HpaImportError(f"spec.metrics[{index}]: must be an object, {_not(metric)}")
            found = _metric(index, metric, notes)
            if found is not None:
                metrics.append(found)
    if metric_override is not None:
        if metrics:
            notes.append(
                f"--metric {metric_override[0].value}={metric_override[1]:g} replaces "
                f"{metrics[0][0].value}={metrics[0][1]:g} from the HPA"
            )
        chosen = metric_override
    elif metrics:
        chosen = metrics[0]
        for kind, target in metrics[1:]:
            notes.append(
                f"{kind.value}={target:g}: not used (a GPUScalingPolicy scales on one metric; the HPA "
                "takes the highest recommendation of all of them)"
            )
    else:
        raise HpaImportError("spec.metrics: no metric this controller can read; give one with --metric TYPE=TARGET")

    behavior = spec.get("behavior")
    policy_behavior: dict[str, Any]
    if behavior is None:
        policy_behavior = {"hpaWithoutBehavior": True}
    else:
        behavior = _object(behavior, "spec.behavior")
        policy_behavior = {}
        for direction in ("scaleUp", "scaleDown"):
            rules = _rules(behavior.get(direction), f"spec.behavior.{direction}")
            if rules:
                policy_behavior[direction] = rules
    body: dict[str, Any] = {
        "targetRef": {"apiVersion": target_api, "kind": "Deployment", "name": target_name},
        "minReplicas": spec.get("minReplicas", 1),
        "maxReplicas": spec["maxReplicas"],
        "metric": {"type": chosen[0].value, "target": chosen[1]},
    }
    if policy_behavior:
        body["behavior"] = policy_behavior
    manifest = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }
    _validate(manifest)
    return ImportedPolicy(manifest, notes)


def _validate(manifest: Mapping[str, Any]) -> None:
    """The output must be a policy the controller accepts; a failure here is an input the HPA accepted but we
    cannot express (e.g. a rate policy over 30 minutes)."""
    result = validate_policy(dict(manifest))
    if isinstance(result, InvalidPolicy):
        raise HpaImportError(f"{result.field}: {result.message}")
