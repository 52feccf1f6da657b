"""Scenario files for the simulator (YAML), validated by pydantic.

A scenario describes node pools, inference services and the step length. Services are written exactly as the
``GPUScalingPolicy`` custom resources the controller reads in a cluster, plus a ``simulation`` block that says
where the demand comes from and how fast a replica is. See ``autoscaler/sim/scenarios/default.yaml``.

A scenario file may come from somebody else, so everything in it is checked before anything is read, allocated or
written: every number must be finite (no ``.nan``/``.inf``) and a number (``true``/``false`` is not one, nor is a
quoted ``"15"``), and is bounded where a larger value would only cost memory or time; ``name`` must be a safe file
name (it names the output files); a service replica or a training gang that no node pool could ever hold (no pool that
can have a node, GPUs per replica or pod beyond every pool's nodes, a gang larger than all of them) is refused, and so
is ``maxNodes`` on a pool that does not burst. The limits on the size of a run:

- at most :data:`MAX_STEPS` (1,000,000) simulation steps (``durationSeconds`` / ``stepSeconds``, or the shortest
  trace / ``stepSeconds``): 14 days at 1.2 s steps, a year at 32 s steps;
- at most :data:`MAX_SERVICE_STEPS` (10,000,000) service-steps (services x steps, 2.5 times the 50 services x 14 days
  at 15 s of ``benchmarks/bench_simulate.py``; about 1.5 GB of per-step timelines for the five policies);
- at most :data:`MAX_REPLICA_STEPS` (1,000,000,000) replica-steps (the services' maxReplicas, within the node pools'
  GPUs, x steps): the latency model costs one Erlang C term per ready replica and step, about a minute per policy;
- at most :data:`MAX_TRACE_BINS` (20,000,000) bins of demand over all traces, binned at ``binSeconds``;
- a scenario file is at most :data:`MAX_SCENARIO_BYTES` (4 MiB) of UTF-8 YAML, without duplicate keys.
"""

from __future__ import annotations

import collections.abc
import enum
import inspect
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autoscaler.core.model import Mode
from autoscaler.policy import API_GROUP, API_VERSION, DNS_LABEL, DNS_SUBDOMAIN, KIND, GPUScalingPolicySpec
from autoscaler.yaml_input import YamlProblem, load_yaml

# the Literal types below spell them out (a type cannot be built from the constants): kept equal here
assert (f"{API_GROUP}/{API_VERSION}", KIND) == ("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy")

BUILTIN_PREFIX = "builtin:"
SCENARIO_DIR = Path(__file__).parent / "scenarios"

