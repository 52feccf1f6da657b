"""The HPA divides a per-pod External / Object metric by the scale's ``status.replicas``, not ``spec.replicas``.

Upstream (kubernetes/kubernetes ``pkg/controller/podautoscaler``):

* ``horizontal.go`` ``computeReplicasForMetrics`` reads ``specReplicas := scale.Spec.Replicas`` and
  ``statusReplicas := scale.Status.Replicas`` and hands both to ``computeReplicasForMetric``;
  ``computeStatusForExternalMetric`` / ``computeStatusForObjectMetric`` call
  ``GetExternalPerPodMetricReplicas(statusReplicas, ...)`` / ``GetObjectPerPodMetricReplicas(statusReplicas, ...)``
  for an ``AverageValue`` target. Every other metric (Resource, Pods, External/Object ``Value``) gets
  ``specReplicas``.
* ``replica_calculator.go`` ``GetExternalPerPodMetricReplicas``: ``replicaCount = statusReplicas``,
  ``usageRatio = usage / (targetPerPod * replicaCount)``; inside the tolerance it returns ``statusReplicas``,
  otherwise ``ceil(usage / targetPerPod)``. With ``statusReplicas == 0`` Go's float division gives +Inf (usage > 0)
  or NaN (usage == 0); neither is within the tolerance, so the answer is ``ceil(usage / target)`` (0 for no usage).
* ``reconcileAutoscaler``: ``currentReplicas := scale.Spec.Replicas`` for everything after the metric: the
  "scaling disabled" check (``scale.Spec.Replicas == 0``), the min/max clamps, ``recordInitialRecommendation``,
  the stabilisation windows and the rate limits (``normalizeDesiredReplicas*``).

``status.replicas`` differs from ``spec.replicas`` while a scale-up's pods are still being created (status below
spec) and during a rolling update with surge pods (status above spec). The expected values below are upstream's
answers worked through the Go code with the default tolerance 0.1 and a target of 10 per pod.
"""

from __future__ import annotations

import math

import pytest

from autoscaler.core import hpa
from autoscaler.core.decide import decide_service
from autoscaler.core.model import MetricKind, PodMetrics, ServiceObservation, ServicePolicy, ServiceState

NOW = 1_700_000_000.0
TARGET = 10.0  # requests/s per replica (upstream: an External metric with AverageValue 10)
# upstream `recommendations: []timestampedRecommendation{}`: known, nothing inside any window
KNOWN_EMPTY: tuple[tuple[float, int], ...] = ((NOW - 3600.0, 0),)


def policy(behavior: bool = True, metric: MetricKind = MetricKind.REQUEST_RATE) -> ServicePolicy:
    return ServicePolicy(
        namespace="ml", name="chat", min_replicas=1, max_replicas=30, metric=metric, target=TARGET, behavior=behavior
    )


def desired(
    spec: int, status: int | None, total: float, *, behavior: bool = True, history: tuple[tuple[float, int], ...] = ()
) -> int:
    pol = policy(behavior)
    obs = ServiceObservation(
        key=pol.key, spec_replicas=spec, ready_replicas=min(spec, status or 0), metric_total=total,
        status_replicas=status,
    )  # fmt: skip
    decision, _ = decide_service(pol, obs, ServiceState(recommendations=history), NOW)
    return decision.desired_replicas


# (spec.replicas, status.replicas, total req/s, upstream's desired replicas). Rows marked * gave a different answer
# when the ratio was taken over spec.replicas (the old answer in the comment).
CASES = [
    # * rolling update, 2 surge pods: 125 / (10 x 12) = 1.04 is within tolerance -> statusReplicas 12 (old: 13)
    pytest.param(10, 12, 125.0, 12, id="surge-within-tolerance-keeps-status"),
    # * scale-up 8 -> 10, two pods not created yet: 85 / 80 = 1.06 within -> 8, a scale-down (old: 9)
    pytest.param(10, 8, 85.0, 8, id="creating-within-tolerance-returns-status"),
    # * no pod created yet: usage / 0 = +Inf, never within tolerance -> ceil(42 / 10) = 5 (old: 42/40 within -> 4)
    pytest.param(4, 0, 42.0, 5, id="status-zero-infinite-ratio"),
    # no pod and no usage: 0/0 = NaN, not within -> ceil(0) = 0, clamped to minReplicas 1 (the same before)
    pytest.param(4, 0, 0.0, 1, id="status-zero-no-usage-nan-ratio"),
    # outside the tolerance both ways the answer is ceil(total / target), whatever the replicas divided by
    pytest.param(10, 12, 135.0, 14, id="surge-outside-tolerance"),
    pytest.param(10, 8, 95.0, 10, id="creating-outside-tolerance"),
    pytest.param(10, 8, 60.0, 6, id="creating-scale-down"),
    # status == spec: unchanged
    pytest.param(10, 10, 85.0, 9, id="settled-scale-down"),
    pytest.param(10, 10, 105.0, 10, id="settled-within-tolerance"),
    # status unknown (None): taken as spec, the behaviour of every observation built without it
    pytest.param(10, None, 85.0, 9, id="status-unknown-is-spec"),
]


