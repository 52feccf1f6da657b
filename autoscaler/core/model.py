"""Data types of the pure core: what the controller sees, what it is told, what it decides.

Everything here is immutable and free of I/O. Times are Unix seconds (float) passed in by the caller; the core never
reads a clock. Adapters (Prometheus, Kubernetes) and the simulator build these objects; the core only reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from autoscaler.core.reasons import Reason

if TYPE_CHECKING:
    from autoscaler.core.arbitrate import CapacityReport
    from autoscaler.core.tick import ServiceForecastView


class MetricKind(StrEnum):
    """The per-replica signal a service is scaled on (its target is an average per ready replica)."""

    GPU_UTILIZATION = "gpu_utilization"  # DCGM_FI_DEV_GPU_UTIL, percent 0-100, averaged over the pod's GPUs
    ENGINE_ACTIVE = "engine_active"  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, ratio 0-1
    REQUEST_RATE = "request_rate"  # requests per second
    QUEUE_DEPTH = "queue_depth"  # requests waiting


class Mode(StrEnum):
    ACTIVE = "active"
    RECOMMEND_ONLY = "recommend-only"


class SelectPolicy(StrEnum):
    """How several rate policies of one direction combine (HPA ``selectPolicy``)."""

    MAX = "Max"  # the policy that allows the largest change
    MIN = "Min"  # the policy that allows the smallest change
    DISABLED = "Disabled"  # no scaling in this direction


class RateKind(StrEnum):
    PODS = "Pods"
    PERCENT = "Percent"


@dataclass(frozen=True, slots=True)
class RatePolicy:
    """At most ``value`` pods (or percent of the replicas at the period's start) per ``period_s`` seconds."""

    kind: RateKind
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction of the HPA ``behavior`` block."""

    stabilisation_s: float
    policies: tuple[RatePolicy, ...]
    select: SelectPolicy = SelectPolicy.MAX
    tolerance: float = 0.1  # KEP-4951 per-direction tolerance, a ratio (0.1 = 10 %)


DEFAULT_SCALE_UP = ScalingRules(
    stabilisation_s=0.0,
    policies=(RatePolicy(RateKind.PODS, 4, 15.0), RatePolicy(RateKind.PERCENT, 100, 15.0)),
)
DEFAULT_SCALE_DOWN = ScalingRules(stabilisation_s=300.0, policies=(RatePolicy(RateKind.PERCENT, 100, 15.0),))


class ForecastMode(StrEnum):
    SHADOW = "shadow"  # fit and report the forecast floor, never apply it
    ACTIVE = "active"  # the forecast floor raises the replicas ahead of demand


@dataclass(frozen=True, slots=True)
class ForecastPolicy:
    """How one service uses its demand forecast (``spec.forecast``; absent = forecasting off)."""

    mode: ForecastMode = ForecastMode.SHADOW
    quantile: float = 0.9  # forecast quantile of the request rate provisioned for
    # requests/s one replica carries; None = the metric target when scaling on request_rate, else no floor
    rate_per_replica: float | None = None
    # While the forecast has not earned trust (core.headroom), the reactive path runs at this share of the metric
    # target: no hotter than an HPA's headroom (the forecast floor keeps ratePerReplica). 1.0 turns it off.
    untrusted_target_ratio: float = 0.75


@dataclass(frozen=True, slots=True)
class ServicePolicy:
    """The scaling policy of one inference service (built from the CRD, a scenario file or settings)."""

    namespace: str
    name: str
    min_replicas: int = 1
    max_replicas: int = 10
    metric: MetricKind = MetricKind.GPU_UTILIZATION
    target: float = 70.0  # average per ready replica, in the metric's unit
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    # False: an HPA without a ``behavior`` block. Upstream then takes the behaviour-less path: the highest
    # recommendation of the scale-down window (``scale_down.stabilisation_s``, the controller's
    # --horizontal-pod-autoscaler-downscale-stabilization), a scale-up cap of max(2 x current, 4) per sync, no
    # rate policies. True: the rules above, as an HPA with a (defaulted) behavior block.
    behavior: bool = True
    latency_slo_s: float | None = None  # latency objective (the service's latency quantile), seconds
    slo_guard: bool = True  # scale up when latency > SLO even if the metric is on target
    slo_guard_max_factor: float = 2.0  # SLO guard grows replicas by at most this factor per tick
    gpus_per_replica: int = 1
    cold_start_s: float = 90.0  # pod creation to ready: image pull + model load, seconds
    priority: int = 0
    mode: Mode = Mode.ACTIVE
    forecast: ForecastPolicy | None = None  # None: reactive only, no forecast is fitted
    # the quantile latency_slo_s applies to (spec.latency.quantile, 0.95 = P95); None: the metrics source's default
    latency_quantile: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodMetrics:
    """The scaling metric summed over pods, in the shape the HPA replica calculator needs.

    ``ready_with_metric`` ready pods reported a sample (their sum is ``metric_sum``); ``missing`` ready pods had no
    sample; ``unready`` pods are still starting (not ready, so their metric is not trusted).
    """

    ready_with_metric: int
    metric_sum: float
    missing: int = 0
    unready: int = 0


@dataclass(frozen=True, slots=True)
class ServiceObservation:
    """What the controller sees of one service at one tick.

    A signal that is ``None`` is unknown. ``stale_reasons`` lists why signals are untrusted (empty result, NaN,
    sample too old, Prometheus unreachable...). The core holds on unknown or stale data, never reads it as zero.
    Either ``pods`` (per-pod samples, HPA ``Pods``/``Resource`` metric) or ``metric_total`` (service-wide total,
    HPA ``External`` metric with an average-value target) carries the scaling metric.

    ``partial_reasons`` lists what is incomplete without making the scaling metric untrusted: ready pods without a
    sample (k of n pods reported) or a missing signal of the SLO guard. Partial data never removes capacity (no
    scale-down), but a scale-up on the fresh part of the metric still goes: an exporter down on one node must not
    freeze a service under load.
    """

    key: str
    spec_replicas: int  # replicas on the Deployment's scale subresource now
    ready_replicas: int
    pods: PodMetrics | None = None
    metric_total: float | None = None
    latency_s: float | None = None  # the service's latency quantile (e.g. P95), seconds
    request_rate: float | None = None  # requests per second, whole service
    queue_depth: float | None = None  # requests waiting, whole service
    stale_reasons: tuple[str, ...] = ()
    partial_reasons: tuple[str, ...] = ()
    # The Deployment's (its scale subresource's) ``status.replicas``: pods created for it and not terminating, ready
    # or not; during a scale-up it can lag ``spec_replicas`` (pods not yet created), during a rolling update exceed
    # it (surge pods). The HPA's ``GetExternalPerPodMetricReplicas`` / ``GetObjectPerPodMetricReplicas`` divide a
    # total metric by it and return it inside the tolerance; everything else works on ``spec_replicas``.
    # None: not known (taken as ``spec_replicas``).
    status_replicas: int | None = None

    @property
    def created_replicas(self) -> int:
        """``status_replicas``, or ``spec_replicas`` when it is not known."""
        return self.spec_replicas if self.status_replicas is None else self.status_replicas


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU as dcgm-exporter reports it."""

    node: str
    gpu: str  # index label ``gpu``
    uuid: str
    model_name: str
    utilization: float | None = None  # DCGM_FI_DEV_GPU_UTIL, percent 0-100
    engine_active: float | None = None  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, ratio 0-1
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    namespace: str | None = None  # pod mapping, when dcgm-exporter has it on
    pod: str | None = None
    stale_reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Observation:
    time: float
    services: Mapping[str, ServiceObservation]
    gpus: tuple[GpuSample, ...] = ()


@dataclass(frozen=True, slots=True)
class ServiceState:
    """What the core remembers about one service between ticks (all of it returned, never mutated)."""

    # (time, recommendation before stabilisation), for the stabilisation windows
    recommendations: tuple[tuple[float, int], ...] = ()
    # (time, replica change: + up / - down), for the rate policies
    scale_events: tuple[tuple[float, int], ...] = ()
    # (time, the reactive recommendation: the metric's or the SLO guard's, before the forecast floor), kept for a
    # service with a forecast floor: a scale-down window longer than the spec's holds only these (``core.decide``)
    reactive_recommendations: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CapacityState:
    """What the capacity arbitration (``core.arbitrate``) remembers between ticks. Times are Unix seconds."""

    short_since: float | None = None  # first tick of the current stretch with inference replicas left without GPUs
    free_since: float | None = None  # first tick of the current stretch with no shortfall
    burst_unneeded_since: Mapping[str, float] = field(default_factory=dict)  # burst pool -> since when a node is spare
    # suspended workload "kind/namespace/name" -> since when its GPUs have been free (resume hysteresis)
    resumable_since: Mapping[str, float] = field(default_factory=dict)
    # burst pool -> (since when, how many) nodes the provider counts have not registered as Nodes: past the
    # provision timeout they are no longer capacity on its way
    unregistered_since: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    # burst pool -> (when its requested nodes last went past the provision timeout, how many times in a row): the
    # pool is not grown again for a back-off that doubles with each failure (Cluster Autoscaler's node-group backoff)
    provision_failures: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    # service "namespace/name" -> first tick of its current stretch of replicas left without GPUs (a shortfall
    # without a usable forecast is acted on only once it has lasted ``CapacityConfig.shortfall_confirm_s``)
    service_short_since: Mapping[str, float] = field(default_factory=dict)
    # burst pool -> when a give-back of one of its nodes last failed (the actuator's write): none of its nodes is given
    # back again for ``CapacityConfig.give_back_retry_s`` (Cluster Autoscaler's --scale-down-delay-after-failure)
    give_back_failed_at: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ControllerState:
    services: Mapping[str, ServiceState] = field(default_factory=dict)
    capacity: CapacityState = field(default_factory=CapacityState)


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """The outcome for one service at one tick, whether or not it changes anything."""

    key: str
    current_replicas: int
    desired_replicas: int
    reason: Reason
    detail: str  # the numbers behind the reason, for humans
    recommend_only: bool = False
    # what the metric (with the SLO guard and the forecast floor) asks for this tick, before the scale-down
    # stabilisation and the rate limits; None: no recommendation was made (a hold, a clamp, a failure)
    recommended_replicas: int | None = None

    @property
    def changes(self) -> bool:
        return self.desired_replicas != self.current_replicas


# ---- Actions: what acting on a plan does. Each carries its reason. -----------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleDeployment:
    namespace: str
    name: str
    replicas: int
    previous_replicas: int
    reason: Reason
    detail: str


@dataclass(frozen=True, slots=True)
class EvictPod:
    namespace: str
    name: str
    reason: Reason
    detail: str
    gang: str | None = None
    service: str = ""  # "namespace/name" of the service the GPUs are freed for ("" = none)
    lost_work_gpu_s: float = 0.0  # this pod's share of the work its gang loses since its last checkpoint
    uid: str | None = None  # the pod the plan was made from (a precondition: a successor of the same name is spared)
    # (PodDisruptionBudget "namespace/name", pods of the gang it covers) as the plan saw them: a budget covering
    # several of the gang's pods is checked for all of them at once before the first eviction (a dry run per pod
    # spends nothing, so each passes a budget that allows fewer than the gang needs)
    budgets: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class SuspendWorkload:
    kind: str  # "Job" | "JobSet" | ...
    namespace: str
    name: str
    reason: Reason
    detail: str
    service: str = ""  # "namespace/name" of the service the GPUs are freed for ("" = none)
    lost_work_gpu_s: float = 0.0  # GPUs x seconds since its last checkpoint: the work the stop throws away


@dataclass(frozen=True, slots=True)
class ResumeWorkload:
    """Undo a ``SuspendWorkload`` of ours: the training gets its GPUs back (``spec.suspend: false``)."""

    kind: str
    namespace: str
    name: str
    reason: Reason
    detail: str


@dataclass(frozen=True, slots=True)
class ScaleNodePool:
    """Resize a node pool. A scale-down names the node it emptied (``remove_node``): the provider would otherwise
    pick one by its own delete policy (a MachineSet's is Random), and could remove a busy node instead."""

    pool: str
    nodes: int
    previous_nodes: int
    reason: Reason
    detail: str
    remove_node: str | None = None
    # the stops (of the same plan, before it) this give-back was planned on: the gangs whose GPUs take the node's
    # replicas (a consolidation); given back without them, those replicas would have nowhere to go
    needs: tuple[EvictPod | SuspendWorkload, ...] = ()
    # a burst scale-up: the services ("namespace/name") whose replicas the nodes are for; the growth goes out only if
    # the scale-up of one of them (same plan) was made
    services: tuple[str, ...] = ()
    # a give-back of a node the provider counts that never registered as a Node (past the provision timeout): the
    # provider removes one such Machine (no Node, so no ``remove_node`` to name), never a registered node
    remove_unregistered: bool = False
    # with ``remove_unregistered``, seconds: only a Machine that has itself existed this long (the pool's provision
    # limit) is given back. The core's timer is the pool's: when a MachineHealthCheck has replaced the stuck Machine,
    # the only one left without a Node is the replacement, still booting, and must not be removed for its predecessor
    unregistered_min_age_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SetPodDeletionCost:
    """Set (``cost``) or remove (None) the ``controller.kubernetes.io/pod-deletion-cost`` of one replica of a
    Deployment, with this controller's mark beside it (``gpuautoscaler.dev/deletion-cost-by``): planned right before
    the Deployment's scale-down, so that its ReplicaSet deletes the chosen replicas (``core.scale_down_choice``).
    ``uid``: the pod the plan was made from (a precondition: a successor of the same name is not marked). A mark not
    written never stops the scale-down: the ReplicaSet then deletes in its own order."""

    namespace: str
    name: str
    uid: str | None
    cost: int | None
    reason: Reason
    detail: str
    deployment: str = ""  # the Deployment it is a replica of (its name)


Action = ScaleDeployment | EvictPod | SuspendWorkload | ResumeWorkload | ScaleNodePool | SetPodDeletionCost


@dataclass(frozen=True, slots=True)
class Plan:
    """One tick's plan: a decision per service, and the actions to apply (already filtered for recommend-only)."""

    time: float
    decisions: tuple[ScaleDecision, ...] = ()
    actions: tuple[Action, ...] = ()
    # what the tick made of each forecasting service's forecast (``core.tick.decide_tick`` fills it)
    forecasts: Mapping[str, ServiceForecastView] = field(default_factory=dict)
    # the capacity arbitration's options, costs and choices (``core.arbitrate``); None when arbitration is off
    capacity: CapacityReport | None = None
