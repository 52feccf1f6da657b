"""``decide_tick(tick_input, state, config) -> (plan, state)``: one tick of the whole controller, pure.

The controller's tick job and the simulator both call this and nothing else to decide (issue 11). It takes what the
tick gathered -- the observation, the cluster snapshot, the valid policies and the latest published forecast of each
forecasting service -- and returns one plan for every service:

1. the forecast readout (``read_forecasts``): per forecasting service, higher priority first, the lead time (p95 of
   the Deployment's observed bind-to-ready times, else ``coldStartSeconds``; plus node boot when the free GPUs left
   by higher-priority floors do not cover this floor's extra replicas), the demand at ``now + lead`` and the replica
   floor (``core.predictive.forecast_floor``: stale, unreliable or short forecasts are not used, and say why);
2. the per-service decision (``core.decide.decide``) with those floors.

The plan carries the forecast views (``Plan.forecasts``) so that reporting does not recompute them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate, pod_priorities, preemptor_priority
from autoscaler.core.cluster import (
    ClusterSnapshot,
    NodeRoom,
    PodInfo,
    WaitingGpuWork,
    cold_starts_by_service,
    deployment_pods,
    free_gpus,
    gpu_types_meet,
    hole_node_for_waiting_work,
    node_room,
    preemptible_gpus,
    replica_gpus,
    selector_key,
    waiting_for_room,
    waiting_gpu_work,
)
from autoscaler.core.decide import ReplicaFloor, decide
from autoscaler.core.headroom import (
    DEFAULT_HEADROOM,
    Headroom,
    HeadroomConfig,
    earned_headroom,
    wants_headroom,
)
from autoscaler.core.model import ControllerState, ForecastMode, Observation, Plan, ServicePolicy
from autoscaler.core.predictive import (
    ForecastInput,
    PredictiveSettings,
    forecast_floor,
    lead_time_s,
    provisioned_input,
    rate_per_replica,
)
from autoscaler.core.reasons import Reason
from autoscaler.core.scale_down_choice import choosing, mark_scale_downs


@dataclass(frozen=True, slots=True)
class PublishedForecast:
    """The latest fit of one service and its accountability, immutable (read by the tick without a lock)."""

    key: str
    latest: ForecastInput
    model: str  # registry name of the model fitted ("auto: holt_winters" when chosen by selection)
    quantile: float  # provisioned level the fit and its scores are for
    pinball_ratio: float | None = None  # recent pinball loss / the baseline's (None: not scored yet)
    relative_error: float | None = None  # recent MAE of the median / mean demand
    scored: int = 0  # live scored values behind the verdict (0 when it comes from the bootstrap backtest)
    # share of the scored demand at or below the provisioned quantile (None: nothing scored yet); earns headroom
    coverage: float | None = None
    coverage_samples: int = 0  # values behind ``coverage`` (live scores, or the bootstrap backtest's)
    series: str | None = None  # what the fitted history is a series of (the source's query); None: it cannot tell
    # the share of the quantile's excess over the median the floor provisions (``core.headroom.calibrated_excess``,
    # measured on the live scores; 1: the quantile itself)
    excess_share: float = 1.0


@dataclass(frozen=True, slots=True)
class ServiceForecastView:
    """What the tick made of one service's forecast: its floor, the lead time, the demand it provisions for."""

    key: str
    namespace: str
    service: str
    mode: ForecastMode
    published: PublishedForecast | None
    floor: ReplicaFloor | None
    lead_s: float
    demand: float | None  # forecast request rate at the quantile over [now + lead, now + lead + tick], req/s
    message: str = ""  # why there is no floor, when there is none
    headroom: Headroom | None = None  # the target ratio an ACTIVE forecasting service ran at this tick
    # the share of the quantile's excess over the median the floor provisioned this tick (calibrated excess); 1: the
    # quantile as fitted
    excess_share: float = 1.0


