from __future__ import annotations

import numpy as np
import pytest

from forecast.base import coarsen, expand, resample_factor, weighted_quantile
from forecast.preprocessing import (
    DAY_S,
    WEEK_S,
    as_series,
    clip_outliers,
    detect_periods,
    dominant_periods,
    fill_gaps,
    fill_missing,
    seasonal_strength,
)
from tests.forecast.conftest import daily_series


def test_fill_gaps_interpolates_inside_and_holds_the_ends() -> None:
    y = np.array([np.nan, 1.0, np.nan, np.nan, 4.0, np.inf, np.nan])
    kept = y.copy()
    np.testing.assert_allclose(fill_gaps(y), [1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 4.0])
    np.testing.assert_array_equal(y, kept)  # input untouched


def test_fill_gaps_without_any_value_raises() -> None:
    with pytest.raises(ValueError):
        fill_gaps([np.nan, np.nan])
    with pytest.raises(ValueError):
        fill_gaps([])
    with pytest.raises(ValueError):
        fill_gaps([[1.0, 2.0]])


def test_clip_outliers_removes_a_spike_but_keeps_the_daily_peak() -> None:
    y = daily_series(days=3.0, noise=2.0)
    spiked = y.copy()
    spiked[200] = 5_000.0
    clipped = clip_outliers(spiked, k=6.0)
    assert clipped[200] < 200.0
    peak = int(np.argmax(y))
    assert clipped[peak] == pytest.approx(y[peak])  # real peaks are followed by the rolling median
    assert spiked[200] == 5_000.0
    # Everything away from the spike is unchanged; a spike in the newest samples is kept (could be a real surge).
    late = spiked.copy()
    late[-2] = 5_000.0
    assert clip_outliers(late)[-2] == 5_000.0
    mask = np.ones(y.size, bool)
    mask[200] = False
    np.testing.assert_allclose(clipped[mask], y[mask], atol=0.5)


def test_clip_outliers_leaves_flat_data_and_nan_alone() -> None:
    flat = np.array([3.0] * 20 + [np.nan])
    out = clip_outliers(flat)
    np.testing.assert_array_equal(out[:-1], flat[:-1])
    assert np.isnan(out[-1])
    with pytest.raises(ValueError):
        clip_outliers(flat, k=0)


@pytest.mark.parametrize("step_s", [60.0, 300.0, 600.0])
def test_detect_daily_period(step_s: float) -> None:
    y = daily_series(days=14.0, step_s=step_s, noise=15.0)
    assert detect_periods(y, step_s) == (DAY_S,)
    assert seasonal_strength(y, step_s, DAY_S) > 0.7


@pytest.mark.parametrize("step_s", [300.0, 600.0])
def test_detect_weekly_period_when_weekends_are_quiet(step_s: float) -> None:
    y = daily_series(days=14.0, step_s=step_s, noise=15.0)
    weekday = (np.arange(y.size) * step_s // DAY_S) % 7
    y = y * np.where(weekday >= 5, 0.6, 1.0)
    assert set(detect_periods(y, step_s)) == {DAY_S, WEEK_S}


def test_no_period_in_noise_a_trend_or_a_short_series() -> None:
    rng = np.random.default_rng(3)
    assert detect_periods(rng.normal(size=4032), 300.0) == ()
    assert detect_periods(np.arange(4032.0) + rng.normal(size=4032), 300.0) == ()
    assert detect_periods(daily_series(days=1.5), 600.0) == ()  # not two full days


def test_dominant_periods_finds_the_day() -> None:
    periods = dominant_periods(daily_series(days=7.0, noise=1.0), 600.0, top=1)
    assert periods == pytest.approx((DAY_S,), rel=0.01)


def test_resampling_aligns_to_the_end() -> None:
    y = np.arange(10.0)
    coarse, drop = coarsen(y, 3)
    assert drop == 1
    np.testing.assert_allclose(coarse, [2.0, 5.0, 8.0])
    np.testing.assert_allclose(expand(coarse, 3, 7), [2, 2, 2, 5, 5, 5, 8])


def test_resample_factor_keeps_a_day_whole() -> None:
    assert resample_factor(60.0, None) == 1
    assert resample_factor(60.0, 900.0) == 15
    # 20,160 one-minute samples into at most 1,500: 14 is needed, 15 divides 1,440.
    assert resample_factor(60.0, None, 20_160, 1_500) == 15
    assert resample_factor(600.0, None, 2_016, 4_032) == 1


def test_weighted_quantile_follows_the_weights() -> None:
    values = np.array([0.0, 10.0])
    assert weighted_quantile(values, np.array([1.0, 1.0]), [0.5])[0] == pytest.approx(5.0)
    assert weighted_quantile(values, np.array([1.0, 99.0]), [0.5])[0] > 9.0


def test_fill_missing_fills_in_place_as_fill_gaps_does() -> None:
    raw = np.array([np.nan, 2.0, np.inf, 4.0, np.nan, -np.inf])
    arr = as_series(raw)
    filled = fill_missing(arr)
    assert filled is arr  # in place: the caller's fresh copy, no second one
    np.testing.assert_array_equal(filled, fill_gaps(raw))
    np.testing.assert_array_equal(filled, [2.0, 2.0, 3.0, 4.0, 4.0, 4.0])
    with pytest.raises(ValueError, match="no finite value"):
        fill_missing(as_series([np.nan, np.inf]))
