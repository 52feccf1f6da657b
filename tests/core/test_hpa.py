"""The HPA arithmetic against the Kubernetes project's own worked examples.

Cases come from kubernetes/pkg/controller/podautoscaler/replica_calculator_test.go (CPU utilisation: each pod
requests 1.0 CPU, so a level of 300m is 30 %) and the HPA documentation's algorithm section.
"""

from __future__ import annotations

import pytest

from autoscaler.core import hpa
from autoscaler.core.model import PodMetrics, RateKind, RatePolicy, ScalingRules, SelectPolicy


def pods_from_levels(
    levels_milli: list[int], ready: list[bool] | None = None, pods: int | None = None
) -> PodMetrics:
    """Build PodMetrics like the upstream test harness: ``levels`` for the first pods, the rest have no sample."""
    count = pods if pods is not None else len(levels_milli)
    ready = ready if ready is not None else [True] * count
    metric_sum = 0.0
    with_metric = missing = unready = 0
    for index in range(count):
        if not ready[index]:
            unready += 1
        elif index < len(levels_milli):
            with_metric += 1
            metric_sum += levels_milli[index] / 10.0  # milli-CPU of a 1.0 request -> percent
        else:
            missing += 1
    return PodMetrics(with_metric, metric_sum, missing, unready)


# (name, current replicas, levels in milli-CPU, readiness, pods, target %, expected replicas)
UPSTREAM_CASES = [
    ("ScaleUp", 3, [300, 500, 700], None, None, 30, 5),
    ("ScaleUpUnreadyLessScale", 3, [300, 500, 700], [False, True, True], None, 30, 4),
    ("ScaleUpUnreadyNoScale", 3, [400, 500, 700], [True, False, False], None, 30, 3),
    ("ScaleDown", 5, [100, 300, 500, 250, 250], None, None, 50, 3),
    ("ScaleDownIncludeUnreadyPods", 5, [100, 300, 500, 250, 250], [True, True, True, False, False], None, 50, 2),
    ("ScaleDownExcludeUnscheduledPods", 5, [100], [True, False, False, False, False], None, 50, 1),
    ("MissingMetricsUnreadyScaleDown", 4, [100, 100, 100], [False, True, True, True], 4, 50, 3),
    ("missing samples count as 0 on a scale-up", 4, [100, 2000], None, 4, 50, 4),  # (10+200)/4 = 52.5 %: in tolerance
    ("DuringRollingUpdateWithMaxSurge", 2, [100, 100], None, 3, 50, 2),
    ("Tolerance: 105 % of target keeps replicas", 3, [1050, 1050, 1050], None, None, 100, 3),
]


@pytest.mark.parametrize(("name", "current", "levels", "ready", "pods", "target", "expected"), UPSTREAM_CASES)
def test_replica_calculator_matches_upstream(
    name: str, current: int, levels: list[int], ready: list[bool] | None, pods: int | None, target: float, expected: int
) -> None:
    metrics = pods_from_levels(levels, ready, pods)
    replicas, _ = hpa.replicas_for_pod_metric(current, metrics, target, 0.1, 0.1, missing_value_on_scale_down=100.0)
    assert replicas == expected, name


def test_missing_pods_count_as_full_not_target_on_scale_down() -> None:
    # 2 ready pods at 10 % of a 50 % target, 1 ready pod without a sample: counting it at 100 % gives
    # (10 + 10 + 100) / 3 = 40 % -> ceil(0.8 * 3) = 3; at the target it would be 2.
    metrics = PodMetrics(ready_with_metric=2, metric_sum=20.0, missing=1)
    assert hpa.replicas_for_pod_metric(3, metrics, 50, missing_value_on_scale_down=100.0)[0] == 3
    assert hpa.replicas_for_pod_metric(3, metrics, 50)[0] == 2


# Documentation: "if the current metric value is 200m, and the desired value is 100m, the number of replicas will be
# doubled ... If the current value is instead 50m, you'll scale down by half".
@pytest.mark.parametrize(
    ("current", "value", "target", "expected"),
    [(4, 200, 100, 8), (4, 50, 100, 2), (4, 105, 100, 4), (4, 111, 100, 5), (4, 89, 100, 4), (10, 89, 100, 9)],
)
def test_documented_formula_on_pod_metric(current: int, value: float, target: float, expected: int) -> None:
    metrics = PodMetrics(ready_with_metric=current, metric_sum=value * current)
    assert hpa.replicas_for_pod_metric(current, metrics, target)[0] == expected