@dataclass(frozen=True, slots=True)
class ForecastReadConfig:
    """How the tick reads forecasts; the controller's values come from its settings, the simulator's from its
    scenario."""

    refit_period_s: float = 3600.0  # how often fits are made, seconds
    max_fit_age_periods: float = 3.0  # a fit older than this many refit periods is stale
    node_boot_s: float = 0.0  # seconds a new GPU node takes to join; added to the lead when free GPUs are short
    tick_interval_s: float = 15.0  # seconds between ticks: a floor covers the peak over the next tick
    headroom: HeadroomConfig | None = DEFAULT_HEADROOM  # None: every service runs at its spec's target
    # the floor provisions the quantile's calibrated share of its excess (``PublishedForecast.excess_share``; False:
    # the quantile as fitted)
    calibrated_excess: bool = True
    # scale-down holds what the forecast needs within the lead time, and waits a lead time without a forecast
    cold_start_aware: bool = True
    # ... what it needs from now to now + this many lead times (``PredictiveSettings.hold_leads``; 1: only until a
    # replica asked for now could serve, 2: also those the floor would add back within a cold start), lead times
    scale_down_hold_leads: float = 2.0
    # while lower-priority GPU work waits (``core.cluster.waiting_gpu_work``), a scale-down that would free a node
    # enough for it also holds what the forecast needs this many seconds past the lead time, as far as the forecast
    # reaches, when the replicas wanted back would then not fit elsewhere (about a training checkpoint interval;
    # 0: only the lead time), seconds
    contended_hold_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class TickConfig:
    forecast: ForecastReadConfig = ForecastReadConfig()
    capacity: CapacityConfig | None = None  # None: no capacity arbitration (replicas only)


@dataclass(frozen=True, slots=True)
class TickInput:
    """Everything one tick decides on (gathered by the controller's job code, or by the simulator)."""

    now: float  # Unix seconds
    observation: Observation
    snapshot: ClusterSnapshot
    policies: Mapping[str, ServicePolicy]  # valid policies by service key "namespace/name"
    forecasts: Mapping[str, PublishedForecast] = field(default_factory=dict)
    # Requests/s one replica serves at saturation, where known (the simulator knows it, a cluster does not): lets
    # ``rate_per_replica`` turn demand into replicas for a utilisation-scaled service without ratePerReplica.
    throughputs: Mapping[str, float] = field(default_factory=dict)
    # Nodes per pool as the node-pool provider counts them (requested nodes not yet registered included); None:
    # count the snapshot's nodes.
    pool_nodes: Mapping[str, int] | None = None
    # per pool, the (min, max) nodes its provider allows (None where unset or unread): see ``ArbitrationInput``
    pool_bounds: Mapping[str, tuple[int | None, int | None]] | None = None


class _SnapshotFacts:
    """What ``read_forecasts`` derives from the cluster snapshot alone (cold starts, free and preemptible GPUs,
    waiting work, room per node). A simulated cluster hands over the same pod, node and workload tuples tick after
    tick until something changes, and these walks over every pod were a tenth of a forecasting tick there: they are
    kept for the tuples they were computed from (immutable, held here, so their identity cannot be reused)."""

    __slots__ = ("_for_room", "_pods", "_preemptible", "_room", "cold_starts", "free", "snapshot", "waiting")

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.cold_starts: Mapping[str, Sequence[float]] = MappingProxyType(
            {key: tuple(seconds) for key, seconds in cold_starts_by_service(snapshot).items()}
        )
        self.free = free_gpus(snapshot)
        self.waiting = tuple(waiting_gpu_work(snapshot))
        self._preemptible: dict[int, int] = {}
        self._room: dict[frozenset[str], NodeRoom] = {}
        self._pods: dict[str, list[PodInfo]] | None = None
        self._for_room: dict[frozenset[str], tuple[WaitingGpuWork, ...]] = {}

    def same_content(self, snapshot: ClusterSnapshot) -> bool:
        kept = self.snapshot
        return kept.pods is snapshot.pods and kept.nodes is snapshot.nodes and kept.workloads is snapshot.workloads

    def preemptible(self, below_priority: int) -> int:
        found = self._preemptible.get(below_priority)
        if found is None:
            found = self._preemptible[below_priority] = preemptible_gpus(self.snapshot, below_priority)
        return found

    def room(self, choosing: frozenset[str] = frozenset()) -> NodeRoom:
        """The room per node, with the removal order of the Deployments in ``choosing`` as this controller chooses
        it (``core.scale_down_choice``)."""
        found = self._room.get(choosing)
        if found is None:
            found = self._room[choosing] = node_room(self.snapshot, choosing)
        return found

    def waiting_for_room(self, not_room: frozenset[str]) -> tuple[WaitingGpuWork, ...]:
        """The waiting work that does not start on the GPUs free now outside the pools ``not_room``
        (``core.cluster.waiting_for_room``)."""
        found = self._for_room.get(not_room)
        if found is None:
            found = self._for_room[not_room] = tuple(waiting_for_room(self.waiting, self.snapshot, not_room))
        return found

    def pods(self) -> Mapping[str, Sequence[PodInfo]]:
        """The active pods of every Deployment (``core.cluster.deployment_pods``)."""
        if self._pods is None:
            self._pods = deployment_pods(self.snapshot)
        return self._pods

    def choosing(self, policies: Mapping[str, ServicePolicy], capacity: CapacityConfig | None) -> frozenset[str]:
        """The services whose scale-down replicas this tick chooses (none unless ``choose_scale_down_replicas``)."""
        if capacity is None or not capacity.choose_scale_down_replicas:
            return frozenset()
        return choosing(policies, self.pods(), self.waiting)


