"""Baselines every other model has to beat: the last value, and the value one season ago.

Both give quantiles from their own empirical in-sample errors at the same lead, so their intervals are honest about
how noisy the series is, with no distributional assumption.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from forecast.base import (
    DEFAULT_QUANTILES,
    BaseForecaster,
    kept_order_hints,
    residual_offsets,
    sample_index,
)
from forecast.preprocessing import DAY_S, FloatArray


def _format_period(period_s: float) -> str:
    for unit, seconds in (("w", 604_800.0), ("d", 86_400.0), ("h", 3_600.0), ("m", 60.0)):
        if period_s >= seconds and period_s % seconds == 0:
            return f"{int(period_s // seconds)}{unit}"
    return f"{period_s:g}s"


def _first_index(model: BaseForecaster) -> int:
    """The position (``sample_index``) of the first sample the model was given, for its ``OrderHints``."""
    return sample_index(model.start_, model.step_s_)


class LastValue(BaseForecaster):
    """Naive forecast: every future step equals the last observation.

    Quantiles at lead ``h`` are the last value plus the empirical quantiles of ``y[t + h] - y[t]`` over the last
    ``residual_window`` training samples, so the interval widens with the lead as much as the series really moves.
    Recent errors weigh more (halving every ``residual_half_life_s``), see ``forecast.base.residual_offsets``.
    """

    levels_independent = True  # residual quantiles, one per level (BaseForecaster.levels_independent)

    def __init__(
        self,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        residual_window: int = 2016,
        residual_half_life_s: float | None = DAY_S,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.quantiles = quantiles
        self.residual_window = residual_window
        self.residual_half_life_s = residual_half_life_s
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    def _fit(self, y: FloatArray) -> None:
        if int(self.residual_window) < 2:
            raise ValueError(f"residual_window must be >= 2, got {self.residual_window}")
        self.order_hints_ = kept_order_hints(self)
        self._update(y)

    def _update(self, y: FloatArray) -> None:
        self.history_ = y[-int(self.residual_window) :].copy()
        # the change residuals sorted with their weights, kept while updates only append (see forecast.base.OrderHints)
        self.order_hints_.advance(self.history_, _first_index(self) + self.n_obs_ - self.history_.size)

    def _predict(self, horizon: int) -> FloatArray:
        hist = self.history_
        offsets = np.zeros((len(self.levels_), horizon))
        first = _first_index(self) + self.n_obs_ - hist.size
        for h in range(1, horizon + 1):
            # Beyond the history's reach, the longest lead it can show is the best guess of the spread.
            lag = min(h, hist.size - 1)
            if lag >= 1:
                offsets[:, h - 1] = residual_offsets(
                    hist[lag:] - hist[:-lag],
                    self.levels_,
                    self.step_s_,
                    self.residual_half_life_s,
                    self.order_hints_.at(lag, first),
                )
        out: FloatArray = hist[-1] + offsets
        return out


class SeasonalNaive(BaseForecaster):
    """Seasonal naive: step ``t + h`` equals the last observed value at the same phase, ``y[t + h - k * period]``.

    ``period_s`` is typically 86 400 (daily) or 604 800 (weekly); it is rounded to a whole number of steps. Quantiles
    add the empirical quantiles of the in-sample seasonal-naive errors at the same lag ``k * period`` (recent errors
    weighing more, halving every ``residual_half_life_s``). When the
    training series is shorter than one period plus two steps there is no season to copy: the model then falls
    back to the naive forecast (period = one step) and sets ``fallback_ = True``, so a young service still gets a
    baseline (this is also what it is on the 1-hour Azure traces).
    """

    levels_independent = True  # residual quantiles, one per level (BaseForecaster.levels_independent)

    def __init__(
        self,
        period_s: float = DAY_S,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        residual_half_life_s: float | None = DAY_S,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.period_s = period_s
        self.quantiles = quantiles
        self.residual_half_life_s = residual_half_life_s
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    def label(self) -> str:
        name = f"SeasonalNaive({_format_period(float(self.period_s))})"
        # A fallen-back model must not be reported as a seasonal baseline it was not.
        return f"{name}->naive" if getattr(self, "fallback_", False) else name

    def _fit(self, y: FloatArray) -> None:
        if float(self.period_s) <= 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        self.order_hints_ = kept_order_hints(self)
        self._update(y)

    def _update(self, y: FloatArray) -> None:
        period = max(1, round(float(self.period_s) / self.step_s_))
        self.fallback_ = y.size < period + 2
        self.period_steps_ = 1 if self.fallback_ else period
        self.history_ = y.copy()
        # the seasonal errors sorted with their weights, kept while updates only append (see forecast.base.OrderHints)
        self.order_hints_.advance(self.history_, _first_index(self))

    def _predict(self, horizon: int) -> FloatArray:
        y, period = self.history_, self.period_steps_
        n = y.size
        out = np.empty((len(self.levels_), horizon))
        steps = np.arange(1, horizon + 1)
        cycles = -(-steps // period)  # ceil: how many whole seasons back the same phase was last observed
        point = y[n - 1 + steps - cycles * period]
        offsets_by_cycles: dict[int, FloatArray] = {}
        for k in range(int(cycles[0]), int(cycles[-1]) + 1):  # cycles ascend by at most one per step
            # The error of copying k seasons back; capped at the longest lag the history can show.
            lag = min(k * period, n - 1)
            if lag not in offsets_by_cycles:
                offsets_by_cycles[lag] = residual_offsets(
                    y[lag:] - y[:-lag],
                    self.levels_,
                    self.step_s_,
                    self.residual_half_life_s,
                    self.order_hints_.at(lag, _first_index(self)),
                )
            steps_k = slice((k - 1) * period, min(k * period, horizon))  # the steps copied from k seasons back
            out[:, steps_k] = point[steps_k][None, :] + offsets_by_cycles[lag][:, None]
        return out
