"""Review 34 of earned headroom (``core/headroom.py``): a controller that has not run its first refit holds the services
it has no forecast for, and a quantile the accountability window cannot judge says so."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.headroom import (
    DEFAULT_HEADROOM,
    HeadroomConfig,
    HeadroomState,
    earned_headroom,
    scores_needed,
)
from autoscaler.core.model import (
    ControllerState,
    ForecastMode,
    ForecastPolicy,
    MetricKind,
    Observation,
    ServiceObservation,
    ServicePolicy,
)
from autoscaler.core.tick import ForecastReadConfig, TickConfig, TickInput, decide_tick

POLICY = ServicePolicy(
    namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=3.2,
    cold_start_s=90.0, forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99),
)  # fmt: skip
HOLD = TickConfig(ForecastReadConfig(headroom=dataclasses.replace(DEFAULT_HEADROOM, hold_unfitted=True)))


def tick_at(now: float, rate: float, replicas: int, policy: ServicePolicy = POLICY) -> TickInput:
    obs = Observation(now, {policy.key: ServiceObservation(policy.key, replicas, replicas, metric_total=rate)})
    return TickInput(now, obs, ClusterSnapshot(now), {policy.key: policy})


def test_without_a_first_refit_a_service_is_neither_scaled_up_nor_down_for_want_of_a_forecast() -> None:
    # 24 req/s on 8 replicas: the spec's 3.2 per replica. Read as untrusted (0.75 x 3.2) it was scaled to 10.
    plan, _ = decide_tick(tick_at(0.0, 24.0, 8), ControllerState())
    assert plan.decisions[0].desired_replicas == 10
    plan, state = decide_tick(tick_at(0.0, 24.0, 8), ControllerState(), HOLD)
    assert plan.decisions[0].desired_replicas == 8
    headroom = plan.forecasts[POLICY.key].headroom
    assert headroom is not None and headroom.ratio == 1.0 and headroom.state is HeadroomState.UNTRUSTED
    assert "first refit" in headroom.detail and "no forecast fitted yet" in headroom.detail
    # demand halves: no scale-down for as long as the controller has not refitted (here an hour of ticks)
    for i in range(1, 241):
        plan, state = decide_tick(tick_at(15.0 * i, 12.0, 8), state, HOLD)
        assert plan.decisions[0].desired_replicas == 8
    # ... but more demand is still served, at the spec's target
    plan, state = decide_tick(tick_at(3700.0, 32.0, 8), state, HOLD)
    assert plan.decisions[0].desired_replicas == 10


@pytest.mark.parametrize("behavior", [True, False])
def test_the_hold_also_holds_a_policy_without_behavior_and_with_headroom_off(behavior: bool) -> None:
    off = dataclasses.replace(
        POLICY, behavior=behavior, forecast=dataclasses.replace(POLICY.forecast, untrusted_target_ratio=1.0)
    )
    plan, state = decide_tick(tick_at(0.0, 24.0, 8, off), ControllerState(), HOLD)
    for i in range(1, 100):
        plan, state = decide_tick(tick_at(15.0 * i, 6.0, 8, off), state, HOLD)
    assert plan.decisions[0].desired_replicas == 8


def test_the_hold_is_only_for_a_forecast_that_is_not_usable() -> None:
    config = dataclasses.replace(DEFAULT_HEADROOM, hold_unfitted=True)
    earned = earned_headroom(POLICY, coverage=0.999, scored=200, usable=True, config=config)
    assert earned.state is HeadroomState.EARNED and earned.down_window_s == 0.0
    held = earned_headroom(POLICY, coverage=None, scored=0, usable=False, why_unusable="no fit", config=config)
    assert held.ratio == 1.0 and math.isinf(held.down_window_s)
    # without the flag (the simulator, and the controller once it has refitted): the untrusted target, as before
    untrusted = earned_headroom(POLICY, coverage=None, scored=0, usable=False, why_unusable="no fit")
    assert untrusted.ratio == 0.75 and untrusted.down_window_s == 0.0  # the spec's own window (300 s) stands


def test_scores_needed_is_the_rule_the_headroom_judges_by() -> None:
    assert [scores_needed(q, 30) for q in (0.5, 0.9, 0.95, 0.97, 0.99, 0.999)] == [30, 30, 30, 34, 100, 1000]


def test_a_quantile_the_window_cannot_hold_the_scores_of_says_so() -> None:
    p999 = dataclasses.replace(POLICY, forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.999))
    config = dataclasses.replace(DEFAULT_HEADROOM, max_scored=361)
    headroom = earned_headroom(p999, coverage=1.0, scored=361, usable=True, config=config)
    assert headroom.state is HeadroomState.LEARNING
    assert "can never earn trust" in headroom.detail and "1000" in headroom.detail and "361" in headroom.detail
    # a P99 fits in the window: learning, on its way
    on_its_way = earned_headroom(POLICY, coverage=1.0, scored=40, usable=True, config=config)
    assert on_its_way.state is HeadroomState.LEARNING and "never" not in on_its_way.detail
    with pytest.raises(ValueError, match="max_scored"):
        HeadroomConfig(max_scored=-1)
