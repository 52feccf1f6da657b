"""``decide(observation, state, policies, now) -> (plan, state)``: one tick of the inference scaler.

Per service, in this order (each step a small pure function, Ray Serve style guard-rails):
1. hold when the Deployment is scaled to zero by hand, or when the scaling metric is stale/missing (a fresh latency
   breach or a usable forecast floor may still add replicas); when the observation is only partial (k of n pods
   reported, the guard's latency missing), forbid a scale-down only;
2. the HPA v2 recommendation on the service's metric (tolerance per direction);
3. the SLO guard: latency above the SLO forces a scale-up (and forbids a scale-down);
4. the forecast floor, when one is given (it can only raise the recommendation);
5. the HPA stabilisation windows, then the rate policies and min/max replicas.
Every decision carries a Reason and the numbers behind it. Acting on the plan is somebody else's job.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeGuard

from autoscaler.core import hpa
from autoscaler.core.headroom import DEFAULT_HEADROOM, wants_headroom
from autoscaler.core.model import (
    Action,
    ControllerState,
    MetricKind,
    Mode,
    Observation,
    Plan,
    ScaleDecision,
    ScaleDeployment,
    ScalingRules,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.reasons import Reason


@dataclass(frozen=True, slots=True)
class ReplicaFloor:
    """A lower bound on replicas from outside the reactive path (the forecast). ``shadow`` floors are reported in
    the decision's detail but not applied; an unusable floor (stale or unreliable forecast) only explains, in the
    detail, why the service scales reactively."""

    replicas: int
    reason: Reason
    detail: str
    shadow: bool = False
    usable: bool = True
    # A scale-down never goes below this: the replicas the forecast needs at any time from now to now + lead. A
    # replica removed and wanted back within its cold start costs a cold start of GPU time and saves nothing.
    hold: int = 0
    hold_window_s: float = 0.0  # the seconds after now that ``hold`` covers (the lead, or longer under contention)
    # What the forecast needs over a longer window while lower-priority GPU work waits (``core.tick`` folds it into
    # ``hold`` for the scale-downs that would hand that work GPUs it can use), and that window, seconds
    contended_hold: int = 0
    contended_window_s: float = 0.0
    # Without a usable forecast, the scale-down stabilisation window is at least this (the lead time, seconds): a
    # replica the service needed within the last cold start is likely needed within the next.
    down_window_s: float = 0.0
    # The share of the policy's target the reactive path runs at (core.headroom: earned by the forecast's coverage)
    target_ratio: float = 1.0
    # The trust behind ``target_ratio``, 0..1 (core.headroom: 0 while learning, degraded or untrusted; between 0 and 1
    # partial). With some trust, a floor that covers the full target's recommendation lifts the reduced target.
    trust: float = 0.0


def _metric_is_stale(policy: ServicePolicy, obs: ServiceObservation) -> str | None:
    """Why the scaling metric cannot be trusted, or None when it can."""
    if obs.stale_reasons:
        return "; ".join(obs.stale_reasons)
    if policy.metric in (MetricKind.REQUEST_RATE, MetricKind.QUEUE_DEPTH) and obs.metric_total is not None:
        value = obs.metric_total
        if math.isnan(value) or math.isinf(value) or value < 0:
            return f"{policy.metric.value}: invalid value {value!r}"
        return None
    if obs.pods is None:
        return f"{policy.metric.value}: no samples"
    if obs.pods.ready_with_metric == 0:
        return f"{policy.metric.value}: no ready pod reported a sample"
    if math.isnan(obs.pods.metric_sum) or math.isinf(obs.pods.metric_sum) or obs.pods.metric_sum < 0:
        return f"{policy.metric.value}: invalid sum {obs.pods.metric_sum!r}"
    return None


# A pod whose sample is missing counts as fully busy on a scale-down: for utilisation-like signals max(100 %, target)
# of its GPU (as the HPA does with the CPU request), the target for the others.
_FULL_SCALE: dict[MetricKind, float] = {MetricKind.GPU_UTILIZATION: 100.0, MetricKind.ENGINE_ACTIVE: 1.0}


def _metric_recommendation(policy: ServicePolicy, obs: ServiceObservation, current: int) -> tuple[int, str]:
    tol_up, tol_down = policy.scale_up.tolerance, policy.scale_down.tolerance
    if obs.pods is not None and obs.pods.ready_with_metric > 0:
        full = _FULL_SCALE.get(policy.metric)
        replicas, ratio = hpa.replicas_for_pod_metric(
            current,
            obs.pods,
            policy.target,
            tol_up,
            tol_down,
            None if full is None else max(full, policy.target),
            # GPU utilisation is a percentage like the HPA's CPU utilisation: truncated to a whole percent
            whole_percent=policy.metric is MetricKind.GPU_UTILIZATION,
        )
        average = obs.pods.metric_sum / obs.pods.ready_with_metric
        return replicas, f"{policy.metric.value} {average:.3g} per pod vs target {policy.target:g} (ratio {ratio:.2f})"
    assert obs.metric_total is not None
    # Upstream's GetExternalPerPodMetricReplicas gets the scale's status.replicas (the pods created), not the spec:
    # the ratio is over them and, within the tolerance, they are the recommendation. Everything else stays on spec.
    created = obs.created_replicas
    replicas, ratio = hpa.replicas_for_total_metric(created, obs.metric_total, policy.target, tol_up, tol_down)
    over = "" if created == current else f" over {created} created"
    return replicas, (
        f"{policy.metric.value} {obs.metric_total:.4g} total vs {policy.target:g} per replica{over} (ratio {ratio:.2f})"
    )


def _slo_guard(policy: ServicePolicy, obs: ServiceObservation, current: int) -> tuple[int, str] | None:
    """While fresh latency is above the SLO: never fewer than the current replicas, and at least one more ready
    replica than now.

    Growth is computed from the *ready* replicas, as Knative's panic mode does: pods already starting are capacity
    on its way, so a breach that lasts through a cold start does not double the Deployment on every tick.

    Every metric grows in proportion to the overshoot, a request rate too: the default request counter
    (``vllm:request_success_total``) counts *finished* requests, which saturate at what the ready replicas serve as a
    busy GPU's utilisation does, so in an overload the metric reads on target and the overshoot is the only measure
    of what waits. One more ready replica per breach on a request rate (stop 45, measured and reverted) passed 7 of
    the trace matrix's 30 rows instead of 4, but only because the simulator reports the arrival rate: against a
    finished-request rate it adds one replica per cold start to a service twice over capacity.
    """
    if not policy.slo_guard or policy.latency_slo_s is None or obs.latency_s is None:
        return None
    latency = obs.latency_s
    if math.isnan(latency) or latency <= policy.latency_slo_s:
        return None
    ready = obs.ready_replicas
    # In proportion to the overshoot, bounded: queueing latency explodes near saturation, so the ratio overstates
    # the missing capacity.
    factor = min(policy.slo_guard_max_factor, latency / policy.latency_slo_s)
    replicas = max(current, ready + 1, math.ceil(max(ready, 1) * factor))
    return replicas, f"latency {latency:.3g}s > SLO {policy.latency_slo_s:g}s with {ready} ready"


def _retention(up: ScalingRules, down: ScalingRules) -> tuple[float, float]:
    """How long recommendations (stabilisation windows) and scale events (rate-policy periods) must be kept.
    Not memoised: hashing the two rule sets (their rate-policy tuples) cost twice what this does."""
    keep_events = 0.0
    for rate in (*up.policies, *down.policies):
        if rate.period_s > keep_events:
            keep_events = rate.period_s
    return max(up.stabilisation_s, down.stabilisation_s), keep_events


def _not_after(state: ServiceState, now: float) -> ServiceState:
    """``state`` with no entry later than ``now``. The runtime's clock is wall time: stepped back (NTP, a VM
    restored), entries "in the future" would sit inside every window for as long as the step, and a scale-up with a
    0 s window would stay capped at an old recommendation (upstream's Go times compare on the monotonic clock).
    Entries are appended in time order: only the last ones can be later than ``now``."""
    recs, events, reactive = state.recommendations, state.scale_events, state.reactive_recommendations
    # recommendations are appended in time order; scale events may not be (a slot reused)
    if (recs and recs[-1][0] > now) or (reactive and reactive[-1][0] > now) or any(t > now for t, _ in events):
        return ServiceState(
            tuple((min(t, now), r) for t, r in recs),
            tuple((min(t, now), change) for t, change in events),
            tuple((min(t, now), r) for t, r in reactive),
        )
    return state


def _with_clamp_event(
    policy: ServicePolicy, state: ServiceState, now: float, current: int, desired: int, recommend_only: bool
) -> ServiceState:
    """Upstream stores the scale event of a min/max clamp too (``storeScaleEvent`` after every rescale, with a
    behavior block): the rate policies of the next period count it."""
    if not policy.behavior or recommend_only or desired == current:
        return state
    _, keep_events = _retention(policy.scale_up, policy.scale_down)
    events = _store_event(policy, _prune(state.scale_events, now, keep_events), now, desired - current)
    return replace(state, scale_events=events)


def _store_event(
    policy: ServicePolicy, events: tuple[tuple[float, int], ...], now: float, change: int
) -> tuple[tuple[float, int], ...]:
    rules = policy.scale_up if change > 0 else policy.scale_down
    return hpa.store_scale_event(events, now, change, hpa.longest_period(rules))


def _prune(entries: tuple[tuple[float, int], ...], now: float, keep_s: float) -> tuple[tuple[float, int], ...]:
    """Drop entries at or before ``now - keep_s`` (scale events are not in time order: a new one may take an
    outdated one's place, as upstream's slots)."""
    cutoff = now - keep_s
    if all(timestamp > cutoff for timestamp, _ in entries):
        return entries
    return tuple(entry for entry in entries if entry[0] > cutoff)


@functools.lru_cache(maxsize=256)
def _with_target_ratio(policy: ServicePolicy, ratio: float) -> ServicePolicy:
    return replace(policy, target=policy.target * ratio)


@functools.lru_cache(maxsize=256)
def _with_down_window(policy: ServicePolicy, window_s: float) -> ServicePolicy:
    return replace(policy, scale_down=replace(policy.scale_down, stabilisation_s=window_s))


def _floor_applies(floor: ReplicaFloor | None) -> TypeGuard[ReplicaFloor]:
    """A forecast floor the decision applies: given, usable and not a shadow."""
    return floor is not None and floor.usable and not floor.shadow


def _down_window_history(
    state: ServiceState, now: float, floor: ReplicaFloor | None, spec_window_s: float, window_s: float,
    inclusive: bool = False,
) -> tuple[tuple[float, int], ...]:
    """The recommendations a scale-down window of ``window_s`` reads. A window longer than the spec's (a service
    that has not earned its headroom, ``core.headroom``) holds only the *reactive* recommendations beyond the spec's
    window while a forecast floor is applied: the floor's own cost of coming back is its ``hold`` (what the forecast
    needs again within the lead time), and holding the forecast's peaks longer because the forecast is doubted made a
    doubted forecast dearer than a trusted one (on ServeGen its hedge before each 10-minute window edge was held
    through most of the window). The recommendations with the floor are held for the spec's window, as an earned
    service's are. ``inclusive``: an entry exactly at the cutoff is in the window (the behaviour-less HPA's rule)."""
    if window_s <= spec_window_s or not _floor_applies(floor):
        return state.recommendations
    cutoff = now - spec_window_s
    recent = tuple(e for e in state.recommendations if e[0] > cutoff or (inclusive and e[0] == cutoff))
    return recent + state.reactive_recommendations


def decide_service(
    policy: ServicePolicy,
    obs: ServiceObservation | None,
    state: ServiceState,
    now: float,
    floor: ReplicaFloor | None = None,
) -> tuple[ScaleDecision, ServiceState]:
    """One service's decision and its next state."""
    recommend_only = policy.mode is Mode.RECOMMEND_ONLY
    if obs is None:
        return (
            ScaleDecision(policy.key, 0, 0, Reason.METRICS_STALE, "no observation of this service", recommend_only),
            state,
        )
    current = obs.spec_replicas
    state = _not_after(state, now)
    if not state.recommendations:
        # upstream recordInitialRecommendation: a new (or restarted) controller remembers the current replicas as a
        # recommendation, so nothing scales down before a whole scale-down window has been observed
        seeded = ((now, current),) if floor is not None and not floor.shadow else ()
        state = ServiceState(((now, current),), state.scale_events, seeded)

    def decision(desired: int, reason: Reason, detail: str) -> ScaleDecision:
        return ScaleDecision(policy.key, current, desired, reason, detail, recommend_only)

    if current == 0 and policy.min_replicas != 0:
        return decision(0, Reason.SCALING_DISABLED, "spec.replicas is 0"), state
    if current > policy.max_replicas:
        clamped = decision(policy.max_replicas, Reason.AT_MAX_REPLICAS, f"above maxReplicas {policy.max_replicas}")
        return clamped, _with_clamp_event(policy, state, now, current, policy.max_replicas, recommend_only)
    if current < policy.min_replicas:
        clamped = decision(policy.min_replicas, Reason.AT_MIN_REPLICAS, f"below minReplicas {policy.min_replicas}")
        return clamped, _with_clamp_event(policy, state, now, current, policy.min_replicas, recommend_only)

    # The scale-down window a forecasting service's decision uses moves with its forecast (core.headroom: towards an
    # HPA's 300 s as trust falls; the lead time while the forecast is unusable). Its recommendations are kept for the
    # longest of those windows, so that a window that grows is in force at once, not after it has filled again.
    retain_s = 0.0
    spec_down_window_s = policy.scale_down.stabilisation_s
    full_target_policy: ServicePolicy | None = None  # the spec's target, when the reactive path runs below it
    if floor is not None and not floor.shadow:
        retain_s = max(floor.down_window_s, floor.hold_window_s)
        if wants_headroom(policy):
            retain_s = max(retain_s, DEFAULT_HEADROOM.untrusted_down_window_s)
        if floor.target_ratio < 1.0:
            full_target_policy = policy
            policy = _with_target_ratio(policy, floor.target_ratio)
        if floor.down_window_s > policy.scale_down.stabilisation_s:
            policy = _with_down_window(policy, floor.down_window_s)
    stale = _metric_is_stale(policy, obs)
    guard = _slo_guard(policy, obs, current)
    if stale is not None:
        # A fresh latency breach, or a usable forecast, is still a safe reason to add capacity (upstream scales up
        # on its valid metrics while another is invalid); nothing is ever removed on stale data.
        if guard is not None:
            recommendation, reason, detail = guard[0], Reason.SLO_BREACH, f"{guard[1]}; metric stale ({stale})"
            reactive = recommendation
        elif _floor_applies(floor) and floor.replicas > current:
            recommendation, reason = floor.replicas, floor.reason
            detail = f"{floor.detail}; metric stale ({stale})"
            reactive = current  # the metric said nothing: only the floor raised it
        else:
            return decision(current, Reason.METRICS_STALE, stale), state
    else:
        recommendation, detail = _metric_recommendation(policy, obs, current)
        if full_target_policy is not None and _floor_applies(floor) and floor.trust > 0.0:
            # The reduced target is headroom for a floor that under-covers (core.headroom). A floor whose measured
            # coverage earned some trust (partial) and that asks for at least what the metric asks for at the spec's
            # target covers this tick's demand: the reduced target's extra replicas would count the same doubt
            # twice. Without any trust (learning, degraded) the floor covering now says little about a cold start
            # ahead, and the reduced target stays.
            at_full_target, _ = _metric_recommendation(full_target_policy, obs, current)
            if floor.replicas >= at_full_target and at_full_target < recommendation:
                detail = (
                    f"{detail}; target x {floor.target_ratio:.2f} not applied: forecast floor {floor.replicas} covers "
                    f"the {at_full_target} of the full target"
                )
                recommendation = at_full_target
        if recommendation > current:
            reason = Reason.METRIC_ABOVE_TARGET
        elif recommendation < current:
            reason = Reason.METRIC_BELOW_TARGET
        else:
            reason = Reason.WITHIN_TOLERANCE
        if guard is not None and guard[0] > recommendation:
            recommendation, reason, detail = guard[0], Reason.SLO_BREACH, f"{guard[1]}; {detail}"
        reactive = recommendation

    if floor is not None:
        if not floor.usable:
            detail = f"{detail}; reactive only, {floor.reason.text.split(':')[0]} ({floor.detail})"
        elif floor.shadow:
            detail = f"{detail}; shadow forecast floor {floor.replicas} ({floor.detail})"
        else:
            if floor.replicas > recommendation:
                if recommendation <= current < floor.replicas <= current * (1.0 + policy.scale_up.tolerance):
                    # The scale-down tolerance's other side: a rise the forecast alone asks for, within the HPA's
                    # scale-up tolerance of the current replicas, is not a scale-up (the metric's own rises have
                    # passed that tolerance on its ratio). The P99 moves a little every minute: on the trace matrix
                    # acting on each such rise cost up to 27 % more scaling actions (8 % on the default row) and up
                    # to 1 % more GPU-hours, for at most 0.24 points of requests within SLO (benchmarks/README.md).
                    recommendation, reason = current, Reason.WITHIN_TOLERANCE
                    detail = (
                        f"forecast floor {floor.replicas} within scale-up tolerance {policy.scale_up.tolerance:g} "
                        f"of {current} ({floor.detail}); {detail}"
                    )
                else:
                    recommendation, reason, detail = floor.replicas, floor.reason, f"{floor.detail}; {detail}"
            if recommendation < current and floor.hold > recommendation:
                recommendation, reason = min(current, floor.hold), Reason.FORECAST_HOLD
                detail = f"forecast needs {floor.hold} again within {floor.hold_window_s:.0f}s; {detail}"
            if (
                floor.hold
                and reason in (floor.reason, Reason.FORECAST_HOLD)
                and current > recommendation >= current * (1.0 - policy.scale_down.tolerance)
            ):
                # The forecast moves a little every minute; the HPA's scale-down tolerance keeps that from becoming
                # a scale-down (and a scale-up back) every time. Only a drop the forecast decided: one the metric
                # asks for has passed the HPA's tolerance on the metric's ratio already.
                recommendation, reason = current, Reason.WITHIN_TOLERANCE
                detail = f"within scale-down tolerance {policy.scale_down.tolerance:g} of {current}; {detail}"

    if obs.partial_reasons and recommendation <= current:
        # Partial data never removes capacity, and a hold on it says so (not "within tolerance"). Like a stale hold,
        # nothing is recorded: a scale-down on complete data after the fault is judged on that data alone.
        partial = "; ".join(obs.partial_reasons)
        detail = f"recommended {recommendation} on partial data ({partial}); {detail}"
        return decision(current, Reason.METRICS_PARTIAL, detail), state

    up_rules, down_rules = policy.scale_up, policy.scale_down
    # what a scale-down window longer than the spec's reads, and the state's reactive history for the next tick
    history = _down_window_history(
        state, now, floor, spec_down_window_s, down_rules.stabilisation_s, inclusive=not policy.behavior
    )
    reactive_history = state.reactive_recommendations
    if floor is not None and not floor.shadow:
        kept = max(retain_s, down_rules.stabilisation_s)
        reactive_history = (*_prune(reactive_history, now, kept), (now, reactive))
    if not policy.behavior:
        return _without_behavior(
            policy, state, now, current, recommendation, reason, detail, decision, retain_s, history, reactive_history
        )
    stabilised = hpa.stabilise(
        now, current, recommendation, history, up_rules.stabilisation_s, down_rules.stabilisation_s
    )
    if stabilised != recommendation:
        reason = Reason.SCALE_DOWN_STABILISED if stabilised > recommendation else Reason.SCALE_UP_STABILISED
        detail = f"recommended {recommendation}, stabilised at {stabilised}; {detail}"

    desired = stabilised
    if desired > current:
        limit = max(hpa.scale_up_limit(now, current, state.scale_events, up_rules), current)
        if policy.max_replicas <= limit:
            if desired > policy.max_replicas:
                desired, reason = policy.max_replicas, Reason.AT_MAX_REPLICAS
                detail = f"maxReplicas {policy.max_replicas}; {detail}"
        elif desired > limit:
            desired, reason = limit, Reason.SCALE_UP_RATE_LIMITED
            detail = f"rate limit allows {limit}; {detail}"
    elif desired < current:
        limit = min(hpa.scale_down_limit(now, current, state.scale_events, down_rules), current)
        if policy.min_replicas >= limit:
            if desired < policy.min_replicas:
                desired, reason = policy.min_replicas, Reason.AT_MIN_REPLICAS
                detail = f"minReplicas {policy.min_replicas}; {detail}"
        elif desired < limit:
            desired, reason = limit, Reason.SCALE_DOWN_RATE_LIMITED
            detail = f"rate limit allows {limit}; {detail}"

    keep_recommendations, keep_events = _retention(up_rules, down_rules)
    if retain_s > keep_recommendations:
        keep_recommendations = retain_s
    recommendations = (*_prune(state.recommendations, now, keep_recommendations), (now, recommendation))
    events = _prune(state.scale_events, now, keep_events)
    if desired != current and not recommend_only:
        events = _store_event(policy, events, now, desired - current)
    made = replace(decision(desired, reason, detail), recommended_replicas=recommendation)
    return made, ServiceState(recommendations, events, reactive_history)


