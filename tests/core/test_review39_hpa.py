"""Review 39: the reactive mode's fidelity to the Kubernetes HorizontalPodAutoscaler (``core.hpa``, ``core.decide``,
``policy``), compared with ``pkg/controller/podautoscaler`` (``horizontal.go``, ``replica_calculator.go``, read
through the code index: the autoscaling/v2 revision with KEP-4951 ``Tolerances``, ``recordInitialRecommendation``,
``GetExternalPerPodMetricReplicas`` with its int32 cap and ``storeScaleEvent`` / ``markScaleEventsOutdated``).

Defects found (strict xfails below, each with a WRONG / RIGHT docstring; all three fixed in the same stop, their
tests now say "Fixed"):

1. ``hpa.replicas_for_total_metric`` / ``hpa.replicas_for_pod_metric`` (non-percent metrics) divide floats where
   upstream divides integer milli-values (``GetExternalPerPodMetricReplicas``: ``float64(usage) /
   float64(targetUsagePerPod)``; ``calcPlainMetricReplicas`` via ``GetMetricUsageRatio``: ``metricsTotal /
   int64(len(metrics))``). At an exact multiple of the target the float quotient lands a hair above the integer (or
   the ratio a hair outside the tolerance) and ``ceil`` adds a replica: 16.8 req/s at 2.4 per replica asks 8, not
   7; 3 pods at engine_active 0.8 against 0.6 ask 5, not 4; 34.56 req/s on 12 replicas at the packaged 3.2 is
   exactly the 0.9 tolerance edge upstream holds at and this scales down. The project already guards GPU
   utilisation against the same noise (``whole_percent``: ``round(mean, 9)``), not the other metrics.
2. ``hpa._changes_in_period`` counts every scale event of the last ``periodSeconds``; upstream keeps its events in
   per-direction slots and ``storeScaleEvent`` overwrites a slot marked outdated by that direction's *longest*
   period (``markScaleEventsOutdated``), after which ``getReplicasChangePerPeriod`` no longer sees it in the other
   direction's longer period. The replicas "at the period start" then differ: a scale-up allowed 8 upstream goes
   to 9 here, a scale-down upstream stops at 6 goes to 2 here. (tests/core/test_hpa_upstream.py calls the slot reuse
   a storage detail; these cases show that it changes the answer.)
3. ``policy.ScalingRulesSpec.tolerance`` is bounded ``< 1``; the HPA API only requires ``>= 0`` (``HPAScalingRules``:
   "Must be greater than or equal to zero"), and upstream's own ``TestReplicaCalcConfigurableTolerance`` uses a
   200 % scale-up tolerance. Such an HPA cannot be written as (or imported into) a GPUScalingPolicy.
   (tests/kube/test_crd_parity.py pins ``tolerance: 1`` as refused: a fix must change that case too.)

Pins of right behaviour checked against upstream and not pinned elsewhere: the rate policies' float arithmetic is
upstream's (Percent ceil / int32 truncation, noise included); GPU utilisation is truncated to a whole percent before
the inclusive per-direction tolerance; the behaviour-less path takes the window's maximum even above the metric on a
scale-up; the recorded recommendation is the raw one while the event is the change made; the HPA documentation's
Pods 4 / Percent 10 per 60 s scale-down walks 80 -> 72 -> 64 -> 57 with strict period edges; a partial behavior
block gets upstream's defaults (``SetDefaults_HorizontalPodAutoscalerBehavior`` and the controller's 300 s window).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoscaler.core import hpa
from autoscaler.core.decide import decide_service
from autoscaler.core.model import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    MetricKind,
    PodMetrics,
    RateKind,
    RatePolicy,
    ScalingRules,
    SelectPolicy,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.reasons import Reason
from autoscaler.policy import GPUScalingPolicySpec, ScalingRulesSpec, to_service_policy

NO_WINDOW_DOWN = ScalingRules(0.0, (RatePolicy(RateKind.PERCENT, 100, 15.0),))


def _policy(metric: MetricKind, target: float, **changes: object) -> ServicePolicy:
    base = ServicePolicy("ml", "chat", 1, 100, metric, target, scale_down=NO_WINDOW_DOWN)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _total(replicas: int, total: float) -> ServiceObservation:
    return ServiceObservation("ml/chat", replicas, replicas, metric_total=total, status_replicas=replicas)


def _pods(values: list[float]) -> ServiceObservation:
    # as the Prometheus adapter builds it: a float sum of the per-pod values (adapters/prometheus.py _pod_metrics)
    n = len(values)
    return ServiceObservation("ml/chat", n, n, PodMetrics(n, sum(values)))


def _milli(value: float) -> int:
    return round(value * 1000)


def _go_per_pod_total(usage: float, target: float, status: int, tolerance: float = 0.1) -> int:
    """``GetExternalPerPodMetricReplicas`` on milli-values (int64), as upstream computes it."""
    usage_m, target_m = _milli(usage), _milli(target)
    ratio = float(usage_m) / (float(target_m) * float(status))
    if 1.0 - tolerance <= ratio <= 1.0 + tolerance:
        return status
    return math.ceil(float(usage_m) / float(target_m))


def _go_plain(values: list[float], target: float, current: int, tolerance: float = 0.1) -> int:
    """``calcPlainMetricReplicas`` with every pod ready and reporting: ``GetMetricUsageRatio`` averages the milli
    values with an integer division."""
    milli = [_milli(v) for v in values]
    average = sum(milli) // len(milli)
    ratio = float(average) / float(_milli(target))
    if 1.0 - tolerance <= ratio <= 1.0 + tolerance:
        return current
    return math.ceil(ratio * len(milli))


# ---- defect 1: float quotients where upstream divides integer milli-values -------------------------------------------

# (policy, observation, upstream's answer)
FLOAT_NOISE_CASES = [
    pytest.param(_policy(MetricKind.REQUEST_RATE, 2.4), _total(10, 16.8), 7, id="total-16.8-at-2.4-is-7"),
    pytest.param(_policy(MetricKind.REQUEST_RATE, 0.7), _total(5, 2.1), 3, id="total-2.1-at-0.7-is-3"),
    pytest.param(
        _policy(MetricKind.REQUEST_RATE, 3.2),
        _total(12, 34.56),
        12,
        id="total-at-exactly-0.9-of-3.2-holds",
    ),
    pytest.param(_policy(MetricKind.ENGINE_ACTIVE, 0.6), _pods([0.8, 0.8, 0.8]), 4, id="engine-3x0.8-at-0.6-is-4"),
    pytest.param(_policy(MetricKind.ENGINE_ACTIVE, 0.7), _pods([0.35] * 6), 3, id="engine-6x0.35-at-0.7-is-3"),
    # where the float arithmetic happens to be exact, the two agree (these must keep passing)
    pytest.param(_policy(MetricKind.REQUEST_RATE, 3.2), _total(3, 19.2), 6, id="total-19.2-at-3.2-is-6"),
    pytest.param(_policy(MetricKind.ENGINE_ACTIVE, 0.5), _pods([0.75] * 4), 6, id="engine-4x0.75-at-0.5-is-6"),
]


@pytest.mark.parametrize(("policy", "obs", "upstream"), FLOAT_NOISE_CASES)
def test_an_exact_multiple_of_the_target_gets_upstreams_replicas(
    policy: ServicePolicy, obs: ServiceObservation, upstream: int
) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``replicas_for_total_metric`` computes ``total / (target * status)`` and ``ceil(total / target)`` in
    floats, and ``replicas_for_pod_metric`` (``whole_percent=False``) ``(metric_sum / n) / target`` then
    ``ceil(ratio * n)``. 16.8 / 2.4 is 7.000000000000001 (8 replicas), 2.1 / 0.7 is 3.0000000000000004 (4), three
    float 0.8s sum to 2.4000000000000004 (5 replicas for 4), 34.56 / (3.2 x 12) is 0.8999999999999999, just outside
    the 0.1 scale-down tolerance (12 -> 11).
    RIGHT: upstream works on the metrics API's milli-values: ``GetExternalPerPodMetricReplicas`` divides
    ``float64(16800) / float64(2400)`` = 7 and compares ``34560 / (3200 x 12)`` = 0.9 with the inclusive tolerance
    (hold at 12); ``GetMetricUsageRatio`` averages ``2400 / 3`` = 800 milli and ``ceil(800 / 600 x 3)`` = 4. The
    answer must be upstream's at an exact multiple of the target, as it already is for GPU utilisation
    (``whole_percent`` rounds the mean to 9 places before truncating)."""
    if obs.pods is not None:
        values = [obs.pods.metric_sum / obs.pods.ready_with_metric] * obs.pods.ready_with_metric
        assert _go_plain(values, policy.target, obs.spec_replicas) == upstream  # the port agrees with the table
    else:
        assert obs.metric_total is not None
        assert _go_per_pod_total(obs.metric_total, policy.target, obs.created_replicas) == upstream
    made, _ = decide_service(policy, obs, ServiceState(), 0.0)
    assert made.desired_replicas == upstream, made.detail


