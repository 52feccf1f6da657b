"""``PhaseNaive``'s mean reversion (``reversion_periods``): the change at each phase and lead is regressed on the
origin's deviation from the mean level of the last few periods, and the quantiles are learnt less that part."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from sklearn.base import clone

from forecast.base import OrderHints, carry_order_hints, recency_weights, residual_offsets, weighted_quantile
from forecast.phase import PhaseNaive

STEP = 60.0
DAY0 = 20_833 * 86_400.0
PERIOD = 10  # steps: 10-minute windows of one-minute samples
LEVELS = (0.1, 0.5, 0.9, 0.99)
REVERSION = 6  # periods; the default since stop 52 (see forecast.phase's docstring), off with None


def test_reversion_is_on_by_default_and_off_with_none() -> None:
    """On by default (6 periods, stop 52); ``reversion_periods=None`` (``modelParams: {reversion_periods: null}``)
    turns it off: no slope is fitted."""
    assert PhaseNaive().reversion_periods == REVERSION
    y = _windows(3 * 1440, 0.3)
    default = PhaseNaive(quantiles=LEVELS, period_s=600.0).fit(y, start=DAY0, step_s=STEP)
    off = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=None).fit(y, start=DAY0, step_s=STEP)
    assert _edge_slope(default) < -0.4
    assert default.predict(15).quantiles[0.99] != off.predict(15).quantiles[0.99]


def _windows(n: int, persistence: float, seed: int = 0) -> np.ndarray:
    """Demand constant within 10-minute windows whose log level is an AR(1) around log 20: ``persistence`` 1 is a
    random walk (nothing to revert to), 0 independent windows (full reversion)."""
    rng = np.random.default_rng(seed)
    windows = n // PERIOD + 1
    log_level = np.empty(windows)
    log_level[0] = 0.0
    for k in range(1, windows):
        log_level[k] = persistence * log_level[k - 1] + rng.normal(0.0, 0.25)
    level = 20.0 * np.exp(np.repeat(log_level, PERIOD)[:n])
    return np.asarray(level * (1.0 + rng.normal(0.0, 0.01, n)))


def _edge_slope(model: PhaseNaive) -> float:
    """The fitted slope of the change across the next window edge, from an origin at the last step of a window."""
    phase = (model.hint_first_index_ + PERIOD - 1) % PERIOD  # the true phase of a window's last minute
    return model._slope(phase, 1)


def test_windows_that_revert_to_their_mean_get_a_negative_slope_at_the_edge_and_a_random_walk_none() -> None:
    n = 3 * 1440
    reverting = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=REVERSION).fit(
        _windows(n, 0.3), start=DAY0, step_s=STEP
    )
    walk = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=REVERSION).fit(
        _windows(n, 1.0), start=DAY0, step_s=STEP
    )
    assert _edge_slope(reverting) < -0.4
    assert _edge_slope(walk) > -0.15
    # inside a window (origin at its first minute, one step ahead) the demand does not change: no slope to speak of
    inside = (reverting.hint_first_index_) % PERIOD
    assert reverting._slope(inside, 1) > -0.05


def test_after_a_rise_above_the_recent_mean_the_band_before_the_edge_is_lower() -> None:
    """The same history but the last window: high above the recent mean, the forecast across the edge expects a
    fall (median below the last value) and its P99 is lower than without reversion; far below it, higher."""
    n = 3 * 1440  # ends at a window's last minute: the next step crosses an edge
    y = _windows(n, 0.3)
    for factor, lower in ((2.5, True), (0.4, False)):
        changed = y.copy()
        changed[-PERIOD:] *= factor  # the last window, far from the recent mean
        with_reversion = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=REVERSION).fit(
            changed, start=DAY0, step_s=STEP
        )
        without = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=None).fit(
            changed, start=DAY0, step_s=STEP
        )
        reverted, plain = with_reversion.predict(1), without.predict(1)
        if lower:
            assert reverted.quantiles[0.5][0] < changed[-1]
            assert reverted.quantiles[0.99][0] < plain.quantiles[0.99][0]
        else:
            assert reverted.quantiles[0.5][0] > changed[-1]
            assert reverted.quantiles[0.99][0] > plain.quantiles[0.99][0]


def _pinball(actual: np.ndarray, predicted: np.ndarray, level: float) -> float:
    diff = actual - predicted
    return float(np.mean(np.maximum(level * diff, (level - 1.0) * diff)))


def test_on_reverting_windows_the_forecast_across_the_edge_scores_better_than_without() -> None:
    """Rolling origins at the last minute of each window of the fourth day (fitted on the three before): the P99 and
    the median one step ahead, scored by pinball loss, beat the same model without reversion."""
    y = _windows(4 * 1440, 0.3, seed=3)
    history = 3 * 1440
    origins = [end for end in range(history, y.size - 1) if end % PERIOD == 0][:100]  # y[end - 1]: a last minute
    scores: dict[str | None, dict[float, list[float]]] = {}
    for periods in (6, None):
        model = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=periods)
        model.fit(y[:history], start=DAY0, step_s=STEP)
        predicted: dict[float, list[float]] = {0.5: [], 0.99: []}
        for end in origins:
            model.update(y[end - history : end], start=DAY0 + (end - history) * STEP)
            forecast = model.predict(1)
            for level in predicted:
                predicted[level].append(forecast.quantiles[level][0])
        scores[str(periods)] = predicted
    actual = y[np.asarray(origins)]
    for level in (0.5, 0.99):
        reverted = _pinball(actual, np.asarray(scores["6"][level]), level)
        plain = _pinball(actual, np.asarray(scores["None"][level]), level)
        assert reverted < 0.9 * plain, (level, reverted, plain)


def _scratch(model: PhaseNaive, horizon: int) -> dict[float, tuple[float, ...]]:
    """The model's forecast learnt from scratch with its fitted slopes: no kept residual sets, no cached spreads."""
    fresh = copy.deepcopy(model)
    fresh.order_hints_.invalidate()
    fresh.offsets_cache_ = {}
    return dict(fresh.predict(horizon).quantiles)


