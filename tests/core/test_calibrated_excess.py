"""Issue 14: the floor provisions the share of its quantile's excess over the median that the measured coverage
needed (``core.headroom.calibrated_excess``, split-conformal), never more than the quantile itself."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.headroom import calibrated_excess
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
from autoscaler.core.predictive import ForecastInput, provisioned_input
from autoscaler.core.tick import ForecastReadConfig, PublishedForecast, TickConfig, TickInput, decide_tick
from forecast.types import Forecast

NOW = 36_000.0


def scores(shares: list[float], median: float = 10.0, upper: float = 20.0) -> list[tuple[float, float, float]]:
    """(actual, median, upper) with each actual at ``share`` of the excess above the median."""
    return [(median + s * (upper - median), median, upper) for s in shares]


def test_too_few_scores_keep_the_quantile() -> None:
    """A P99 needs 100 scores (``scores_needed``): until then the whole excess."""
    assert calibrated_excess(scores([0.1] * 99), 0.99, 30) == (1.0, 99)


def test_an_over_covering_band_provisions_the_share_that_covered_the_quantile() -> None:
    """399 actuals at 40 % of the excess, one at 90 %: the ceil(401 x 0.99) = 397th smallest share is 0.4."""
    share, n = calibrated_excess(scores([0.4] * 399 + [0.9]), 0.99, 30)
    assert (share, n) == (pytest.approx(0.4), 400)


def test_an_under_covering_band_keeps_the_quantile() -> None:
    """5 % of the actuals above the quantile: the share needed is above 1, the floor keeps the quantile (the reactive
    path's reduced target makes up for it, as earned headroom does)."""
    assert calibrated_excess(scores([0.5] * 190 + [1.5] * 10), 0.99, 30)[0] == 1.0


def test_a_zero_excess_counts_as_covered_by_the_median_or_by_nothing() -> None:
    flat = [(11.0, 10.0, 10.0)] * 5 + [(9.0, 10.0, 10.0)] * 195
    assert calibrated_excess(flat, 0.99, 30)[0] == 1.0  # 2.5 % above a zero-width band: nothing narrower covers


def _forecast() -> ForecastInput:
    levels = {0.1: 4.0, 0.5: 8.0, 0.9: 10.0, 0.99: 12.0}
    forecast = Forecast(start=NOW - 60.0, step_s=60.0, quantiles={q: (v,) * 60 for q, v in levels.items()}, model="f")
    return ForecastInput(forecast, fitted_at=NOW - 60.0, reliable=True, reliability_detail="live: ok")


def test_provisioned_input_narrows_the_level_and_drops_the_levels_between() -> None:
    latest = _forecast()
    assert provisioned_input(latest, 0.99, 1.0) is latest
    narrowed = provisioned_input(latest, 0.99, 0.25).forecast
    assert narrowed.at(NOW, 0.99) == pytest.approx(9.0)  # 8 + 0.25 x (12 - 8)
    assert narrowed.at(NOW, 0.5) == 8.0 and narrowed.at(NOW, 0.1) == 4.0
    assert 0.9 not in narrowed.quantiles  # P90 (10) would cross the narrowed P99 (9)


def _floor(share: float, calibrated: bool = True) -> int:
    p = ServicePolicy(
        namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=2.0,
        cold_start_s=90.0, scale_down=dataclasses.replace(DEFAULT_SCALE_DOWN, stabilisation_s=60.0),
        forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99),
    )  # fmt: skip
    pub = PublishedForecast(
        p.key, _forecast(), "f", 0.99, pinball_ratio=0.8, relative_error=0.1, scored=500, coverage=0.999,
        coverage_samples=500, excess_share=share,
    )  # fmt: skip
    obs = ServiceObservation(p.key, 5, 5, pods=PodMetrics(5, 8.0), request_rate=8.0)
    tick = TickInput(NOW, Observation(NOW, {p.key: obs}), ClusterSnapshot(NOW), {p.key: p}, {p.key: pub})
    config = TickConfig(ForecastReadConfig(tick_interval_s=60.0, calibrated_excess=calibrated))
    plan, _ = decide_tick(tick, ControllerState(), config)
    floor = plan.forecasts[p.key].floor
    assert floor is not None and floor.usable
    return floor.replicas


def test_the_tick_floor_reads_the_calibrated_share() -> None:
    """P99 12 req/s at 2 per replica: 6 replicas; half its excess over the median (8): 10 req/s, 5 replicas."""
    assert _floor(1.0) == 6
    assert _floor(0.5) == 5
    assert _floor(0.5, calibrated=False) == 6  # the switch off: the quantile as fitted


def test_the_floor_says_it_is_calibrated() -> None:
    p = ServicePolicy(
        namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=2.0,
        cold_start_s=90.0, forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99),
    )  # fmt: skip
    pub = PublishedForecast(p.key, _forecast(), "f", 0.99, scored=500, coverage=0.999, coverage_samples=500,
                            excess_share=0.5)  # fmt: skip
    obs = ServiceObservation(p.key, 5, 5, pods=PodMetrics(5, 8.0), request_rate=8.0)
    tick = TickInput(NOW, Observation(NOW, {p.key: obs}), ClusterSnapshot(NOW), {p.key: p}, {p.key: pub})
    plan, _ = decide_tick(tick, ControllerState())
    floor = plan.forecasts[p.key].floor
    assert floor is not None and "calibrated: 50.0% of its excess" in floor.detail


def test_the_narrowed_fit_is_built_once_per_fit_and_share() -> None:
    """Read at every tick between two publications: the same fit and share give the same object; another share or
    another fit (even an equal one) its own answer."""
    latest = _forecast()
    first = provisioned_input(latest, 0.99, 0.25)
    assert provisioned_input(latest, 0.99, 0.25) is first
    assert provisioned_input(latest, 0.99, 0.5).forecast.at(NOW, 0.99) == pytest.approx(10.0)
    other = _forecast()
    again = provisioned_input(other, 0.99, 0.25)
    assert again is not first and again.forecast.at(NOW, 0.99) == pytest.approx(9.0)
    assert again.forecast.start == other.forecast.start