# ---- defect 2: upstream overwrites outdated scale-event slots -------------------------------------------------------

_UP_ONE_PER_MINUTE = ScalingRules(0.0, (RatePolicy(RateKind.PODS, 1, 60.0),), SelectPolicy.MAX, 0.0)
_DOWN_ALL_PER_15S = ScalingRules(0.0, (RatePolicy(RateKind.PERCENT, 100, 15.0),), SelectPolicy.MAX, 0.0)
_UP_DEFAULT = dataclasses.replace(DEFAULT_SCALE_UP, tolerance=0.0)
_DOWN_TWO_PER_2MIN = ScalingRules(0.0, (RatePolicy(RateKind.PODS, 2, 120.0),), SelectPolicy.MAX, 0.0)

# (up rules, down rules, first replicas, [(time s, request-rate total = the recommendation)], upstream's last answer)
SLOT_CASES = [
    pytest.param(
        _UP_ONE_PER_MINUTE, _DOWN_ALL_PER_15S, 10, [(0.0, 7.0), (20.0, 5.0), (40.0, 9.0)], 8,
        id="scale-up-after-an-overwritten-scale-down",
    ),
    pytest.param(
        _UP_DEFAULT, _DOWN_TWO_PER_2MIN, 4, [(0.0, 8.0), (30.0, 16.0), (60.0, 1.0)], 6,
        id="scale-down-after-an-overwritten-scale-up",
    ),
    # events of one direction only, none overwritten before it counts: the two agree
    pytest.param(
        _UP_ONE_PER_MINUTE, _DOWN_ALL_PER_15S, 10, [(0.0, 7.0), (40.0, 12.0)], 11, id="no-overwrite-no-difference"
    ),
]  # fmt: skip


