"""Earned headroom with a usable forecast floor (issue 14): the scale-down window that grows without full trust holds
the reactive path's recommendations, not the floor's; with some trust earned, a floor that covers the full
target's recommendation lifts the reduced target; and a rise the floor alone asks for within the scale-up tolerance
is not a scale-up."""

from __future__ import annotations

import dataclasses

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.decide import ReplicaFloor, decide_service
from autoscaler.core.headroom import HeadroomState
from autoscaler.core.model import (
    ControllerState,
    Observation,
    ServiceObservation,
    ServiceState,
)
from autoscaler.core.predictive import ForecastInput
from autoscaler.core.reasons import Reason
from autoscaler.core.tick import PublishedForecast, TickInput, decide_tick
from forecast.types import Forecast
from tests.core.test_review34_headroom import POLICY  # chat at 3.2 req/s per replica, P99 floor, 90 s

SPEC_60S = dataclasses.replace(POLICY, scale_down=dataclasses.replace(POLICY.scale_down, stabilisation_s=60.0))


def flat(level: float) -> Forecast:
    return Forecast(start=0.0, step_s=60.0, quantiles={0.5: [level] * 30, 0.99: [level] * 30}, model="flat")


def published(level: float, coverage: float, scored: int) -> PublishedForecast:
    return PublishedForecast(POLICY.key, ForecastInput(flat(level), 0.0), "flat", 0.99, scored=scored,
                             coverage=coverage, coverage_samples=scored)


def decide_at(rate: float, replicas: int, forecast: PublishedForecast) -> tuple[int, str, HeadroomState]:
    obs = Observation(60.0, {POLICY.key: ServiceObservation(POLICY.key, replicas, replicas, metric_total=rate)})
    tick = TickInput(60.0, obs, ClusterSnapshot(60.0), {POLICY.key: POLICY}, {POLICY.key: forecast})
    plan, _ = decide_tick(tick, ControllerState())
    headroom = plan.forecasts[POLICY.key].headroom
    assert headroom is not None
    return plan.decisions[0].desired_replicas, plan.decisions[0].detail, headroom.state


def test_a_partly_trusted_floor_that_covers_the_full_target_lifts_the_reduced_target() -> None:
    # P99 covered 96.25 % of 200 scores: 3.75 x the allowed misses, trust 0.5, the reactive path at 0.875 x 3.2 = 2.8.
    # 24 req/s on 6 replicas: the full target asks 24 / 3.2 -> 8, the reduced one 24 / 2.8 -> 9.
    replicas, detail, state = decide_at(24.0, 6, published(24.0, 0.9625, 200))
    assert state is HeadroomState.PARTIAL
    assert replicas == 8 and "not applied: forecast floor 8 covers the 8 of the full target" in detail
    # a floor below the full target's 8 (20 req/s -> 7) does not cover this tick: the reduced target stays
    replicas, detail, _ = decide_at(24.0, 6, published(20.0, 0.9625, 200))
    assert replicas == 9 and "not applied" not in detail
    # without any trust (learning: too few scores; degraded: 5 x the allowed misses) the reduced target stays even
    # under a floor that covers it: the floor covering now says little about a cold start ahead
    for forecast, expected in ((published(24.0, 1.0, 5), HeadroomState.LEARNING),
                               (published(24.0, 0.95, 200), HeadroomState.DEGRADED)):
        replicas, detail, state = decide_at(24.0, 6, forecast)
        assert state is expected and replicas == 10  # 24 / (0.75 x 3.2) = 10
        assert "not applied" not in detail


