"""Conformance: the Kubernetes HPA controller's own unit-test tables, replayed against our port (issue 16).

Upstream sources (kubernetes/kubernetes, ``pkg/controller/podautoscaler``, read through the code index):

* ``horizontal_test.go`` at commit 003e86297d18a8538c9da3619871393f9703bf70 (autoscaling/v2, ``monitor`` labels,
  ``convertDesiredReplicasWithRules(current, desired, min, max)``).
* ``replica_calculator_test.go``: the one-function-per-case layout (``TestReplicaCalcScaleUp`` ...) as stored in the
  index version 112302491 (autoscaling/v2, container metrics, "usage" naming), plus the KEP-4951
  ``TestReplicaCalcConfigurableTolerance*`` and int-overflow tests of the later index version 51982554829. The index
  does not name the commit of either version. It does name commit 5f3bc7cdab9b2544f0389b9a83c88fa15b793b7a for an
  older (autoscaling/v2beta2) revision: the 39 translated cases that already exist there have the same inputs and
  expected replicas (checked; ``...ExcludeUnreadyPods`` was then called ``...IncludeUnreadyPods``). The newest
  stored revision regroups the same cases into ``TestReplicaCalcResourceScale/...`` style sub-tests, numbers
  unchanged.
* Upstream arithmetic cross-read: ``replica_calculator.go`` (``GetResourceReplicas``, ``calcPlainMetricReplicas``,
  ``groupPods``, ``Tolerances.isWithin``) of the same era.

Counts: 168 cases translated (from 98 upstream tests), 66 upstream tests or sub-cases listed in ``NOT_EXPRESSIBLE``.

How the upstream fixtures map onto our model (facts carry over, the code is ours):

* Pods, as upstream's ``groupPods`` sorts them: deleted or Failed pods are ignored; Pending pods are ``unready``;
  a pod without a sample is ``missing`` (whatever its readiness); for CPU only, a pod with a sample that is not
  Ready or still inside the CPU initialisation period ("hot" start time) is ``unready``. Pod (custom) metrics ignore
  readiness altogether, so an unready pod with a sample counts as ready there (upstream's
  ``TestReplicaCalcScaleUpCMUnreadyHotCpuNoLessScale`` relies on it).
* Resource (CPU utilisation) cases: per-pod percent = usage / request * 100, ``whole_percent=True`` (upstream's
  ``int32(sum * 100 / requests)``), ``missing_value_on_scale_down = max(100, target)``. With unequal requests
  upstream computes a request-weighted average; that is expressible only when every counted pod is ready with a
  sample (then the weighted average *is* the mean we pass in) - otherwise the case is listed.
* Pod metric cases: values in upstream's milli-units, ``whole_percent=False``, missing pods count as the target.
* Object metrics with an ``AverageValue`` target (``GetObjectPerPodMetricReplicas``) and external metrics with an
  ``AverageValue`` target (``GetExternalPerPodMetricReplicas``) are the same arithmetic: ``replicas_for_total_metric``.
  ``Value`` targets (replicas scale with the ready-pod count) have no counterpart and are listed.
* Upstream ``Tolerances{scaleDown, scaleUp}`` (field order!) maps to ``tolerance_down`` / ``tolerance_up``.
* Whole-controller cases of ``horizontal_test.go`` go through ``decide_service``. No ``behavior`` block upstream means
  ``ServicePolicy(behavior=False)``; a behaviour given by ``generateScalingRules`` maps to ``ScalingRules`` and the
  missing direction gets upstream's defaults (``DEFAULT_SCALE_UP`` / ``DEFAULT_SCALE_DOWN``). Upstream's
  ``recommendations: nil`` is an empty ``ServiceState`` (decide seeds it with the current replicas, as
  ``recordInitialRecommendation`` does); ``recommendations: []timestampedRecommendation{}`` (known, empty) is a
  history whose only entry lies outside every window (``KNOWN_EMPTY_HISTORY``). CPU maps to ``GPU_UTILIZATION``
  (missing pods count as 100 %, upstream's ``max(100, target)`` for the targets used), the ``qps`` pod metric to
  ``REQUEST_RATE`` with per-pod samples, per-pod object / external metrics to ``REQUEST_RATE`` totals. Missing pods are
  passed as HPA ``missing`` counts only; ``partial_reasons`` (our own extra guard) is left empty.
* ``TestScalingWithRules`` and ``TestConvertDesiredReplicasWithRules`` test the rate-limit / clamp step on a given
  "prenormalized" recommendation. We feed that recommendation through ``decide_service`` as a ``REQUEST_RATE`` total
  against a target of 1 with zero tolerance, and zero both stabilisation windows (upstream calls the function after
  stabilisation, so its window values play no part).
* ``TestStoreScaleEvents``: only its ``getReplicasChangePerPeriod(60, events)`` half is translated (through a 0-pod
  rate policy); the slot reuse and ``outdated`` flags of stored events are storage details we do not have. Likewise
  the stored-log lengths of ``TestNormalizeDesiredReplicas*`` are not checked, only the stabilised value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

NOW = 1_700_000_000.0
DEFAULT_TOLERANCE = 0.1  # upstream defaultTestingTolerance
# upstream `recommendations: []timestampedRecommendation{}`: a history that exists but has nothing inside any window
KNOWN_EMPTY_HISTORY: tuple[tuple[float, int], ...] = ((NOW - 3600.0, 0),)


# ---- upstream fixtures ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pods:
    """Upstream's fixture: ``count`` pods; the first ``len(levels)`` report a sample (milli-units), the rest none.

    Per-pod flags, one character per pod (missing characters mean the default):
    ``ready`` T/F (default T), ``start`` h = hot (inside the CPU initialisation period) / c = cool (default c),
    ``phase`` R Running / P Pending / F Failed (default R), ``deleted`` Y = deletion timestamp set (default n).
    Samples beyond ``count`` belong to no pod (upstream's "superfluous metrics") and are dropped.
    """

    levels: tuple[int, ...]
    count: int
    ready: str = ""
    start: str = ""
    phase: str = ""
    deleted: str = ""

    def _flag(self, flags: str, index: int, default: str) -> str:
        return flags[index] if index < len(flags) else default

    def group(self, cpu: bool) -> tuple[list[int], int, int]:
        """(indices of ready pods with a sample, missing, unready), as upstream's ``groupPods``."""
        ready: list[int] = []
        missing = unready = 0
        for index in range(self.count):
            phase = self._flag(self.phase, index, "R")
            if self._flag(self.deleted, index, "n") == "Y" or phase == "F":
                continue  # ignored
            if phase == "P":
                unready += 1
                continue
            if index >= len(self.levels):
                missing += 1
                continue
            if cpu and (self._flag(self.start, index, "c") == "h" or self._flag(self.ready, index, "T") == "F"):
                unready += 1
                continue
            ready.append(index)
        return ready, missing, unready


def cpu_metrics(pods: Pods, requests_milli: tuple[int, ...]) -> PodMetrics:
    """CPU utilisation (percent of request) of the ready pods with a sample, in our per-pod-mean shape."""
    assert len(requests_milli) == pods.count, "one request per pod"
    ready, missing, unready = pods.group(cpu=True)
    if len(set(requests_milli)) == 1:
        metric_sum = sum(pods.levels[i] * 100 / requests_milli[i] for i in ready)
    else:
        # Upstream averages request-weighted. Only when no missing / unready pod enters the recomputation is that
        # weighted average the whole computation; other unequal-request cases are listed in NOT_EXPRESSIBLE.
        assert missing == 0 and unready == 0, "unequal requests with missing or unready pods are not expressible"
        weighted = 100 * sum(pods.levels[i] for i in ready) / sum(requests_milli[i] for i in ready)
        metric_sum = len(ready) * weighted
    return PodMetrics(len(ready), metric_sum, missing, unready)


def plain_metrics(pods: Pods) -> PodMetrics:
    """A pod (custom) metric: readiness does not matter, Pending pods are unready, pods without a sample missing."""
    ready, missing, unready = pods.group(cpu=False)
    return PodMetrics(len(ready), float(sum(pods.levels[i] for i in ready)), missing, unready)


def cores(*values: float) -> tuple[int, ...]:
    """CPU requests in millicores, written as upstream's resource.MustParse("1.0") cores."""
    return tuple(round(v * 1000) for v in values)


def rules(pods: int, pods_period: int, percent: int, percent_period: int, window: int) -> ScalingRules:
    """Upstream's ``generateScalingRules``: a Pods and/or a Percent policy, selectPolicy Max."""
    policies = []
    if pods:
        policies.append(RatePolicy(RateKind.PODS, pods, float(pods_period)))
    if percent:
        policies.append(RatePolicy(RateKind.PERCENT, percent, float(percent_period)))
    return ScalingRules(float(window), tuple(policies), SelectPolicy.MAX)


def uniform_events(changes: tuple[int, ...], period_s: int, sign: int) -> tuple[tuple[float, int], ...]:
    """Upstream's ``generateEventsUniformDistribution``: each event in the middle of its slice of the period (the Go
    code truncates the offset to whole seconds). ``sign`` -1 turns upstream's scale-down list into our signed events."""
    segment = period_s / len(changes)
    return tuple(
        (NOW - math.trunc(period_s - segment * (index + 1) + segment / 2), sign * change)
        for index, change in enumerate(changes)
    )


def ago(*entries: tuple[float, int]) -> tuple[tuple[float, int], ...]:
    """Upstream ``timestampedRecommendation{value, now - age}`` pairs given as (age in seconds, value), time-ordered."""
    return tuple(sorted((NOW - age, value) for age, value in entries))


# ---- replica_calculator_test.go: Resource (CPU utilisation) ---------------------------------------------------------

ONE = cores(1.0)
MIXED = cores(0.9, 1.0, 1.1)
TOL = (DEFAULT_TOLERANCE, DEFAULT_TOLERANCE)  # (up, down)

# TestReplicaCalcComputedToleranceAlgImplementation: 10 pods at 150m, requests 300m +-100/10/2/1/0, 50 % utilisation;
# targets int32(100 * (1 / (2 * 0.9) + .01)) = 56 and int32(100 * (1 / (2 * 0.9) + .004)) = 55.
COMPUTED_REQUESTS = (400, 200, 310, 290, 302, 298, 301, 299, 300, 300)
COMPUTED_PODS = Pods((150,) * 10, 10)

# (current, requests in millicores, pods, target utilisation %, (tolerance up, tolerance down), expected replicas)
RESOURCE_CASES = [
    pytest.param(3, ONE * 3, Pods((300, 500, 700), 3), 30, TOL, 5, id="TestReplicaCalcScaleUp"),
    pytest.param(
        3, ONE * 3, Pods((300, 500, 700), 3, ready="FTT"), 30, TOL, 4, id="TestReplicaCalcScaleUpUnreadyLessScale"
    ),
    pytest.param(
        3, ONE * 3, Pods((300, 500, 700), 3, start="hcc"), 30, TOL, 4, id="TestReplicaCalcScaleUpHotCpuLessScale"
    ),
    pytest.param(
        3, ONE * 3, Pods((400, 500, 700), 3, ready="TFF"), 30, TOL, 3, id="TestReplicaCalcScaleUpUnreadyNoScale"
    ),
    pytest.param(
        3, ONE * 3, Pods((400, 500, 700), 3, ready="TFF", start="chh"), 30, TOL, 3,
        id="TestReplicaCalcScaleHotCpuNoScale",
    ),
    pytest.param(
        2, ONE * 4, Pods((500, 700), 4, ready="TTFF", phase="RRFF"), 30, TOL, 4,
        id="TestReplicaCalcScaleUpIgnoresFailedPods",
    ),
    pytest.param(
        2, ONE * 4, Pods((500, 700), 4, ready="TTFF", deleted="nnYY"), 30, TOL, 4,
        id="TestReplicaCalcScaleUpIgnoresDeletionPods",
    ),
    pytest.param(5, ONE * 5, Pods((100, 300, 500, 250, 250), 5), 50, TOL, 3, id="TestReplicaCalcScaleDown"),
    pytest.param(
        5, ONE * 5, Pods((100, 300, 500, 250, 250), 5, ready="TTTFF"), 50, TOL, 2,
        id="TestReplicaCalcScaleDownExcludeUnreadyPods",
    ),
    pytest.param(
        5, ONE * 5, Pods((100,), 5, ready="TFFFF", phase="RPPPP"), 50, TOL, 1,
        id="TestReplicaCalcScaleDownExcludeUnscheduledPods",
    ),
    pytest.param(
        5, ONE * 5, Pods((100, 300, 500, 250, 250), 5, start="ccchh"), 50, TOL, 2,
        id="TestReplicaCalcScaleDownIgnoreHotCpuPods",
    ),
    pytest.param(
        5, ONE * 7, Pods((100, 300, 500, 250, 250), 7, ready="TTTTTFF", phase="RRRRRFF"), 50, TOL, 3,
        id="TestReplicaCalcScaleDownIgnoresFailedPods",
    ),
    pytest.param(
        5, ONE * 7, Pods((100, 300, 500, 250, 250), 7, ready="TTTTTFF", deleted="nnnnnYY"), 50, TOL, 3,
        id="TestReplicaCalcScaleDownIgnoresDeletionPods",
    ),
    pytest.param(3, MIXED, Pods((1010, 1030, 1020), 3), 100, TOL, 3, id="TestReplicaCalcTolerance"),
    pytest.param(
        4, ONE * 4, Pods((4000, 9500, 3000, 7000, 3200, 2000), 4), 100, TOL, 24, id="TestReplicaCalcSuperfluousMetrics"
    ),
    pytest.param(4, ONE * 4, Pods((400, 95), 4), 100, TOL, 3, id="TestReplicaCalcMissingMetrics"),
    pytest.param(2, ONE * 2, Pods((1000,), 2), 100, TOL, 2, id="TestReplicaCalcMissingMetricsNoChangeEq"),
    pytest.param(2, ONE * 2, Pods((1900,), 2), 100, TOL, 2, id="TestReplicaCalcMissingMetricsNoChangeGt"),
    pytest.param(2, ONE * 2, Pods((600,), 2), 100, TOL, 2, id="TestReplicaCalcMissingMetricsNoChangeLt"),
    pytest.param(
        3, ONE * 3, Pods((100, 450), 3, ready="FTT"), 50, TOL, 3, id="TestReplicaCalcMissingMetricsUnreadyChange"
    ),
    pytest.param(
        3, ONE * 3, Pods((100, 450), 3, start="hcc"), 50, TOL, 3, id="TestReplicaCalcMissingMetricsHotCpuNoChange"
    ),
    pytest.param(
        3, ONE * 3, Pods((100, 2000), 3, ready="FTT"), 50, TOL, 4, id="TestReplicaCalcMissingMetricsUnreadyScaleUp"
    ),
    pytest.param(
        3, ONE * 3, Pods((100, 2000), 3, ready="FTT", start="hcc"), 50, TOL, 4,
        id="TestReplicaCalcMissingMetricsHotCpuScaleUp",
    ),
    pytest.param(
        4, ONE * 4, Pods((100, 100, 100), 4, ready="FTTT"), 50, TOL, 3,
        id="TestReplicaCalcMissingMetricsUnreadyScaleDown",
    ),
    pytest.param(2, ONE * 3, Pods((100, 100), 3), 50, TOL, 2, id="TestReplicaCalcDuringRollingUpdateWithMaxSurge"),
    pytest.param(
        10, COMPUTED_REQUESTS, COMPUTED_PODS, 56, TOL, 9,
        id="TestReplicaCalcComputedToleranceAlgImplementation/scale down",
    ),
    pytest.param(
        10, COMPUTED_REQUESTS, COMPUTED_PODS, 55, TOL, 10,
        id="TestReplicaCalcComputedToleranceAlgImplementation/within tolerance",
    ),
    # KEP-4951: upstream Tolerances{scaleDown, scaleUp}; here (up, down)
    pytest.param(
        3, MIXED, Pods((909, 1010, 1111), 3), 100, (0.0, 0.0), 4,
        id="TestReplicaCalcConfigurableTolerance/Outside of a 0% tolerance",
    ),
    pytest.param(
        3, MIXED, Pods((1890, 1910, 1900), 3), 100, (2.0, DEFAULT_TOLERANCE), 3,
        id="TestReplicaCalcConfigurableTolerance/Within a 200% scale-up tolerance",
    ),
    pytest.param(
        3, MIXED, Pods((1100, 1080, 1090), 3), 100, (0.08, 2.0), 4,
        id="TestReplicaCalcConfigurableTolerance/Outside 8% scale-up tolerance (and superfuous scale-down tolerance)",
    ),
    pytest.param(
        3, MIXED, Pods((660, 640, 650), 3), 100, (DEFAULT_TOLERANCE, 0.36), 3,
        id="TestReplicaCalcConfigurableTolerance/Within a 36% scale-down tolerance",
    ),
    pytest.param(
        3, MIXED, Pods((660, 640, 650), 3), 100, (DEFAULT_TOLERANCE, 0.34), 2,
        id="TestReplicaCalcConfigurableTolerance/Outside a 34% scale-down tolerance",
    ),
]


@pytest.mark.parametrize(("current", "requests", "pods", "target", "tolerances", "expected"), RESOURCE_CASES)
def test_replica_calc_resource(
    current: int, requests: tuple[int, ...], pods: Pods, target: int, tolerances: tuple[float, float], expected: int
) -> None:
    replicas, _ = hpa.replicas_for_pod_metric(
        current,
        cpu_metrics(pods, requests),
        float(target),
        tolerance_up=tolerances[0],
        tolerance_down=tolerances[1],
        missing_value_on_scale_down=float(max(100, target)),
        whole_percent=True,
    )
    assert replicas == expected


# ---- replica_calculator_test.go: Pods (plain / custom) metrics -------------------------------------------------------

# (current, pods (values in milli-units), target (milli-units), (tolerance up, tolerance down), expected replicas)
PLAIN_CASES = [
    pytest.param(3, Pods((20000, 10000, 30000), 3), 15000, TOL, 4, id="TestReplicaCalcScaleUpCM"),
    pytest.param(
        3, Pods((50000, 10000, 30000), 3, ready="TTF", start="cch"), 15000, TOL, 6,
        id="TestReplicaCalcScaleUpCMUnreadyHotCpuNoLessScale",
    ),
    pytest.param(
        3, Pods((50000, 15000, 30000), 3, ready="FTF", start="hch"), 15000, TOL, 7,
        id="TestReplicaCalcScaleUpCMUnreadyHotCpuScaleWouldScaleDown",
    ),
    # despite the name, upstream runs these two with metricType podMetric (GetMetricReplicas on one pod)
    pytest.param(1, Pods((8600,), 1), 4400, TOL, 2, id="TestReplicaCalcScaleUpCMExternal"),
    pytest.param(1, Pods((8600,), 1), 4400, TOL, 2, id="TestReplicaCalcScaleUpCMExternalNoLabels"),
    pytest.param(5, Pods((12000,) * 5, 5), 20000, TOL, 3, id="TestReplicaCalcScaleDownCM"),
    pytest.param(3, Pods((20000, 21000, 21000), 3), 20000, TOL, 3, id="TestReplicaCalcToleranceCM"),
    pytest.param(
        5, Pods((20000, 19000, 21000), 5), 20000, TOL, 5, id="TestPlainMetricReplicaCalcMissingMetricsNoChangeEq"
    ),
    pytest.param(2, Pods((10000, 10000), 3), 17000, TOL, 2, id="TestReplicaCalcDuringRollingUpdateWithMaxSurgeCM"),
    pytest.param(
        3, Pods((20000, 21000, 21000), 3), 20000, (0.01, DEFAULT_TOLERANCE), 4,
        id="TestReplicaCalcConfigurableToleranceCM",
    ),
]


@pytest.mark.parametrize(("current", "pods", "target", "tolerances", "expected"), PLAIN_CASES)
def test_replica_calc_pod_metric(
    current: int, pods: Pods, target: int, tolerances: tuple[float, float], expected: int
) -> None:
    replicas, _ = hpa.replicas_for_pod_metric(
        current,
        plain_metrics(pods),
        float(target),
        tolerance_up=tolerances[0],
        tolerance_down=tolerances[1],
        missing_value_on_scale_down=None,
        whole_percent=False,
    )
    assert replicas == expected


# ---- replica_calculator_test.go: per-pod (AverageValue) object and external metrics ----------------------------------

MAX_INT64 = 2**63 - 1

# (status replicas, total (milli-units), target per pod (milli-units), (tolerance up, tolerance down), expected)
TOTAL_CASES = [
    pytest.param(3, 20000, 5000, TOL, 4, id="TestReplicaCalcScaleUpCMPerPodObject"),
    pytest.param(3, 8600, 2150, TOL, 4, id="TestReplicaCalcScaleUpPerPodCMExternal"),
    pytest.param(5, 6000, 2000, TOL, 3, id="TestReplicaCalcScaleDownPerPodCMObject"),
    pytest.param(5, 8600, 2867, TOL, 3, id="TestReplicaCalcScaleDownPerPodCMExternal"),
    pytest.param(4, 20166, 5000, TOL, 4, id="TestReplicaCalcTolerancePerPodCMObject"),
    pytest.param(3, 8600, 2900, TOL, 3, id="TestReplicaCalcTolerancePerPodCMExternal"),
    pytest.param(4, 20208, 5000, (0.01, DEFAULT_TOLERANCE), 5, id="TestReplicaCalcConfigurableTolerancePerPodCMObject"),
    pytest.param(
        3, 8600, 2800, (0.01, DEFAULT_TOLERANCE), 4, id="TestReplicaCalcConfigurableTolerancePerPodCMExternal"
    ),
    pytest.param(1, MAX_INT64, MAX_INT64, TOL, 1, id="TestExternalPerPodMetricUsageOverflow"),
]


@pytest.mark.parametrize(("status", "total", "target", "tolerances", "expected"), TOTAL_CASES)
def test_replica_calc_per_pod_total(
    status: int, total: int, target: int, tolerances: tuple[float, float], expected: int
) -> None:
    replicas, _ = hpa.replicas_for_total_metric(status, float(total), float(target), tolerances[0], tolerances[1])
    assert replicas == expected


# ---- horizontal_test.go: whole reconcile cases through decide_service -----------------------------------------------


@dataclass(frozen=True)
class Whole:
    """One upstream ``testCase`` of horizontal_test.go reduced to what decide_service sees."""

    min_replicas: int
    max_replicas: int
    spec: int
    target: float
    metric: MetricKind = MetricKind.GPU_UTILIZATION
    pods: PodMetrics | None = None
    total: float | None = None
    behavior: tuple[ScalingRules, ScalingRules] | None = None  # None: the HPA has no behavior block
    history: tuple[tuple[float, int], ...] = ()  # () = upstream `recommendations: nil`


def run_whole(case: Whole) -> int:
    extra: dict[str, object] = {}
    if case.behavior is None:
        extra["behavior"] = False
    else:
        extra["scale_up"], extra["scale_down"] = case.behavior
    policy = ServicePolicy(
        namespace="test-namespace",
        name="test-hpa",
        min_replicas=case.min_replicas,
        max_replicas=case.max_replicas,
        metric=case.metric,
        target=case.target,
        **extra,  # type: ignore[arg-type]
    )
    ready = case.pods.ready_with_metric if case.pods is not None else case.spec
    obs = ServiceObservation(
        key=policy.key, spec_replicas=case.spec, ready_replicas=ready, pods=case.pods, metric_total=case.total
    )
    decision, _ = decide_service(policy, obs, ServiceState(recommendations=case.history), NOW)
    return decision.desired_replicas


def cpu(levels: tuple[int, ...], requests: tuple[int, ...], **flags: str) -> PodMetrics:
    """horizontal_test.go's pods: one per reportedCPURequests entry, the first len(reportedLevels) with a sample."""
    return cpu_metrics(Pods(levels, len(requests), **flags), requests)


def qps(levels: tuple[int, ...], count: int, **flags: str) -> PodMetrics:
    return plain_metrics(Pods(levels, count, **flags))


QPS = MetricKind.REQUEST_RATE
EMPTY = KNOWN_EMPTY_HISTORY
UPSCALE_CAP_RULES = (rules(0, 0, 700, 60, 0), DEFAULT_SCALE_DOWN)

WHOLE_CASES = [
    pytest.param(Whole(2, 6, 3, 30, pods=cpu((300, 500, 700), ONE * 3)), 5, id="TestScaleUp"),
    pytest.param(
        Whole(2, 6, 3, 30, pods=cpu((300, 500, 700), ONE * 3, ready="FTT")), 4, id="TestScaleUpUnreadyLessScale"
    ),
    pytest.param(
        Whole(2, 6, 3, 30, pods=cpu((300, 500, 700), ONE * 3, start="hcc")), 4, id="TestScaleUpHotCpuLessScale"
    ),
    pytest.param(
        Whole(2, 6, 3, 30, pods=cpu((400, 500, 700), ONE * 3, ready="TFF")), 3, id="TestScaleUpUnreadyNoScale"
    ),
    pytest.param(
        Whole(2, 6, 3, 30, pods=cpu((400, 500, 700), ONE * 3, ready="TFF", start="chh")), 3,
        id="TestScaleUpHotCpuNoScale",
    ),
    pytest.param(
        Whole(2, 6, 2, 30, pods=cpu((500, 700), ONE * 4, ready="TTFF", phase="RRFF")), 4,
        id="TestScaleUpIgnoresFailedPods",
    ),
    pytest.param(
        Whole(2, 6, 2, 30, pods=cpu((500, 700), ONE * 4, ready="TTFF", deleted="nnYY")), 4,
        id="TestScaleUpIgnoresDeletionPods",
    ),
    pytest.param(Whole(2, 6, 3, 15000, QPS, pods=qps((20000, 10000, 30000), 3)), 4, id="TestScaleUpCM"),
    pytest.param(
        Whole(2, 6, 3, 15000, QPS, pods=qps((50000, 10000, 30000), 3, ready="TTF", start="cch")), 6,
        id="TestScaleUpCMUnreadyAndHotCpuNoLessScale",
    ),
    pytest.param(
        Whole(2, 6, 3, 15000, QPS, pods=qps((50000, 15000, 30000), 3, ready="FTF", start="hch")), 6,
        id="TestScaleUpCMUnreadyandCpuHot",
    ),
    pytest.param(
        Whole(2, 6, 3, 15000, QPS, pods=qps((50000, 15000, 30000), 3, start="hch")), 6,
        id="TestScaleUpHotCpuNoScaleWouldScaleDown",
    ),
    pytest.param(Whole(2, 6, 3, 10000, QPS, total=40000), 4, id="TestScaleUpPerPodCMObject"),
    pytest.param(Whole(2, 6, 3, 2222, QPS, total=8600), 4, id="TestScaleUpPerPodCMExternal"),
    pytest.param(
        Whole(2, 6, 5, 50, pods=cpu((100, 300, 500, 250, 250), ONE * 5), history=EMPTY), 3, id="TestScaleDown"
    ),
    pytest.param(
        Whole(
            2, 6, 5, 50, pods=cpu((100, 300, 500, 250, 250), ONE * 5),
            behavior=(rules(0, 0, 100, 15, 30), DEFAULT_SCALE_DOWN), history=EMPTY,
        ),
        3,
        id="TestScaleDownWithScalingRules",
    ),
    pytest.param(
        Whole(2, 6, 5, 50, pods=cpu((100, 300, 500, 250, 250), ONE * 5)), 5, id="TestScaleDownStabilizeInitialSize"
    ),
    pytest.param(Whole(2, 6, 5, 20000, QPS, pods=qps((12000,) * 5, 5), history=EMPTY), 3, id="TestScaleDownCM"),
    pytest.param(Whole(2, 6, 5, 20000, QPS, total=60000, history=EMPTY), 3, id="TestScaleDownPerPodCMObject"),
    pytest.param(Whole(2, 6, 5, 3000, QPS, total=8600, history=EMPTY), 3, id="TestScaleDownPerPodCMExternal"),
    pytest.param(
        Whole(2, 6, 5, 50, pods=cpu((100, 300, 500, 250, 250), ONE * 5, ready="TTTFF"), history=EMPTY), 2,
        id="TestScaleDownIncludeUnreadyPods",
    ),
    pytest.param(
        Whole(2, 6, 5, 50, pods=cpu((100, 300, 500, 250, 250), ONE * 5, start="ccchh"), history=EMPTY), 2,
        id="TestScaleDownIgnoreHotCpuPods",
    ),
    pytest.param(
        Whole(
            2, 6, 5, 50, pods=cpu((100, 300, 500, 250, 250), ONE * 7, ready="TTTTTFF", phase="RRRRRFF"), history=EMPTY
        ),
        3,
        id="TestScaleDownIgnoresFailedPods",
    ),
    pytest.param(
        Whole(
            2, 6, 5, 50, pods=cpu((100, 300, 500, 250, 250), ONE * 7, ready="TTTTTFF", deleted="nnnnnYY"), history=EMPTY
        ),
        3,
        id="TestScaleDownIgnoresDeletionPods",
    ),
    pytest.param(Whole(1, 5, 3, 100, pods=cpu((1010, 1030, 1020), MIXED)), 3, id="TestTolerance"),
    pytest.param(Whole(1, 5, 3, 20000, QPS, pods=qps((20000, 20001, 21000), 3)), 3, id="TestToleranceCM"),
    pytest.param(Whole(2, 6, 4, 2200, QPS, total=8600), 4, id="TestTolerancePerPodCMObject"),
    pytest.param(Whole(2, 6, 4, 2200, QPS, total=8600), 4, id="TestTolerancePerPodCMExternal"),
    pytest.param(Whole(2, 5, 3, 90, pods=cpu((10, 95, 10), MIXED), history=EMPTY), 2, id="TestMinReplicas"),
    pytest.param(Whole(0, 5, 3, 90, pods=cpu((0, 0, 0), MIXED), history=EMPTY), 0, id="TestZeroMinReplicasDesiredZero"),
    pytest.param(Whole(2, 5, 3, 90, pods=cpu((0, 0, 0), MIXED), history=EMPTY), 2, id="TestMinReplicasDesiredZero"),
    pytest.param(Whole(3, 5, 0, 90), 0, id="TestZeroReplicas"),
    pytest.param(Whole(3, 5, 2, 90), 3, id="TestTooFewReplicas"),
    pytest.param(Whole(3, 5, 10, 90), 5, id="TestTooManyReplicas"),
    pytest.param(Whole(2, 5, 3, 90, pods=cpu((8000, 9500, 1000), MIXED)), 5, id="TestMaxReplicas"),
    pytest.param(
        Whole(2, 6, 4, 100, pods=cpu((4000, 9500, 3000, 7000, 3200, 2000), ONE * 4)), 6, id="TestSuperfluousMetrics"
    ),
    pytest.param(Whole(2, 6, 4, 100, pods=cpu((400, 95), ONE * 4), history=EMPTY), 3, id="TestMissingMetrics"),
    pytest.param(Whole(1, 5, 4, 50, pods=cpu((200,), cores(0.2)), history=EMPTY), 2, id="TestMissingReports"),
    pytest.param(
        Whole(1, 100, 3, 10, pods=cpu((100, 200, 300), cores(0.1, 0.1, 0.1)), behavior=UPSCALE_CAP_RULES), 24,
        id="TestUpscaleCap",
    ),
    pytest.param(
        Whole(1, 20, 3, 10, pods=cpu((100, 200, 300), cores(0.1, 0.1, 0.1)), behavior=UPSCALE_CAP_RULES), 20,
        id="TestUpscaleCapGreaterThanMaxReplicas",
    ),
    pytest.param(Whole(1, 8, 4, 50, pods=cpu((500,) * 5, ONE * 5)), 4, id="TestMoreReplicasThanSpecNoScale"),
    pytest.param(Whole(1, 5, 3, 15000, QPS, pods=qps((20000, 10000, 30000), 3)), 4, id="TestNoBackoffUpscaleCM"),
    pytest.param(
        Whole(1, 5, 4, 100, pods=cpu((50, 50, 50), cores(0.1, 0.1, 0.1)), history=ago((600, 10), (60, 4))), 4,
        id="TestStabilizeDownscale",
    ),
    pytest.param(
        Whole(0, 1000, 10, 56, pods=cpu(COMPUTED_PODS.levels, COMPUTED_REQUESTS), history=EMPTY), 9,
        id="TestComputedToleranceAlgImplementation/scale down",
    ),
    pytest.param(
        Whole(0, 1000, 10, 55, pods=cpu(COMPUTED_PODS.levels, COMPUTED_REQUESTS), history=EMPTY), 10,
        id="TestComputedToleranceAlgImplementation/within tolerance",
    ),
    pytest.param(Whole(2, 6, 1, 50, pods=cpu((0, 0, 0, 0), ONE * 4)), 2, id="TestScaleUpRCImmediately"),
    pytest.param(Whole(2, 5, 6, 50, pods=cpu((8000, 9500, 1000), MIXED)), 5, id="TestScaleDownRCImmediately"),
]


@pytest.mark.parametrize(("case", "expected"), WHOLE_CASES)
def test_horizontal_whole_decision(case: Whole, expected: int) -> None:
    assert run_whole(case) == expected


# ---- horizontal_test.go: normalisation (rate limits, clamps) on a given recommendation ------------------------------


def exact(rules_: ScalingRules) -> ScalingRules:
    """The same policies without stabilisation window and with zero tolerance (see the module docstring)."""
    return ScalingRules(0.0, rules_.policies, rules_.select, tolerance=0.0)


def normalise(
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    up: ScalingRules | None,
    down: ScalingRules | None,
    events: tuple[tuple[float, int], ...] = (),
    behavior: bool = True,
) -> int:
    """decide_service on a recommendation of exactly ``desired`` (a REQUEST_RATE total against a target of 1)."""
    extra: dict[str, object] = {} if behavior else {"behavior": False}
    policy = ServicePolicy(
        namespace="test-namespace",
        name="test-hpa",
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        metric=MetricKind.REQUEST_RATE,
        target=1.0,
        scale_up=exact(up or DEFAULT_SCALE_UP),
        scale_down=exact(down or DEFAULT_SCALE_DOWN),
        **extra,  # type: ignore[arg-type]
    )
    obs = ServiceObservation(key=policy.key, spec_replicas=current, ready_replicas=current, metric_total=float(desired))
    state = ServiceState(recommendations=KNOWN_EMPTY_HISTORY, scale_events=tuple(sorted(events)))
    decision, _ = decide_service(policy, obs, state, NOW)
    return decision.desired_replicas


# TestConvertDesiredReplicasWithRules: (current, prenormalized desired, min, max, expected)
CONVERT_CASES = [
    pytest.param(5, 7, 3, 8, 7, id="TestConvertDesiredReplicasWithRules/prenormalized desired replicas within range"),
    pytest.param(3, 1, 2, 8, 2, id="TestConvertDesiredReplicasWithRules/prenormalized desired replicas < minReplicas"),
    pytest.param(
        1, 0, 0, 10, 0, id="TestConvertDesiredReplicasWithRules/prenormalized desired zeroed replicas within range"
    ),
    pytest.param(
        20, 1000, 1, 10, 10,
        id="TestConvertDesiredReplicasWithRules/maxReplicas is the limit because maxReplicas < scaleUpLimit",
    ),
]


@pytest.mark.parametrize(("current", "desired", "min_replicas", "max_replicas", "expected"), CONVERT_CASES)
def test_convert_desired_replicas_with_rules(
    current: int, desired: int, min_replicas: int, max_replicas: int, expected: int
) -> None:
    assert normalise(current, desired, min_replicas, max_replicas, None, None, behavior=False) == expected


UP_159 = uniform_events((1, 5, 9), 120, +1)
DOWN_159 = uniform_events((1, 5, 9), 120, -1)
UP_OUTDATED = uniform_events((8, 12, 9, 11), 120, +1)
DOWN_OUTDATED = uniform_events((8, 12, 9, 11), 120, -1)
DOWN_10S = uniform_events((10, 10, 10), 120, -1)


def _swr(
    name: str,
    current: int,
    desired: int,
    min_r: int,
    max_r: int,
    expected: int,
    *,
    up: ScalingRules | None = None,
    down: ScalingRules | None = None,
    ev: tuple[tuple[float, int], ...] = (),
) -> object:
    """One TestScalingWithRules row: (current, prenormalized desired, min, max, expected) plus rules and events."""
    return pytest.param(current, desired, min_r, max_r, up, down, ev, expected, id=f"TestScalingWithRules/{name}")


SCALING_WITH_RULES_CASES = [
    _swr("prenormalized desired replicas within range", 5, 7, 3, 8, 7),
    _swr("prenormalized desired replicas < minReplicas", 3, 1, 2, 8, 2),
    _swr("prenormalized desired replicas within range when minReplicas is 0", 1, 0, 0, 10, 0),
    _swr("maxReplicas is the limit because maxReplicas < scaleUpLimit", 20, 1000, 1, 10, 10),
    _swr("desired replica count is more than the maximum replica count", 100, 1000, 100, 150, 150),
    _swr(
        "scaleUpLimit is the limit because scaleUpLimit < maxReplicas with user policies", 3, 1000, 1, 2000, 4,
        up=rules(0, 0, 1, 60, 0),
    ),
    _swr("scaleUp with default behavior", 10, 50, 1, 1000, 20),
    _swr("scaleUp with pods policy larger than percent policy", 10, 500, 1, 1000, 110, up=rules(100, 60, 100, 60, 0)),
    _swr("scaleUp with percent policy larger than pods policy", 10, 500, 1, 1000, 20, up=rules(2, 60, 100, 60, 0)),
    _swr(
        "scaleUp with spec MaxReplicas limitation with large pod policy", 10, 50, 1, 1000, 50,
        up=rules(100, 60, 0, 0, 0),
    ),
    _swr(
        "scaleUp with spec MaxReplicas limitation with large percent policy", 10, 50, 1, 1000, 50,
        up=rules(10000, 60, 0, 0, 0),
    ),
    _swr("scaleUp with pod policy limitation", 10, 50, 1, 1000, 40, up=rules(30, 60, 0, 0, 0)),
    _swr("scaleUp with percent policy limitation", 10, 50, 1, 1000, 30, up=rules(0, 0, 200, 60, 0)),
    _swr(
        "scaleDown with percent policy larger than pod policy", 100, 2, 1, 1000, 80, down=rules(20, 60, 1, 60, 300)
    ),
    _swr("scaleDown with pod policy larger than percent policy", 100, 2, 1, 1000, 98, down=rules(2, 60, 1, 60, 300)),
    _swr(
        "scaleDown with spec MinReplicas=nil limitation with large pod policy", 10, 0, 1, 1000, 1,
        down=rules(100, 60, 0, 0, 300),
    ),
    _swr(
        "scaleDown with spec MinReplicas limitation with large pod policy", 10, 0, 1, 1000, 1,
        down=rules(100, 60, 0, 0, 300),
    ),
    _swr(
        "scaleDown with spec MinReplicas limitation with large percent policy", 10, 2, 5, 1000, 5,
        down=rules(0, 0, 100, 60, 300),
    ),
    _swr("scaleDown with pod policy limitation", 10, 2, 1, 1000, 5, down=rules(5, 60, 0, 0, 300)),
    _swr("scaleDown with percent policy limitation", 10, 5, 1, 1000, 5, down=rules(0, 0, 50, 60, 300)),
    _swr(
        "scaleUp with spec MaxReplicas limitation with large pod policy and events", 100, 500, 1, 200, 200,
        up=rules(300, 60, 0, 0, 0), ev=UP_159,
    ),
    _swr(
        "scaleUp with spec MaxReplicas limitation with large percent policy and events", 100, 500, 1, 200, 200,
        up=rules(0, 0, 10000, 60, 0), ev=UP_159,
    ),
    _swr(
        "scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of recent scale up events",
        100, 500, 1, 1000, 100, up=rules(5, 120, 0, 0, 0), ev=UP_159,
    ),
    _swr(
        "scaleUp with pod policy and previous scale up events", 100, 500, 1, 1000, 235,
        up=rules(150, 120, 0, 0, 0), ev=UP_159,
    ),
    _swr(
        "scaleUp with percent policy and previous scale up events", 100, 500, 1, 1000, 255,
        up=rules(0, 0, 200, 120, 0), ev=UP_159,
    ),
    _swr(
        "scaleUp with percent policy and previous scale up and down events", 6, 24, 1, 1000, 16,
        up=rules(0, 0, 300, 300, 0), ev=uniform_events((4,), 120, +1) + uniform_events((2,), 120, -1),
    ),
    _swr("scaleDown with default policy and previous events", 10, 5, 1, 1000, 5, ev=DOWN_159),
    _swr(
        "scaleDown with spec MinReplicas=nil limitation with large pod policy and previous events", 100, 0, 1, 1000, 1,
        down=rules(115, 120, 0, 0, 300), ev=DOWN_159,
    ),
    _swr(
        "scaleDown with spec MinReplicas limitation with large pod policy and previous events", 100, 0, 5, 1000, 5,
        down=rules(130, 120, 0, 0, 300), ev=DOWN_159,
    ),
    _swr(
        "scaleDown with spec MinReplicas limitation with large percent policy and previous events", 100, 2, 5, 1000, 5,
        down=rules(0, 0, 100, 120, 300), ev=DOWN_159,
    ),
    _swr(
        "scaleDown with pod policy limitation and previous events", 100, 2, 1, 1000, 100,
        down=rules(5, 120, 0, 0, 300), ev=DOWN_159,
    ),
    _swr(
        "scaleDown with percent policy limitation and previous events", 100, 0, 1, 1000, 56,
        down=rules(0, 0, 50, 120, 300), ev=uniform_events((2, 4, 6), 120, -1),
    ),
    _swr(
        "scaleDown with percent policy and previous scale up and down events", 10, 1, 1, 1000, 6,
        down=rules(0, 0, 50, 180, 0), ev=uniform_events((2,), 120, +1) + uniform_events((4,), 120, -1),
    ),
    _swr(
        "scaleDown with previous events preventing further scale down", 100, 0, 1, 1000, 100,
        down=rules(0, 0, 10, 120, 300), ev=DOWN_10S,
    ),
    _swr(
        "scaleDown with with previous events still allowing more scale down", 10, 5, 1, 1000, 5,
        down=rules(0, 0, 1000, 120, 300), ev=DOWN_10S,
    ),
    _swr(
        "check 'outdated' flag for events for one behavior for up", 100, 200, 1, 1000, 200,
        up=rules(1000, 60, 0, 0, 0), ev=UP_OUTDATED,
    ),
    _swr(
        "check that events were not marked 'outdated' for two different policies in the behavior for up",
        100, 200, 1, 1000, 200, up=rules(1000, 120, 100, 60, 0), ev=UP_OUTDATED,
    ),
    _swr(
        "check that events were marked 'outdated' for two different policies in the behavior for up",
        100, 200, 1, 1000, 200, up=rules(1000, 30, 100, 60, 0), ev=UP_OUTDATED,
    ),
    _swr(
        "check 'outdated' flag for events for one behavior for down", 100, 5, 1, 1000, 5,
        down=rules(1000, 60, 0, 0, 300), ev=DOWN_OUTDATED,
    ),
    _swr(
        "check that events were not marked 'outdated' for two different policies in the behavior for down",
        100, 5, 1, 1000, 5, down=rules(1000, 120, 100, 60, 300), ev=DOWN_OUTDATED,
    ),
    _swr(
        "check that events were marked 'outdated' for two different policies in the behavior for down",
        100, 5, 1, 1000, 5, down=rules(1000, 30, 100, 60, 300), ev=DOWN_OUTDATED,
    ),
]


@pytest.mark.parametrize(
    ("current", "desired", "min_replicas", "max_replicas", "up", "down", "events", "expected"), SCALING_WITH_RULES_CASES
)
def test_scaling_with_rules(
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    up: ScalingRules | None,
    down: ScalingRules | None,
    events: tuple[tuple[float, int], ...],
    expected: int,
) -> None:
    assert normalise(current, desired, min_replicas, max_replicas, up, down, events) == expected


# TestNormalizeDesiredReplicas (no behavior block: max of the recommendations of the last 5 minutes). The upstream
# function takes no current replica count; we run the whole behaviour-less step with current = the prenormalized one.
NORMALIZE_CASES = [
    pytest.param(KNOWN_EMPTY_HISTORY, 5, 5, id="TestNormalizeDesiredReplicas/empty log"),
    pytest.param(ago((120, 4), (60, 5)), 3, 5, id="TestNormalizeDesiredReplicas/stabilize"),
    pytest.param(ago((120, 1), (60, 2)), 3, 3, id="TestNormalizeDesiredReplicas/no stabilize"),
    pytest.param(ago((600, 10), (540, 9)), 3, 3, id="TestNormalizeDesiredReplicas/no stabilize - old recommendations"),
    pytest.param(
        ago((600, 10), (60, 4), (120, 5), (540, 9)), 3, 5,
        id="TestNormalizeDesiredReplicas/stabilize - old recommendations",
    ),
]


@pytest.mark.parametrize(("history", "prenormalized", "expected"), NORMALIZE_CASES)
def test_normalize_desired_replicas(history: tuple[tuple[float, int], ...], prenormalized: int, expected: int) -> None:
    policy = ServicePolicy(
        namespace="test-namespace",
        name="test-hpa",
        min_replicas=1,
        max_replicas=1000,
        metric=MetricKind.REQUEST_RATE,
        target=1.0,
        behavior=False,  # type: ignore[call-arg]
    )
    obs = ServiceObservation(
        key=policy.key, spec_replicas=prenormalized, ready_replicas=prenormalized, metric_total=float(prenormalized)
    )
    decision, _ = decide_service(policy, obs, ServiceState(recommendations=history), NOW)
    assert decision.desired_replicas == expected


# TestNormalizeDesiredReplicasWithBehavior calls stabilizeRecommendationWithBehaviors: hpa.stabilise.
# (history, current, prenormalized, up window s, down window s, expected)
STABILISE_CASES = [
    pytest.param(
        (), 100, 5, 0, 0, 5, id="TestNormalizeDesiredReplicasWithBehavior/empty recommendations for scaling down"
    ),
    pytest.param(
        ago((120, 4), (60, 5)), 100, 3, 0, 180, 5,
        id="TestNormalizeDesiredReplicasWithBehavior/simple scale down stabilization",
    ),
    pytest.param(
        ago((120, 4), (60, 5)), 1, 7, 300, 0, 4,
        id="TestNormalizeDesiredReplicasWithBehavior/simple scale up stabilization",
    ),
    pytest.param(
        ago((120, 1), (60, 2)), 100, 3, 300, 0, 3,
        id="TestNormalizeDesiredReplicasWithBehavior/no scale down stabilization",
    ),
    pytest.param(
        ago((120, 4), (60, 5)), 1, 3, 0, 300, 3, id="TestNormalizeDesiredReplicasWithBehavior/no scale up stabilization"
    ),
    pytest.param(
        ago((600, 10), (540, 9)), 100, 3, 0, 0, 3,
        id="TestNormalizeDesiredReplicasWithBehavior/no scale down stabilization, reuse recommendation element",
    ),
    pytest.param(
        ago((600, 10), (540, 9)), 1, 100, 0, 0, 100,
        id="TestNormalizeDesiredReplicasWithBehavior/no scale up stabilization, reuse recommendation element",
    ),
    pytest.param(
        ago((600, 10), (60, 4), (120, 5), (540, 9)), 100, 3, 0, 180, 5,
        id="TestNormalizeDesiredReplicasWithBehavior/"
        "scale down stabilization, reuse one of obsolete recommendation element",
    ),
    pytest.param(
        ago((6000, 10), (60, 6), (120, 5), (180, 9)), 1, 100, 300, 0, 5,
        id="TestNormalizeDesiredReplicasWithBehavior/"
        "scale up stabilization, reuse one of obsolete recommendation element",
    ),
    pytest.param(
        ago((6000, 2), (180, 3)), 2, 1, 300, 300, 2,
        id="TestNormalizeDesiredReplicasWithBehavior/"
        "scale up and down stabilization, do not scale up when prenormalized rec goes down",
    ),
    pytest.param(
        ago((6000, 2), (180, 1)), 2, 3, 300, 300, 2,
        id="TestNormalizeDesiredReplicasWithBehavior/"
        "scale up and down stabilization, do not scale down when prenormalized rec goes up",
    ),
]


@pytest.mark.parametrize(("history", "current", "prenormalized", "up_s", "down_s", "expected"), STABILISE_CASES)
def test_stabilize_recommendation_with_behaviors(
    history: tuple[tuple[float, int], ...], current: int, prenormalized: int, up_s: int, down_s: int, expected: int
) -> None:
    assert hpa.stabilise(NOW, current, prenormalized, history, float(up_s), float(down_s)) == expected


# TestStoreScaleEvents: getReplicasChangePerPeriod(60, prevScaleEvents), seen through a 0-pod rate policy of period
# 60 s (the limit is then the replica count at the period's start). (events as (age s, change), expected change)
STORE_EVENTS_CASES = [
    pytest.param((), 0, id="TestStoreScaleEvents/empty entries with default behavior"),
    pytest.param((), 0, id="TestStoreScaleEvents/empty entries with two-policy-behavior"),
    pytest.param(((61, 7),), 0, id="TestStoreScaleEvents/one outdated entry to be kept untouched without behavior"),
    pytest.param(((61, 7),), 0, id="TestStoreScaleEvents/one outdated entry to be replaced with behavior"),
    pytest.param(((58, 7),), 7, id="TestStoreScaleEvents/one actual entry to be not touched with behavior"),
    pytest.param(((61, 7), (59, 6)), 6, id="TestStoreScaleEvents/two entries, one of them to be replaced"),
    pytest.param(
        ((29, 8), (59, 6), (61, 7), (61, 9)), 14,
        id="TestStoreScaleEvents/replace one entry, use policies with different periods",
    ),
    pytest.param(((58, 7), (59, 6)), 13, id="TestStoreScaleEvents/two entries, both actual"),
]

PERIOD_START_PROBE = ScalingRules(0.0, (RatePolicy(RateKind.PODS, 0, 60.0),))


@pytest.mark.parametrize(("events", "expected_change"), STORE_EVENTS_CASES)
def test_replicas_change_per_period(events: tuple[tuple[int, int], ...], expected_change: int) -> None:
    up_events = tuple(sorted((NOW - age, change) for age, change in events))
    down_events = tuple(sorted((NOW - age, -change) for age, change in events))
    assert 10 - hpa.scale_up_limit(NOW, 10, up_events, PERIOD_START_PROBE) == expected_change
    assert hpa.scale_down_limit(NOW, 10, down_events, PERIOD_START_PROBE) - 10 == expected_change


MIN_SELECT_RULES = ScalingRules(
    300.0, (RatePolicy(RateKind.PODS, 2, 60.0), RatePolicy(RateKind.PERCENT, 50, 60.0)), SelectPolicy.MIN
)
LIMIT_CASES = [
    pytest.param("up", 1, 2, id="TestCalculateScaleUpLimitWithScalingRules"),
    pytest.param("down", 5, 3, id="TestCalculateScaleDownLimitWithBehaviors"),
]


@pytest.mark.parametrize(("direction", "current", "expected"), LIMIT_CASES)
def test_calculate_limit_with_min_select(direction: str, current: int, expected: int) -> None:
    limit = hpa.scale_up_limit if direction == "up" else hpa.scale_down_limit
    assert limit(NOW, current, (), MIN_SELECT_RULES) == expected


# ---- bookkeeping ---------------------------------------------------------------------------------------------------

TRANSLATED_TABLES = {
    "replica_calculator_test.go": (RESOURCE_CASES, PLAIN_CASES, TOTAL_CASES),
    "horizontal_test.go": (
        WHOLE_CASES,
        CONVERT_CASES,
        SCALING_WITH_RULES_CASES,
        NORMALIZE_CASES,
        STABILISE_CASES,
        STORE_EVENTS_CASES,
        LIMIT_CASES,
    ),
}
TRANSLATED_COUNT = 168
NOT_EXPRESSIBLE_COUNT = 66

_CONTAINER = "container-level resource metric (ContainerResource): our pods carry one per-pod signal"
_OBJECT_VALUE = "object metric with a Value target: replicas = ceil(ratio * ready pods), no counterpart in our port"
_EXTERNAL_VALUE = "external metric with a Value target: replicas = ceil(ratio * ready pods), no counterpart in our port"
_MULTI = "several metrics (the HPA takes the largest; an invalid or failing one blocks a scale-down): we use one"
_CONDITIONS = "asserts HPA status conditions / API errors only; no replica arithmetic"

NOT_EXPRESSIBLE: list[tuple[str, str]] = [
    # replica_calculator_test.go
    ("TestReplicaCalcDisjointResourcesMetrics", "metrics-client error (metric pod names match no pod)"),
    ("TestReplicaCalcContainerScaleUp", _CONTAINER),
    ("TestReplicaCalcScaleUpContainerHotCpuLessScale", _CONTAINER),
    ("TestReplicaCalcMissingContainerMetricScaleUpIgnoresFailedPods", _CONTAINER),
    ("TestReplicaCalcScaleUpContainerIgnoresFailedPods", _CONTAINER),
    ("TestReplicaCalcScaleUpContainerIgnoresDeletionPods", _CONTAINER),
    ("TestReplicaCalcScaleUpCMObject", _OBJECT_VALUE),
    ("TestReplicaCalcScaleUpCMObjectIgnoresUnreadyPods", _OBJECT_VALUE),
    ("TestReplicaCalcScaleUpCMExternalIgnoresUnreadyPods", _EXTERNAL_VALUE),
    ("TestReplicaCalcContainerScaleDown", _CONTAINER),
    ("TestReplicaCalcScaleDownCMObject", _OBJECT_VALUE),
    ("TestReplicaCalcScaleDownCMExternal", _EXTERNAL_VALUE),
    ("TestReplicaCalcScaleDownContainerExcludeUnreadyPods", _CONTAINER),
    ("TestReplicaCalcScaleDownContainerExcludeUnscheduledPods", _CONTAINER),
    ("TestReplicaCalcScaleDownContainerIgnoreHotCpuPods", _CONTAINER),
    ("TestReplicaCalcScaleDownContainerIgnoresFailedPods", _CONTAINER),
    ("TestReplicaCalcScaleDownIgnoresDeletionPods_StillRunning", _CONTAINER),
    ("TestReplicaCalcToleranceCMObject", _OBJECT_VALUE),
    ("TestReplicaCalcToleranceCMExternal", _EXTERNAL_VALUE),
    ("TestReplicaCalcEmptyMetrics", "metrics-client error (no metrics returned); the adapter reports stale instead"),
    ("TestReplicaCalcEmptyCPURequest", "error on a container without a CPU request; requests are not in our model"),
    (
        "TestReplicaCalcMissingMetricsScaleDownTargetOver100",
        "unequal requests (1, 1, 2, 2 CPU) with a missing and an unready pod: upstream weights the max(100, 300) % "
        "fallback by the missing pod's 2-CPU request (ratios 6 % then 124 %); a per-pod mean gives 7 % then 105 %",
    ),
    ("TestGroupPods", "pod classification (groupPods) happens in the adapter; the core receives the counts"),
    ("TestCalculatePodRequests", "summing container / init-container requests; requests are not in our model"),
    ("TestReplicaCalcScaleUpOverflow", _OBJECT_VALUE + "; also int32 saturation"),
    (
        "TestExternalPerPodMetricReplicaOverflow",
        "int32 saturation of the replica count (MaxInt32): Python ints do not overflow, maxReplicas clamps later",
    ),
    ("TestReplicaCalcConfigurableToleranceCMObject", _OBJECT_VALUE),
    ("TestReplicaCalcConfigurableToleranceCMExternal", _EXTERNAL_VALUE),
    # horizontal_test.go
    ("TestScaleUpContainer", _CONTAINER),
    ("TestScaleUpDeployment", "scale-target kind (Deployment) plumbing; the arithmetic is TestScaleUp's"),
    ("TestScaleUpReplicaSet", "scale-target kind (ReplicaSet) plumbing; the arithmetic is TestScaleUp's"),
    ("TestScaleUpCMObject", _OBJECT_VALUE),
    ("TestScaleUpFromZeroCMObject", _OBJECT_VALUE + "; scale from zero"),
    ("TestScaleUpFromZeroIgnoresToleranceCMObject", _OBJECT_VALUE + "; scale from zero"),
    ("TestScaleUpCMExternal", _EXTERNAL_VALUE),
    ("TestScaleDownContainerResource", _CONTAINER),
    ("TestScaleUpOneMetricInvalid", _MULTI),
    ("TestScaleUpFromZeroOneMetricInvalid", _MULTI),
    ("TestScaleUpBothMetricsEmpty", _MULTI + "; " + _CONDITIONS),
    ("TestScaleDownCMObject", _OBJECT_VALUE),
    ("TestScaleDownToZeroCMObject", _OBJECT_VALUE),
    ("TestScaleDownCMExternal", _EXTERNAL_VALUE),
    ("TestScaleDownToZeroCMExternal", _EXTERNAL_VALUE),
    ("TestToleranceCMObject", _OBJECT_VALUE),
    ("TestToleranceCMExternal", _EXTERNAL_VALUE),
    ("TestEmptyMetrics", "metrics-client failure (FailedGetResourceMetric); the stale hold is tested in test_decide"),
    ("TestEmptyCPURequest", "missing CPU request error; requests are not in our model"),
    ("TestEventCreated", "asserts the Kubernetes events emitted"),
    ("TestEventNotCreated", "asserts the Kubernetes events emitted"),
    ("TestConditionInvalidSelectorMissing", _CONDITIONS),
    ("TestConditionInvalidSelectorUnparsable", _CONDITIONS),
    ("TestConditionNoAmbiguousSelectorWhenNoSelectorOverlapBetweenHPAs", "selector overlap between HPAs (plumbing)"),
    ("TestConditionAmbiguousSelectorWhenFullSelectorOverlapBetweenHPAs", _CONDITIONS),
    ("TestConditionAmbiguousSelectorWhenPartialSelectorOverlapBetweenHPAs", _CONDITIONS),
    ("TestConditionFailedGetMetrics", _CONDITIONS),
    ("TestConditionInvalidSourceType", _CONDITIONS),
    ("TestConditionFailedGetScale", _CONDITIONS),
    ("TestConditionFailedUpdateScale", _CONDITIONS),
    ("TestNoBackoffUpscaleCMNoBackoffCpu", _MULTI),
    ("TestAvoidUnnecessaryUpdates", "status-update suppression (API plumbing)"),
    ("TestScaleUpOneMetricEmpty", _MULTI),
    ("TestNoScaleDownOneMetricInvalid", _MULTI),
    ("TestNoScaleDownOneMetricEmpty", _MULTI),
    ("TestMultipleHPAs", "1000 HPAs through the work queue (concurrency / plumbing)"),
    (
        "TestConvertDesiredReplicasWithRules/scaleUpLimit is the limit because scaleUpLimit < maxReplicas",
        "expects calculateScaleUpLimit(3) = 24 because the test binary's init() sets scaleUpLimitFactor = 8; "
        "production (and our port) use factor 2",
    ),
    (
        "TestScalingWithRules/scaleDownLimit is the limit because scaleDownLimit > minReplicas with user defined "
        "policies",
        "skipped upstream (testThis: true returns before the assertion)",
    ),
]


def _translated_ids() -> list[str]:
    return [param.id for tables in TRANSLATED_TABLES.values() for table in tables for param in table]


def test_bookkeeping_is_consistent() -> None:
    translated = _translated_ids()
    assert all(translated), "every translated case has an id"
    assert len(translated) == len(set(translated)), "translated case ids are unique"
    listed = [name for name, _ in NOT_EXPRESSIBLE]
    assert len(listed) == len(set(listed)), "each untranslated test is listed once"
    assert all(reason for _, reason in NOT_EXPRESSIBLE), "every listed test has a reason"
    translated_set = set(translated)
    translated_tests = {case_id.split("/", 1)[0] for case_id in translated}
    for name in listed:
        if "/" in name:
            assert name not in translated_set, f"{name} is both translated and listed"
        else:
            assert name not in translated_tests, f"{name} is both translated and listed"
    assert len(translated) == TRANSLATED_COUNT, "update the counts in the module docstring"
    assert len(NOT_EXPRESSIBLE) == NOT_EXPRESSIBLE_COUNT, "update the counts in the module docstring"
