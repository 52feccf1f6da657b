"""core/tick.py: a forecast read at a quantile other than the one it was scored at (spec.forecast.quantile changed
since the latest refit).

The tick reads the latest published fit until the next refit. When the policy's quantile changes in between and the
new level lies inside the fit's levels (0.99 -> 0.95 with levels 0.1, 0.5, 0.9, 0.99), ``Forecast.at`` interpolates
it: the floor can still be read, as it can for any level inside a fit. The trust cannot: the coverage (and the
bootstrap/live scores behind it) was measured for the old level, and says nothing about the new one, in either
direction. P99's 99.5 % coverage does not mean P95's forecast covered 95 %, and P95's 97 % coverage would be
"earned" trust for a P99 it never showed. Until the service is scored at its new level, the headroom is the untrusted
one, exactly as for a new level outside the fit (``tests/runtime/test_forecasting.py::
test_a_quantile_change_between_refits_earns_no_headroom_and_keeps_the_scale_down_window``), and it says why.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.headroom import HeadroomState
from autoscaler.core.model import (
    DEFAULT_SCALE_DOWN,
    ControllerState,
    ForecastMode,
    ForecastPolicy,
    MetricKind,
    Observation,
    PodMetrics,
    ServiceObservation,
    ServicePolicy,
)
from autoscaler.core.predictive import ForecastInput
from autoscaler.core.reasons import Reason
from autoscaler.core.tick import PublishedForecast, ServiceForecastView, TickInput, decide_tick
from forecast.types import Forecast

NOW = 36_000.0
LEVELS = {0.1: 4.0, 0.5: 8.0, 0.9: 10.0, 0.95: 11.0, 0.99: 12.0}  # req/s at each level, flat over the horizon


def policy(quantile: float, window_s: float = 60.0) -> ServicePolicy:
    """Request rate at 2 req/s per replica; a 60 s scale-down window (shorter than the untrusted 300 s)."""
    return ServicePolicy(
        namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=2.0,
        cold_start_s=90.0, scale_down=dataclasses.replace(DEFAULT_SCALE_DOWN, stabilisation_s=window_s),
        forecast=ForecastPolicy(ForecastMode.ACTIVE, quantile),
    )  # fmt: skip


def published(scored_at: float, levels: tuple[float, ...], coverage: float = 0.999) -> PublishedForecast:
    """A fresh, reliable fit scored at ``scored_at`` whose coverage there earns full trust (500 scores)."""
    forecast = Forecast(
        start=NOW - 60.0, step_s=60.0, quantiles={q: (LEVELS[q],) * 60 for q in levels}, model="flat"
    )
    latest = ForecastInput(forecast, fitted_at=NOW - 60.0, reliable=True, reliability_detail="live: ok")
    return PublishedForecast(
        "ml/chat", latest, "flat", scored_at, pinball_ratio=0.8, relative_error=0.1, scored=500, coverage=coverage,
        coverage_samples=500,
    )


def view(service_quantile: float, pub: PublishedForecast) -> ServiceForecastView:
    p = policy(service_quantile)
    obs = ServiceObservation(p.key, 5, 5, pods=PodMetrics(5, 8.0), request_rate=8.0)
    tick = TickInput(NOW, Observation(NOW, {p.key: obs}), ClusterSnapshot(NOW), {p.key: p}, {p.key: pub})
    plan, _ = decide_tick(tick, ControllerState())
    return plan.forecasts[p.key]


def test_the_same_quantile_earns_its_headroom() -> None:
    """The control: a fit scored at the service's own quantile earns the full target with this coverage."""
    seen = view(0.99, published(0.99, (0.1, 0.5, 0.9, 0.99)))
    assert seen.floor is not None and seen.floor.usable
    assert seen.headroom is not None and seen.headroom.state is HeadroomState.EARNED, seen.headroom


@pytest.mark.parametrize(
    ("scored_at", "levels", "now_at", "demand"),
    [
        (0.99, (0.1, 0.5, 0.9, 0.99), 0.95, 10.0 + 2.0 * 5 / 9),  # lower, interpolated between 0.9 and 0.99
        (0.95, (0.1, 0.5, 0.9, 0.95, 0.99), 0.99, 12.0),  # higher, a level the fit has: trust it never showed
        (0.99, (0.1, 0.5, 0.9, 0.99), 0.9, 10.0),  # a level the fit stores exactly
    ],
)
def test_a_quantile_inside_the_fit_gives_a_floor_but_no_trust_until_scored_at_it(
    scored_at: float, levels: tuple[float, ...], now_at: float, demand: float
) -> None:
    seen = view(now_at, published(scored_at, levels))
    # the floor reads the new level from the old fit, as for any level inside a fit (interpolated if not stored)
    assert seen.floor is not None and seen.floor.usable and seen.floor.reason is Reason.FORECAST_FLOOR, seen.floor
    assert seen.demand == pytest.approx(demand)
    assert seen.floor.replicas == pytest.approx(demand / 2.0, abs=1)
    # ... but its trust was measured at the old level: none is earned at the new one
    h = seen.headroom
    assert h is not None
    assert h.state in (HeadroomState.LEARNING, HeadroomState.UNTRUSTED), h
    assert h.ratio == pytest.approx(0.75) and h.trust == 0.0
    assert h.coverage is None and h.scored == 0, h  # the old level's coverage is not shown as the new one's
    assert "quantile" in h.detail, h.detail
    # the untrusted scale-down window, as any service that has not earned its trust
    assert h.down_window_s == pytest.approx(300.0)
    assert seen.floor.target_ratio == pytest.approx(0.75)
    assert seen.floor.down_window_s == pytest.approx(300.0)


def test_a_quantile_outside_the_fit_has_no_floor_and_no_trust() -> None:
    """The case the runtime test covers, here pure: 0.9 -> 0.95 when the fit stops at 0.9."""
    seen = view(0.95, published(0.9, (0.1, 0.5, 0.9)))
    assert seen.floor is not None and not seen.floor.usable and "outside the forecast's levels" in seen.floor.detail
    assert seen.headroom is not None and seen.headroom.state is HeadroomState.UNTRUSTED
    assert seen.headroom.coverage is None and seen.headroom.ratio == pytest.approx(0.75)
    assert seen.floor.down_window_s >= seen.lead_s > 0