@pytest.mark.parametrize(("spec", "status", "total", "expected"), CASES)
def test_total_metric_is_divided_by_status_replicas(spec: int, status: int | None, total: float, expected: int) -> None:
    assert desired(spec, status, total, history=KNOWN_EMPTY) == expected


@pytest.mark.parametrize(("spec", "status", "total", "expected"), CASES)
def test_without_behavior_block_too(spec: int, status: int | None, total: float, expected: int) -> None:
    """``normalizeDesiredReplicas`` (no behavior block): the scale-up cap max(2 x spec, 4) is far above every row."""
    assert desired(spec, status, total, behavior=False, history=KNOWN_EMPTY) == expected


def test_stabilisation_and_limits_stay_on_spec_replicas() -> None:
    """A new controller remembers spec.replicas (``recordInitialRecommendation(currentReplicas)``), so the
    recommendation of 8 created pods is held at spec 10 for the scale-down window, as upstream does."""
    assert desired(10, 8, 85.0) == 10
    # the rate limit counts from spec: +4 pods or +100 % of spec 2 per 15 s -> 6, not from the 1 created pod
    assert desired(2, 1, 200.0, history=KNOWN_EMPTY) == 6


def test_scaling_disabled_reads_spec_not_status() -> None:
    """``scale.Spec.Replicas == 0 && minReplicas != 0``: scaling is off even while old pods still run."""
    assert desired(0, 3, 500.0, history=KNOWN_EMPTY) == 0


def test_pod_metrics_ignore_status_replicas() -> None:
    """``GetResourceReplicas`` / ``GetMetricReplicas`` get specReplicas: within tolerance they return spec."""
    pol = policy(metric=MetricKind.GPU_UTILIZATION)
    obs = ServiceObservation(
        key=pol.key, spec_replicas=10, ready_replicas=8, pods=PodMetrics(8, 8 * 10.5), status_replicas=8
    )
    decision, _ = decide_service(pol, obs, ServiceState(recommendations=KNOWN_EMPTY), NOW)
    assert decision.desired_replicas == 10


# replicas_for_total_metric itself: (status replicas, total, target per replica, expected replicas, expected ratio)
CALC_CASES = [
    pytest.param(8, 85.0, 10.0, 8, 85 / 80, id="within"),
    pytest.param(12, 125.0, 10.0, 12, 125 / 120, id="within-above-spec"),
    pytest.param(8, 95.0, 10.0, 10, 95 / 80, id="outside"),
    pytest.param(0, 42.0, 10.0, 5, math.inf, id="zero-status"),
    pytest.param(0, 0.0, 10.0, 0, math.nan, id="zero-status-zero-usage"),
]


@pytest.mark.parametrize(("status", "total", "target", "expected", "ratio"), CALC_CASES)
def test_replicas_for_total_metric(status: int, total: float, target: float, expected: int, ratio: float) -> None:
    replicas, got_ratio = hpa.replicas_for_total_metric(status, total, target)
    assert replicas == expected
    if math.isnan(ratio):
        assert math.isnan(got_ratio)
    else:
        assert got_ratio == pytest.approx(ratio)


def test_decision_detail_names_the_created_replicas() -> None:
    pol = policy()
    obs = ServiceObservation(
        key=pol.key, spec_replicas=10, ready_replicas=8, metric_total=85.0, status_replicas=8
    )
    decision, _ = decide_service(pol, obs, ServiceState(recommendations=KNOWN_EMPTY), NOW)
    assert "8 created" in decision.detail
