"""Incremental updates (issue 14, simulator speed) give the same forecasts as learning from scratch.

``LastValue``, ``SeasonalNaive`` and ``PhaseNaive`` keep each residual set sorted with its weights across updates
that only append to the history (``forecast.base.OrderHints``, ``SlidingQuantiles``), and ``PhaseNaive`` learns the
spreads of the leads that share their origins together (``residual_offset_rows``). The references below are the
algorithms as they were before: the spreads learnt from scratch at every predict, one lead at a time, with a full
``np.argsort`` and a cumulative sum of the weights. The kept sets carry the weights' sums instead of recomputing
them, so "the same" is up to float rounding: ``_close`` allows 1e-9 relative (measured: about 1e-12).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.base import clone

from forecast.base import (
    BaseForecaster,
    OrderHints,
    SlidingQuantiles,
    carry_order_hints,
    recency_weights,
    residual_offset_rows,
    residual_offsets,
    weighted_quantile,
)
from forecast.baselines import LastValue, SeasonalNaive
from forecast.phase import PhaseNaive
from forecast.types import Forecast

STEP = 60.0
LEVELS = (0.1, 0.5, 0.9, 0.99)
HORIZON = 10


# -- the algorithms before issue 14, from scratch -----------------------------------------------------------------
def _package(model: BaseForecaster, values: np.ndarray) -> dict[float, tuple[float, ...]]:
    """What ``BaseForecaster.predict`` makes of ``_predict``'s array."""
    values = np.where(np.isfinite(values), values, np.nan)
    values = np.where(np.isnan(values), model.last_value_, values)
    if model.nonnegative:
        values = np.maximum(values, 0.0)
    values = np.sort(values, axis=0)
    return {level: tuple(values[i].tolist()) for i, level in enumerate(model.levels_)}


def _reference_last_value(model: LastValue, horizon: int) -> dict[float, tuple[float, ...]]:
    hist = model.history_
    offsets = np.zeros((len(model.levels_), horizon))
    for h in range(1, horizon + 1):
        lag = min(h, hist.size - 1)
        if lag >= 1:
            offsets[:, h - 1] = residual_offsets(
                hist[lag:] - hist[:-lag], model.levels_, model.step_s_, model.residual_half_life_s
            )
    return _package(model, hist[-1] + offsets)