def _without_behavior(
    policy: ServicePolicy,
    state: ServiceState,
    now: float,
    current: int,
    recommendation: int,
    reason: Reason,
    detail: str,
    decision: Callable[[int, Reason, str], ScaleDecision],
    retain_s: float,
    history: tuple[tuple[float, int], ...],
    reactive_history: tuple[tuple[float, int], ...],
) -> tuple[ScaleDecision, ServiceState]:
    """``normalizeDesiredReplicas`` + ``convertDesiredReplicasWithRules``: an HPA without a behavior block.
    ``retain_s``: keep the recommendations at least this long (a window that may grow, seconds); ``history``: what
    the window reads (``_down_window_history``); ``reactive_history``: the state's."""
    window = policy.scale_down.stabilisation_s
    stabilised = hpa.stabilise_without_behavior(now, recommendation, history, window)
    if stabilised != recommendation:
        reason = Reason.SCALE_DOWN_STABILISED
        detail = f"recommended {recommendation}, stabilised at {stabilised}; {detail}"
    desired = stabilised
    scale_up_limit = hpa.scale_up_limit_without_behavior(current)
    if desired < policy.min_replicas:
        desired, reason, detail = (
            policy.min_replicas,
            Reason.AT_MIN_REPLICAS,
            f"minReplicas {policy.min_replicas}; {detail}",
        )
    elif desired > min(policy.max_replicas, scale_up_limit):
        if policy.max_replicas > scale_up_limit:
            desired, reason = scale_up_limit, Reason.SCALE_UP_RATE_LIMITED
            detail = f"scale-up limit max(2 x {current}, 4) = {scale_up_limit}; {detail}"
        else:
            desired, reason = policy.max_replicas, Reason.AT_MAX_REPLICAS
            detail = f"maxReplicas {policy.max_replicas}; {detail}"
    recommendations = (*_prune(state.recommendations, now, max(window, retain_s)), (now, recommendation))
    made = replace(decision(desired, reason, detail), recommended_replicas=recommendation)
    return made, ServiceState(recommendations, state.scale_events, reactive_history)