@pytest.mark.parametrize("gaps", [False, True], ids=["windows", "gap-windows"])
def test_minute_updates_with_kept_sets_equal_learning_from_scratch_with_the_fitted_slopes(gaps: bool) -> None:
    """The residuals less slope x deviation are kept sorted across updates (``OrderHints``), as the plain ones are:
    the forecasts equal those learnt from scratch with the same slopes, update after update, and the kept sets are
    slid (not relearnt); after a refit handed the hints, the sets of the old slopes are rebuilt, not slid."""
    y = _windows(2 * 1440 + 400, 0.3, seed=5)
    if gaps:
        y[(np.arange(y.size) % 240) < 60] = 0.0  # an hour idle in every four: many equal residuals
    window = 1440
    model = PhaseNaive(quantiles=LEVELS, residual_window=window, period_s=600.0, reversion_periods=REVERSION)
    model.fit(y[:window], start=DAY0, step_s=STEP)
    reused_before = model.order_hints_.reused
    for k in range(1, 400):
        series = y[k : window + k]
        if k % 120 == 0:  # an hourly refit handed the old model's hints, as the simulator's and the controller's
            fresh = clone(model)
            carry_order_hints(model, fresh)
            model = fresh.fit(series, start=DAY0 + k * STEP, step_s=STEP)
        else:
            model.update(series, start=DAY0 + k * STEP)
        forecast = dict(model.predict(12).quantiles)
        expected = _scratch(model, 12)
        for level in LEVELS:
            np.testing.assert_allclose(forecast[level], expected[level], rtol=1e-9, atol=1e-9, err_msg=f"k={k}")
    assert any(model._reverted(phase, lead) for phase in range(PERIOD) for lead in range(1, 13))
    assert model.order_hints_.reused - reused_before > 1000