def _reference_seasonal(model: SeasonalNaive, horizon: int) -> dict[float, tuple[float, ...]]:
    y, period = model.history_, model.period_steps_
    n = y.size
    out = np.empty((len(model.levels_), horizon))
    steps = np.arange(1, horizon + 1)
    cycles = -(-steps // period)
    point = y[n - 1 + steps - cycles * period]
    for k in np.unique(cycles):
        lag = min(int(k) * period, n - 1)
        offsets = residual_offsets(y[lag:] - y[:-lag], model.levels_, model.step_s_, model.residual_half_life_s)
        mask = cycles == k
        out[:, mask] = point[mask][None, :] + offsets[:, None]
    return _package(model, out)


def _reference_phase(model: PhaseNaive, horizon: int) -> dict[float, tuple[float, ...]]:
    series, period = model.learn_series_, model.period_bins_
    origin_phase = model.origin_index_ % period
    columns = []
    for lead in range(1, horizon + 1):
        lag = min(lead, series.size - 1)
        if lag < 1:
            columns.append(np.zeros(len(model.levels_)))
            continue
        origins = np.arange(series.size - lag)
        starts = origins[(model.learn_first_index_ + origins) % period == origin_phase]
        spacing_s = model.step_s_ * period
        if starts.size < 10:
            starts, spacing_s = origins, model.step_s_
        columns.append(
            residual_offsets(
                series[starts + lag] - series[starts], model.levels_, spacing_s, model.residual_half_life_s
            )
        )
    offsets = np.stack(columns, axis=1)
    if model._in_ratios():
        values = np.expm1(math.log1p(max(model.origin_value_, 0.0)) + offsets)
    else:
        values = model.origin_value_ + offsets
    return _package(model, values)


def _reference(model: BaseForecaster, horizon: int) -> dict[float, tuple[float, ...]]:
    if isinstance(model, PhaseNaive):
        return _reference_phase(model, horizon)
    if isinstance(model, SeasonalNaive):
        return _reference_seasonal(model, horizon)
    assert isinstance(model, LastValue)
    return _reference_last_value(model, horizon)


def _close(actual: dict[float, tuple[float, ...]], expected: dict[float, tuple[float, ...]]) -> bool:
    """Same levels, same lengths, every value within 1e-9 of the reference (relative to the forecast's scale)."""
    if actual.keys() != expected.keys():
        return False
    scale = max(1.0, *(abs(v) for values in expected.values() for v in values))
    return all(
        len(actual[level]) == len(expected[level])
        and np.allclose(actual[level], expected[level], rtol=1e-9, atol=1e-9 * scale)
        for level in expected
    )


def _models() -> list[BaseForecaster]:
    return [
        PhaseNaive(quantiles=LEVELS, residual_window=600, reversion_periods=None),
        PhaseNaive(quantiles=LEVELS, residual_window=600, reversion_periods=None, period_s=600.0),
        PhaseNaive(
            quantiles=LEVELS, residual_window=600, reversion_periods=None, period_s=600.0, multiplicative=False
        ),
        LastValue(quantiles=LEVELS, residual_window=300),
        SeasonalNaive(quantiles=LEVELS, period_s=3600.0),
    ]


def _windowed(n: int, rng: np.random.Generator, zeros: bool) -> np.ndarray:
    """Per-minute demand that jumps every 10 minutes, with (optionally) long runs of 0 (gap windows: many ties)."""
    level = np.repeat(np.exp(rng.normal(3.0, 0.5, n // 10 + 1)), 10)[:n]
    y = np.round(level * (1.0 + rng.normal(0.0, 0.02, n)), 1)  # rounding: ties among the residuals
    if zeros:
        y[(np.arange(n) % 240) < 90] = 0.0
    return y


def _replay(
    model: BaseForecaster, y: np.ndarray, windows: list[tuple[int, int]], window_len: int, refit_every: int = 0
) -> BaseForecaster:
    """Fit on the first window, update on the rest (every ``refit_every``-th: a new model fitted with the old one's
    hints, as the simulator's hourly refit); after each, the forecast equals the reference's exactly."""
    for k, (end, offset) in enumerate(windows):
        first = max(0, end - window_len)
        series = y[first:end]
        start = (offset + first) * STEP
        if refit_every and k and k % refit_every == 0:
            fresh = clone(model)
            carry_order_hints(model, fresh)
            model = fresh.fit(series, start=start, step_s=STEP)
        elif k == 0:
            model.fit(series, start=start, step_s=STEP)
        else:
            model.update(series, start=start)
        forecast = model.predict(HORIZON)
        expected = _reference(model, HORIZON)
        assert _close(dict(forecast.quantiles), expected), f"window {k} ({first}..{end})"
    # the sets kept from the previous predict were slid for most updates (not relearnt from scratch)
    assert model.order_hints_.reused > len(windows) // 2
    return model


@pytest.mark.parametrize("zeros", [False, True], ids=["windows", "gap-windows"])
@pytest.mark.parametrize("index", range(5))
def test_updates_minute_by_minute_equal_learning_from_scratch(index: int, zeros: bool) -> None:
    model = _models()[index]
    y = _windowed(2_500, np.random.default_rng(index), zeros)
    # the controller's pattern: every minute one new sample, the window sliding once full
    windows = [*((end, 1_000) for end in range(400, 1_000)), *((end, 1_000) for end in range(1_000, 2_501, 7))]
    _replay(model, y, windows, window_len=1_200)


@pytest.mark.parametrize("index", range(5))
def test_refits_that_carry_the_hints_equal_learning_from_scratch(index: int) -> None:
    model = _models()[index]
    y = _windowed(2_000, np.random.default_rng(10 + index), zeros=index % 2 == 1)
    windows = [(end, 500) for end in range(400, 2_000)]
    last = _replay(model, y, windows, window_len=1_200, refit_every=60)
    assert last is not model and last.order_hints_ is model.order_hints_  # handed over, and used


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    index=st.integers(0, 4),
    seed=st.integers(0, 2**16),
    zeros=st.booleans(),
    moves=st.lists(st.tuples(st.integers(-3, 40), st.booleans()), min_size=1, max_size=12),
)
def test_any_sequence_of_updates_equals_learning_from_scratch(
    index: int, seed: int, zeros: bool, moves: list[tuple[int, bool]]
) -> None:
    """Windows that move forward by any amount, stand still, move back, or whose past values were rewritten (a
    filled gap, a corrected sample): the orders kept are used only when they are still the right ones."""
    model = _models()[index]
    rng = np.random.default_rng(seed)
    y = _windowed(1_400, rng, zeros)
    end, windows, series = 500, [(500, 0)], [y.copy()]
    for advance, rewrite in moves:
        end = min(max(end + advance, 300), y.size)
        if rewrite:
            y = y.copy()
            y[rng.integers(0, end)] += 1.0
        windows.append((end, 0))
        series.append(y.copy())
    for k, ((end, offset), values) in enumerate(zip(windows, series, strict=True)):
        _replay_one(model, values, end, offset, first_call=k == 0)


def _replay_one(model: BaseForecaster, y: np.ndarray, end: int, offset: int, first_call: bool) -> None:
    first = max(0, end - 700)
    start = (offset + first) * STEP
    if first_call:
        model.fit(y[first:end], start=start, step_s=STEP)
    else:
        model.update(y[first:end], start=start)
    assert _close(dict(model.predict(HORIZON).quantiles), _reference(model, HORIZON))


def test_gaps_in_the_input_are_filled_and_change_the_history_so_the_orders_are_relearnt() -> None:
    model = PhaseNaive(quantiles=LEVELS, residual_window=600, period_s=600.0, reversion_periods=None)
    y = _windowed(1_200, np.random.default_rng(5), zeros=False)
    holed = y.copy()
    holed[995:1_000] = np.nan  # held at the end now, interpolated once newer samples arrive
    model.fit(holed[:1_000], start=0.0, step_s=STEP)
    assert _close(dict(model.predict(HORIZON).quantiles), _reference(model, HORIZON))
    for end in range(1_001, 1_030):
        model.update(holed[:end], start=0.0)
        assert _close(dict(model.predict(HORIZON).quantiles), _reference(model, HORIZON))


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    size=st.integers(1, 400),
    spacing=st.sampled_from([1, 10]),
    ties=st.booleans(),
    shifts=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70)), min_size=1, max_size=8),
)
def test_a_slid_set_gives_the_weighted_quantiles_of_its_residuals(
    seed: int, size: int, spacing: int, ties: bool, shifts: list[tuple[int, int]]
) -> None:
    """After dropping the oldest and appending the newest residuals (any numbers, ties, more than a slide takes at
    once), the kept set's quantiles are ``weighted_quantile`` of exactly those residuals with recency weights."""
    rng = np.random.default_rng(seed)
    draw = (lambda n: rng.integers(0, 4, n).astype(float)) if ties else (lambda n: rng.normal(size=n))
    stream = draw(size + sum(a for _, a in shifts))
    hints = OrderHints()
    first, count = 0, size
    slides, last = 0, None  # the slides expected: (first, count) of the previous call
    for drop, add in [(0, 0), *shifts]:
        first, count = first + min(drop, count), count - min(drop, count) + add
        residuals = stream[first : first + count]
        if count == 0:
            continue
        if last is not None:
            dropped, kept_count = first - last[0], last[1] - (first - last[0])
            added = count - kept_count
            slides += kept_count > 0 and dropped <= SlidingQuantiles.MAX_CHANGE and added <= SlidingQuantiles.MAX_CHANGE
        last = (first, count)
        kept = hints.at("one", first * spacing, spacing).quantiles(residuals, LEVELS, 120.0, 3_600.0)
        weights = recency_weights(count, 120.0, 3_600.0)
        assert kept is not None and weights is not None
        expected = weighted_quantile(residuals, weights, LEVELS)
        assert np.allclose(kept, expected, rtol=1e-9, atol=1e-9)
    assert hints.reused == slides  # slid whenever it could, rebuilt otherwise