_last_facts: list[_SnapshotFacts] = []  # one entry: the facts of the latest snapshot read


def _snapshot_facts(snapshot: ClusterSnapshot) -> _SnapshotFacts:
    kept = _last_facts[0] if _last_facts else None
    if kept is not None and kept.same_content(snapshot):
        return kept
    facts = _SnapshotFacts(snapshot)
    _last_facts[:] = [facts]
    return facts


def read_forecasts(
    tick: TickInput,
    config: ForecastReadConfig,
    capacity: CapacityConfig | None = None,
    earn_headroom: bool = False,
) -> dict[str, ServiceForecastView]:
    """The forecast view (floor, lead, demand) of every forecasting service. Higher priority first: it gets the
    free GPUs, the others' leads then include node boot. With capacity arbitration that may preempt, the GPUs of
    preemptible training count as free: taking them is immediate, no node has to boot. ``earn_headroom``: each
    ACTIVE service's earned headroom (``_earned``) is applied to its floor (``_floor_at_headroom``) and shown in its
    view, as the tick decides with it."""
    rules = config.headroom if earn_headroom else None
    facts = _snapshot_facts(tick.snapshot)
    cold_starts = facts.cold_starts
    # GPUs the services before this one took (their floors above their replicas), from the free ones and those of
    # the training each may preempt: only training below the service's own preemptor priority (the arbitration
    # stops no gang at or above it), so a service below the training waits for a node to boot
    taken = 0
    taken_of: dict[str | None, int] = {}  # the same by the GPU type the services select (None: any)
    runs_at = pod_priorities(tick.snapshot) if capacity is not None and capacity.preempt else {}
    views: dict[str, ServiceForecastView] = {}
    # the lower-priority work a scale-down could open a hole for: not what starts on the GPUs free now (it waits for
    # something else -- quota, the scheduler's next pass), nor on burst nodes (inference only)
    burst_pools = frozenset(p.name for p in capacity.pools) if capacity is not None else frozenset()
    waiting_room = facts.waiting_for_room(burst_pools) if config.contended_hold_s > 0 and facts.waiting else ()
    # the room per node is read for the holes only: none without such work
    room = facts.room(facts.choosing(tick.policies, capacity)) if waiting_room else None
    free_of: dict[str | None, int] = {}  # free GPUs on the ready nodes of a GPU type (None: of every type)
    deployments = {(d.namespace, d.name): d for d in tick.snapshot.deployments}
    for key, policy in sorted(tick.policies.items(), key=lambda kv: (-kv[1].priority, kv[0])):
        fp = policy.forecast
        if fp is None:
            continue
        # what one replica takes on a node: its pod template's request when read (capacity arbitration counts it so)
        deployment = deployments.get((policy.namespace, policy.name))
        gpus_per_replica = replica_gpus(policy.gpus_per_replica, deployment)
        gpu_type = deployment.gpu_product if deployment is not None else None  # the nodes its replicas may use
        pub = tick.forecasts.get(key)
        observed = cold_starts.get(key, ())
        lead = lead_time_s(policy.cold_start_s, observed)
        if pub is None:
            floor = None
            if config.cold_start_aware and fp.mode is ForecastMode.ACTIVE:
                floor = ReplicaFloor(
                    0, Reason.FORECAST_MISSING, "no forecast fitted yet", usable=False, down_window_s=lead
                )
            message = "no forecast fitted yet"
            headroom = _earned(policy, pub, floor, tick.now, config, rules)
            views[key] = ServiceForecastView(
                key, policy.namespace, policy.name, fp.mode, pub, _floor_at_headroom(floor, headroom, message), lead,
                None, message, headroom,
            )  # fmt: skip
            continue
        calibrated = False
        if config.calibrated_excess and pub.excess_share < 1.0 and pub.quantile == fp.quantile:
            # what the floor, the demand and capacity arbitration read: the quantile's calibrated share (the fit
            # itself when it has no stored median or level to narrow between: then the floor does not say it is)
            narrowed = provisioned_input(pub.latest, fp.quantile, pub.excess_share)
            calibrated = narrowed is not pub.latest
            pub = replace(pub, latest=narrowed)
        rate = rate_per_replica(policy, tick.throughputs.get(key))
        if rate is None:
            message = f"metric {policy.metric.value}: set spec.forecast.ratePerReplica to turn demand into replicas"
            demand = _demand(pub.latest, tick.now, lead, fp.quantile, config)
            # A forecast that can never become a floor earns nothing and keeps the lead-time scale-down window, as
            # no forecast does: publishing it must not lower a safeguard the service had before its first fit.
            floor = None
            if fp.mode is ForecastMode.ACTIVE:
                window = lead if config.cold_start_aware else 0.0
                floor = ReplicaFloor(0, Reason.FORECAST_MISSING, message, usable=False, down_window_s=window)
            headroom = _earned(policy, pub, floor, tick.now, config, rules)
            views[key] = ServiceForecastView(
                key, policy.namespace, policy.name, fp.mode, pub, _floor_at_headroom(floor, headroom, message), lead,
                demand, message, headroom,
            )  # fmt: skip
            continue
        lower = [w for w in waiting_room if w.priority < policy.priority]
        hole = hole_node_for_waiting_work(room, key, lower) if lower and room is not None else None
        settings = PredictiveSettings(
            rate_per_replica=rate,
            quantile=fp.quantile,
            refit_period_s=config.refit_period_s,
            max_fit_age_periods=config.max_fit_age_periods,
            shadow=fp.mode is ForecastMode.SHADOW,
            cold_start_aware=config.cold_start_aware,
            hold_leads=config.scale_down_hold_leads,
            contended_hold_s=config.contended_hold_s if hole is not None else 0.0,
        )
        try:
            floor = forecast_floor(policy, pub.latest, settings, tick.now, lead, config.tick_interval_s)
            seen = tick.observation.services.get(key)
            current = seen.spec_replicas if seen is not None else 0
            if floor is not None and floor.usable and config.node_boot_s > 0:
                extra = max(0, floor.replicas - current) * gpus_per_replica
                free = facts.free - taken
                if capacity is not None and capacity.preempt:
                    below = min(capacity.training.preemptible_below_priority, preemptor_priority(policy, runs_at))
                    free += facts.preemptible(below)
                free = max(0, free)
                if extra > free:
                    lead = lead_time_s(policy.cold_start_s, observed, config.node_boot_s, needs_new_nodes=True)
                    floor = forecast_floor(policy, pub.latest, settings, tick.now, lead, config.tick_interval_s)
            # by the services before this one (this one's own floor is in its comeback), of a GPU type its replicas
            # may use: those of any type may take GPUs of its type, and take any when it selects none
            taken_before = sum(gpus for kind, gpus in taken_of.items() if gpu_types_meet(kind, gpu_type))
            if floor is not None and floor.usable and not floor.shadow:
                # what this floor takes is no room for the services after it (their leads, their comebacks)
                grows = max(0, floor.replicas - current) * gpus_per_replica
                taken += grows
                taken_of[gpu_type] = taken_of.get(gpu_type, 0) + grows
            if floor is not None and hole is not None and room is not None and floor.contended_hold > floor.hold:
                # Taking the GPUs back costs a stopped gang only when the waiting work, once started in the hole,
                # leaves too few free GPUs elsewhere for the replicas the forecast wants back over the window: the
                # work the hole is for (its size, its GPU type), and what higher-priority floors take is no room.
                # That work starts whole: a gang whose last pod the hole fits takes free GPUs for its other pods
                # too; counted as its one pod, it was left to the next rise to preempt, at every window edge.
                # All counted on the nodes of the GPU type the replicas select: free GPUs of another type are no
                # room for them, and a floor or a gang's pod of another type takes none of theirs.
                usable = free_of.get(gpu_type)
                if usable is None:
                    usable = free_of[gpu_type] = sum(
                        left for node, left in room.free.items() if _of_type(room, node, gpu_type)
                    )
                comeback = (floor.contended_hold - current) * gpus_per_replica
                takes = _gang_takes(lower, hole, room, usable + hole[0] * gpus_per_replica, gpu_type)
                if takes + comeback > usable - taken_before:
                    # A scale-down of fewer than ``hole[0]`` replicas frees no node enough for the waiting work:
                    # those GPUs would sit idle, not be taken, so only the larger scale-downs are held back.
                    held = max(floor.hold, min(floor.contended_hold, current - (hole[0] - 1)))
                    if held > floor.hold:
                        floor = replace(floor, hold=held, hold_window_s=floor.contended_window_s)
        except ValueError as exc:  # e.g. spec.forecast.quantile changed: the fit lacks the level until the refit
            # as every unusable floor of an active service: a scale-down waits a lead time (cold start)
            down_window = lead if config.cold_start_aware and fp.mode is ForecastMode.ACTIVE else 0.0
            floor = ReplicaFloor(
                0, Reason.FORECAST_STALE, f"latest fit cannot be read: {exc}", usable=False, down_window_s=down_window
            )
        if calibrated and floor is not None and floor.usable:
            share = f"{pub.excess_share:.1%} of its excess over the median, the share its measured coverage needed"
            floor = replace(floor, detail=f"{floor.detail} (calibrated: {share})")
        demand = _demand(pub.latest, tick.now, lead, fp.quantile, config)
        headroom = _earned(policy, pub, floor, tick.now, config, rules)
        views[key] = ServiceForecastView(
            key, policy.namespace, policy.name, fp.mode, pub, _floor_at_headroom(floor, headroom, ""), lead, demand,
            headroom=headroom, excess_share=pub.excess_share if calibrated else 1.0,
        )  # fmt: skip
    return views