@pytest.mark.parametrize(
    ("status", "total", "target", "expected"),
    [(1, 8600, 4400, 2), (3, 8600, 2150, 4), (5, 8600, 2867, 3), (2, 2000, 1000, 2), (2, 2150, 1000, 2)],
)
def test_external_per_pod_metric(status: int, total: float, target: float, expected: int) -> None:
    # Upstream: ScaleUpCMExternal (1 -> 2), ScaleUpPerPodCMExternal (3 -> 4), ScaleDownPerPodCMExternal (5 -> 3).
    assert hpa.replicas_for_total_metric(status, total, target)[0] == expected


@pytest.mark.parametrize(
    ("ratio", "up", "down", "inside"),
    [(1.0, 0.1, 0.1, True), (1.1, 0.1, 0.1, True), (1.11, 0.1, 0.1, False), (0.9, 0.1, 0.1, True),
     (0.89, 0.1, 0.1, False), (1.04, 0.0, 0.5, False), (0.6, 0.0, 0.5, True)],
)
def test_per_direction_tolerance(ratio: float, up: float, down: float, inside: bool) -> None:
    assert hpa.within_tolerance(ratio, up, down) is inside


def test_stabilisation_takes_highest_recommendation_in_down_window() -> None:
    history = ((0.0, 10), (100.0, 6), (200.0, 8))
    # at t=250 all three are inside a 300 s window: the highest (10) wins over the new 4
    assert hpa.stabilise(250.0, 10, 4, history, 0.0, 300.0) == 10
    # at t=350 the first fell out: highest is 8
    assert hpa.stabilise(350.0, 10, 4, history, 0.0, 300.0) == 8
    # at t=601 all fell out: the new recommendation applies
    assert hpa.stabilise(601.0, 10, 4, history, 0.0, 300.0) == 4


def test_stabilisation_up_window_takes_lowest() -> None:
    history = ((0.0, 3), (30.0, 9))
    assert hpa.stabilise(40.0, 3, 12, history, 60.0, 0.0) == 3
    assert hpa.stabilise(61.0, 3, 12, history, 60.0, 0.0) == 9


DEFAULT_UP = ScalingRules(0.0, (RatePolicy(RateKind.PODS, 4, 15.0), RatePolicy(RateKind.PERCENT, 100, 15.0)))
DEFAULT_DOWN = ScalingRules(300.0, (RatePolicy(RateKind.PERCENT, 100, 15.0),))


@pytest.mark.parametrize(
    ("current", "events", "now", "expected"),
    [
        (1, (), 100.0, 5),  # max(1 + 4, 2 * 1)
        (10, (), 100.0, 20),  # max(10 + 4, 2 * 10)
        (10, ((90.0, 5),), 100.0, 10),  # the period started at 5 replicas: max(5 + 4, 2 * 5)
        (10, ((85.0, 5),), 100.0, 20),  # the event is exactly one period old: outside the period
    ],
)
def test_scale_up_rate_limit(current: int, events: tuple[tuple[float, int], ...], now: float, expected: int) -> None:
    assert hpa.scale_up_limit(now, current, events, DEFAULT_UP) == expected


def test_scale_down_rate_limits() -> None:
    assert hpa.scale_down_limit(0.0, 10, (), DEFAULT_DOWN) == 0
    pods_rule = ScalingRules(300.0, (RatePolicy(RateKind.PODS, 1, 60.0), RatePolicy(RateKind.PERCENT, 10, 60.0)))
    # Max select: the policy allowing the largest change: min(10 - 1, int(10 * 0.9)) = 9
    assert hpa.scale_down_limit(0.0, 10, (), pods_rule) == 9
    # After removing 1 in the period: period start is 10 again, limit stays 9 for current 9
    assert hpa.scale_down_limit(30.0, 9, ((0.0, -1),), pods_rule) == 9
    min_rule = ScalingRules(300.0, pods_rule.policies, SelectPolicy.MIN)
    assert hpa.scale_down_limit(0.0, 100, (), min_rule) == 99  # Min: max(99, 90)
    disabled = ScalingRules(300.0, pods_rule.policies, SelectPolicy.DISABLED)
    assert hpa.scale_down_limit(0.0, 100, (), disabled) == 100