def test_residual_offset_rows_are_residual_offsets_row_by_row() -> None:
    rng = np.random.default_rng(3)
    series = np.round(rng.normal(size=900), 1)
    lags = [1, 2, 3, 4]
    hints = OrderHints()
    for first in range(3, 60, 2):
        count = (series.size - first - lags[-1] - 40) // 2
        origins = first + 2 * np.arange(count)
        plain = residual_offset_rows(series, first, 2, count, lags, LEVELS, 120.0, 3_600.0)
        kept = residual_offset_rows(series, first, 2, count, lags, LEVELS, 120.0, 3_600.0, hints.at("rows", first, 2))
        for r, lag in enumerate(lags):
            alone = residual_offsets(series[origins + lag] - series[origins], LEVELS, 120.0, 3_600.0)
            assert np.array_equal(plain[r], alone)  # the plain path: the same arithmetic, bit for bit
            assert np.allclose(kept[r], alone, rtol=1e-9, atol=1e-9)
    assert hints.reused > 0


def test_sums_carried_across_updates_are_rebuilt_before_they_drift() -> None:
    rng = np.random.default_rng(4)
    stream = rng.gamma(2.0, 1.0, 3 * SlidingQuantiles.MAX_UPDATES)
    hints = OrderHints()
    size, worst = 500, 0.0
    for first in range(0, stream.size - size, 7):
        residuals = stream[first : first + size]
        kept = hints.at("k", first).quantiles(residuals, LEVELS, 60.0, 1_800.0)
        expected = residual_offsets(residuals, LEVELS, 60.0, 1_800.0)
        assert kept is not None
        worst = max(worst, float(np.max(np.abs(kept - expected))))
    assert worst < 1e-10
    assert all(s.changes <= SlidingQuantiles.MAX_UPDATES for s in hints._sets.values())


