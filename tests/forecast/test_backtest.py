from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from forecast.backtest import evaluate, median_of, origin_indices, pinball_losses, rolling_origin_backtest
from forecast.base import DEFAULT_QUANTILES, BaseForecaster
from forecast.baselines import LastValue, SeasonalNaive
from forecast.preprocessing import FloatArray
from tests.forecast.conftest import START, STEP_S, daily_series


class Spy(BaseForecaster):
    """Forecasts the training mean; records what it was shown, to prove the backtest never leaks the future."""

    seen: list[tuple[str, int, float]] = []  # noqa: RUF012 - class-level log shared with the test

    def __init__(
        self,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.quantiles = quantiles
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    def _fit(self, y: FloatArray) -> None:
        Spy.seen.append(("fit", y.size, float(y[-1])))
        self.mean_ = float(y.mean())

    def _update(self, y: FloatArray) -> None:
        Spy.seen.append(("update", y.size, float(y[-1])))

    def _predict(self, horizon: int) -> FloatArray:
        return np.tile(np.array([[-1.0], [0.0], [1.0]]) + self.mean_, (1, horizon))


def test_origin_indices_end_with_a_full_horizon() -> None:
    np.testing.assert_array_equal(origin_indices(20, 3, min_train_steps=10, origin_every=2), [11, 13, 15, 17])
    np.testing.assert_array_equal(origin_indices(20, 3, min_train_steps=10, n_origins=2), [16, 17])
    with pytest.raises(ValueError):
        origin_indices(10, 5, min_train_steps=8)


def test_backtest_never_shows_the_model_the_future_and_refits_on_schedule() -> None:
    Spy.seen = []
    y = np.arange(100.0)
    result = rolling_origin_backtest(
        Spy(), y, step_s=60.0, horizon_steps=5, n_origins=6, origin_every=3, refit_every=2, max_train_steps=40
    )
    np.testing.assert_array_equal(result.origins, [80, 83, 86, 89, 92, 95])
    assert [kind for kind, _, _ in Spy.seen] == ["fit", "update"] * 3
    for (_, size, last), origin in zip(Spy.seen, result.origins, strict=True):
        assert last == origin - 1  # the newest value shown is the one just before the origin
        assert size == 40  # max_train_steps window
    assert len(result.fit_seconds) == 3 and len(result.update_seconds) == 3
    np.testing.assert_array_equal(result.actuals[0], y[80:85])
    np.testing.assert_allclose(result.origin_times, result.origins * 60.0)


def test_backtest_scores_a_naive_model_exactly() -> None:
    # On a straight line, the naive forecast's error at lead h is h, and its interval (from past h-step changes,
    # all equal to h) is a single point: nothing is inside [q10, q90] except where the value is exactly hit.
    y = np.arange(50.0)
    result = rolling_origin_backtest(LastValue(), y, step_s=60.0, horizon_steps=2, n_origins=5)
    quality = result.quality
    assert quality.n == 10
    assert quality.mae == pytest.approx(0.0, abs=1e-9)
    assert quality.interval_coverage == pytest.approx(1.0)
    naive = rolling_origin_backtest(LastValue(residual_window=2), y, step_s=60.0, horizon_steps=2, n_origins=5)
    # residual_window=2 only sees 1-step changes: lead 2 is under-forecast by 1 at every origin.
    assert naive.quality_at_lead(2).mae == pytest.approx(1.0)
    assert naive.quality_at_lead(1).mae == pytest.approx(0.0, abs=1e-9)
    assert naive.quality_at_lead(2).upper_coverage == 0.0


def test_backtest_is_deterministic_and_leaves_the_model_unfitted() -> None:
    y = daily_series(days=4.0)
    model = SeasonalNaive()
    first = rolling_origin_backtest(model, y, step_s=STEP_S, start=START, horizon_steps=6, n_origins=10)
    second = rolling_origin_backtest(model, y, step_s=STEP_S, start=START, horizon_steps=6, n_origins=10)
    np.testing.assert_array_equal(first.predictions, second.predictions)
    assert not hasattr(model, "forecast_start_")
    assert first.quality.n == 60
    assert first.origin_times[0] == START + first.origins[0] * STEP_S


def test_missing_actuals_are_left_out_of_the_scores() -> None:
    y = daily_series(days=4.0)
    y[-3] = np.nan
    result = rolling_origin_backtest(LastValue(), y, step_s=STEP_S, horizon_steps=6, n_origins=1)
    assert result.quality.n == 5


def test_pinball_and_median_helpers() -> None:
    actual = np.array([10.0, 10.0])
    pred = np.array([[8.0, 12.0], [9.0, 13.0]])
    losses = pinball_losses(actual, pred, (0.1, 0.9))
    # Under-forecast costs the level, over-forecast 1 - level: P10 at 12 (over by 2) costs 1.8, P90 at 9 costs 0.9.
    np.testing.assert_allclose(losses, [[0.2, 1.8], [0.9, 0.3]])
    np.testing.assert_allclose(median_of(pred, (0.1, 0.9)), [8.5, 12.5])
    np.testing.assert_allclose(median_of(pred, (0.6, 0.9)), [8.0, 12.0])  # nearest level below the range
    quality = evaluate("m", actual, pred, (0.1, 0.9))
    assert quality.pinball[0.9] == pytest.approx(0.6)
    assert quality.interval_coverage == 0.0
    assert quality.upper_coverage == 0.5
    with pytest.raises(ValueError):
        evaluate("m", actual, pred[:1], (0.1, 0.9))