def decide(
    observation: Observation,
    state: ControllerState,
    policies: Mapping[str, ServicePolicy],
    now: float,
    floors: Mapping[str, ReplicaFloor] | None = None,
) -> tuple[Plan, ControllerState]:
    """The plan for every policy's service at ``now``; services without a policy are ignored."""
    decisions: list[ScaleDecision] = []
    actions: list[Action] = []
    next_states: dict[str, ServiceState] = {}
    empty = ServiceState()
    for key, policy in policies.items():
        floor = floors.get(key) if floors else None
        previous = state.services.get(key, empty)
        seen = observation.services.get(key)
        try:
            made, next_state = decide_service(policy, seen, previous, now, floor)
        except (ArithmeticError, ValueError) as exc:
            # One service's absurd spec or data (a target that underflows to zero, an overflow) must not lose the
            # tick for every other service: this one keeps its replicas and says why.
            current = seen.spec_replicas if seen is not None else 0
            made = ScaleDecision(
                key,
                current,
                current,
                Reason.DECISION_FAILED,
                f"{type(exc).__name__}: {exc}",
                policy.mode is Mode.RECOMMEND_ONLY,
            )
            next_state = previous
        decisions.append(made)
        next_states[key] = next_state
        if made.changes and not made.recommend_only:
            actions.append(
                ScaleDeployment(
                    policy.namespace,
                    policy.name,
                    made.desired_replicas,
                    made.current_replicas,
                    made.reason,
                    made.detail,
                )
            )
    return Plan(now, tuple(decisions), tuple(actions)), ControllerState(next_states)