def _floor_at_headroom(floor: ReplicaFloor | None, headroom: Headroom | None, message: str) -> ReplicaFloor | None:
    """The reactive path runs at the earned share of the target; the floor turns forecast demand into replicas at
    the full target (a floor that under-covers is the reactive path's to make up for, not the floor's). A service
    that has not earned its full target gets a floor even without a forecast, to carry the ratio and the longer
    scale-down window to the decision."""
    if headroom is None or (headroom.ratio >= 1.0 and headroom.down_window_s <= 0):
        return floor  # earned (or not an ACTIVE forecasting service): nothing changes in the decision
    if floor is None:
        floor = ReplicaFloor(0, Reason.FORECAST_MISSING, message or "no forecast", usable=False)
    return replace(
        floor,
        target_ratio=headroom.ratio,
        down_window_s=max(floor.down_window_s, headroom.down_window_s),
        trust=headroom.trust,
    )


def _demand(
    latest: ForecastInput, now: float, lead: float, quantile: float, config: ForecastReadConfig
) -> float | None:
    start = now + lead
    try:
        return latest.forecast.max_over(start, start + config.tick_interval_s, quantile)
    except ValueError:
        return None


def _earned(
    policy: ServicePolicy,
    pub: PublishedForecast | None,
    floor: ReplicaFloor | None,
    now: float,
    config: ForecastReadConfig,
    rules: HeadroomConfig | None,
) -> Headroom | None:
    """The headroom (``core.headroom``) an ACTIVE forecasting service earned with its published forecast; None for
    other services or without ``rules``. It is earned by the forecast the floor reads: a fit too old or judged
    unreliable, one the floor cannot use this tick (a horizon short of now + lead, a quantile the fit lacks) earns
    nothing, and a coverage measured at another quantile says nothing about this one."""
    if rules is None or not wants_headroom(policy):
        return None
    if pub is None:
        return earned_headroom(
            policy, coverage=None, scored=0, usable=False, why_unusable="no forecast fitted yet", config=rules
        )
    same_level = policy.forecast is not None and pub.quantile == policy.forecast.quantile
    age = now - pub.latest.refit_time
    why = ""
    if age > config.max_fit_age_periods * config.refit_period_s:
        why = f"fit is {age:.0f}s old"
    elif not pub.latest.reliable:
        why = "forecast unreliable"
    elif floor is not None and not floor.usable:
        why = floor.detail
    elif not same_level:
        why = "the forecast quantile changed"
    return earned_headroom(
        policy,
        coverage=pub.coverage if same_level else None,
        scored=pub.coverage_samples if same_level else 0,
        usable=not why,
        why_unusable=why,
        config=rules,
    )


