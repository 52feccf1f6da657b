from __future__ import annotations

import numpy as np
import pytest

from forecast.baselines import LastValue, SeasonalNaive
from forecast.gbm import QuantileGBM
from forecast.selection import pinball_ratio, select_model
from forecast.statistical import HoltWinters
from tests.forecast.conftest import START, STEP_S, daily_series

KW = {"step_s": STEP_S, "start": START, "horizon_steps": 6, "n_origins": 12, "origin_every": 6}


def test_a_seasonal_model_beats_the_seasonal_naive_on_a_noisy_cycle() -> None:
    y = daily_series(days=6.0, noise=10.0)
    candidates = {"snaive": SeasonalNaive(), "last": LastValue(), "hw": HoltWinters()}
    selection = select_model(y, candidates, baseline="snaive", **KW)
    # Copying yesterday doubles the noise; smoothing models do not.
    assert selection.best == "hw"
    assert selection.ratios["snaive"] == 1.0
    assert selection.ratios["hw"] < 0.9
    assert selection.reliable, selection.reason
    assert not hasattr(selection.estimator, "forecast_start_")  # handed back unfitted, ready for the refit job
    assert selection.table()[0]["model"] == "hw"


def test_the_baseline_wins_when_nothing_beats_it_by_the_margin() -> None:
    # A square wave: yesterday is right but for the noise, the last value is wrong at every switch.
    y = np.tile(np.r_[np.zeros(72), np.full(72, 100.0)], 5) + np.random.default_rng(0).normal(0, 1, 720)
    selection = select_model(y, {"snaive": SeasonalNaive(), "last": LastValue()}, baseline="snaive", **KW)
    assert selection.best == "snaive"
    assert selection.ratios["last"] > 1.0


def test_a_failing_candidate_is_reported_not_fatal() -> None:
    y = daily_series(days=2.2)
    selection = select_model(
        y,
        {"snaive": SeasonalNaive(), "gbm": QuantileGBM(min_samples_leaf=10_000)},
        baseline="snaive",
        **{**KW, "n_origins": 3},
    )
    assert "gbm" in selection.errors
    assert selection.best == "snaive"


def test_baseline_must_be_a_candidate() -> None:
    with pytest.raises(ValueError):
        select_model(daily_series(), {"last": LastValue()}, baseline="snaive", **KW)


def test_unreliable_when_too_few_scored_values() -> None:
    selection = select_model(
        daily_series(days=3.0),
        {"snaive": SeasonalNaive(), "last": LastValue()},
        baseline="snaive",
        **{**KW, "n_origins": 2},
        min_samples=100,
    )
    assert not selection.reliable
    assert "only 12" in selection.reason


def test_pinball_ratio_is_nan_for_a_perfect_baseline() -> None:
    y = np.tile(np.r_[np.zeros(72), np.full(72, 100.0)], 5)
    selection = select_model(y, {"snaive": SeasonalNaive(residual_half_life_s=None)}, baseline="snaive", **KW)
    quality = selection.results["snaive"].quality
    assert quality.mean_pinball == 0.0
    assert np.isnan(pinball_ratio(quality, quality))
