"""The Kubernetes HPA v2 arithmetic, as small pure functions.

Ported from kubernetes/pkg/controller/podautoscaler (``replica_calculator.go`` and ``horizontal.go``) so that the
reactive policy behaves exactly like the HPA on the same metric, and so the simulator's ``hpa`` baseline is faithful.
Time is an argument everywhere. Function names say which part of the HPA they mirror.
"""

from __future__ import annotations

import math

from autoscaler.core.model import PodMetrics, RateKind, ScalingRules, SelectPolicy

# Past this the milli-value arithmetic is left for floats (a broken exporter's 1e308 req/s: the result is capped
# by ``ceil_replicas`` and the max-replicas clamp all the same).
_MILLI_LIMIT = 1e15


def _milli(value: float) -> int | None:
    """``value`` as the metrics APIs carry it, a whole number of milli-units (None when too large or not finite)."""
    return round(value * 1000) if math.isfinite(value) and abs(value) < _MILLI_LIMIT else None


def within_tolerance(usage_ratio: float, tolerance_up: float, tolerance_down: float) -> bool:
    """KEP-4951 per-direction tolerance: no change while 1 - down <= ratio <= 1 + up."""
    return (1.0 - tolerance_down) <= usage_ratio <= (1.0 + tolerance_up)


def replicas_for_pod_metric(
    current_replicas: int,
    pods: PodMetrics,
    target: float,
    tolerance_up: float = 0.1,
    tolerance_down: float = 0.1,
    missing_value_on_scale_down: float | None = None,
    whole_percent: bool = False,
) -> tuple[int, float]:
    """``GetResourceReplicas`` / ``GetMetricReplicas`` for a per-pod metric with an average target.

    Returns (recommended replicas, usage ratio of the ready pods with metrics). Missing samples of ready pods count
    as ``missing_value_on_scale_down`` on a scale-down (the HPA uses 100 % of the request for utilisation metrics and
    the target for other pod metrics; default: the target) and as 0 on a scale-up; unready pods count as 0 on a
    scale-up and are left out otherwise. A conservative
    recomputation that flips direction, or lands within tolerance, keeps the current replicas.
    Requires ``pods.ready_with_metric > 0`` (the caller treats no samples at all as stale).

    At a ratio of exactly 1 the missing pods are left out (upstream fills them in only strictly below or above 1).
    ``whole_percent``: the average is truncated to a whole number before the ratio, as upstream's
    ``GetResourceUtilizationRatio`` does for utilisation (``int32(sum * 100 / requests)``).
    """

    target_milli = _milli(target)

    def ratio(total: float, count: int) -> float:
        if whole_percent:
            # rounded first: a float mean of 87 can be 86.99999999999999, which upstream's integer arithmetic never
            # sees (``int32(sum * 100 / requests)``)
            return float(math.floor(round(total / count, 9))) / target
        total_milli = _milli(total)
        if total_milli is None or not target_milli:
            return (total / count) / target
        # upstream averages whole milli-values (``GetMetricUsageRatio``: ``metricsTotal / int64(len(metrics))``) and
        # divides by the target's: three pods at 0.8 against 0.6 are 800 / 600, not 0.8000000000000002 / 0.6
        return (total_milli // count) / target_milli

    ready_count = pods.ready_with_metric
    usage_ratio = ratio(pods.metric_sum, ready_count)
    scale_up_with_unready = pods.unready > 0 and usage_ratio > 1.0
    if not scale_up_with_unready and pods.missing == 0:
        if within_tolerance(usage_ratio, tolerance_up, tolerance_down):
            return current_replicas, usage_ratio
        return ceil_replicas(usage_ratio * ready_count), usage_ratio

    metric_sum = pods.metric_sum
    samples = ready_count
    if pods.missing > 0 and usage_ratio != 1.0:
        if usage_ratio < 1.0:
            # scaling down: assume the missing pods are busy, so we do not remove capacity they may be using
            busy = target if missing_value_on_scale_down is None else missing_value_on_scale_down
            metric_sum += pods.missing * busy
        samples += pods.missing  # scaling up: they count as 0
    if scale_up_with_unready:
        samples += pods.unready  # unready pods count as 0
    new_usage_ratio = ratio(metric_sum, samples)
    if (
        within_tolerance(new_usage_ratio, tolerance_up, tolerance_down)
        or (usage_ratio < 1.0 and new_usage_ratio > 1.0)
        or (usage_ratio > 1.0 and new_usage_ratio < 1.0)
    ):
        return current_replicas, usage_ratio
    new_replicas = ceil_replicas(new_usage_ratio * samples)
    if (new_usage_ratio < 1.0 and new_replicas > current_replicas) or (
        new_usage_ratio > 1.0 and new_replicas < current_replicas
    ):
        return current_replicas, usage_ratio
    return new_replicas, usage_ratio


MAX_REPLICA_COUNT = 2**31 - 1  # int32, what a Deployment's replicas can hold


def ceil_replicas(value: float) -> int:
    """``math.ceil`` of a replica count, capped at ``MAX_REPLICA_COUNT``: a huge but finite metric (1e308 req/s
    from a broken exporter) overflows to inf on division and ``ceil(inf)`` raises, losing the tick for every
    service; capped, the max-replicas clamp decides as for any large value."""
    return math.ceil(min(value, MAX_REPLICA_COUNT))


def replicas_for_total_metric(
    status_replicas: int,
    total: float,
    target_per_replica: float,
    tolerance_up: float = 0.1,
    tolerance_down: float = 0.1,
) -> tuple[int, float]:
    """``GetExternalPerPodMetricReplicas`` (and ``GetObjectPerPodMetricReplicas``): a service-wide total (e.g. request
    rate) against a per-replica target.

    ``status_replicas`` is the scale subresource's ``status.replicas`` (pods created and not terminating), which
    upstream both divides by and returns inside the tolerance, not ``spec.replicas``. With no pod created upstream's
    float division gives +Inf (or NaN for a zero total); neither is within the tolerance, so the answer is then
    ``ceil(total / target)``: the same here, without dividing by zero.
    """
    # in whole milli-values, as upstream: 16.8 req/s at 2.4 a replica is 16800 / 2400 = 7 (7.000000000000001 in
    # floats, 8 replicas), and 34.56 on 12 replicas at 3.2 is exactly on the 0.9 tolerance edge
    usage_milli, target_milli = _milli(total), _milli(target_per_replica)
    usage: float = total
    target: float = target_per_replica
    if usage_milli is not None and target_milli:  # else beyond milli-values: floats
        usage, target = float(usage_milli), float(target_milli)
    no_pod = math.inf if total > 0 else math.nan
    usage_ratio = usage / (target * status_replicas) if status_replicas > 0 else no_pod
    if within_tolerance(usage_ratio, tolerance_up, tolerance_down):
        return status_replicas, usage_ratio
    return ceil_replicas(usage / target), usage_ratio


def stabilise(
    now: float,
    current_replicas: int,
    recommendation: int,
    history: tuple[tuple[float, int], ...],
    up_window_s: float,
    down_window_s: float,
) -> int:
    """``stabilizeRecommendationWithBehaviors``: scale up no further than the lowest recommendation of the up
    window, scale down no further than the highest recommendation of the down window. ``history`` holds earlier
    (time, unstabilised recommendation) pairs; the caller appends the new one."""
    up_recommendation = recommendation
    down_recommendation = recommendation
    up_cutoff = now - up_window_s
    down_cutoff = now - down_window_s
    for timestamp, value in history:
        if timestamp > up_cutoff and value < up_recommendation:
            up_recommendation = value
        if timestamp > down_cutoff and value > down_recommendation:
            down_recommendation = value
    stabilised = current_replicas
    if stabilised < up_recommendation:
        stabilised = up_recommendation
    if stabilised > down_recommendation:
        stabilised = down_recommendation
    return stabilised


def stabilise_without_behavior(
    now: float, recommendation: int, history: tuple[tuple[float, int], ...], window_s: float
) -> int:
    """``stabilizeRecommendation`` (an HPA without a behavior block): the highest recommendation of the
    scale-down window, whatever the current replicas. Upstream drops samples strictly before ``now - window``."""
    cutoff = now - window_s
    highest = recommendation
    for timestamp, value in history:
        if timestamp >= cutoff and value > highest:
            highest = value
    return highest


def scale_up_limit_without_behavior(current_replicas: int) -> int:
    """``calculateScaleUpLimit``: at most max(2 x current, 4) replicas per sync, with no memory of past events."""
    return max(2 * current_replicas, 4)


def store_scale_event(
    events: tuple[tuple[float, int], ...], now: float, change: int, longest_period_s: float
) -> tuple[tuple[float, int], ...]:
    """``storeScaleEvent``: the change made at ``now`` (+ up, - down), written over an outdated event of the same
    direction -- one from before ``now - longest_period_s``, the longest rate-policy period of that direction
    (``markScaleEventsOutdated``; the last such in the list, as upstream's loop picks) -- else appended. An event
    written over no longer counts in the *other* direction's periods either: scale-ups 15 s apart (the default
    scale-up period) leave only the latest in the list, so a scale-down policy of 2 pods per 120 s starts its period
    from the replicas before that one, not before both (16 -> 6 after 4 -> 8 -> 16, not 16 -> 2)."""
    cutoff = now - longest_period_s
    up = change > 0
    outdated = [i for i, (t, c) in enumerate(events) if (c > 0) == up and t < cutoff]
    if outdated:
        i = outdated[-1]
        return (*events[:i], (now, change), *events[i + 1 :])
    return (*events, (now, change))


def longest_period(rules: ScalingRules) -> float:
    """``getLongestPolicyPeriod``: the longest rate-policy period of one direction, seconds (0 without policies)."""
    return max((policy.period_s for policy in rules.policies), default=0.0)


def _changes_in_period(now: float, period_s: float, events: tuple[tuple[float, int], ...]) -> tuple[int, int]:
    """(replicas added, replicas removed) by scale events strictly inside the last ``period_s`` seconds."""
    cutoff = now - period_s
    added = removed = 0
    for timestamp, change in events:
        if timestamp > cutoff:
            if change > 0:
                added += change
            else:
                removed -= change
    return added, removed


def scale_up_limit(
    now: float, current_replicas: int, events: tuple[tuple[float, int], ...], rules: ScalingRules
) -> int:
    """``calculateScaleUpLimitWithScalingRules``: the most replicas the rate policies allow now."""
    if rules.select is SelectPolicy.DISABLED or not rules.policies:
        return current_replicas
    limits = []
    for policy in rules.policies:
        added, removed = _changes_in_period(now, policy.period_s, events)
        period_start = current_replicas - added + removed
        if policy.kind is RateKind.PODS:
            limits.append(period_start + policy.value)
        else:
            # rounded up, or a small Deployment could never grow by a percentage
            limits.append(math.ceil(period_start * (1 + policy.value / 100)))
    return min(limits) if rules.select is SelectPolicy.MIN else max(limits)


def scale_down_limit(
    now: float, current_replicas: int, events: tuple[tuple[float, int], ...], rules: ScalingRules
) -> int:
    """``calculateScaleDownLimitWithBehaviors``: the fewest replicas the rate policies allow now."""
    if rules.select is SelectPolicy.DISABLED or not rules.policies:
        return current_replicas
    limits = []
    for policy in rules.policies:
        added, removed = _changes_in_period(now, policy.period_s, events)
        period_start = current_replicas - added + removed
        if policy.kind is RateKind.PODS:
            limits.append(period_start - policy.value)
        else:
            limits.append(int(period_start * (1 - policy.value / 100)))  # truncation, as the HPA's int32()
    return max(limits) if rules.select is SelectPolicy.MIN else min(limits)