def decide_tick(
    tick: TickInput, state: ControllerState, config: TickConfig | None = None
) -> tuple[Plan, ControllerState]:
    """One plan for every service of ``tick.policies``, and the state for the next tick."""
    config = config if config is not None else TickConfig()
    # Only a policy with spec.forecast has a view: without one, skip reading the snapshot's cold starts and GPUs.
    views = read_forecasts(tick, config.forecast, config.capacity, True) if _any_forecasting(tick.policies) else {}
    floors = {key: view.floor for key, view in views.items() if view.floor is not None}
    plan, new_state = decide(tick.observation, state, tick.policies, tick.now, floors=floors)
    plan = replace(plan, forecasts=MappingProxyType(views))
    if config.capacity is None:
        return plan, replace(new_state, capacity=state.capacity)
    usable = {}
    for key, view in views.items():
        fp = tick.policies[key].forecast
        if view.floor is not None and view.floor.usable and not view.floor.shadow and view.published and fp:
            usable[key] = (view.published.latest.forecast, fp.quantile, view.lead_s)
    arbitration = ArbitrationInput(
        tick.now,
        tick.snapshot,
        tick.policies,
        plan.decisions,
        usable,
        tick.throughputs,
        tick.pool_nodes,
        config.forecast.tick_interval_s,
        tick.pool_bounds,
        _over_slo(tick),
    )
    actions, report, capacity = arbitrate(arbitration, state.capacity, config.capacity)
    planned = plan.actions + tuple(actions)
    if config.capacity.choose_scale_down_replicas:
        # the replicas each scale-down removes, marked right before it, in the order the hold predicted its holes in
        facts = _snapshot_facts(tick.snapshot)
        chosen = facts.choosing(tick.policies, config.capacity)
        planned = mark_scale_downs(planned, facts.pods(), chosen, facts.room(chosen).free)
    return replace(plan, actions=planned, capacity=report), replace(new_state, capacity=capacity)