@pytest.mark.parametrize(("up", "down", "replicas", "ticks", "upstream"), SLOT_CASES)
def test_period_start_counts_the_scale_events_upstream_still_holds(
    up: ScalingRules, down: ScalingRules, replicas: int, ticks: list[tuple[float, float]], upstream: int
) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``decide_service`` keeps every scale event for the longest period of either direction and
    ``_changes_in_period`` counts all of those inside each policy's ``periodSeconds``. Case 1 (scale-up 1 pod / 60 s,
    scale-down 100 % / 15 s): 10 -> 7 at t=0, 7 -> 5 at t=20, then at t=40 the period start is 5 + 3 + 2 = 10 and the
    limit 11, so 5 -> 9. Case 2 (default scale-up, scale-down 2 pods / 120 s): 4 -> 8 at t=0, 8 -> 16 at t=30, then
    at t=60 the period start is 16 - 4 - 8 = 4, the limit 2, so 16 -> 2.
    RIGHT: upstream ``storeScaleEvent`` first runs ``markScaleEventsOutdated(events, getLongestPolicyPeriod(same
    direction))`` and writes the new event over an outdated slot. In case 1 the t=0 scale-down (older than the 15 s
    scale-down period at t=20) is overwritten by the t=20 one, so at t=40 ``getReplicasChangePerPeriod(60,
    scaleDownEvents)`` sees 2 removed: period start 7, limit 8, 5 -> 8. In case 2 the t=0 scale-up is overwritten at
    t=30 (default scale-up period 15 s): 8 added within 120 s, period start 8, limit 6, 16 -> 6
    (``calculateScaleUpLimitWithScalingRules`` / ``calculateScaleDownLimitWithBehaviors``)."""
    policy = ServicePolicy("ml", "chat", 1, 100, MetricKind.REQUEST_RATE, 1.0, up, down)
    state, current, desired = ServiceState(), replicas, replicas
    for now, total in ticks:
        made, state = decide_service(policy, _total(current, total), state, now)
        desired, current = made.desired_replicas, made.desired_replicas
    assert desired == upstream, state.scale_events


# ---- defect 3: the policy refuses tolerances the HPA API accepts ---------------------------------------------------


@pytest.mark.parametrize("tolerance", [1.0, 2.0])
def test_a_tolerance_the_hpa_api_accepts_is_accepted(tolerance: float) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``ScalingRulesSpec.tolerance`` has ``lt=1``, so ``scaleUp: {tolerance: 2}`` is an invalid spec (and an
    HPA carrying it cannot be imported).
    RIGHT: ``HPAScalingRules.tolerance`` "must be greater than or equal to zero" and nothing more; upstream's
    ``TestReplicaCalcConfigurableTolerance`` "Within a 200% scale-up tolerance" case runs with 2.0, and the core
    (``hpa.within_tolerance``) handles it: the spec should carry it through to ``ScalingRules.tolerance``."""
    spec = GPUScalingPolicySpec.model_validate(
        {"targetRef": {"name": "chat"}, "behavior": {"scaleUp": {"tolerance": tolerance}}}
    )
    policy = to_service_policy("ml", "chat-policy", spec)
    assert policy.scale_up.tolerance == tolerance
    # what the core does with it: 190 % of target is within a 200 % scale-up tolerance (upstream case, 3 replicas)
    assert hpa.replicas_for_pod_metric(3, PodMetrics(3, 570.0), 100.0, 2.0, 0.1, whole_percent=True)[0] == 3