def first_scale_down(peak_from_floor: bool, down_window_s: float) -> float:
    """5 replicas on 16 req/s; at 15 s one recommendation of 10, from the floor or from the metric (32 req/s); then
    5 again. The time of the first scale-down from 10."""
    state, replicas = ServiceState(), 5
    for now in (15.0 * k for k in range(20)):
        peak = now == 15.0
        rate = 32.0 if peak and not peak_from_floor else 16.0
        floor_replicas = 10 if peak and peak_from_floor else 5
        floor = ReplicaFloor(floor_replicas, Reason.FORECAST_FLOOR, "flat", down_window_s=down_window_s,
                             target_ratio=1.0, trust=0.5)
        obs = ServiceObservation(POLICY.key, replicas, replicas, metric_total=rate)
        decision, state = decide_service(SPEC_60S, obs, state, now, floor)
        if decision.desired_replicas < replicas:
            return now
        replicas = decision.desired_replicas
    raise AssertionError("never scaled down")


def test_a_window_grown_by_partial_trust_holds_the_reactive_recommendations_not_the_floors() -> None:
    # trust earned: the spec's 60 s window, whoever asked for the 10 (upstream's window is (now - 60 s, now])
    assert first_scale_down(peak_from_floor=True, down_window_s=0.0) == 75.0
    assert first_scale_down(peak_from_floor=False, down_window_s=0.0) == 75.0
    # trust partly lost, the window grown to 180 s: the metric's 10 is held for it ...
    assert first_scale_down(peak_from_floor=False, down_window_s=180.0) == 195.0
    # ... the floor's for the spec's 60 s: the floor's cost of coming back is its hold, and holding a doubted
    # forecast's peaks longer made it dearer than a trusted one (issue 14: ServeGen's edge hedges held for minutes)
    assert first_scale_down(peak_from_floor=True, down_window_s=180.0) == 75.0


def test_once_the_forecast_is_unusable_the_grown_window_holds_every_recommendation() -> None:
    # a floor of 10 at 15 s, then the forecast goes unusable (stale): no floor is applied any more, and the grown
    # window holds what was recommended, the floor's 10 included, as before issue 14's split
    state, replicas = ServiceState(), 5
    for now in (15.0 * k for k in range(20)):
        floor = ReplicaFloor(10 if now == 15.0 else 5, Reason.FORECAST_FLOOR, "flat", usable=now < 30.0,
                             down_window_s=180.0, trust=0.5)
        obs = ServiceObservation(POLICY.key, replicas, replicas, metric_total=16.0)
        decision, state = decide_service(SPEC_60S, obs, state, now, floor)
        if decision.desired_replicas < replicas:
            break
        replicas = decision.desired_replicas
    assert (now, replicas) == (195.0, 10)


def test_a_small_forecast_driven_rise_is_within_the_scale_up_tolerance() -> None:
    # 20 replicas on 48 req/s (the metric at 3.2 asks for 15): a floor of 22 is 10 % above 20, within the HPA's
    # scale-up tolerance, and is not acted on; 23 is a real rise. Either way no scale-down below the floor.
    no_window = dataclasses.replace(POLICY, scale_down=dataclasses.replace(POLICY.scale_down, stabilisation_s=0.0))
    obs = ServiceObservation(POLICY.key, 20, 20, metric_total=48.0)
    for floor_replicas, expected, reason in ((22, 20, Reason.WITHIN_TOLERANCE), (23, 23, Reason.FORECAST_FLOOR)):
        floor = ReplicaFloor(floor_replicas, Reason.FORECAST_FLOOR, "flat", hold=floor_replicas, hold_window_s=90.0)
        decision, _ = decide_service(no_window, obs, ServiceState(), 0.0, floor)
        assert (decision.desired_replicas, decision.reason) == (expected, reason), decision.detail
    # a rise the metric asks for is not held back by the floor's tolerance: 80 req/s asks for 25
    floor = ReplicaFloor(22, Reason.FORECAST_FLOOR, "flat", hold=22, hold_window_s=90.0)
    decision, _ = decide_service(no_window, ServiceObservation(POLICY.key, 20, 20, metric_total=80.0), ServiceState(),
                                 0.0, floor)
    assert decision.desired_replicas == 25