def _over_slo(tick: TickInput) -> frozenset[str]:
    """The services whose latency this tick is not seen to meet their SLO: the arbitration never waits out their
    shortfall as cheaper than acting, a wait-out being safe only while latency shows no demand served late.

    Above the SLO as the SLO guard reads it (a sample, not NaN); or unknown on an incomplete reading -- the reader
    leaves the latency out with a reason when its query fails, its sample is old, or no request finished in the
    window while requests wait (the deepest overload reads as no latency at all); or no SLO to meet. A latency
    absent without any reason is a window without traffic: nothing is served late."""
    over = set()
    for key, policy in tick.policies.items():
        obs = tick.observation.services.get(key)
        slo = policy.latency_slo_s
        if obs is None:
            continue
        if slo is None:
            over.add(key)
        elif obs.latency_s is None or math.isnan(obs.latency_s):
            if obs.partial_reasons or obs.stale_reasons:
                over.add(key)
        elif obs.latency_s > slo:
            over.add(key)
    return frozenset(over)


def _any_forecasting(policies: Mapping[str, ServicePolicy]) -> bool:
    return any(p.forecast is not None for p in policies.values())


def _of_type(room: NodeRoom, node: str, gpu_type: str | None) -> bool:
    """Whether pods selecting ``gpu_type`` (None: any) may run on ``node``: a node without the GPU type label is no
    node a selector of one matches."""
    return gpu_type is None or room.product.get(node) == gpu_type