def test_the_core_already_applies_a_tolerance_above_one() -> None:
    """The arithmetic side of defect 3 works: only the policy model stands in the way."""
    assert ScalingRulesSpec.model_validate({"tolerance": 0.99}).tolerance == 0.99
    assert hpa.within_tolerance(2.9, 2.0, 0.1) and not hpa.within_tolerance(3.01, 2.0, 0.1)


# ---- pins: right behaviour checked against upstream ---------------------------------------------------------------

# (direction, period-start replicas, percent, expected limit): Go's float64 arithmetic, noise included, is Python's
PERCENT_ARITHMETIC = [
    pytest.param("up", 50, 10, 56, id="up-50x1.1=55.00000000000001-ceil-56"),
    pytest.param("up", 25, 12, 29, id="up-25x1.12=28.000000000000004-ceil-29"),
    pytest.param("up", 3, 10, 4, id="up-3x1.1-ceil-4"),
    pytest.param("down", 30, 90, 2, id="down-30x0.1=2.999999999999999-int32-2"),
    pytest.param("down", 10, 90, 0, id="down-10x0.1=0.9999999999999998-int32-0"),
    pytest.param("down", 72, 10, 64, id="down-72x0.9=64.8-int32-64"),
    pytest.param("down", 3, 150, -1, id="down-percent-over-100-truncates-toward-zero"),
]


