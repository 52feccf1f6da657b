"""Review 32 of the per-service decision (``core.decide``): reproductions of what the review found, and the
guard-rails it checked, kept as deterministic tests.

- A forecast floor's "scale-down within tolerance" hold also swallowed *reactive* scale-downs whose metric ratio is
  outside the tolerance (described, not fixed at first because the fix moves the simulator's figures; fixed at stop 39).
- The HPA arithmetic with a behavior block (stabilisation windows, rate policies with Pods/Percent, periods and
  selectPolicy Min/Max/Disabled, min/max clamps, the initial recommendation), run tick after tick against an
  independent port of upstream's ``normalizeDesiredReplicasWithBehaviors``.
- The project's rules on random inputs: stale or partial data never scales down, a latency breach or a forecast
  floor/hold at or above the current replicas never scales down, the decision stays within min/max, a
  recommend-only service records no scale event, every decision carries a detail.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from autoscaler.core.decide import ReplicaFloor, decide, decide_service
from autoscaler.core.model import (
    ControllerState,
    MetricKind,
    Mode,
    Observation,
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

NO_WINDOW_DOWN = ScalingRules(0.0, (RatePolicy(RateKind.PERCENT, 100, 15.0),))
GPU = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=40, target=70.0, scale_down=NO_WINDOW_DOWN)
RATE = dataclasses.replace(GPU, metric=MetricKind.REQUEST_RATE, target=1.0)


def _gpu(replicas: int, util: float) -> ServiceObservation:
    return ServiceObservation("ml/chat", replicas, replicas, PodMetrics(replicas, util * replicas))


def _rate(replicas: int, total: float) -> ServiceObservation:
    return ServiceObservation("ml/chat", replicas, replicas, metric_total=total)


def _floor(replicas: int, hold: int) -> ReplicaFloor:
    return ReplicaFloor(replicas, Reason.FORECAST_FLOOR, f"forecast {replicas}", hold=hold, hold_window_s=90.0)


# ---- defect 1: the forecast's tolerance hold swallows reactive scale-downs ------------------------------------------
#
# ``decide_service`` holds "a forecast-driven drop within the scale-down tolerance" (README, step 4) with
# ``if floor.hold and current > recommendation >= current * (1 - tolerance)``: the test is on the replica counts and
# on any recommendation, so with a usable cold-start-aware forecast (``hold`` > 0) a drop the *metric* asks for is held
# too, although the metric's ratio is outside the tolerance and the forecast is far below. An HPA (and this service
# without a forecast) scales 10 -> 9 at a GPU utilisation ratio of 0.85; with a forecast of 3 it stays at 10 "within
# scale-down tolerance 0.1 of 10". For a total metric, ceil(total / target) is within 10 % of the current replicas
# whenever total / target is in (0.9 x current - 1, 0.9 x current): 20 replicas at 17.5 req/s (ratio 0.875) stay 20.
# Restricting the hold to drops the forecast decided (the floor's replicas or its hold) moved the simulator's figures
# (predictive: more scaling actions, fewer GPU-hours), so it was described and not made until stop 39, where it was
# fixed (the reactive path's drop has passed the HPA's tolerance on the metric ratio already).
_TOLERANCE_CASES = [
    # (policy, observation, floor, expected desired, expected reason)
    pytest.param(GPU, _gpu(10, 0.85 * 70.0), None, 9, Reason.METRIC_BELOW_TARGET, id="gpu-no-forecast"),
    pytest.param(
        GPU,
        _gpu(10, 0.85 * 70.0),
        _floor(3, 3),
        9,
        Reason.METRIC_BELOW_TARGET,
        id="gpu-forecast-far-below",
    ),
    pytest.param(RATE, _rate(20, 17.5), None, 18, Reason.METRIC_BELOW_TARGET, id="rate-no-forecast"),
    pytest.param(
        RATE,
        _rate(20, 17.5),
        _floor(5, 5),
        18,
        Reason.METRIC_BELOW_TARGET,
        id="rate-forecast-far-below",
    ),
    # what the hold is for, and must keep doing: a drop the forecast decides, within 10 %, holds
    pytest.param(RATE, _rate(20, 12.0), _floor(19, 19), 20, Reason.WITHIN_TOLERANCE, id="forecast-drop-19-of-20"),
    pytest.param(RATE, _rate(20, 12.0), _floor(15, 19), 20, Reason.WITHIN_TOLERANCE, id="forecast-hold-19-of-20"),
    pytest.param(RATE, _rate(22, 12.0), _floor(19, 19), 19, Reason.FORECAST_FLOOR, id="forecast-drop-19-of-22"),
]


@pytest.mark.parametrize(("policy", "obs", "floor", "desired", "reason"), _TOLERANCE_CASES)
def test_the_forecast_tolerance_hold_applies_to_forecast_driven_drops_only(
    policy: ServicePolicy, obs: ServiceObservation, floor: ReplicaFloor | None, desired: int, reason: Reason
) -> None:
    decision, _ = decide_service(policy, obs, ServiceState(((0.0, obs.spec_replicas),)), 100.0, floor)
    assert (decision.desired_replicas, decision.reason) == (desired, reason), decision.detail


# ---- the HPA path against an independent port of upstream ---------------------------------------------------------


def _upstream_limit(
    current: int,
    up_events: list[tuple[float, int]],
    down_events: list[tuple[float, int]],
    rules: ScalingRules,
    now: float,
    up: bool,
) -> int:
    """``calculateScaleUpLimitWithScalingRules`` / ``calculateScaleDownLimitWithBehaviors`` over upstream's two
    event lists (``getReplicasChangePerPeriod`` of each: replica changes, both positive)."""
    if rules.select is SelectPolicy.DISABLED:
        return current
    proposals = []
    for rate in rules.policies:
        cutoff = now - rate.period_s
        added = sum(change for t, change in up_events if t > cutoff)
        deleted = sum(change for t, change in down_events if t > cutoff)
        start = current - added + deleted
        if rate.kind is RateKind.PODS:
            proposals.append(start + rate.value if up else start - rate.value)
        elif up:
            proposals.append(math.ceil(start * (1 + rate.value / 100)))
        else:
            proposals.append(int(start * (1 - rate.value / 100)))
    least_change = rules.select is SelectPolicy.MIN
    return (min if up == least_change else max)(proposals)


class _Upstream:
    """``reconcileAutoscaler`` with a behavior block, on a given (prenormalised) recommendation: the initial
    recommendation, the clamps of a current count out of range, ``stabilizeRecommendationWithBehaviors`` (reusing the
    slot of a sample older than both windows), ``convertDesiredReplicasWithBehaviorRate`` and ``storeScaleEvent``
    (per-direction slots: ``markScaleEventsOutdated`` by that direction's longest period, then the new event written
    over the last outdated slot, else appended -- review 39)."""

    def __init__(self) -> None:
        self.recommendations: list[tuple[float, int]] | None = None
        self.up_events: list[tuple[float, int]] = []
        self.down_events: list[tuple[float, int]] = []

    @staticmethod
    def _store(events: list[tuple[float, int]], rules: ScalingRules, now: float, change: int) -> None:
        longest = max((rate.period_s for rate in rules.policies), default=0.0)
        outdated = [i for i, (t, _) in enumerate(events) if t < now - longest]
        if outdated:
            events[outdated[-1]] = (now, change)
        else:
            events.append((now, change))

    def step(self, policy: ServicePolicy, current: int, recommendation: int, now: float) -> int:
        if self.recommendations is None:
            self.recommendations = [(now, current)]
        if current == 0 and policy.min_replicas != 0:
            return 0
        if current > policy.max_replicas:
            desired = policy.max_replicas
        elif current < policy.min_replicas:
            desired = policy.min_replicas
        else:
            up_cut, down_cut = now - policy.scale_up.stabilisation_s, now - policy.scale_down.stabilisation_s
            up_rec = down_rec = recommendation
            old = None
            for i, (t, value) in enumerate(self.recommendations):
                if t > up_cut:
                    up_rec = min(up_rec, value)
                if t > down_cut:
                    down_rec = max(down_rec, value)
                if t < up_cut and t < down_cut:
                    old = i
            if old is None:
                self.recommendations.append((now, recommendation))
            else:
                self.recommendations[old] = (now, recommendation)
            desired = min(max(current, up_rec), down_rec)
            if desired > current:
                limit = max(
                    _upstream_limit(current, self.up_events, self.down_events, policy.scale_up, now, True), current
                )
                desired = min(desired, policy.max_replicas if policy.max_replicas <= limit else limit)
            elif desired < current:
                limit = min(
                    _upstream_limit(current, self.up_events, self.down_events, policy.scale_down, now, False), current
                )
                desired = max(desired, policy.min_replicas if policy.min_replicas >= limit else limit)
        if desired > current:
            self._store(self.up_events, policy.scale_up, now, desired - current)
        elif desired < current:
            self._store(self.down_events, policy.scale_down, now, current - desired)
        return desired


def _random_rules(rnd: random.Random) -> ScalingRules:
    rates = tuple(
        RatePolicy(
            rnd.choice([RateKind.PODS, RateKind.PERCENT]),
            rnd.choice([1, 2, 4, 10, 50, 100, 150]),
            rnd.choice([15.0, 30.0, 60.0, 120.0]),
        )
        for _ in range(rnd.randint(1, 3))
    )
    return ScalingRules(rnd.choice([0.0, 30.0, 60.0, 120.0]), rates, rnd.choice(list(SelectPolicy)), 0.0)


@pytest.mark.parametrize("seed", range(4))
def test_behavior_path_matches_an_independent_port_of_upstream_tick_after_tick(seed: int) -> None:
    """Random rules, bounds and recommendations (a request-rate total of ``recommendation`` at a target of 1 with no
    tolerance recommends exactly that), 40 ticks of 15 s, now and then a replica count changed by someone else."""
    rnd = random.Random(seed)
    for _ in range(150):
        low = rnd.choice([0, 1, 2])
        policy = ServicePolicy(
            "ml", "chat", low, low + rnd.choice([1, 5, 20, 60]), MetricKind.REQUEST_RATE, 1.0,
            _random_rules(rnd), _random_rules(rnd),
        )  # fmt: skip
        upstream, state = _Upstream(), ServiceState()
        current = rnd.randint(0, policy.max_replicas + 3)
        for tick in range(40):
            now = tick * 15.0
            recommendation = rnd.randint(0, policy.max_replicas + 5)
            made, state = decide_service(policy, _rate(current, float(recommendation)), state, now)
            expected = upstream.step(policy, current, recommendation, now)
            assert made.desired_replicas == expected, (policy, tick, current, recommendation, made)
            current = expected if rnd.random() > 0.05 else rnd.randint(0, policy.max_replicas + 3)


# ---- the project's rules on random inputs --------------------------------------------------------------------------


def _random_case(rnd: random.Random) -> tuple[ServicePolicy, ServiceObservation, ReplicaFloor | None, ServiceState]:
    low = rnd.choice([0, 0, 1, 2, 5])
    metric = rnd.choice(list(MetricKind))
    policy = ServicePolicy(
        "ml", "chat", low, low + rnd.choice([0, 1, 3, 10, 40]), metric, rnd.choice([0.5, 3.2, 70.0]),
        dataclasses.replace(_random_rules(rnd), tolerance=rnd.choice([0.0, 0.1, 0.3])),
        dataclasses.replace(_random_rules(rnd), tolerance=rnd.choice([0.0, 0.1, 0.3])),
        behavior=rnd.random() < 0.8, latency_slo_s=rnd.choice([None, 1.0]),
        mode=rnd.choice([Mode.ACTIVE, Mode.RECOMMEND_ONLY]),
    )  # fmt: skip
    current = rnd.choice([0, 1, 2, 3, 5, 8, 13, 20, 45])
    ready = rnd.randint(0, current)
    if metric in (MetricKind.REQUEST_RATE, MetricKind.QUEUE_DEPTH):
        total = rnd.choice([0.0, 1.0, 10.0, 100.0, math.nan, None])
        created = rnd.choice([None, max(0, current - 1), current + 1])
        obs = ServiceObservation("ml/chat", current, ready, metric_total=total, status_replicas=created)
    else:
        with_metric = rnd.randint(0, current)
        pods = PodMetrics(
            with_metric, with_metric * rnd.uniform(0, 150), rnd.randint(0, current - with_metric), rnd.randint(0, 2)
        )
        obs = ServiceObservation("ml/chat", current, ready, rnd.choice([None, pods]))
    obs = dataclasses.replace(
        obs,
        latency_s=rnd.choice([None, 0.5, 1.5, 5.0]),
        stale_reasons=rnd.choice([(), (), ("sample 900 s old",)]),
        partial_reasons=rnd.choice([(), (), ("1 of 3 pods without a sample",)]),
    )
    floor = None
    if rnd.random() < 0.5:
        floor = ReplicaFloor(
            rnd.randint(policy.min_replicas, policy.max_replicas), Reason.FORECAST_FLOOR, "forecast",
            shadow=rnd.random() < 0.2, usable=rnd.random() < 0.8, hold=rnd.randint(0, policy.max_replicas),
            hold_window_s=90.0, down_window_s=rnd.choice([0.0, 90.0, 300.0]), target_ratio=rnd.choice([1.0, 0.75]),
        )  # fmt: skip
    now = 1000.0
    recommendations = tuple(sorted((now - rnd.uniform(0, 400), rnd.randint(0, 50)) for _ in range(rnd.randint(0, 5))))
    events = tuple(sorted((now - rnd.uniform(0, 400), rnd.randint(-10, 10)) for _ in range(rnd.randint(0, 4))))
    return policy, obs, floor, ServiceState(recommendations, events)


@pytest.mark.parametrize("seed", range(4))
def test_the_rules_hold_on_random_inputs(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(2500):
        policy, obs, floor, state = _random_case(rnd)
        plan, after = decide(
            Observation(1000.0, {"ml/chat": obs}),
            ControllerState({"ml/chat": state}),
            {"ml/chat": policy},
            1000.0,
            {"ml/chat": floor} if floor is not None else None,
        )
        made, kept = plan.decisions[0], after.services["ml/chat"]
        current, desired = obs.spec_replicas, made.desired_replicas
        case = (policy, obs, floor, state, made)
        assert made.detail, case
        if made.reason is Reason.DECISION_FAILED:
            assert desired == current and kept == state, case
            continue
        in_range = policy.min_replicas <= current <= policy.max_replicas
        if current == 0 and policy.min_replicas != 0:
            assert desired == 0, case
            continue
        if in_range:
            assert policy.min_replicas <= desired <= policy.max_replicas, case
            if obs.stale_reasons or obs.partial_reasons:
                assert desired >= current, case
            if policy.latency_slo_s is not None and obs.latency_s is not None and obs.latency_s > policy.latency_slo_s:
                assert desired >= current, case
            applied = floor is not None and floor.usable and not floor.shadow and not obs.stale_reasons
            if applied and floor is not None and max(floor.replicas, floor.hold) >= current:
                assert desired >= current, case
        if policy.mode is Mode.RECOMMEND_ONLY:
            assert plan.actions == () and set(kept.scale_events) <= set(state.scale_events), case
        else:
            assert len(plan.actions) == (1 if desired != current else 0), case