def _gang_takes(
    waiting: Sequence[WaitingGpuWork],
    hole: tuple[int, int, str, int],
    room: NodeRoom,
    free_after: int,
    gpu_type: str | None = None,
) -> int:
    """The GPUs the waiting work a hole is for (``hole_node_for_waiting_work``: pods of ``hole[1]`` GPUs, on node
    ``hole[2]``, which has ``hole[3]`` free once the scale-down is made) takes once it starts from the nodes of
    ``gpu_type`` (the service's; None: every node), the most of any such work (any may be the one the scheduler or
    the queue starts): its pods placed largest first, each on a node of its GPU type with room (the hole's node with
    its room then, the others with their free GPUs now), one of ``gpu_type`` first (where the scheduler may put it:
    the worst case for the service's comeback), the fullest first; a work whose pods needed to start
    (``WaitingGpuWork.needed_pods``: all of a gang's, or its minAvailable less its pods placed; more than its pods
    when too few of them exist to reach its minAvailable) do not all find one does not start and takes nothing but
    the one pod counted. At most ``free_after``, the GPUs of ``gpu_type`` free after the scale-down.

    The hole's work is any whose pod does not fit on the hole's node now and does once the scale-down is made, not
    only the smallest size the hole is named for: a replica of several GPUs frees room for larger work as well, and
    the scheduler may start that. One gang is placed once, not once per pending pod (its entries are alike): a
    64-pod gang's 64 entries made 64 identical placements over every node, seconds a tick with thousands of pods."""
    pod_gpus, hole_node, hole_free = hole[1], hole[2], hole[3]
    product = room.product.get(hole_node)
    free_now = room.free.get(hole_node, 0)
    most = pod_gpus
    seen: set[tuple[object, ...]] = set()
    for w in waiting:
        if (
            pod_gpus <= 0
            or not free_now < w.gpus <= hole_free
            or w.gpu_product not in (None, product)
            or not room.admits(hole_node, w)
        ):
            # not the hole's work: a size it does not start, another GPU type than the hole's node, or a node its
            # nodeSelector, required affinity or tolerations rule out
            continue
        gang = w.gang
        shape = (w.gpu_product, selector_key(w.node_selector), w.tolerations, gang, w.needed_pods)
        if shape in seen:
            continue  # another pending pod of a gang placed already (or a gang just like it): the same count
        seen.add(shape)
        room_left = {
            node: free
            for node, free in room.free.items()
            if node != hole_node
            and free > 0
            and (w.gpu_product is None or room.product.get(node) == w.gpu_product)
            and room.admits(node, w)
        }
        room_left[hole_node] = hole_free
        placed = taken = 0
        for size in gang:
            fitting = [node for node, free in room_left.items() if free >= size]
            if not fitting:
                continue
            # the service's type first, then best fit: the fullest node it fits on
            node = min(fitting, key=lambda n: (not _of_type(room, n, gpu_type), room_left[n], n))
            room_left[node] -= size
            placed += 1
            if _of_type(room, node, gpu_type):
                taken += size
        if placed >= w.needed_pods:
            most = max(most, taken)
    return max(pod_gpus, min(most, free_after))