def test_without_a_period_or_in_differences_reversion_changes_nothing() -> None:
    rng = np.random.default_rng(7)
    smooth = 20.0 + rng.normal(0.0, 1.0, 2 * 1440)  # no window edges: no period detected
    windows = _windows(2 * 1440, 0.3)
    cases = [
        ({}, smooth),
        ({"period_s": 600.0, "multiplicative": False}, windows),
    ]
    for params, y in cases:
        reverted = (
            PhaseNaive(quantiles=LEVELS, reversion_periods=REVERSION, **params)
            .fit(y, start=DAY0, step_s=STEP)
            .predict(15)
        )
        plain = PhaseNaive(quantiles=LEVELS, reversion_periods=None, **params).fit(y, start=DAY0, step_s=STEP)
        for level in LEVELS:
            assert reverted.quantiles[level] == plain.predict(15).quantiles[level]


def test_a_short_history_has_no_slope_and_forecasts_as_without_reversion() -> None:
    """Fewer than 30 origins per phase with a deviation (5 hours of 10-minute windows after the first hour): the
    plain spreads."""
    y = _windows(5 * 60, 0.3)
    reverted = (
        PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=REVERSION)
        .fit(y, start=DAY0, step_s=STEP)
        .predict(15)
    )
    plain = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=None).fit(y, start=DAY0, step_s=STEP)
    for level in LEVELS:
        assert reverted.quantiles[level] == plain.predict(15).quantiles[level]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "6"])
def test_a_bad_reversion_period_count_is_refused_naming_the_parameter(bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match="reversion_periods"):
        PhaseNaive(period_s=600.0, reversion_periods=bad).fit(_windows(1440, 0.3), start=DAY0, step_s=STEP)  # type: ignore[arg-type]


def test_returning_from_an_idle_gap_is_not_taken_for_reversion() -> None:
    """A service idle for an hour in every four, with window levels that do not revert (a random walk): the return
    from each gap is a huge rise above a trailing mean full of zeros, and each gap's start a huge fall. Neither is a
    level reverting to its mean: deviations whose span holds an idle sample are unknown, changes ending idle are
    left out of the slope, and there is nothing else to learn here."""
    y = _windows(3 * 1440, 1.0, seed=11)
    y[(np.arange(y.size) % 240) < 60] = 0.0
    model = PhaseNaive(quantiles=LEVELS, period_s=600.0, reversion_periods=REVERSION).fit(y, start=DAY0, step_s=STEP)
    assert np.isnan(model.deviation_[y.size - 240 + 60 + 30])  # half an hour after a gap: the span holds idle minutes
    assert _edge_slope(model) > -0.15


def test_a_kept_set_passed_residuals_that_differ_in_the_last_bits_rebuilds_instead_of_dropping_the_wrong_one() -> None:
    """``SlidingQuantiles.slide`` drops its oldest residuals by value. Residuals recomputed each update that differ in
    the last bits from the kept ones (a mean summed from another start: what the first version of the reversion did)
    crashed it with an IndexError, or silently dropped a neighbour; now the set is rebuilt from what was passed."""
    rng = np.random.default_rng(2)
    residuals = rng.normal(0.0, 1.0, 500)
    hints = OrderHints()
    levels = (0.1, 0.5, 0.99)
    residual_offsets(residuals, levels, 600.0, 86_400.0, hints.at(("k",), 0, 1))
    for step in range(1, 40):
        # the same residuals one step on, the kept ones off in the last bits, and one new one
        moved = np.concatenate((residuals[step:] * (1.0 + 1e-15), rng.normal(0.0, 1.0, step)))
        got = residual_offsets(moved, levels, 600.0, 86_400.0, hints.at(("k",), step, 1))
        weights = recency_weights(moved.size, 600.0, 86_400.0)
        assert weights is not None
        np.testing.assert_allclose(got, weighted_quantile(moved, weights, levels), rtol=1e-9, atol=1e-12)
