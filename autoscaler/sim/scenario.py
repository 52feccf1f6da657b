"""Scenario files for the simulator (YAML), validated by pydantic.

A scenario describes node pools, inference services and the step length. Services are written exactly as the
``GPUScalingPolicy`` custom resources the controller reads in a cluster, plus a ``simulation`` block that says
where the demand comes from and how fast a replica is. See ``autoscaler/sim/scenarios/default.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autoscaler.policy import API_GROUP, API_VERSION, KIND, GPUScalingPolicySpec

BUILTIN_PREFIX = "builtin:"
SCENARIO_DIR = Path(__file__).parent / "scenarios"


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the file, the field and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class NodePool(_Strict):
    name: str = Field(min_length=1, description="node pool name (the node-pool label value in a cluster)")
    gpu_type: str = Field("A100-80GB", alias="gpuType", description="GPU product, informational")
    gpus_per_node: int = Field(8, alias="gpusPerNode", ge=1, le=64, description="GPUs per node")
    nodes: int = Field(ge=0, description="nodes always present (on-premises or reserved)")
    burst: bool = Field(False, description="whether nodes can be added on demand (a cloud burst pool)")
    max_nodes: int | None = Field(None, alias="maxNodes", ge=0, description="upper bound on nodes for a burst pool")
    boot_seconds: float = Field(300.0, alias="bootSeconds", ge=0, description="request to GPU-ready node, seconds")
    price_per_gpu_hour: float = Field(0.0, alias="pricePerGpuHour", ge=0, description="price of one GPU-hour, $")
    scale_down_unneeded_seconds: float = Field(
        600.0, alias="scaleDownUnneededSeconds", ge=0,
        description="a burst node is removed after its GPUs were unneeded this long (Cluster Autoscaler: 10 min)",
    )

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
    trace_scale: float = Field(1.0, alias="traceScale", gt=0, description="multiplier on the trace's request rate")
    bin_seconds: float = Field(
        60.0, alias="binSeconds", gt=0, le=3600,
        description="demand is averaged over bins of this many seconds before it reaches the latency model "
        "(a steady-state queue model; request counts in shorter bins are mostly arrival noise), seconds",
    )
    throughput_per_replica: float = Field(
        alias="throughputPerReplica", gt=0, description="requests/s one replica completes at saturation"
    )
    base_latency_seconds: float = Field(
        alias="baseLatencySeconds", gt=0, description="latency of a request that does not queue, seconds"
    )


class Metadata(_Strict):
    name: str = Field(min_length=1)
    namespace: str = Field("default", min_length=1)


class ServiceEntry(_Strict):
    api_version: str = Field(f"{API_GROUP}/{API_VERSION}", alias="apiVersion")
    kind: Literal["GPUScalingPolicy"] = KIND
    metadata: Metadata
    spec: GPUScalingPolicySpec
    simulation: ServiceSimulation

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
    static_headroom: float = Field(
        1.0, alias="staticHeadroom", ge=1.0, description="static policy: replicas for the peak times this factor"
    )


class Forecasting(_Strict):
    """How the simulator's ``predictive`` policy forecasts (the controller's refit job has the same settings)."""

    model: str = Field("last_value", description="forecaster name (see `autoscaler backtest --help` for the list)")
    refit_seconds: float = Field(3600.0, alias="refitSeconds", gt=0, description="full refit period, seconds")
    update_seconds: float = Field(
        300.0, alias="updateSeconds", gt=0, description="conditioning on new data with fitted parameters, seconds"
    )
    history_seconds: float = Field(7 * 86400.0, alias="historySeconds", gt=0, description="training window, s")
    resolution_seconds: float = Field(60.0, alias="resolutionSeconds", gt=0, description="forecast step, seconds")
    horizon_seconds: float = Field(1800.0, alias="horizonSeconds", gt=0, description="forecast horizon, seconds")
    min_history_seconds: float = Field(
        1800.0, alias="minHistorySeconds", ge=0, description="no forecast before this much history, seconds"
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
    def _known_model(self) -> Forecasting:
        from forecast.registry import make_model

        if "quantiles" in self.model_params:
            raise ValueError("modelParams: quantiles come from each service's spec.forecast.quantile, not from here")
        try:
            make_model(self.model, **self.model_params)  # an unknown model or parameter fails here, not mid-run
        except ValueError as exc:
            raise ValueError(f"model: {exc}") from None
        except TypeError as exc:
            raise ValueError(f"modelParams: {exc}") from None
        return self

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
        )


class Scenario(_Strict):
    name: str = Field(min_length=1, description="scenario name, used for output file names")
    description: str = ""
    step_seconds: float = Field(15.0, alias="stepSeconds", gt=0, le=3600, description="simulation step = tick, s")
    duration_seconds: float | None = Field(
        None, alias="durationSeconds", gt=0, description="simulated time, seconds (default: the shortest trace)"
    )
    metrics_delay_seconds: float = Field(
        30.0, alias="metricsDelaySeconds", ge=0,
        description="age of the metrics the controller sees (DCGM collect 30 s + scrape), seconds",
    )
    node_pools: list[NodePool] = Field(alias="nodePools", min_length=1)
    services: list[ServiceEntry] = Field(min_length=1)
    baselines: Baselines = Field(default_factory=Baselines)
    forecasting: Forecasting = Field(default_factory=Forecasting)

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        pools = {p.name for p in self.node_pools}
        if len(pools) != len(self.node_pools):
            raise ValueError("nodePools: pool names must be unique")
        keys = [(s.metadata.namespace, s.spec.target_ref.name) for s in self.services]
        if len(set(keys)) != len(keys):
            raise ValueError("services: two services scale the same namespace/Deployment")
        return self


def _format_errors(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {location}: {message}")
    return "\n".join(lines)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(f"{source}: invalid scenario\n{_format_errors(error)}") from None


def load_scenario(path: str | Path) -> tuple[Scenario, Path]:
    """The scenario and the directory its relative trace paths are resolved against."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read scenario: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise ScenarioError(f"{path}{where}: not valid YAML: {getattr(error, 'problem', error)}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario is a YAML mapping with nodePools and services")
    return parse_scenario(data, str(path)), path.parent


def default_scenario_path() -> Path:
    return SCENARIO_DIR / "default.yaml"
