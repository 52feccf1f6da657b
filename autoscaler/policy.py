"""The per-service policy as users write it: the ``GPUScalingPolicy`` custom resource's ``spec``.

The same YAML objects configure the controller (as custom resources in the cluster) and the simulator (as the
``services`` of a scenario file). Validation happens here, at the boundary; the core receives a frozen
``ServicePolicy``. Field names follow the HPA's camelCase where they mean the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import NoneType
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from autoscaler.core.model import (
    ForecastMode,
    ForecastPolicy,
    MetricKind,
    Mode,
    RateKind,
    RatePolicy,
    ScalingRules,
    SelectPolicy,
    ServicePolicy,
)

API_GROUP = "gpuautoscaler.dev"
API_VERSION = "v1alpha1"
KIND = "GPUScalingPolicy"
PLURAL = "gpuscalingpolicies"

#: Kubernetes replica counts, HPA rate-policy values and PriorityClass values are int32.
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
#: The largest PriorityClass value a user may create (``HighestUserDefinablePriority``); system classes sit above it.
USER_PRIORITY_MAX = 1_000_000_000
#: Per-replica targets and rates (any unit) are at least this: smaller ones ask for an unbounded replica count, and
#: scaled by untrustedTargetRatio they can round to 0 (a division by zero).
MIN_PER_REPLICA = 1e-6
#: untrustedTargetRatio is at least this: running at less than 1 % of the target is no headroom, it is a misprint.
MIN_UNTRUSTED_TARGET_RATIO = 0.01


def _nullable(field: FieldInfo) -> bool:
    """An ``Optional`` field: ``nullable: true`` in the CRD, where the apiserver keeps an explicit null."""
    return field.annotation is NoneType or NoneType in get_args(field.annotation)


class _Strict(BaseModel):
    # NaN and infinity pass a one-sided bound (target > 0): refused, as JSON (the API server) cannot carry them anyway
    # keys by their camelCase alias only, as the API server reads the CRD (``min_replicas`` is an unknown field there)
    model_config = ConfigDict(
        extra="forbid", validate_by_alias=True, validate_by_name=False, frozen=True, allow_inf_nan=False
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        # The apiserver prunes an explicit null of a field its schema does not mark nullable (every field that is not
        # Optional here: ``minReplicas: null``, ``metric: null``, YAML's ``guard:`` with no value), then applies the
        # default; a required one is then missing. Read such a null as the apiserver stores it: as absent. An
        # Optional field's null (``latency: null``) it keeps, and None is what the model makes of it.
        if not isinstance(data, Mapping):
            return data
        absent = {
            key for name, field in cls.model_fields.items() if not _nullable(field) for key in (name, field.alias)
        }
        return {key: value for key, value in data.items() if value is not None or key not in absent}


def _json_integer(value: Any) -> Any:
    # pydantic's lax mode reads "5" and true as 5 and 1; the CRD's ``integer`` type refuses both. The model must
    # refuse what the apiserver refuses, or a scenario or --policy file runs that ``kubectl apply`` rejects. An
    # integral float, 5.0, pydantic reads as 5, as ``kubectl apply`` does (YAML's 5.0 reaches the apiserver as 5); sent
    # as JSON ``5.0`` the schema takes it too, but a CEL rule that reads the field (minReplicas, maxReplicas) fails
    # on it: an expected difference of tests/realkube/test_crd_parity_real.py.
    if isinstance(value, (str, bool)):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    if isinstance(value, float) and value.is_integer():
        # past int64, pydantic says "Unable to parse input string as an integer" of 1e20: the bound says what is wrong
        return int(value)
    return value


def _json_number(value: Any) -> Any:
    if isinstance(value, (str, bool)):  # as the CRD's ``number`` type (see _json_integer)
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return value


#: An ``integer`` of the CRD: a JSON number without a fraction, not a string or a boolean.
Integer = Annotated[int, BeforeValidator(_json_integer)]
#: A ``number`` of the CRD: a JSON number, not a string or a boolean.
Number = Annotated[float, BeforeValidator(_json_number)]
#: A ``boolean`` of the CRD: true or false, not "true", 0 or "yes".
Boolean = Annotated[bool, Strict()]


# A Kubernetes object name (RFC 1123 subdomain: lower-case labels of letters, digits and '-', joined by dots).
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # a namespace's characters (at most 63 of them)
DNS_SUBDOMAIN = rf"{DNS_LABEL}(\.{DNS_LABEL})*"
LABEL_VALUE_MAX = 63  # characters of a Kubernetes label value


#: The API version of the only kind a policy scales (Deployment): the controller reads and scales Deployments through
#: apps/v1 whatever targetRef says, so another value (``extensions/v1beta1``, ``apps/v1beta2``, ``foo``) names nothing.
TARGET_API_VERSION: Final = "apps/v1"


class TargetRef(_Strict):
    api_version: Literal["apps/v1"] = Field(
        TARGET_API_VERSION, alias="apiVersion", description="API version of the scaled workload: apps/v1"
    )
    kind: Literal["Deployment"] = Field("Deployment", description="kind of the scaled workload")
    name: str = Field(
        min_length=1,
        max_length=253,
        # a Deployment's name is a DNS-1123 subdomain: a name with ": " or "/" names nothing, and it would be
        # folded into the service key (namespace/name) every report and query override is looked up by
        pattern=f"^{DNS_SUBDOMAIN}$",
        description="name of the Deployment in the policy's namespace (a DNS-1123 subdomain)",
    )


GPU_UTILIZATION_TARGET_MESSAGE = "target: gpu_utilization is a percentage, must be <= 100"
ENGINE_ACTIVE_TARGET_MESSAGE = (
    "target: engine_active is a ratio, must be <= 1 (metric.target defaults to 70, a gpu_utilization percentage)"
)
#: The signals read as one total for the whole service, the only ones that *can* have a value with no pod running
#: (upstream's HPA: an Object or External metric). Necessary, not sufficient: the default queries read the pods' own
#: series, which end with the last pod ("no series": stale, held at zero), so a service scaled to zero comes back
#: only when its signal is read in front of the pods, by the policy's override (a gateway's or a queue's series).
WHOLE_SERVICE_METRICS = (MetricKind.REQUEST_RATE, MetricKind.QUEUE_DEPTH)
#: The spec.queries override (its alias) that reads each whole-service metric.
SCALE_FROM_ZERO_QUERY = {MetricKind.REQUEST_RATE: "requestRate", MetricKind.QUEUE_DEPTH: "queueDepth"}
#: ``{metric}``, ``{query}``: the whole-service metric and the override that must read it in front of the pods.
MIN_REPLICAS_ZERO_QUERY_MESSAGE = (
    "minReplicas 0 with metric {metric} needs spec.queries.{query} reading it in front of the pods (the series of a "
    "gateway or a queue): the default query reads the series of the pods themselves, which end with the last pod, "
    "so the service would never scale back up"
)
#: ``{metric}``: the per-pod metric the policy scales on (the CRD's CEL rule fills it in the same way).
MIN_REPLICAS_ZERO_MESSAGE = (
    "minReplicas 0 needs a whole-service metric (request_rate or queue_depth): a per-pod metric ({metric}) has no "
    "samples with no pod, so the service would never scale back up"
)
HPA_WITHOUT_BEHAVIOR_MESSAGE = "{direction}: policies and selectPolicy have no effect with hpaWithoutBehavior: true"
HPA_WITHOUT_BEHAVIOR_WINDOW_MESSAGE = "scaleUp.stabilizationWindowSeconds has no effect with hpaWithoutBehavior: true"


class MetricTarget(_Strict):
    type: MetricKind = Field(
        MetricKind.GPU_UTILIZATION,
        description="per-replica scaling signal: gpu_utilization (percent 0-100), engine_active (ratio 0-1), "
        "request_rate (requests/s), queue_depth (requests)",
    )
    target: Number = Field(
        70.0,
        ge=MIN_PER_REPLICA,
        description=f"average value per ready replica, in the signal's unit, at least {MIN_PER_REPLICA:g} (the "
        "default, 70, is a gpu_utilization percentage: give it for the other signals)",
    )

    @model_validator(mode="after")
    def _target_in_range(self) -> MetricTarget:
        # The CRD carries the same two rules as CEL (adapters/kubernetes/crd.py METRIC_VALIDATIONS): keep them alike.
        if self.type is MetricKind.GPU_UTILIZATION and self.target > 100:
            raise ValueError(GPU_UTILIZATION_TARGET_MESSAGE)
        if self.type is MetricKind.ENGINE_ACTIVE and self.target > 1:
            raise ValueError(ENGINE_ACTIVE_TARGET_MESSAGE)
        return self


#: The HPA's bounds on its behavior (k8s.io/kubernetes pkg/apis/autoscaling/validation: MaxPeriodSeconds,
#: MaxStabilizationWindowSeconds), both whole seconds (int32) there as here.
MAX_PERIOD_SECONDS = 1800
MAX_STABILIZATION_WINDOW_SECONDS = 3600


class RatePolicySpec(_Strict):
    type: Literal["Pods", "Percent"] = Field(description="Pods: absolute pods; Percent: percent of replicas")
    value: Integer = Field(gt=0, le=INT32_MAX, description="pods or percent allowed per period")
    period_seconds: Integer = Field(
        alias="periodSeconds", ge=1, le=MAX_PERIOD_SECONDS, description="period, whole seconds (1-1800, as the HPA)"
    )


class ScalingRulesSpec(_Strict):
    stabilization_window_seconds: int | None = Field(
        None,
        alias="stabilizationWindowSeconds",
        ge=0,
        le=MAX_STABILIZATION_WINDOW_SECONDS,
        description="stabilisation window, whole seconds (0-3600, as the HPA)",
    )
    tolerance: Number = Field(
        0.1, ge=0, description="no change while |metric/target - 1| <= tolerance (ratio; no upper bound, as the HPA)"
    )
    select_policy: Literal["Max", "Min", "Disabled"] = Field("Max", alias="selectPolicy")
    policies: list[RatePolicySpec] | None = Field(
        None,
        description="rate policies, at least one; HPA defaults when omitted (selectPolicy: Disabled stops scaling "
        "in this direction)",
        json_schema_extra={"minItems": 1},
    )

    # an Optional constrained field: the Integer alias would take its bounds off the schema (see _json_integer)
    _window_is_an_integer = field_validator("stabilization_window_seconds", mode="before")(_json_integer)

    @field_validator("policies")
    @classmethod
    def _at_least_one(cls, policies: list[RatePolicySpec] | None) -> list[RatePolicySpec] | None:
        # As the HPA API ("must specify at least one Policy"): an empty list would allow no change at all, silently.
        if policies is not None and not policies:
            raise ValueError("at least one rate policy (omit it for the defaults, or selectPolicy: Disabled)")
        return policies

    def to_rules(self, default: ScalingRules) -> ScalingRules:
        policies = default.policies
        if self.policies is not None:
            policies = tuple(RatePolicy(RateKind(p.type), p.value, p.period_seconds) for p in self.policies)
        window: float | None = self.stabilization_window_seconds
        if window is None:
            window = default.stabilisation_s
        return ScalingRules(
            stabilisation_s=window, policies=policies, select=SelectPolicy(self.select_policy), tolerance=self.tolerance
        )


class BehaviorSpec(_Strict):
    scale_up: ScalingRulesSpec = Field(default_factory=ScalingRulesSpec, alias="scaleUp")
    scale_down: ScalingRulesSpec = Field(default_factory=ScalingRulesSpec, alias="scaleDown")
    hpa_without_behavior: Boolean = Field(
        False,
        alias="hpaWithoutBehavior",
        description="behave as an HPA with no behavior block (what autoscaler import-hpa writes for one): "
        "scale-up at most max(2 x current, 4) replicas per tick, no scale-down rate limit, scale-down "
        "stabilised over scaleDown.stabilizationWindowSeconds (default 300 s); rate policies are then not allowed",
    )

    @model_validator(mode="after")
    def _no_policies_without_behavior(self) -> BehaviorSpec:
        if self.hpa_without_behavior:
            for direction, rules in (("scaleUp", self.scale_up), ("scaleDown", self.scale_down)):
                if rules.policies is not None or rules.select_policy != "Max":
                    raise ValueError(HPA_WITHOUT_BEHAVIOR_MESSAGE.format(direction=direction))
            if self.scale_up.stabilization_window_seconds:
                raise ValueError(HPA_WITHOUT_BEHAVIOR_WINDOW_MESSAGE)
        return self


class LatencySpec(_Strict):
    slo_seconds: Number = Field(alias="sloSeconds", gt=0, description="latency objective, seconds")
    quantile: Number = Field(0.95, gt=0, lt=1, description="the latency quantile the SLO applies to")
    guard: Boolean = Field(True, description="scale up when latency > SLO even if the metric is on target")


class QueriesSpec(_Strict):
    """PromQL overrides for this service's application signals. ``{namespace}`` and ``{name}`` are substituted
    (escaped) by the Prometheus adapter."""

    request_rate: str | None = Field(None, alias="requestRate", description="requests per second, whole service")
    queue_depth: str | None = Field(None, alias="queueDepth", description="requests waiting, whole service")
    latency: str | None = Field(None, description="latency quantile in seconds, whole service")


class ForecastSpec(_Strict):
    mode: Literal["off", "shadow", "active"] = Field(
        "off",
        description="off: reactive only; shadow: report what the forecast would do; active: forecast raises "
        "the replica floor ahead of demand",
    )
    quantile: Number = Field(0.9, gt=0, lt=1, description="forecast quantile provisioned for")
    rate_per_replica: float | None = Field(
        None,
        alias="ratePerReplica",
        ge=MIN_PER_REPLICA,
        description="requests/s one replica serves, to turn the request-rate forecast into replicas (default: "
        "metric.target when metric.type is request_rate; other metrics get no forecast floor without it)",
    )
    untrusted_target_ratio: Number = Field(
        0.75,
        alias="untrustedTargetRatio",
        ge=MIN_UNTRUSTED_TARGET_RATIO,
        le=1,
        description="active mode: the share of metric.target the reactive path runs at (the forecast floor keeps "
        "ratePerReplica) while its forecast has not earned trust (too few live scores, stale, unreliable, or its "
        "quantile covering too little of the demand); trust then raises it to the full target. 1 turns this off",
    )

    _rate_is_a_number = field_validator("rate_per_replica", mode="before")(_json_number)  # see ScalingRulesSpec

    def to_policy(self) -> ForecastPolicy | None:
        if self.mode == "off":
            return None
        return ForecastPolicy(
            ForecastMode(self.mode), self.quantile, self.rate_per_replica, self.untrusted_target_ratio
        )


class GPUScalingPolicySpec(_Strict):
    target_ref: TargetRef = Field(alias="targetRef")
    gpus_per_replica: Integer = Field(1, alias="gpusPerReplica", ge=1, le=64, description="nvidia.com/gpu per replica")
    min_replicas: Integer = Field(
        1,
        alias="minReplicas",
        ge=0,
        le=INT32_MAX,
        description="fewest replicas; 0 (scale to zero) only with a whole-service metric.type (request_rate or "
        "queue_depth)",
    )
    max_replicas: Integer = Field(
        10, alias="maxReplicas", ge=1, le=INT32_MAX, description="most replicas (at least minReplicas)"
    )
    metric: MetricTarget = Field(default_factory=MetricTarget)
    latency: LatencySpec | None = None
    queries: QueriesSpec = Field(default_factory=QueriesSpec)
    priority: Integer = Field(
        0,
        ge=INT32_MIN,
        le=INT32_MAX,
        description="higher wins GPUs; compared with training PriorityClass values (int32, as they are; user-defined "
        f"classes are at most {USER_PRIORITY_MAX:,})",
    )
    cold_start_seconds: Number = Field(
        90.0, alias="coldStartSeconds", ge=0, le=3600, description="pod creation to ready (image pull + model load), s"
    )
    mode: Mode = Field(Mode.ACTIVE, description="active: act; recommend-only: report the plan, write nothing")
    behavior: BehaviorSpec = Field(default_factory=BehaviorSpec)
    forecast: ForecastSpec = Field(default_factory=ForecastSpec)
    adopt_hpa: str | None = Field(
        None,
        alias="adoptHpa",
        min_length=1,
        max_length=253,
        pattern=f"^{DNS_SUBDOMAIN}$",  # an HPA's name is a DNS-1123 subdomain: another string names no HPA
        description="name of the HorizontalPodAutoscaler (same namespace) that scales the Deployment today: while "
        "it exists this policy only recommends (autoscaler plan shows both), and deleting it hands the Deployment "
        "over. Without this field an HPA on the same Deployment is a conflict: the policy recommends only and warns",
    )

    @model_validator(mode="after")
    def _bounds(self) -> GPUScalingPolicySpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})")
        return self

    @model_validator(mode="after")
    def _scale_to_zero_needs_a_whole_service_metric(self) -> GPUScalingPolicySpec:
        # Scaled to zero, a per-pod metric has no pod to sample: the core reads that as stale and holds at zero for
        # good. A query override (queries.requestRate ...) changes where a signal is read, not which one scales.
        # The CRD carries the same rule as CEL (adapters/kubernetes/crd.py SPEC_VALIDATIONS): keep them alike.
        if self.min_replicas == 0 and self.metric.type not in WHOLE_SERVICE_METRICS:
            raise ValueError(MIN_REPLICAS_ZERO_MESSAGE.format(metric=self.metric.type.value))
        if self.min_replicas == 0:
            query = SCALE_FROM_ZERO_QUERY[self.metric.type]
            if not self.queries.model_dump(by_alias=True).get(query):
                raise ValueError(MIN_REPLICAS_ZERO_QUERY_MESSAGE.format(metric=self.metric.type.value, query=query))
        return self


def to_service_policy(namespace: str, name: str, spec: GPUScalingPolicySpec) -> ServicePolicy:
    """The core's frozen policy for one validated spec (service key = namespace/targetRef.name)."""
    from autoscaler.core.model import DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP

    del name  # the policy object's own name; the service is identified by the Deployment it scales
    return ServicePolicy(
        namespace=namespace,
        name=spec.target_ref.name,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        metric=spec.metric.type,
        target=spec.metric.target,
        scale_up=spec.behavior.scale_up.to_rules(DEFAULT_SCALE_UP),
        scale_down=spec.behavior.scale_down.to_rules(DEFAULT_SCALE_DOWN),
        behavior=not spec.behavior.hpa_without_behavior,
        latency_slo_s=spec.latency.slo_seconds if spec.latency else None,
        slo_guard=spec.latency.guard if spec.latency else False,
        gpus_per_replica=spec.gpus_per_replica,
        cold_start_s=spec.cold_start_seconds,
        priority=spec.priority,
        mode=spec.mode,
        forecast=spec.forecast.to_policy(),
        latency_quantile=spec.latency.quantile if spec.latency else None,
    )