@pytest.mark.parametrize(("direction", "start", "percent", "expected"), PERCENT_ARITHMETIC)
def test_percent_policies_use_upstreams_float_arithmetic(
    direction: str, start: int, percent: int, expected: int
) -> None:
    """``calculateScaleUpLimitWithScalingRules``: ``int32(math.Ceil(float64(p) * (1 + float64(v)/100)))``;
    ``calculateScaleDownLimitWithBehaviors``: ``int32(float64(p) * (1 - float64(v)/100))`` (truncation toward 0).
    Exact (rational) arithmetic would give 55, 28, 3 and 1 in the noisy rows: not what the HPA does."""
    rules = ScalingRules(0.0, (RatePolicy(RateKind.PERCENT, percent, 60.0),))
    limit = hpa.scale_up_limit if direction == "up" else hpa.scale_down_limit
    assert limit(0.0, start, (), rules) == expected


# (per-pod GPU utilisation %, expected replicas of 10 at target 70 with the default 0.1 tolerances)
WHOLE_PERCENT_EDGES = [
    pytest.param(77.0, 10, id="77-is-ratio-1.1-inclusive-hold"),
    pytest.param(77.9, 10, id="77.9-truncates-to-77-hold"),
    pytest.param(78.0, 12, id="78-scales-up-ceil(11.14)"),
    pytest.param(63.0, 10, id="63-is-ratio-0.9-inclusive-hold"),
    pytest.param(62.9, 9, id="62.9-truncates-to-62-scales-down-ceil(8.86)"),
]


@pytest.mark.parametrize(("util", "expected"), WHOLE_PERCENT_EDGES)
def test_gpu_utilisation_is_truncated_then_held_within_the_inclusive_tolerance(util: float, expected: int) -> None:
    """``GetResourceUtilizationRatio``: ``int32(sum * 100 / requests)`` then ``Tolerances.isWithin``:
    ``1 - down <= ratio <= 1 + up``, both ends inclusive."""
    policy = _policy(MetricKind.GPU_UTILIZATION, 70.0)
    made, _ = decide_service(policy, _pods([util] * 10), ServiceState(), 0.0)
    assert made.desired_replicas == expected, made.detail


def test_without_behavior_the_window_maximum_wins_even_above_the_metric_on_a_scale_up() -> None:
    """``normalizeDesiredReplicas``: ``stabilizeRecommendation`` returns the highest recommendation of the window,
    whatever the current replicas, then ``convertDesiredReplicasWithRules`` caps it at max(2 x current, 4): at 6
    replicas with a 12 recommended 60 s ago, a metric asking 8 scales to 12 (ScaleDownStabilized is upstream's
    condition reason there too)."""
    policy = _policy(MetricKind.REQUEST_RATE, 1.0, behavior=False, scale_down=DEFAULT_SCALE_DOWN)
    made, state = decide_service(policy, _total(6, 8.0), ServiceState(((-60.0, 12),)), 0.0)
    assert (made.desired_replicas, made.reason) == (12, Reason.SCALE_DOWN_STABILISED), made.detail
    assert state.recommendations[-1] == (0.0, 8)  # the prenormalized recommendation is what is recorded
    assert state.scale_events == ()  # no behavior block: upstream stores no scale event


def test_with_behavior_the_raw_recommendation_is_recorded_and_the_event_is_the_change_made() -> None:
    """``stabilizeRecommendationWithBehaviors`` records ``args.DesiredReplicas`` (before the rate limit);
    ``storeScaleEvent(behavior, key, currentReplicas, desiredReplicas)`` the change actually made."""
    policy = _policy(MetricKind.REQUEST_RATE, 1.0, scale_up=_UP_DEFAULT, scale_down=DEFAULT_SCALE_DOWN)
    made, state = decide_service(policy, _total(2, 40.0), ServiceState(), 0.0)
    assert (made.desired_replicas, made.reason) == (6, Reason.SCALE_UP_RATE_LIMITED)  # max(2 + 4, 2 x 2)
    assert state.recommendations == ((0.0, 2), (0.0, 40))  # the initial recommendation, then the raw one
    assert state.scale_events == ((0.0, 4),)