#: Simulation steps in one run, at most (duration / stepSeconds).
MAX_STEPS = 1_000_000
#: Services x steps in one run, at most (each policy keeps per-step timelines of every service).
MAX_SERVICE_STEPS = 10_000_000
#: Replicas x steps in one run, at most: the latency model and the oracle cost O(ready replicas) per service-step,
#: about 50 ns per replica (so at most about a minute per policy).
MAX_REPLICA_STEPS = 1_000_000_000
#: Bins of demand over all the scenario's traces (each binned at its ``binSeconds``), at most.
MAX_TRACE_BINS = 20_000_000
#: Size of a scenario file, at most.
MAX_SCENARIO_BYTES = 4 * 1024 * 1024
MAX_SERVICES = 1_000
MAX_NODE_POOLS = 100
MAX_NODES_PER_POOL = 10_000
#: A service's maxReplicas in a simulation, at most (the latency model and the oracle cost O(replicas) per step).
MAX_REPLICAS = 10_000
#: Requests/s of one service after traceScale, at most.
MAX_RATE = 1e9
#: Points of one forecast (horizonSeconds / resolutionSeconds), at most.
MAX_FORECAST_POINTS = 10_000
#: Integers (replica counts, priorities, rate-policy values, forecaster parameters) are 32-bit, as in Kubernetes.
MAX_INT = 2**31 - 1
#: The scenario name is used as a file name: out/<name>.json and out/<name>.png.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,99}")
#: Problems listed in one error, at most (the rest are counted).
MAX_LISTED_PROBLEMS = 20


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the file, the field and the problem."""


class _Strict(BaseModel):
    # keys by their camelCase alias only, as the API server reads the CRD (``min_replicas`` is an unknown field there)
    model_config = ConfigDict(
        extra="forbid", validate_by_alias=True, validate_by_name=False, frozen=True, allow_inf_nan=False
    )


class NodePool(_Strict):
    name: str = Field(min_length=1, description="node pool name (the node-pool label value in a cluster)")
    gpu_type: str = Field("A100-80GB", alias="gpuType", description="GPU product, informational")
    gpus_per_node: int = Field(8, alias="gpusPerNode", ge=1, le=64, description="GPUs per node")
    nodes: int = Field(ge=0, le=MAX_NODES_PER_POOL, description="nodes always present (on-premises or reserved)")
    burst: bool = Field(False, description="whether nodes can be added on demand (a cloud burst pool)")
    max_nodes: int | None = Field(
        None, alias="maxNodes", ge=0, le=MAX_NODES_PER_POOL, description="upper bound on nodes for a burst pool"
    )
    boot_seconds: float = Field(
        300.0, alias="bootSeconds", ge=0, le=86400, description="request to GPU-ready node, seconds"
    )
    price_per_gpu_hour: float = Field(
        0.0, alias="pricePerGpuHour", ge=0, le=10_000, description="price of one GPU-hour, $"
    )
    scale_down_unneeded_seconds: float = Field(
        600.0, alias="scaleDownUnneededSeconds", ge=0, le=86400,
        description="a burst node is removed after its GPUs were unneeded this long (Cluster Autoscaler: 10 min)",
    )
    priority: int = Field(
        0, ge=-MAX_INT, le=MAX_INT,
        description="for the controller's priority expander (capacity.expanders): higher first, burst pools only",
    )

    @field_validator("max_nodes")
    @classmethod
    def _only_for_burst(cls, max_nodes: int | None, info: ValidationInfo) -> int | None:
        if max_nodes is not None and info.data.get("burst") is False:
            raise ValueError(
                f"{max_nodes} has no effect without burst: true (a pool that does not burst keeps its nodes): set "
                "burst: true or remove maxNodes"
            )
        return max_nodes

    @field_validator("boot_seconds", "scale_down_unneeded_seconds", "priority")
    @classmethod
    def _node_changes_only_for_burst(cls, seconds: float, info: ValidationInfo) -> float:
        # Run only when given: a pool that does not burst never adds or removes a node, so a boot time or a
        # scale-down delay on it would be silently ignored (as maxNodes would be).
        if info.data.get("burst") is False:
            raise ValueError(
                f"{seconds:g} has no effect without burst: true (a pool that does not burst never adds or removes a "
                f"node): set burst: true or remove {cls.model_fields[info.field_name or ''].alias}"
            )
        return seconds

    @field_validator("price_per_gpu_hour")
    @classmethod
    def _price_only_for_burst(cls, price: float, info: ValidationInfo) -> float:
        # The report's costs count burst GPU-hours only: a price on a pool that does not burst cost nothing.
        if price > 0 and info.data.get("burst") is False:
            raise ValueError(
                f"{price:g} has no effect without burst: true (the report counts the money of burst nodes only; a "
                "pool that does not burst costs nothing): set burst: true, or remove pricePerGpuHour or make it 0"
            )
        return price

    @model_validator(mode="after")
    def _burst_bounds(self) -> NodePool:
        if self.max_nodes is not None and self.max_nodes < self.nodes:
            raise ValueError(f"maxNodes ({self.max_nodes}) must be >= nodes ({self.nodes})")
        return self

    @property
    def node_limit(self) -> int:
        if not self.burst:
            return self.nodes
        return self.max_nodes if self.max_nodes is not None else self.nodes


class ServiceSimulation(_Strict):
    trace: str = Field(
        description="demand trace: a path (relative to the scenario file) in a canonical trace format, or "
        "'builtin:servegen-m-large' for the packaged trace"
    )
    trace_scale: float = Field(
        1.0, alias="traceScale", gt=0, le=1e6, description="multiplier on the trace's request rate"
    )
    bin_seconds: float = Field(
        60.0, alias="binSeconds", ge=1, le=3600,
        description="demand is averaged over bins of this many seconds before it reaches the latency model "
        "(a steady-state queue model; request counts in shorter bins are mostly arrival noise), seconds",
    )
    throughput_per_replica: float = Field(
        alias="throughputPerReplica", ge=1e-3, le=1e6, description="requests/s one replica completes at saturation"
    )
    base_latency_seconds: float = Field(
        alias="baseLatencySeconds", gt=0, le=3600, description="latency of a request that does not queue, seconds"
    )
    request_rate_counts: Literal["finished", "arrivals"] = Field(
        "finished",
        alias="requestRateCounts",
        description="what a request_rate metric reads: 'finished' requests per second, at most what the ready "
        "replicas serve (the controller's default counter, vllm:request_success_total), or 'arrivals' (a gateway's "
        "count of requests received)",
    )
    forecast_learns_from: Literal["arrivals", "finished"] = Field(
        "arrivals",
        alias="forecastLearnsFrom",
        description="the request rate the forecasts learn from and are scored against: 'arrivals' (the demand; "
        "computed beside the run in worker processes), or 'finished' requests, at most what the ready replicas "
        "served, as the controller's history query of the default counter reads it (in the run's process: slower)",
    )


NAMESPACE_MAX = 63
OBJECT_NAME_MAX = 253


def _namespace_name(namespace: str) -> str:
    """``namespace`` if the API server takes it as one (an RFC 1123 label): a scenario runs what ``kubectl apply``
    would, and the namespace is the first part of the service key ``namespace/name``."""
    if len(namespace) > NAMESPACE_MAX or re.fullmatch(DNS_LABEL, namespace) is None:
        raise ValueError(
            f"{namespace[:60]!r} is not a namespace name (lower-case letters, digits and '-', starting and ending with "
            f"a letter or digit, at most {NAMESPACE_MAX} characters)"
        )
    return namespace


class Metadata(_Strict):
    name: str = Field(min_length=1)
    namespace: str = Field("default", min_length=1)

    @field_validator("name")
    @classmethod
    def _object_name(cls, name: str) -> str:
        if len(name) > OBJECT_NAME_MAX or re.fullmatch(DNS_SUBDOMAIN, name) is None:
            raise ValueError(
                f"{name[:60]!r} is not an object name (lower-case letters, digits, '-' and '.', starting and ending "
                f"with a letter or digit, at most {OBJECT_NAME_MAX} characters)"
            )
        return name

    _namespace = field_validator("namespace")(_namespace_name)


class ServiceEntry(_Strict):
    # the version the controller reads (the CRD serves no other): a typo is refused, as a wrong kind is
    api_version: Literal["gpuautoscaler.dev/v1alpha1"] = Field("gpuautoscaler.dev/v1alpha1", alias="apiVersion")
    kind: Literal["GPUScalingPolicy"] = "GPUScalingPolicy"
    metadata: Metadata
    spec: GPUScalingPolicySpec
    simulation: ServiceSimulation

    @model_validator(mode="after")
    def _simulation_bounds(self) -> ServiceEntry:
        # The spec is the controller's GPUScalingPolicy; a simulation also needs it small enough to replay.
        if self.spec.max_replicas > MAX_REPLICAS:
            raise ValueError(
                f"spec.maxReplicas: at most {MAX_REPLICAS:,} in a simulation, got {self.spec.max_replicas:,}"
            )
        # metric.target and forecast.ratePerReplica are at least policy.MIN_PER_REPLICA in every spec
        if self.spec.mode is not Mode.ACTIVE:
            # A simulation compares policies that act: recommend-only writes nothing, and every column that runs
            # the spec (the HPA baseline's too) would stay at its first replicas while the oracle scales.
            raise ValueError(
                f"spec.mode: a simulation replays the policy acting; {self.spec.mode.value!r} would scale nothing "
                "in any column (remove spec.mode or set it to active)"
            )
        return self

    @model_validator(mode="after")
    def _needs_slo(self) -> ServiceEntry:
        if self.spec.latency is None:
            raise ValueError("spec.latency.sloSeconds is required in a simulation (SLO attainment is measured)")
        if self.spec.latency.slo_seconds <= self.simulation.base_latency_seconds:
            raise ValueError(
                f"spec.latency.sloSeconds ({self.spec.latency.slo_seconds}) must exceed "
                f"simulation.baseLatencySeconds ({self.simulation.base_latency_seconds})"
            )
        return self


class Baselines(_Strict):
    hpa_target_utilization: float = Field(
        70.0, alias="hpaTargetUtilization", gt=0, le=100,
        description="the HPA baseline's GPU utilisation target, percent (the seed article's 70 %)",
    )
    hpa_behavior: bool = Field(
        False, alias="hpaBehavior",
        description="give the HPA baseline the defaulted behavior block (scale-up max(+4 pods, +100 %) per 15 s, "
        "scale-down 100 % per 15 s); false: an HPA without one, as most run (max(2 x current, 4) per sync)",
    )
    static_headroom: float = Field(
        1.0, alias="staticHeadroom", ge=1.0, le=100.0,
        description="static policy: replicas for the peak times this factor",
    )


class Forecasting(_Strict):
    """How the simulator's ``predictive`` policy forecasts (the controller's refit job has the same settings)."""

    model: str = Field(
        "phase_naive",
        description="forecaster name (see `autoscaler backtest --help` for the list); the default is the "
        "controller's (forecast.model)",
    )
    refit_seconds: float = Field(
        3600.0, alias="refitSeconds", ge=60, description="full refit period, seconds (at most one a minute)"
    )
    update_seconds: float = Field(
        300.0, alias="updateSeconds", gt=0, description="conditioning on new data with fitted parameters, seconds"
    )
    history_seconds: float = Field(
        7 * 86400.0, alias="historySeconds", gt=0, le=366 * 86400.0, description="training window, s"
    )
    resolution_seconds: float = Field(
        60.0, alias="resolutionSeconds", ge=1, le=86400, description="forecast step, seconds"
    )
    horizon_seconds: float = Field(1800.0, alias="horizonSeconds", gt=0, description="forecast horizon, seconds")
    min_history_seconds: float = Field(
        1800.0, alias="minHistorySeconds", ge=0, le=366 * 86400.0,
        description="no forecast before this much history, seconds",
    )
    scale_down_hold_leads: float = Field(
        2.0, alias="scaleDownHoldLeads", ge=1, le=10,
        description="a scale-down never goes below what the forecast needs from now to now + this many lead times "
        "(1: until a replica asked for now could serve; 2: also those the floor would add back within a cold "
        "start), lead times (the controller's forecast.scale_down_hold_leads)",
    )
    contended_hold_seconds: float = Field(
        1800.0, alias="contendedHoldSeconds", ge=0, le=86400.0,
        description="while lower-priority GPU work waits, a scale-down that would free a node enough for it keeps "
        "what the forecast needs this far past the lead time (as far as the forecast reaches) when the replicas "
        "wanted back would then not fit elsewhere, seconds (the controller's forecast.contended_hold_seconds)",
    )
    calibrated_excess: bool = Field(
        True, alias="calibratedExcess",
        description="the forecast floor provisions the share of the quantile's excess over the median that the "
        "scores of the accountability window needed (the controller's forecast.calibrated_excess), on/off",
    )
    model_params: dict[str, Any] = Field(
        default_factory=dict,
        alias="modelParams",
        description="constructor parameters of the forecaster overriding its defaults, e.g. {residual_window: 40320}",
    )

    @model_validator(mode="after")
    def _horizon(self) -> Forecasting:
        if self.horizon_seconds <= self.update_seconds:
            raise ValueError("horizonSeconds must exceed updateSeconds (the forecast must last until the next one)")
        return self

    @model_validator(mode="after")
    def _min_history(self) -> Forecasting:
        # The training window keeps about historySeconds: a longer minimum is never reached, and the predictive
        # policy would replay reactive under its name (the controller's settings refuse the same pair).
        if self.min_history_seconds > self.history_seconds:
            raise ValueError(
                f"minHistorySeconds ({self.min_history_seconds:g}) must be <= historySeconds "
                f"({self.history_seconds:g}): the training window never holds more, so no forecast would be made"
            )
        return self

    @model_validator(mode="after")
    def _sizes(self) -> Forecasting:
        if self.history_seconds < self.resolution_seconds:
            raise ValueError(
                f"historySeconds ({self.history_seconds:g}) must be at least resolutionSeconds "
                f"({self.resolution_seconds:g}): the training window holds whole forecast steps"
            )
        points = self.horizon_seconds / self.resolution_seconds
        if points > MAX_FORECAST_POINTS:
            raise ValueError(
                f"horizonSeconds: {self.horizon_seconds:g} s at resolutionSeconds {self.resolution_seconds:g} s is "
                f"{points:,.0f} forecast points, more than the maximum of {MAX_FORECAST_POINTS:,}"
            )
        return self

    @model_validator(mode="after")
    def _known_model(self) -> Forecasting:
        from forecast.registry import make_model

        if "quantiles" in self.model_params:
            raise ValueError("modelParams: quantiles come from each service's spec.forecast.quantile, not from here")
        try:
            estimator = make_model(self.model)
        except ValueError as exc:
            raise ValueError(f"model: {exc}") from None
        params = _checked_model_params(type(estimator), self.model_params)
        try:
            make_model(self.model, **params)  # an unknown parameter fails here, not mid-run
        except (ValueError, TypeError) as exc:
            raise ValueError(f"modelParams: {exc}") from None
        return self if params == self.model_params else self.model_copy(update={"model_params": params})

    def to_config(self) -> Any:
        from autoscaler.sim.predictive import ForecastingConfig

        return ForecastingConfig(
            model=self.model,
            refit_s=self.refit_seconds,
            update_s=self.update_seconds,
            history_s=self.history_seconds,
            resolution_s=self.resolution_seconds,
            horizon_s=self.horizon_seconds,
            min_history_s=self.min_history_seconds,
            model_params=dict(self.model_params),
            contended_hold_s=self.contended_hold_seconds,
            calibrated_excess=self.calibrated_excess,
            scale_down_hold_leads=self.scale_down_hold_leads,
        )


def _checked_model_params(estimator: type, params: dict[str, Any], quoted: bool = False) -> dict[str, Any]:
    """``params`` converted to the types the forecaster's constructor declares, so that a wrong type (a string for
    a window, ``true`` for a period, NaN) fails here and not in the middle of a run. Names the constructor does not
    take are left for the constructor to refuse. ``quoted``: a number may be given as text (the controller's
    environment, ``AUTOSCALER_FORECAST__MODEL_PARAMS__<NAME>``)."""
    try:
        parameters = inspect.signature(estimator, eval_str=True).parameters
    except (NameError, TypeError, ValueError):  # pragma: no cover - every registered forecaster's annotations resolve
        return dict(params)
    hints = {name: p.annotation for name, p in parameters.items() if p.annotation is not inspect.Parameter.empty}
    checked: dict[str, Any] = {}
    for key, value in params.items():
        hint = hints.get(key)
        if hint is None:
            checked[key] = value
            continue
        problems: list[tuple[_Loc, str]] = []
        _input_problems(hint, value, (), problems, set(), quoted)
        if problems:
            raise ValueError(f"modelParams.{key}{_where(problems[0][0], prefix='.')}: {problems[0][1]}")
        try:
            checked[key] = TypeAdapter(hint, config=ConfigDict(allow_inf_nan=False)).validate_python(value)
        except ValidationError as error:
            item = error.errors()[0]
            raise ValueError(f"modelParams.{key}{_where(item['loc'], prefix='.')}: {item['msg']}") from None
    return checked


class TrainingJob(_Strict):
    """One training job of a scenario (a batch Job of ``pods`` pods, run as a gang)."""

    name: str = Field(min_length=1, max_length=63, description="Job name")
    pods: int = Field(1, ge=1, le=1024, description="pods of the gang (workers)")
    gpus_per_pod: int = Field(8, alias="gpusPerPod", ge=1, le=64, description="GPUs per pod")
    priority: int = Field(100, ge=-MAX_INT, le=MAX_INT, description="PriorityClass value")
    work_seconds: float = Field(
        alias="workSeconds", gt=0, le=366 * 86400.0, description="training time it needs with its whole gang, s"
    )
    checkpoint_seconds: float = Field(
        1800.0, alias="checkpointSeconds", gt=0, le=86400.0, description="a checkpoint every this much work, s"
    )
    submit_seconds: float = Field(
        0.0, alias="submitSeconds", ge=0, le=366 * 86400.0, description="submitted this long after the start, s"
    )
    preemptible: bool = Field(True, description="false: labelled gpuautoscaler.dev/preemptible=false")
    restart_seconds: float = Field(
        60.0, alias="restartSeconds", ge=0, le=3600.0, description="pod bound to training (pull + checkpoint load), s"
    )


class TrainingGenerator(_Strict):
    """Training jobs drawn from a runtime trace: Poisson submissions, runtimes sampled from the trace."""

    runtimes: str = Field(
        "builtin:philly-runtimes",
        description="runtimes file (one column of seconds, header line), or builtin:philly-runtimes (Microsoft "
        "Philly job runtimes, CC-BY-4.0)",
    )
    count: int = Field(20, ge=1, le=10_000, description="jobs to generate")
    seed: int = Field(0, ge=0, le=MAX_INT, description="random seed")
    mean_interarrival_seconds: float = Field(
        3600.0, alias="meanInterarrivalSeconds", gt=0, le=30 * 86400.0, description="mean time between submissions, s"
    )
    pods: list[int] = Field(
        default_factory=lambda: [1, 2, 4], min_length=1, max_length=16, description="gang sizes to draw from"
    )
    pods_weights: list[float] | None = Field(
        None, alias="podsWeights", description="weights of the gang sizes (default: equal)"
    )
    gpus_per_pod: int = Field(8, alias="gpusPerPod", ge=1, le=64, description="GPUs per pod")
    priority: int = Field(100, ge=-MAX_INT, le=MAX_INT, description="PriorityClass value of the jobs")
    checkpoint_seconds: float = Field(1800.0, alias="checkpointSeconds", gt=0, le=86400.0)
    max_work_seconds: float = Field(
        86400.0, alias="maxWorkSeconds", gt=0, le=366 * 86400.0, description="runtimes are clipped to this, s"
    )
    restart_seconds: float = Field(60.0, alias="restartSeconds", ge=0, le=3600.0)

    @model_validator(mode="after")
    def _weights(self) -> TrainingGenerator:
        if self.pods_weights is not None:
            if len(self.pods_weights) != len(self.pods):
                raise ValueError("podsWeights: one weight per entry of pods")
            if any(w < 0 for w in self.pods_weights) or sum(self.pods_weights) <= 0:
                raise ValueError("podsWeights: weights are >= 0 and not all 0")
            if not math.isfinite(sum(self.pods_weights)):
                # each weight is finite, but their sum is not: every weight / sum would be 0 and no size drawn
                raise ValueError(
                    "podsWeights: the weights add up to more than the largest finite number: give them as smaller "
                    "numbers in the same proportions (e.g. shares that add up to 1)"
                )
        if any(p < 1 or p > 1024 for p in self.pods):
            raise ValueError("pods: gang sizes are 1 to 1024")
        return self


def generated_job_name(index: int) -> str:
    """The name of the ``index``-th job drawn by ``training.generate``."""
    return f"gen-{index:04d}"


class Training(_Strict):
    """Training sharing the cluster with inference (issue 12): jobs listed, generated, or both."""

    source: str = Field("", description="where the job sizes and runtimes come from (named in the report)")
    namespace: str = Field("training", min_length=1)
    _namespace = field_validator("namespace")(_namespace_name)
    min_runtime_seconds: float = Field(
        600.0, alias="minRuntimeSeconds", ge=0, le=86400.0, description="a gang is never stopped younger than this, s"
    )
    jobs: list[TrainingJob] = Field(default_factory=list, max_length=10_000)
    generate: TrainingGenerator | None = None
    rebalance_allowed: bool = Field(
        False, alias="rebalanceAllowed",
        description="the jobs' pods carry gpuautoscaler.dev/rebalance=allowed: the rebalancer may move a gang whole "
        "(when it checkpointed within rebalance.checkpointMaxAgeSeconds)",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> Training:
        # At load, naming the job: the check after the runtime trace was read named none.
        seen: set[str] = set()
        generated = {generated_job_name(i) for i in range(self.generate.count)} if self.generate is not None else set()
        for index, job in enumerate(self.jobs):
            if job.name in seen:
                raise ValueError(f"jobs.{index}.name: {job.name!r} is the name of an earlier job: job names are unique")
            if job.name in generated:
                raise ValueError(
                    f"jobs.{index}.name: {job.name!r} is the name of a generated job (generate.count "
                    f"{self.generate.count if self.generate else 0} names gen-0000 onwards): job names are unique"
                )
            seen.add(job.name)
        return self


class Capacity(_Strict):
    """The controller's capacity arbitration settings (the controller's --capacity-* settings)."""

    training_gpu_hour_value: float = Field(
        2.0, alias="trainingGpuHourValue", ge=0, le=10_000,
        description="what one training GPU-hour is worth, lost or delayed, $ per GPU-hour",
    )
    slo_risk_per_gpu_hour: float = Field(
        20.0, alias="sloRiskPerGpuHour", ge=0, le=100_000,
        description="cost of one GPU-hour of inference demand left without a GPU (during a node's boot; and a "
        "forecast shortfall that would cost less than this left unserved is waited out while latency meets the "
        "SLO), $ per GPU-hour",
    )
    slo_miss_per_1k_requests: float = Field(
        1.0, alias="sloMissPer1kRequests", ge=0, le=100_000,
        description="the report's total cost counts this per 1,000 requests outside the SLO, $",
    )
    assumed_shortfall_seconds: float = Field(
        1800.0, alias="assumedShortfallSeconds", gt=0, le=86400.0,
        description="how long a shortfall lasts when no usable forecast says, s",
    )
    shortfall_confirm_seconds: float = Field(
        30.0, alias="shortfallConfirmSeconds", ge=0, le=3600.0,
        description="a shortfall no usable forecast vouches for stops training or buys nodes only once it has lasted "
        "this long, s (0: at its first step)",
    )
    burst_idle_cooldown_seconds: float = Field(600.0, alias="burstIdleCooldownSeconds", ge=0, le=86400.0)
    resume_after_seconds: float = Field(300.0, alias="resumeAfterSeconds", ge=0, le=86400.0)
    consolidate_horizon_seconds: float = Field(
        1800.0, alias="consolidateHorizonSeconds", ge=0, le=86400.0,
        description="a busy burst node is emptied when stopping training for its replicas costs less than keeping "
        "it this long, seconds (0: never)",
    )
    choose_scale_down_replicas: bool = Field(
        False, alias="chooseScaleDownReplicas",
        description="while lower-priority GPU work waits, a scale-down deletes the replicas on the nodes with the most "
        "free GPUs first (the controller's pod-deletion-cost marks; capacity.choose_scale_down_replicas)",
    )
    expanders: list[Literal["least-waste", "cheapest", "priority"]] = Field(
        default_factory=lambda: ["least-waste", "cheapest"],  # type: ignore[arg-type]
        min_length=1,
        max_length=3,
    )
    spend_cap_per_hour: float | None = Field(None, alias="spendCapPerHour", ge=0, le=1e9)
    preemptible_below_priority: int = Field(
        1000, alias="preemptibleBelowPriority", ge=-MAX_INT, le=MAX_INT,
        description="training gangs with a lower PriorityClass value may be preempted",
    )


class Rebalance(_Strict):
    """The controller's rebalancer (issue 15): bounded pod moves against GPU fragmentation and to empty burst nodes
    before their give-back (``autoscaler.core.rebalance``). Off unless ``enabled``; it runs beside the controller's
    policies (``predictive``, ``reactive``), not the baselines."""

    enabled: bool = Field(False, description="run the rebalancer beside the controller's policies")
    interval_seconds: float = Field(
        300.0, alias="intervalSeconds", gt=0, le=86400.0, description="seconds between rebalance passes"
    )
    max_moves_per_pass: int = Field(
        2, alias="maxMovesPerPass", ge=0, le=1000, description="pods moved (evicted) in one pass, at most"
    )
    max_moves_per_hour: int = Field(
        8, alias="maxMovesPerHour", ge=0, le=100_000, description="pods moved over any hour, at most"
    )
    min_gain_per_move: float = Field(
        2.0, alias="minGainPerMove", ge=0, le=10_000,
        description="GPUs made usable per pod moved, at least (Karpenter's savings / disruption)",
    )
    checkpoint_max_age_seconds: float = Field(
        600.0, alias="checkpointMaxAgeSeconds", ge=0, le=86400.0,
        description="a training gang (labelled movable) moves only if it checkpointed this recently, s",
    )
    burst_empty_below: float = Field(
        0.5, alias="burstEmptyBelow", ge=0, le=1,
        description="a burst node with less than this share of its GPUs in use is emptied",
    )
    retry_after_seconds: float = Field(
        1800.0, alias="retryAfterSeconds", ge=0, le=7 * 86400.0,
        description="a target whose moves were made is not moved for again within this, s",
    )
    retry_after_max_seconds: float = Field(
        14400.0, alias="retryAfterMaxSeconds", ge=0, le=7 * 86400.0,
        description="each further pass of moves for a target still waiting doubles retryAfterSeconds, up to this, s",
    )
    put_back_checks: int = Field(
        3, alias="putBackChecks", ge=0, le=100,
        description="after this many targets moved for in a row whose room was refilled, moves hold putBackHoldSeconds",
    )
    put_back_hold_seconds: float = Field(
        14400.0, alias="putBackHoldSeconds", ge=0, le=7 * 86400.0,
        description="how long moves are held after putBackChecks refilled rooms in a row, s",
    )
    put_back_watch_seconds: float = Field(
        900.0, alias="putBackWatchSeconds", ge=0, le=86400.0,
        description="a target still fitting where its moves made room this long after them had its room kept, s",
    )
    spare_replicas_only: bool = Field(
        True, alias="spareReplicasOnly",
        description="move a replica only when the tick recommended fewer replicas than the Deployment runs",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Rebalance:
        if self.max_moves_per_pass > self.max_moves_per_hour:
            raise ValueError(
                f"maxMovesPerPass ({self.max_moves_per_pass}) must be <= maxMovesPerHour ({self.max_moves_per_hour})"
            )
        if self.retry_after_max_seconds < self.retry_after_seconds:
            raise ValueError(
                f"retryAfterMaxSeconds ({self.retry_after_max_seconds:g}) must be >= retryAfterSeconds "
                f"({self.retry_after_seconds:g}): the wait only grows"
            )
        return self


class Scenario(_Strict):
    name: str = Field(
        min_length=1,
        description="scenario name, used for output file names (out/<name>.json): letters, digits, '-', '_', '.', "
        "':', not starting with '.', '-' or ':', at most 100 characters",
    )
    description: str = ""
    step_seconds: float = Field(15.0, alias="stepSeconds", ge=1, le=3600, description="simulation step = tick, s")
    duration_seconds: float | None = Field(
        None, alias="durationSeconds", gt=0,
        description=f"simulated time, seconds (default: the shortest trace); at most {MAX_STEPS:,} steps",
    )
    metrics_delay_seconds: float = Field(
        30.0, alias="metricsDelaySeconds", ge=0, le=3600,
        description="age of the metrics the controller sees (DCGM collect 30 s + scrape), seconds",
    )
    node_pools: list[NodePool] = Field(alias="nodePools", min_length=1, max_length=MAX_NODE_POOLS)
    gpu_scoring: Literal["LeastAllocated", "MostAllocated", "Fragmentation"] = Field(
        "LeastAllocated", alias="gpuScoring",
        description="how the simulated scheduler scores nodes for GPU pods: LeastAllocated (the Kubernetes default, "
        "spreads), MostAllocated (bin-packs GPUs, keeps whole nodes free) or Fragmentation (LeastAllocated plus this "
        "project's scheduler extender: FGD's score for the live pods' task mix, at the shipped weight 5)",
    )
    services: list[ServiceEntry] = Field(min_length=1, max_length=MAX_SERVICES)
    baselines: Baselines = Field(default_factory=Baselines)
    forecasting: Forecasting = Field(default_factory=Forecasting)
    training: Training | None = None
    capacity: Capacity = Field(default_factory=Capacity)
    rebalance: Rebalance = Field(default_factory=Rebalance)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        if NAME_PATTERN.fullmatch(name) is None:
            shown = name if len(name) <= 60 else name[:57] + "..."
            raise ValueError(
                f"{shown!r} is not a safe file name (it names out/<name>.json and .png): use letters, digits, "
                "'-', '_', '.' and ':', not starting with '.', '-' or ':', at most 100 characters"
            )
        return name

    @model_validator(mode="after")
    def _run_size(self) -> Scenario:
        if self.duration_seconds is not None:
            self.check_run_size(math.ceil(self.duration_seconds / self.step_seconds), "durationSeconds",
                                self.duration_seconds)
        return self

    def replica_bound(self) -> int:
        """Most ready replicas the services can have at once, summed: maxReplicas, bounded by the pools' GPUs."""
        gpus = sum(pool.node_limit * pool.gpus_per_node for pool in self.node_pools)
        return sum(min(s.spec.max_replicas, gpus // s.spec.gpus_per_replica) for s in self.services)

    def check_run_size(self, steps: int, over: str, seconds: float) -> None:
        """Refuse (ValueError naming the field) a run of more than MAX_STEPS steps, MAX_SERVICE_STEPS service-steps
        or MAX_REPLICA_STEPS replica-steps; ``over`` is what the ``seconds`` are: durationSeconds or the trace."""
        step_s, services = self.step_seconds, len(self.services)
        if steps > MAX_STEPS:
            raise ValueError(
                f"stepSeconds: {step_s:g} s over {over} ({seconds:,.0f} s) is {steps:,} steps, more than the maximum "
                f"of {MAX_STEPS:,} simulation steps: use a longer stepSeconds or a shorter durationSeconds"
            )
        if steps * services > MAX_SERVICE_STEPS:
            raise ValueError(
                f"services: {services:,} services x {steps:,} steps of {step_s:g} s is {steps * services:,} "
                f"service-steps, more than the maximum of {MAX_SERVICE_STEPS:,}: use a longer stepSeconds, a shorter "
                "durationSeconds or fewer services"
            )
        replicas = self.replica_bound()
        if steps * replicas > MAX_REPLICA_STEPS:
            raise ValueError(
                f"services: up to {replicas:,} replicas (maxReplicas, within the node pools' GPUs) x {steps:,} steps "
                f"of {step_s:g} s is {steps * replicas:,} replica-steps, more than the maximum of "
                f"{MAX_REPLICA_STEPS:,} (the latency model costs one Erlang C term per replica and step): use a "
                "longer stepSeconds, a shorter durationSeconds or lower maxReplicas"
            )

    @model_validator(mode="after")
    def _placeable(self) -> Scenario:
        """Every replica and every training pod fits on a node some pool can have (else it would never be placed
        and the run would report the result of a cluster that cannot exist)."""
        usable = [pool for pool in self.node_pools if pool.node_limit > 0]
        if not usable:
            raise ValueError(
                "nodePools: no pool can ever have a node (every pool has nodes: 0, and none is a burst pool with "
                "maxNodes > 0): nothing could be placed"
            )
        largest = max(pool.gpus_per_node for pool in usable)
        if len(usable) == 1:  # the only pool that can have a node
            hosts = f"the gpusPerNode ({largest}) of node pool {usable[0].name!r}, the only pool that can have a node"
        elif all(pool.gpus_per_node == largest for pool in usable):
            hosts = f"every node pool's gpusPerNode ({largest})"
        else:
            hosts = f"every node pool's gpusPerNode (at most {largest})"
        problems: list[str] = []
        for index, service in enumerate(self.services):
            gpus = service.spec.gpus_per_replica
            if gpus > largest:
                problems.append(
                    f"services.{index}.spec.gpusPerReplica ({gpus}) exceeds {hosts}: no replica could "
                    "ever be placed"
                )
        if self.training is not None:
            # Burst pools are tainted for inference only (their nodes are bought for replicas, as the controller's
            # are): training runs on the pools that are not burst pools, or nowhere.
            on_prem = [pool for pool in usable if not pool.burst]
            train_largest = max((pool.gpus_per_node for pool in on_prem), default=0)
            if not on_prem:
                train_hosts = "any node: every pool is a burst pool, and burst pools take inference only"
            elif len(on_prem) == 1:
                train_hosts = (
                    f"the gpusPerNode ({train_largest}) of node pool {on_prem[0].name!r}, the only pool training can "
                    "use (burst pools take inference only)"
                )
            elif all(pool.gpus_per_node == train_largest for pool in on_prem):
                train_hosts = f"every non-burst node pool's gpusPerNode ({train_largest})"
            else:
                train_hosts = f"every non-burst node pool's gpusPerNode (at most {train_largest})"
            for index, job in enumerate(self.training.jobs):
                problem = _gang_problem(on_prem, job.pods, job.gpus_per_pod, train_hosts, train_largest)
                if problem is not None:
                    problems.append(f"training.jobs.{index}.{problem}: the job could never start")
            generator = self.training.generate
            if generator is not None:
                weights = generator.pods_weights or [1.0] * len(generator.pods)
                for pods in sorted({size for size, weight in zip(generator.pods, weights, strict=True) if weight > 0}):
                    problem = _gang_problem(on_prem, pods, generator.gpus_per_pod, train_hosts, train_largest)
                    if problem is not None:
                        problems.append(f"training.generate.{problem}: its jobs could never start")
        if len(problems) > MAX_LISTED_PROBLEMS:
            problems[MAX_LISTED_PROBLEMS:] = [f"... and {len(problems) - MAX_LISTED_PROBLEMS:,} more"]
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        pools = {p.name for p in self.node_pools}
        if len(pools) != len(self.node_pools):
            raise ValueError("nodePools: pool names must be unique")
        keys = [(s.metadata.namespace, s.spec.target_ref.name) for s in self.services]
        if len(set(keys)) != len(keys):
            raise ValueError("services: two services scale the same namespace/Deployment")
        return self


def _gang_problem(pools: list[NodePool], pods: int, gpus_per_pod: int, hosts: str, largest: int) -> str | None:
    """What keeps a gang of ``pods`` pods of ``gpus_per_pod`` GPUs each from ever being placed whole on the ``pools``
    at their largest (``gpusPerPod (N) exceeds ...`` or ``pods (N) ...``), or None when it fits."""
    if gpus_per_pod > largest:
        return f"gpusPerPod ({gpus_per_pod}) exceeds {hosts}"
    room = sum(pool.node_limit * (pool.gpus_per_node // gpus_per_pod) for pool in pools)
    if pods > room:
        return (
            f"pods ({pods}) x gpusPerPod ({gpus_per_pod}): the node pools training can use (not the burst pools) "
            f"hold at most {room} such pods at once and a gang is placed whole"
        )
    return None


# ---- checks on the raw YAML values, before pydantic converts them ---------------------------------------------------
# Pydantic's lax mode reads `true` as 1 where a number is expected, and the policy spec (shared with the controller)
# accepts NaN and infinity; these walks go over the input along the models' field types and name what is wrong.

_Loc = tuple[str | int, ...]


def _number_problem(value: Any, integer: bool, quoted: bool) -> str | None:
    if isinstance(value, bool):
        return "Input should be a number, not a boolean (true/false)"
    number: Any = value
    if isinstance(value, str | bytes):
        try:
            number = float(value)
        except ValueError:
            return None  # not a number at all: pydantic says so
        if not quoted:
            # pydantic's lax mode reads "15" as 15; a service's spec refuses it (as the CRD's number types do), and
            # so does the rest of the file
            return "Input should be a number, not a string (remove the quotes)"
    if isinstance(number, float) and not math.isfinite(number):
        return "Input should be a finite number (not NaN or infinity)"
    if integer and isinstance(number, int | float) and abs(number) > MAX_INT:
        return f"Input should be at most {MAX_INT:,} in magnitude (a 32-bit integer)"
    return None


def _input_problems(
    annotation: Any,
    value: Any,
    loc: _Loc,
    problems: list[tuple[_Loc, str]],
    seen: set[tuple[int, int]],
    quoted: bool = False,
) -> None:
    """Append (location, problem) for every boolean or quoted number (unless ``quoted``: the environment's values
    are text) given as a number, non-boolean given as a boolean, and non-finite or over-large number in ``value``,
    read as ``annotation``. A YAML node shared through aliases is visited once per type it is read as (so a "billion
    laughs" costs its size in memory, not its expansion)."""
    if value is None:
        return
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a constrained type (Annotated[int, Ge(1)]): the constraints are pydantic's
        _input_problems(typing.get_args(annotation)[0], value, loc, problems, seen, quoted)
        return
    if origin is typing.Union or origin is types.UnionType:
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(options) == 1:
            _input_problems(options[0], value, loc, problems, seen, quoted)
        return
    if annotation is bool:
        if not isinstance(value, bool):
            problems.append((loc, "Input should be true or false"))
        return
    if annotation is int or annotation is float:
        problem = _number_problem(value, integer=annotation is int, quoted=quoted)
        if problem is not None:
            problems.append((loc, problem))
        return
    if isinstance(value, bool) and (
        annotation is str
        or origin is typing.Literal
        or (inspect.isclass(annotation) and issubclass(annotation, enum.Enum))
    ):
        # `mode: off` is the boolean false to YAML 1.1 (and to kubectl): "should be 'off'" would tell the user to
        # write what they wrote
        problems.append(
            (loc, f"read as the boolean {str(value).lower()} (YAML reads unquoted on/off/yes/no as booleans): quote "
                  'the value, e.g. "off"')
        )  # fmt: skip
        return
    visit = (id(value), id(annotation))
    if visit in seen:
        return
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        if isinstance(value, dict):
            seen.add(visit)
            for name, info in annotation.model_fields.items():
                for key in dict.fromkeys((info.alias or name, name)):
                    if key in value:
                        _input_problems(info.annotation, value[key], (*loc, key), problems, seen, quoted)
        return
    if isinstance(value, list) and origin in (list, tuple, collections.abc.Sequence):
        seen.add(visit)
        args = typing.get_args(annotation)
        for index, item in enumerate(value):
            if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
                item_type = args[index] if index < len(args) else None
            else:
                item_type = args[0] if args else None
            _input_problems(item_type, item, (*loc, index), problems, seen, quoted)
    # Anything else (str, enums, literals, modelParams' free-form values) is pydantic's, or _checked_model_params'.


def _non_finite(model: BaseModel, loc: _Loc = ()) -> list[tuple[_Loc, str]]:
    """Every non-finite float left in a validated model (the walk above should have caught them all)."""
    problems: list[tuple[_Loc, str]] = []
    for name, info in type(model).model_fields.items():
        stack: list[tuple[_Loc, Any]] = [((*loc, info.alias or name), getattr(model, name))]
        while stack:
            where, value = stack.pop()
            if isinstance(value, float) and not math.isfinite(value):
                problems.append((where, "Input should be a finite number (not NaN or infinity)"))
            elif isinstance(value, BaseModel):
                problems.extend(_non_finite(value, where))
            elif isinstance(value, list | tuple):
                stack.extend(((*where, index), item) for index, item in enumerate(value))
    return problems


def _part(part: Any) -> str:
    text = str(part)
    if len(text) > 60 or not text.isprintable():
        text = repr(text[:57] + "..." if len(text) > 60 else text)
    return text


def _where(loc: _Loc | tuple[Any, ...], prefix: str = "") -> str:
    return prefix + ".".join(_part(part) for part in loc) if loc else ""


def _format_problems(problems: list[tuple[_Loc, str]]) -> str:
    lines = []
    for loc, message in problems[:MAX_LISTED_PROBLEMS]:
        # Errors of a whole-scenario check carry their field at the start of the message.
        lines.append(f"  {_where(loc)}: {message}" if loc else f"  {message}")
    if len(problems) > MAX_LISTED_PROBLEMS:
        lines.append(f"  ... and {len(problems) - MAX_LISTED_PROBLEMS:,} more")
    return "\n".join(lines)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    problems: list[tuple[_Loc, str]] = []
    _input_problems(Scenario, data, (), problems, set())
    scenario: Scenario | None = None
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as error:
        flagged = {loc for loc, _ in problems}
        for item in error.errors():
            loc = tuple(item["loc"])
            # Said already, or a check of the model holding a value said to be wrong (it read that value wrongly).
            if any(loc == bad[: len(loc)] for bad in flagged):
                continue
            message = item["msg"].removeprefix("Value error, ")
            if not loc and item["type"] != "value_error":
                message = f"(top level): {message}"  # a whole-scenario check's own message starts with its field
            problems.append((loc, message))
    except RecursionError:
        problems.append(((), "(top level): nested too deeply"))
    if scenario is not None and not problems:
        problems = _non_finite(scenario)
    if problems or scenario is None:  # scenario is None only with problems
        raise ScenarioError(f"{source}: invalid scenario\n{_format_problems(problems)}")
    return scenario


def _read_scenario_text(path: Path) -> str:
    problem = None
    raw = b""
    try:
        if path.is_dir():
            problem = "it is a directory"
        elif path.exists() and not path.is_file():
            problem = "not a regular file"  # a FIFO or a device would block or never end
        else:
            with path.open("rb") as stream:
                raw = stream.read(MAX_SCENARIO_BYTES + 1)
    except OSError as error:
        problem = str(error.strerror or error)
    except ValueError as error:  # e.g. a NUL byte in the path
        problem = str(error)
    if problem is None and len(raw) > MAX_SCENARIO_BYTES:
        problem = f"larger than {MAX_SCENARIO_BYTES // (1024 * 1024)} MiB"
    if problem is not None:
        raise ScenarioError(f"{path}: cannot read scenario: {problem}")
    # A byte-order mark is dropped first: positions in the error count from the text after it.
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise ScenarioError(f"{path}:{line}:{column}: not UTF-8 text (byte 0x{raw[error.start]:02x})") from None


def load_scenario(path: str | Path) -> tuple[Scenario, Path]:
    """The scenario and the directory its relative trace paths are resolved against."""
    path = Path(path)
    text = _read_scenario_text(path)
    try:
        data = load_yaml(text)  # safe, and a key given twice is an error
    except YamlProblem as error:
        where = f":{error.line}:{error.column}" if error.line is not None else ""
        raise ScenarioError(f"{path}{where}: not valid YAML: {error.problem}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario is a YAML mapping with nodePools and services")
    return parse_scenario(data, str(path)), path.parent


def default_scenario_path() -> Path:
    return SCENARIO_DIR / "default.yaml"
