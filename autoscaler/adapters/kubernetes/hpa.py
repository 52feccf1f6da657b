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
  (queue_depth), a name with ``request`` and ``rate``, ``per_second``, ``rps`` or ``total`` (request_rate) -- except
  that a name that looks like a time (``time``, ``duration``, ``latency``, ``seconds``, a ``_us``/``_ms``/``_ns``
  unit) is neither (``vllm:request_queue_time_seconds`` is a latency, not a queue length). The kind taken, and the
  name it was taken from, is always said (``ImportedPolicy.inferred``). The controller reads these signals with its
  own PromQL (``spec.queries`` overrides it), not through the metrics adapter the HPA used.

Accepted: ``autoscaling/v2`` and ``autoscaling/v2beta2`` (the same schema), and ``autoscaling/v1`` unless it carries
the v2-only fields in its ``autoscaling.alpha.kubernetes.io/metrics`` or ``.../behavior`` annotations (how the API
server serves a v2 HPA as v1): those are refused, with the command that exports the object as v2. Integer fields
must be integers (the API server never serves ``"2"`` or ``true`` there), and the names must be what Kubernetes
accepts (the HPA's name a DNS-1123 subdomain, its namespace a DNS-1123 label).
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity as k8s_parse

from autoscaler.adapters.kubernetes.policies import InvalidPolicy, validate_policy
from autoscaler.core.model import MetricKind
from autoscaler.policy import API_GROUP, API_VERSION, DNS_LABEL, DNS_SUBDOMAIN, KIND

HPA_API_VERSIONS = ("autoscaling/v2", "autoscaling/v2beta2", "autoscaling/v1")
#: Where the API server keeps an autoscaling/v2 HPA's v2-only fields when it serves the object as autoscaling/v1.
V1_METRICS_ANNOTATION = "autoscaling.alpha.kubernetes.io/metrics"
V1_BEHAVIOR_ANNOTATION = "autoscaling.alpha.kubernetes.io/behavior"

_BY_NAME: tuple[tuple[MetricKind, tuple[str, ...], tuple[str, ...]], ...] = (
    # kind, every one of these must appear, one of these must appear
    (MetricKind.GPU_UTILIZATION, ("dcgm_fi_dev_gpu_util",), ("",)),
    (MetricKind.ENGINE_ACTIVE, ("dcgm_fi_prof_gr_engine_active",), ("",)),
    (MetricKind.QUEUE_DEPTH, ("",), ("requests_waiting", "queue")),
    (MetricKind.REQUEST_RATE, ("request",), ("rate", "per_second", "rps", "total")),
)
# A name that says it is a time: a queue's waiting *time* or a request's latency is neither a queue length nor a rate.
_TIME_LIKE = re.compile(r"time|duration|latency|seconds|_(us|ms|ns)(?![a-z])")
_NOT_IF_TIME_LIKE = (MetricKind.QUEUE_DEPTH, MetricKind.REQUEST_RATE)
# What the HPA's per-pod average must be for the policy to mean the same (said with each kind taken from a name).
_MEANING = {
    MetricKind.GPU_UTILIZATION: "GPU utilisation in percent",
    MetricKind.ENGINE_ACTIVE: "the graphics engine's active ratio, 0 to 1",
    MetricKind.QUEUE_DEPTH: "a number of requests waiting, per replica",
    MetricKind.REQUEST_RATE: "requests per second, per replica",
}


class HpaImportError(ValueError):
    """The object cannot be imported; the message names the field."""


@dataclass
class ImportedPolicy:
    """A GPUScalingPolicy manifest, what of the HPA it could not carry over (``notes``), and which metric kinds were
    taken from a metric's name (``inferred``: a guess the user should check)."""

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    inferred: list[str] = field(default_factory=list)


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
    """A name for a message: a printable string as it is (bounded), anything else as :func:`_show` gives it -- a
    line break (or any control character) comes out escaped, so a message is one line, also as a ``#`` comment."""
    if isinstance(value, str) and len(value) <= 60 and value.isprintable():
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


def _integer(value: object, where: str, *, required: bool = False) -> int | None:
    """An integer field (int32 in the HPA API): ``None`` when absent and not required. ``"2"``, ``true`` and ``2.0``
    are refused: the API server never serves them, and written out they are what the policy's CRD refuses."""
    if value is None:
        if required:
            raise HpaImportError(f"{where}: required integer")
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        raise HpaImportError(f"{where}: must be an integer, not {_show(value)}")
    raise HpaImportError(f"{where}: must be an integer, {_not(value)}")


_NAME_RULES = {
    "DNS-1123 subdomain": (DNS_SUBDOMAIN, 253, "lower-case letters, digits, '-' and '.'"),
    "DNS-1123 label": (DNS_LABEL, 63, "lower-case letters, digits and '-'"),
}


def _name(value: object, where: str, what: str) -> str:
    """A required Kubernetes name, ``what`` one of :data:`_NAME_RULES`."""
    pattern, limit, alphabet = _NAME_RULES[what]
    text = _string(value, where)
    if not text:
        raise HpaImportError(f"{where}: required")
    if len(text) > limit or not re.fullmatch(pattern, text):
        raise HpaImportError(
            f"{where}: {_show(text)} is not a valid name (a {what}: {alphabet}, starting and ending with a letter "
            f"or digit, at most {limit} characters)"
        )
    return text


def parse_quantity(value: object, where: str) -> float:
    """A Kubernetes quantity (``500m``, ``1k``, ``10Mi``, ``1.5``, ``1e3``) as a float."""
    if isinstance(value, bool):
        raise HpaImportError(f"{where}: {_show(value)} is not a quantity")
    try:
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            number = float(k8s_parse(value.strip()))  # type: ignore[no-untyped-call]
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


def _by_name(lowered: str) -> MetricKind | None:
    for kind, all_of, any_of in _BY_NAME:
        if all(part in lowered for part in all_of) and any(part in lowered for part in any_of):
            return kind
    return None


def time_like(name: str) -> bool:
    """The name says the metric is a time (a latency, a waiting time), whatever else it says."""
    return _TIME_LIKE.search(name.lower()) is not None


def metric_kind_for(name: str) -> MetricKind | None:
    """The kind of signal a metric's name says it is, or None. A time-like name is never a queue length or a rate."""
    kind = _by_name(name.lower())
    if kind in _NOT_IF_TIME_LIKE and time_like(name):
        return None
    return kind


def _metric(
    index: int, metric: Mapping[str, Any], notes: list[str], inferred: list[str]
) -> tuple[MetricKind, float] | None:
    """One HPA metric as (our kind, per-replica target), or None with a note saying why not; the kind taken from the
    metric's name is said in ``inferred``."""
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
        guessed = _by_name(name.lower())
        if guessed is not None:  # a time-like name that would otherwise have passed for a queue or a rate
            notes.append(
                f"{where}: {kind} metric {_show(name)}: a time or latency by its name, not {guessed.value}: no "
                "equivalent (a latency objective is spec.latency)"
            )
        else:
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
    inferred.append(
        f"{where}: {kind} metric {_show(name)} taken as {ours.value} (from its name): check that its average per pod "
        f"is {_MEANING[ours]}"
    )
    return ours, value


def _rules(value: object, where: str) -> dict[str, Any]:
    spec = _object(value, where)
    if not spec:
        return {}
    # What is written is what was checked here: the raw input ("60", true) would pass the policy's lax validation
    # and then be refused by the CRD's schema.
    out: dict[str, Any] = {}
    window = _integer(spec.get("stabilizationWindowSeconds"), f"{where}.stabilizationWindowSeconds")
    if window is not None:
        out["stabilizationWindowSeconds"] = window
    select = _string(spec.get("selectPolicy"), f"{where}.selectPolicy")
    if select is not None:
        out["selectPolicy"] = select
    if spec.get("policies") is not None:
        out["policies"] = []
        for i, raw in enumerate(_array(spec["policies"], f"{where}.policies")):
            at = f"{where}.policies[{i}]"
            policy = _object(raw, at)
            out["policies"].append(
                {
                    "type": _string(policy.get("type"), f"{at}.type"),
                    "value": _integer(policy.get("value"), f"{at}.value", required=True),
                    "periodSeconds": _integer(policy.get("periodSeconds"), f"{at}.periodSeconds", required=True),
                }
            )
    if spec.get("tolerance") is not None:
        out["tolerance"] = parse_quantity(spec["tolerance"], f"{where}.tolerance")
    return out


def import_hpa(obj: Mapping[str, Any], metric_override: tuple[MetricKind, float] | None = None) -> ImportedPolicy:
    """The GPUScalingPolicy equivalent to one HorizontalPodAutoscaler (autoscaling/v2, v2beta2 or v1)."""
    if not isinstance(obj, Mapping):
        raise HpaImportError("not an object")
    if obj.get("kind") != "HorizontalPodAutoscaler":
        raise HpaImportError(
            f"kind/apiVersion: {_show(obj.get('kind'))} {_show(obj.get('apiVersion'))} is not a "
            f"HorizontalPodAutoscaler ({', '.join(HPA_API_VERSIONS)})"
        )
    version = obj.get("apiVersion")
    if version not in HPA_API_VERSIONS:
        raise HpaImportError(
            f"apiVersion: {_show(version)}: not supported ({', '.join(HPA_API_VERSIONS)}); export the HPA as "
            "autoscaling/v2: kubectl get hpa.v2.autoscaling NAME -n NAMESPACE -o yaml"
        )
    meta = _object(obj.get("metadata"), "metadata")
    spec = _object(obj.get("spec"), "spec")
    name = _name(meta.get("name"), "metadata.name", "DNS-1123 subdomain")
    namespace = "default"
    if meta.get("namespace") not in (None, ""):  # absent or empty: kubectl's default namespace
        namespace = _name(meta.get("namespace"), "metadata.namespace", "DNS-1123 label")
    if version == "autoscaling/v1":
        annotations = _object(meta.get("annotations"), "metadata.annotations")
        for key in (V1_METRICS_ANNOTATION, V1_BEHAVIOR_ANNOTATION):
            if key in annotations:
                # Reading them would mean parsing the API server's internal conversion format; v2 says it all.
                raise HpaImportError(
                    f"metadata.annotations[{key}]: this autoscaling/v1 object carries the HPA's autoscaling/v2 "
                    f"{key.rpartition('/')[2]} in an annotation, which is not imported; export the HPA as "
                    f"autoscaling/v2 and import that: kubectl get hpa.v2.autoscaling {name} -n {namespace} -o yaml"
                )
    ref = _object(spec.get("scaleTargetRef"), "spec.scaleTargetRef")
    if ref.get("kind") != "Deployment" or not ref.get("name"):
        raise HpaImportError(
            f"spec.scaleTargetRef: {_show(ref.get('kind'))} {_show(ref.get('name'))}: only Deployments can be imported"
        )
    target_name = _name(ref["name"], "spec.scaleTargetRef.name", "DNS-1123 subdomain")
    target_api = _string(ref.get("apiVersion"), "spec.scaleTargetRef.apiVersion") or "apps/v1"
    max_replicas = _integer(spec.get("maxReplicas"), "spec.maxReplicas", required=True)
    min_replicas = _integer(spec.get("minReplicas"), "spec.minReplicas")
    notes: list[str] = []
    inferred: list[str] = []
    metrics: list[tuple[MetricKind, float]] = []
    if version == "autoscaling/v1":
        cpu = spec.get("targetCPUUtilizationPercentage")
        cpu_note = f"spec.targetCPUUtilizationPercentage {_show(cpu) if cpu is not None else 80}: CPU has no equivalent"
        if metric_override is None:  # v1 has no spec.metrics: name the field it has
            raise HpaImportError(f"{cpu_note}; give a metric with --metric TYPE=TARGET")
        notes.append(f"{cpu_note} (use --metric)")
    else:
        raw = _array(spec.get("metrics"), "spec.metrics")
        if not raw:  # absent or []: the API server defaults either to CPU at 80 %
            state = "absent" if spec.get("metrics") is None else "empty"
            notes.append(
                f"spec.metrics {state}: the HPA defaults to CPU at 80 %, which has no equivalent (use --metric)"
            )
        for index, metric in enumerate(raw):
            if not isinstance(metric, Mapping):  # null included: an HPA metric is an object with a type
                raise HpaImportError(f"spec.metrics[{index}]: must be an object, {_not(metric)}")
            found = _metric(index, metric, notes, inferred)
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
        # The notes say why each metric is not read (a latency whose name says "queue", CPU): say it with the error.
        why = "; ".join(notes[:3]) + (f"; and {len(notes) - 3} more" if len(notes) > 3 else "")
        raise HpaImportError(
            "spec.metrics: no metric this controller can read; give one with --metric TYPE=TARGET"
            + (f" ({why})" if why else "")
        )

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
        "minReplicas": 1 if min_replicas is None else min_replicas,
        "maxReplicas": max_replicas,
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
    return ImportedPolicy(manifest, notes, inferred)


def _validate(manifest: Mapping[str, Any]) -> None:
    """The output must be a policy the controller accepts; a failure here is an input the HPA accepted but we
    cannot express (e.g. a rate policy over 30 minutes)."""
    result = validate_policy(dict(manifest))
    if isinstance(result, InvalidPolicy):
        raise HpaImportError(f"{result.field}: {result.message}")