def test_a_non_finite_residual_takes_the_plain_path() -> None:
    residuals = np.array([1.0, np.inf, 2.0, 0.5])
    assert OrderHints().at("k", 0).quantiles(residuals, LEVELS, 60.0, 3_600.0) is None
    with_hints = residual_offsets(residuals, LEVELS, 60.0, 3_600.0, OrderHints().at("k", 0))
    assert np.array_equal(with_hints, residual_offsets(residuals, LEVELS, 60.0, 3_600.0))
    hints = OrderHints()
    finite = np.array([1.0, 3.0, 2.0, 0.5])
    assert hints.at("k", 0).quantiles(finite, LEVELS, 60.0, 3_600.0) is not None
    # the next residual is NaN: the slide refuses it, the set is forgotten, the plain path answers
    assert hints.at("k", 1).quantiles(np.array([3.0, 2.0, 0.5, np.nan]), LEVELS, 60.0, 3_600.0) is None
    assert not hints._sets


# -- Forecast: the unchecked constructor and the fast reads -------------------------------------------------------
def _old_at(forecast: Forecast, time: float, level: float) -> float:
    index = forecast.step_index(time)
    levels = forecast.levels
    if level in forecast.quantiles:
        return forecast.quantiles[level][index]
    import bisect

    upper = bisect.bisect_right(levels, level)
    lo, hi = levels[upper - 1], levels[upper]
    lo_val, hi_val = forecast.quantiles[lo][index], forecast.quantiles[hi][index]
    return lo_val + (level - lo) / (hi - lo) * (hi_val - lo_val)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), steps=st.integers(1, 30), level=st.sampled_from([0.1, 0.3, 0.5, 0.9, 0.95, 0.99]))