def test_the_documented_scale_down_walk_with_pods_4_and_percent_10_per_minute() -> None:
    """The HPA documentation's example (Pods 4 and Percent 10 per 60 s, selectPolicy Max): 80 replicas wanting 10 lose
    8 (10 %) in the first step, nothing more inside that period, then 72 -> 64 -> 57 -> ... one step per period.
    A period is ``timestamp.After(now - period)``: the event made exactly 60 s ago no longer counts."""
    down = ScalingRules(0.0, (RatePolicy(RateKind.PODS, 4, 60.0), RatePolicy(RateKind.PERCENT, 10, 60.0)))
    policy = _policy(MetricKind.REQUEST_RATE, 1.0, scale_down=dataclasses.replace(down, tolerance=0.0))
    state, current, seen = ServiceState(), 80, []
    for tick in range(17):
        made, state = decide_service(policy, _total(current, 10.0), state, tick * 15.0)
        current = made.desired_replicas
        seen.append(current)
    assert seen == [72] * 4 + [64] * 4 + [57] * 4 + [51] * 4 + [45], seen


# (behavior block as written, expected (up rules, down rules)) after upstream's defaulting
_DOWN_PODS = {"type": "Pods", "value": 1, "periodSeconds": 60}
DEFAULTING_CASES = [
    pytest.param({}, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN, id="no-behavior-block"),
    pytest.param(
        {"scaleDown": {"policies": [_DOWN_PODS]}},
        DEFAULT_SCALE_UP,
        ScalingRules(300.0, (RatePolicy(RateKind.PODS, 1, 60.0),)),
        id="scaleDown-policies-only-keeps-the-300s-window",
    ),
    pytest.param(
        {"scaleUp": {"stabilizationWindowSeconds": 60}},
        dataclasses.replace(DEFAULT_SCALE_UP, stabilisation_s=60.0),
        DEFAULT_SCALE_DOWN,
        id="scaleUp-window-only-keeps-the-default-policies",
    ),
    pytest.param(
        {"scaleDown": {"selectPolicy": "Disabled"}},
        DEFAULT_SCALE_UP,
        dataclasses.replace(DEFAULT_SCALE_DOWN, select=SelectPolicy.DISABLED),
        id="disabled-keeps-the-window-and-default-policies",
    ),
    pytest.param(
        {"scaleUp": {"tolerance": 0.05}, "scaleDown": {"tolerance": 0.2, "stabilizationWindowSeconds": 0}},
        dataclasses.replace(DEFAULT_SCALE_UP, tolerance=0.05),
        dataclasses.replace(DEFAULT_SCALE_DOWN, stabilisation_s=0.0, tolerance=0.2),
        id="per-direction-tolerance-and-an-explicit-zero-window",
    ),
]


@pytest.mark.parametrize(("behavior", "up", "down"), DEFAULTING_CASES)
def test_a_partial_behavior_block_gets_upstreams_defaults(
    behavior: dict[str, object], up: ScalingRules, down: ScalingRules
) -> None:
    """``SetDefaults_HorizontalPodAutoscalerBehavior``: a direction left out, or its policies / selectPolicy left
    out, get ``GenerateHPAScaleUpRules`` / ``GenerateHPAScaleDownRules`` (up: 0 s, Pods 4 and Percent 100 per 15 s,
    Max; down: Percent 100 per 15 s, Max); an unset scale-down window is the controller's 300 s
    (``maybeInitScaleDownStabilizationWindow``); an unset tolerance is the cluster-wide 0.1."""
    spec = GPUScalingPolicySpec.model_validate({"targetRef": {"name": "chat"}, "behavior": behavior})
    policy = to_service_policy("ml", "chat-policy", spec)
    assert (policy.scale_up, policy.scale_down, policy.behavior) == (up, down, True)
