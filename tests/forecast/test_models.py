"""Behaviour of each model beyond the shared contract: do they actually forecast what they claim to?"""

from __future__ import annotations

import numpy as np
import pytest

from forecast.backtest import rolling_origin_backtest
from forecast.baselines import LastValue, SeasonalNaive
from forecast.gbm import QuantileGBM
from forecast.smoothing import CountLevel, count_quantiles
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


# -- CountLevel: request rates from Poisson / over-dispersed counts in 10 s bins -------------------------------------
BIN_S = 10.0


def poisson_rates(level: np.ndarray, seed: int = 0, dispersion: float = 1.0) -> np.ndarray:
    """Rates (req/s) of counts per ``BIN_S`` bin around ``level``: Poisson, or negative binomial with var/mean."""
    rng = np.random.default_rng(seed)
    mean = level * BIN_S
    if dispersion == 1.0:
        counts = rng.poisson(mean)
    else:
        p = 1.0 / dispersion
        counts = rng.negative_binomial(mean * p / (1.0 - p), p)
    return counts / BIN_S


def test_count_level_recovers_a_constant_level_and_poisson_dispersion() -> None:
    y = poisson_rates(np.full(600, 5.0), seed=1)
    model = CountLevel(max_horizon_steps=30).fit(y, step_s=BIN_S)
    # A flat level: cross-validation picks heavy smoothing, which averages the Poisson noise away.
    assert model.alpha_ <= 0.1
    assert model.level_ == pytest.approx(5.0, abs=0.25)  # the last value alone is off by ~0.7 req/s half the time
    assert 0.7 <= model.dispersion_ <= 1.4  # Poisson: variance = mean (plus the level's small error)
    median = np.array(model.predict(30).values(0.5))
    assert np.all(np.abs(median - 5.0) < 0.35)


def test_count_level_estimates_overdispersion() -> None:
    y = poisson_rates(np.full(1000, 5.0), seed=2, dispersion=3.0)
    model = CountLevel(max_horizon_steps=10).fit(y, step_s=BIN_S)
    assert 2.3 <= model.dispersion_ <= 4.0
    f = model.predict(1)
    # P10-P90 of NB(mean 50, var 150) counts is about 50 +- 16, i.e. +-1.6 req/s.
    assert f.quantiles[0.9][0] - f.quantiles[0.1][0] == pytest.approx(3.1, abs=0.6)


def test_count_level_quantiles_are_monotone_and_widen_with_the_lead() -> None:
    level = 5.0 + np.cumsum(np.random.default_rng(3).normal(0.0, 0.1, 500))
    model = CountLevel(max_horizon_steps=30).fit(poisson_rates(np.maximum(level, 0.5), seed=3), step_s=BIN_S)
    f = model.predict(30)
    lo, mid, hi = (np.array(f.quantiles[q]) for q in (0.1, 0.5, 0.9))
    assert np.all(lo <= mid) and np.all(mid <= hi) and np.all(lo < hi)
    assert (hi - lo)[-1] > (hi - lo)[0]  # the level itself may move over 30 steps


def test_count_level_follows_a_step_in_demand() -> None:
    y = poisson_rates(np.r_[np.full(300, 2.0), np.full(300, 8.0)], seed=4)
    model = CountLevel(max_horizon_steps=6).fit(y, step_s=BIN_S)
    assert model.alpha_ >= 0.1  # a series that jumps needs a level that can follow it
    # Within ~3 noise sigmas of the smoothed level (0.4 req/s at alpha 0.3), far from the old 2 req/s.
    assert np.array(model.predict(6).values(0.5)) == pytest.approx(np.full(6, 8.0), abs=1.2)


@pytest.mark.parametrize("dispersion", [1.0, 2.0])
def test_count_level_p90_coverage_on_simulated_counts_is_near_90_percent(dispersion: float) -> None:
    # The model's own assumption: a level that wanders (random walk) under Poisson / over-dispersed count noise,
    # scored like the benchmark (rolling origins, 30 steps ahead), pooled over four series.
    upper, inside, ratios = [], [], []
    for seed in range(5, 9):
        walk = 20.0 + np.cumsum(np.random.default_rng(100 + seed).normal(0.0, 0.15, 720))
        y = poisson_rates(np.maximum(walk, 2.0), seed=seed, dispersion=dispersion)
        quality, naive = (
            rolling_origin_backtest(
                model, y, step_s=BIN_S, horizon_steps=30, origin_every=5, min_train_steps=120
            ).quality
            for model in (CountLevel(max_horizon_steps=30), LastValue())
        )
        upper.append(quality.upper_coverage)
        inside.append(quality.interval_coverage)
        ratios.append(quality.mean_pinball / naive.mean_pinball)
    assert 0.86 <= np.mean(upper) <= 0.94, upper
    assert 0.74 <= np.mean(inside) <= 0.86, inside
    assert max(ratios) < 0.85, ratios  # averaging the count noise out beats the last value


def test_count_level_fixed_alpha_and_update_keep_the_smoothing() -> None:
    y = poisson_rates(np.full(300, 5.0), seed=6)
    model = CountLevel(alphas=(0.3,)).fit(y[:200], step_s=BIN_S)
    assert model.alpha_ == 0.3
    model.update(y, step_s=BIN_S)
    assert model.alpha_ == 0.3 and model.forecast_start_ == 300 * BIN_S


def test_count_quantiles_fall_back_to_normal_below_the_poisson_variance() -> None:
    # Variance below the Poisson floor (not counts, or counted over a longer interval): normal quantiles.
    q = count_quantiles(10.0, np.array([0.01]), 10.0, (0.1, 0.5, 0.9))
    assert q[:, 0] == pytest.approx([10.0 - 1.2816 * 0.1, 10.0, 10.0 + 1.2816 * 0.1], abs=1e-3)
    # Above it: negative binomial counts, on the count grid (multiples of 1 / interval).
    q = count_quantiles(10.0, np.array([2.0]), 10.0, (0.1, 0.5, 0.9))
    assert np.allclose(q * 10.0, np.round(q * 10.0))
    assert q[0, 0] < 10.0 < q[2, 0]


@pytest.mark.parametrize("params", [{"alphas": ()}, {"alphas": (0.0,)}, {"max_horizon_steps": 0}, {"burn_in": -1}])
def test_count_level_rejects_bad_parameters(params: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        CountLevel(**params).fit(np.ones(50), step_s=BIN_S)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least"):
        CountLevel().fit(np.ones(5), step_s=BIN_S)
