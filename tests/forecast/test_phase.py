"""PhaseNaive: a naive forecast whose intervals are wide only at the phase where the series jumps."""

from __future__ import annotations

import numpy as np
import pytest

from forecast.baselines import LastValue
from forecast.phase import PhaseNaive, detect_change_period

STEP = 60.0
WINDOW = 600.0  # the series below changes level every 10 minutes, as ServeGen's per-window rates do
LEVELS = (0.1, 0.5, 0.9, 0.99)


def windowed_series(windows: int = 1500, seed: int = 3, offset_steps: int = 0) -> np.ndarray:
    """Per-minute demand: a level drawn per 10-minute window (a mean-reverting log-normal walk), plus 1 % noise."""
    rng = np.random.default_rng(seed)
    log_level = np.zeros(windows)
    for k in range(1, windows):
        log_level[k] = 0.8 * log_level[k - 1] + rng.normal(0.0, 0.12)
    level = np.exp(log_level) * 100.0
    per_minute = np.repeat(level, int(WINDOW / STEP))
    y = per_minute * (1.0 + rng.normal(0.0, 0.01, per_minute.size))
    return y[offset_steps:]


def test_detects_the_window_of_a_series_that_jumps_at_window_edges() -> None:
    assert detect_change_period(windowed_series(), STEP) == WINDOW


@pytest.mark.parametrize(
    "series",
    [
        np.random.default_rng(0).poisson(50, 20_000).astype(float),  # arrival noise only
        100.0 + 40.0 * np.sin(2 * np.pi * np.arange(20_000) * STEP / 86_400.0),  # a smooth daily cycle
        np.full(5_000, 7.0),  # constant: no change at all
    ],
    ids=["poisson", "daily-sine", "constant"],
)
def test_finds_no_period_where_there_are_no_edges(series: np.ndarray) -> None:
    assert detect_change_period(series, STEP) is None


def test_too_short_a_history_has_no_period() -> None:
    # 20 cycles of a candidate period are needed before its phase effect is believed: 8 windows of 10 minutes are
    # not 20 cycles of even the shortest candidate (5 minutes).
    assert detect_change_period(windowed_series(windows=8), STEP) is None


def _fit_at(y: np.ndarray, end: int) -> PhaseNaive:
    return PhaseNaive(quantiles=LEVELS).fit(y[:end], start=0.0, step_s=STEP)


def test_interval_is_wide_across_an_edge_and_narrow_inside_a_window() -> None:
    y = windowed_series()
    # History ends 2 minutes before an edge (index 10_000 is an edge): the 3rd step ahead is in the next window.
    model = _fit_at(y, 9_998)
    assert model.period_bins_ == 10
    forecast = model.predict(4)
    upper = np.array(forecast.quantiles[0.99]) / y[9_997]
    inside, across = upper[1], upper[2]  # lead 2: same window; lead 3: the next one
    assert inside < 1.06
    assert across > inside + 0.08
    # The plain naive forecast cannot tell them apart: the same wide spread at every lead.
    naive = LastValue(quantiles=LEVELS).fit(y[:9_998], start=0.0, step_s=STEP).predict(4)
    naive_upper = np.array(naive.quantiles[0.99]) / y[9_997]
    assert naive_upper[1] > inside + 0.05


def test_upper_quantile_is_calibrated_at_every_phase() -> None:
    y = windowed_series(windows=2000)
    model = PhaseNaive(quantiles=LEVELS, residual_half_life_s=None).fit(y[:12_000], start=0.0, step_s=STEP)
    hits = {"inside": [], "across": []}
    for origin in range(12_000, 19_900, 7):  # walk the held-out part, re-conditioning as the simulator does
        model.update(y[:origin], start=0.0)
        p90 = model.predict(3).quantiles[0.9][2]  # 3 steps ahead
        crosses = (origin - 1) // 10 != (origin + 2) // 10
        hits["across" if crosses else "inside"].append(y[origin + 2] <= p90)
    for where, seen in hits.items():
        assert 0.84 <= np.mean(seen) <= 0.96, (where, np.mean(seen), len(seen))


def test_update_moves_the_origin_and_keeps_the_fitted_period() -> None:
    y = windowed_series()
    model = _fit_at(y, 9_000)
    model.update(y[:9_005], start=0.0)
    assert model.predict(1).quantiles[0.5][0] == pytest.approx(y[9_004], rel=1e-3)
    assert model.period_bins_ == 10
    # Even on a history without edges, the period stays the fitted one until the next fit.
    flat = np.full(9_005, 50.0)
    model.update(flat, start=0.0)
    assert model.period_bins_ == 10
    assert model.predict(3).quantiles[0.99] == pytest.approx([50.0] * 3)


def test_phase_follows_the_clock_not_the_array_index() -> None:
    y = windowed_series()
    # The same demand with its first 3 minutes cut off, time-stamped correctly, forecasts the same.
    shifted = windowed_series(offset_steps=3)
    a = _fit_at(y, 9_998).predict(4)
    b = PhaseNaive(quantiles=LEVELS).fit(shifted[: 9_998 - 3], start=3 * STEP, step_s=STEP).predict(4)
    assert np.allclose(a.quantiles[0.99], b.quantiles[0.99], rtol=0.02)


def test_without_edges_it_is_the_naive_forecast() -> None:
    y = 100.0 + np.random.default_rng(1).normal(0.0, 3.0, 5_000)
    model = PhaseNaive(quantiles=LEVELS).fit(y, start=0.0, step_s=STEP)
    assert model.period_bins_ == 1
    assert model.label() == "PhaseNaive" == PhaseNaive().label()  # backtests label a model before fitting it
    assert model.predict(3).quantiles[0.5] == pytest.approx([y[-1]] * 3, rel=0.01)


def test_without_edges_its_intervals_are_the_naive_forecasts() -> None:
    # Bursty counts, no window edges: the same spreads as LastValue learns (differences, not ratios).
    y = np.random.default_rng(2).poisson(np.repeat([5.0, 40.0, 12.0, 60.0], 600)).astype(float)
    shared = {"quantiles": LEVELS, "residual_window": 2016, "residual_half_life_s": 86_400.0}
    phase = PhaseNaive(**shared).fit(y, start=0.0, step_s=STEP)
    naive = LastValue(**shared).fit(y, start=0.0, step_s=STEP)
    assert phase.period_bins_ == 1
    for level in LEVELS:
        assert phase.predict(5).quantiles[level] == pytest.approx(naive.predict(5).quantiles[level])


@pytest.mark.parametrize(
    ("params", "message"),
    [({"period_s": 90.0}, "period_s"), ({"period_s": -600.0}, "period_s"), ({"residual_window": 1}, "residual_window")],
)
def test_bad_parameters_are_named(params: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PhaseNaive(**params).fit(windowed_series(windows=100), start=0.0, step_s=STEP)