def test_predicted_forecasts_equal_validated_ones_and_read_the_same(seed: int, steps: int, level: float) -> None:
    rng = np.random.default_rng(seed)
    model = LastValue(quantiles=LEVELS, residual_window=50).fit(rng.gamma(2.0, 10.0, 80), start=1_700_000_000.0)
    fast = model.predict(steps)
    slow = Forecast(fast.start, fast.step_s, {lv: list(v) for lv, v in fast.quantiles.items()}, fast.model)
    assert fast == slow and repr(fast) == repr(slow) and len(fast) == len(slow) == steps
    assert fast.levels == slow.levels == LEVELS
    assert fast.to_dict() == slow.to_dict()
    for t0 in rng.uniform(fast.start - 120.0, fast.end, 8):
        t1 = t0 + float(rng.uniform(0.0, 900.0))
        if t1 < fast.start:
            continue
        lo, hi = max(t0, fast.start), min(t1, fast.end - fast.step_s * 1e-9)
        first = fast.step_index(lo)
        last = min(len(fast) - 1, max(first, math.floor((hi - fast.start) / fast.step_s + 1e-9)))
        expected = max(_old_at(fast, fast.start + i * fast.step_s, level) for i in range(first, last + 1))
        assert fast.max_over(t0, t1, level) == expected
        if fast.covers(t0):
            assert fast.at(t0, level) == _old_at(fast, t0, level)


def test_a_pickled_model_leaves_its_kept_orders_behind_and_forecasts_the_same() -> None:
    import pickle

    model = PhaseNaive(quantiles=LEVELS, residual_window=600, period_s=600.0, reversion_periods=None)
    y = _windowed(1_000, np.random.default_rng(7), zeros=False)
    model.fit(y[:900], start=0.0, step_s=STEP)
    model.predict(HORIZON)
    model.update(y[:901], start=0.0)
    model.predict(HORIZON)
    assert model.order_hints_._sets
    copy = pickle.loads(pickle.dumps(model))
    assert not copy.order_hints_._sets and len(pickle.dumps(model.order_hints_)) < 200
    for end in range(902, 920):
        model.update(y[:end], start=0.0)
        copy.update(y[:end], start=0.0)
        assert _close(dict(model.predict(HORIZON).quantiles), dict(copy.predict(HORIZON).quantiles))


@pytest.mark.parametrize(
    ("offset", "appended", "changed"),
    [
        (1, 1, False),  # the usual update: one sample in, one out
        (0, 3, False),  # a young window that only grows
        (5, 2, False),  # several updates missed
        (2, 2, True),  # an overlapping sample differs (gap filling redid it): logs recomputed
        (500, 500, False),  # no overlap at all
        (-1, 0, False),  # the window moved back (a refit on older data)
    ],
)
def test_log_levels_kept_across_an_update_equal_fresh_ones(offset: int, appended: int, changed: bool) -> None:
    """``PhaseNaive`` keeps the log levels of the samples an update shares with the previous history."""
    from forecast.phase import _log_level, _log_level_after

    rng = np.random.default_rng(abs(offset) + appended)
    stream = rng.gamma(2.0, 3.0, 2000)
    stream[::7] = 0.0
    previous_first = 100
    previous = stream[previous_first : previous_first + 400]
    first = previous_first + offset
    size = 400 - offset + appended if offset >= 0 else 400
    values = stream[first : first + size].copy()
    if changed:
        values[10] += 1.0
    got = _log_level_after(values, first, previous, _log_level(previous), previous_first)
    assert got.shape == values.shape and np.array_equal(got, _log_level(values))
