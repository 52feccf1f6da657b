"""Behaviour of each model beyond the shared contract: do they actually forecast what they claim to?"""

from __future__ import annotations

import numpy as np
import pytest

from forecast.baselines import LastValue, SeasonalNaive
from forecast.gbm import QuantileGBM
from forecast.statistical import FourierARIMA, HoltWinters, fourier_terms
from tests.forecast.conftest import START, STEP_S, daily_series

DAY = int(86_400 / STEP_S)


def truth(n: int, horizon: int) -> np.ndarray:
    t = (n + np.arange(horizon)) * STEP_S
    return 100.0 + 50.0 * np.sin(2 * np.pi * t / 86_400)


def test_last_value_repeats_the_last_observation() -> None:
    y = np.array([5.0, 3.0, 5.0, 3.0, 5.0, 3.0, 5.0])
    f = LastValue().fit(y, start=0.0, step_s=60.0).predict(2)
    # Median past change is 0 at both leads; one step ahead it moves +-2, two steps ahead it never moved.
    assert f.values(0.5) == pytest.approx((5.0, 5.0), abs=0.01)
    assert f.quantiles[0.1][0] < 5.0 < f.quantiles[0.9][0]
    assert f.quantiles[0.1][1] == pytest.approx(5.0, abs=0.01) == f.quantiles[0.9][1]


def test_last_value_interval_widens_with_the_lead_on_a_random_walk() -> None:
    y = np.cumsum(np.random.default_rng(0).normal(size=2000)) + 100
    f = LastValue(residual_half_life_s=None).fit(y, step_s=60.0).predict(30)
    width = np.array(f.quantiles[0.9]) - np.array(f.quantiles[0.1])
    assert width[-1] > 3 * width[0]  # sqrt(30) ~ 5.5


def test_seasonal_naive_copies_the_last_season() -> None:
    y = truth(0, 3 * DAY)
    f = SeasonalNaive(period_s=86_400).fit(y, start=0.0, step_s=STEP_S).predict(DAY + 5)
    np.testing.assert_allclose(f.values(0.5), truth(3 * DAY, DAY + 5), atol=1e-6)
    # No noise: the in-sample seasonal errors are 0, so is the interval.
    np.testing.assert_allclose(f.quantiles[0.9], f.quantiles[0.1], atol=1e-6)


def test_seasonal_naive_falls_back_to_naive_on_short_history() -> None:
    model = SeasonalNaive(period_s=86_400).fit(np.arange(50.0), step_s=STEP_S)
    assert model.fallback_ and model.period_steps_ == 1
    assert "naive" in model.predict(2).model
    assert model.predict(2).values(0.5)[0] == pytest.approx(50.0, abs=1.5)


def test_holt_winters_uses_a_detected_daily_season() -> None:
    y = daily_series(days=5.0, noise=3.0)
    model = HoltWinters().fit(y, start=0.0, step_s=STEP_S)
    assert model.seasonal_periods_ == DAY
    median = np.array(model.predict(DAY // 2).values(0.5))
    assert np.mean(np.abs(median - truth(y.size, DAY // 2))) < 8.0


def test_holt_winters_skips_the_season_on_noise() -> None:
    y = 100 + np.random.default_rng(1).normal(0, 10, 5 * DAY)
    assert HoltWinters().fit(y, step_s=STEP_S).seasonal_periods_ == 0
    assert HoltWinters(require_detected_season=False).fit(y, step_s=STEP_S).seasonal_periods_ == DAY


def test_holt_winters_resampling_forecasts_in_blocks() -> None:
    model = HoltWinters(resample_s=3 * STEP_S).fit(daily_series(days=5.0), step_s=STEP_S)
    assert model.factor_ == 3
    median = model.predict(6).values(0.5)
    assert median[0] == median[1] == median[2]


def test_fourier_arima_learns_the_daily_shape() -> None:
    y = daily_series(days=5.0, noise=3.0)
    model = FourierARIMA(order=(1, 0, 0)).fit(y, start=0.0, step_s=STEP_S)
    assert model.periods_used_ == (86_400.0,)
    median = np.array(model.predict(DAY // 2).values(0.5))
    assert np.mean(np.abs(median - truth(y.size, DAY // 2))) < 8.0


def test_fourier_terms_use_absolute_time() -> None:
    x = fourier_terms(np.array([0.0, 21_600.0, 86_400.0]), [86_400.0], 1)
    np.testing.assert_allclose(x, [[0, 1], [1, 0], [0, 1]], atol=1e-12)


def test_quantile_gbm_learns_the_daily_shape_and_is_calibrated() -> None:
    y = daily_series(days=6.0, noise=3.0)
    model = QuantileGBM(max_horizon_steps=6).fit(y[:-DAY], start=START, step_s=STEP_S)
    assert model.seasonal_steps_ == (DAY,)
    assert len(model.models_) == 3
    covered, errors = [], []
    for origin in range(y.size - DAY, y.size - 6, 6):
        f = model.update(y[:origin], start=START).predict(6)
        actual = y[origin : origin + 6]
        errors.extend(np.abs(np.array(f.values(0.5)) - actual))
        covered.extend((np.array(f.quantiles[0.1]) <= actual) & (actual <= np.array(f.quantiles[0.9])))
    assert np.mean(errors) < 6.0  # noise sigma 3 -> MAE of a perfect median ~2.4
    assert 0.6 <= np.mean(covered) <= 0.98


def test_quantile_gbm_rejects_too_little_data() -> None:
    with pytest.raises(ValueError, match="more data"):
        QuantileGBM().fit(np.arange(20.0), step_s=STEP_S)


def test_quantile_gbm_leads_beyond_training_reuse_the_longest() -> None:
    model = QuantileGBM(max_horizon_steps=3, max_iter=20).fit(daily_series(days=3.0), step_s=STEP_S)
    assert len(model.predict(10)) == 10
