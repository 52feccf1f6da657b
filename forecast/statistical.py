"""statsmodels forecasters: Holt-Winters exponential smoothing, and ARMA with Fourier seasonality (SARIMAX).

Both can fit on a coarser, block-averaged copy of the series (``resample_s``) because fitting cost grows with the
number of samples and the season length: Holt-Winters with a 1,440-step season takes ~1 s per fit and a seasonal
SARIMAX with that season does not finish at all (test-infrastructure notes, section 8). The coarse forecast is held
over each block when expanded back to the training step.

Quantiles: the point forecast plus empirical quantiles of the one-step in-sample errors *at the training step* (so
within-block noise lost by resampling is still counted; recent errors weigh more, halving every
``residual_half_life_s``), widened with the lead by the model's own growth of
forecast uncertainty (Holt-Winters: the simple-exponential-smoothing variance factor ``1 + (h - 1) alpha^2``;
SARIMAX: the ratio of its forecast standard errors ``se(h) / se(1)``).

Every statsmodels call runs under ``quiet_single_thread()``: warnings silenced (ConvergenceWarning is routine on this
data; a failed optimisation still yields a usable model, and the backtest and accountability checks judge it) and
BLAS limited to one thread, which made SARIMAX fits 10-40x faster on a busy 2-core node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from forecast.base import (
    DEFAULT_QUANTILES,
    BaseForecaster,
    coarsen,
    expand,
    quantiles_around,
    quiet_single_thread,
    resample_factor,
    residual_offsets,
)
from forecast.preprocessing import DAY_S, WEEK_S, FloatArray, detect_periods

# Early one-step residuals reflect the initialisation, not the model; they would widen every interval.
_BURN_IN = 10


def _fine_residuals(y: FloatArray, fitted_coarse: FloatArray, factor: int, drop: int, burn_in: int) -> FloatArray:
    resid = y[drop:] - expand(fitted_coarse, factor, y.size - drop)
    out: FloatArray = resid[burn_in * factor :]
    return out if out.size else resid


class HoltWinters(BaseForecaster):
    """Holt-Winters (additive ETS) via ``statsmodels.tsa.holtwinters.ExponentialSmoothing``, heuristic initialisation.

    ``period_s``: the season in seconds (None = no season). The seasonal component is used only when the (resampled)
    training series holds two full seasons and, if ``require_detected_season``, when ``detect_periods`` finds that
    period: fitting a season to non-seasonal data just adds noise to every forecast. ``seasonal_periods_`` is the
    season used (0 = none). ``trend``/``damped_trend`` as in statsmodels; a damped trend keeps long leads sane.
    Fitted on block means of ``resample_s`` seconds, coarser still if needed to stay within ``max_fit_samples``.
    """

    def __init__(
        self,
        period_s: float | None = DAY_S,
        trend: str | None = "add",
        damped_trend: bool = True,
        require_detected_season: bool = True,
        resample_s: float | None = None,
        max_fit_samples: int | None = 4032,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        residual_half_life_s: float | None = DAY_S,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.period_s = period_s
        self.trend = trend
        self.damped_trend = damped_trend
        self.require_detected_season = require_detected_season
        self.resample_s = resample_s
        self.max_fit_samples = max_fit_samples
        self.quantiles = quantiles
        self.residual_half_life_s = residual_half_life_s
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    def label(self) -> str:
        season = getattr(self, "seasonal_periods_", None)
        return "HoltWinters" if not season else f"HoltWinters(season={season * self.coarse_step_s_:g}s)"

    def _model(self, y: FloatArray, seasonal_periods: int) -> Any:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        return ExponentialSmoothing(
            y,
            trend=self.trend,
            damped_trend=bool(self.damped_trend) and self.trend is not None,
            seasonal="add" if seasonal_periods else None,
            seasonal_periods=seasonal_periods or None,
            initialization_method="heuristic",
        )

    def _fit(self, y: FloatArray) -> None:
        if self.trend not in (None, "add"):
            raise ValueError(f"trend must be 'add' or None, got {self.trend!r}")
        self.factor_ = resample_factor(self.step_s_, self.resample_s, y.size, self.max_fit_samples)
        self.coarse_step_s_ = self.step_s_ * self.factor_
        coarse, _ = coarsen(y, self.factor_)
        if coarse.size < 10:
            raise ValueError(f"HoltWinters needs at least 10 (resampled) observations, got {coarse.size}")
        self.seasonal_periods_ = self._choose_season(coarse)
        with quiet_single_thread():
            result = self._model(coarse, self.seasonal_periods_).fit()
        self.smoothing_params_ = {
            key: float(result.params[key])
            for key in ("smoothing_level", "smoothing_trend", "smoothing_seasonal", "damping_trend")
            if key in result.params and result.params[key] is not None and np.isfinite(result.params[key])
        }
        self._store(y, result)

    def _choose_season(self, coarse: FloatArray) -> int:
        if self.period_s is None:
            return 0
        period = round(float(self.period_s) / self.coarse_step_s_)
        if period < 2 or coarse.size < max(2 * period, 10 + 2 * (period // 2)):
            return 0
        if self.require_detected_season and float(self.period_s) not in detect_periods(
            coarse, self.coarse_step_s_, candidates_s=(float(self.period_s),)
        ):
            return 0
        return period

    def _update(self, y: FloatArray) -> None:
        coarse, _ = coarsen(y, self.factor_)
        season = self.seasonal_periods_ if coarse.size >= max(2 * self.seasonal_periods_, 10) else 0
        with quiet_single_thread():
            model = self._model(coarse, season)
            params = {k: v for k, v in self.smoothing_params_.items() if season or k != "smoothing_seasonal"}
            result = model.fit(optimized=False, **params)
        self._store(y, result)

    def _store(self, y: FloatArray, result: Any) -> None:
        _, drop = coarsen(y, self.factor_)
        self.result_ = result
        resid = _fine_residuals(y, np.asarray(result.fittedvalues), self.factor_, drop, _BURN_IN)
        self.offsets_ = residual_offsets(resid, self.levels_, self.step_s_, self.residual_half_life_s)
        self.alpha_ = float(result.params.get("smoothing_level", 0.5))

    def _predict(self, horizon: int) -> FloatArray:
        coarse_h = -(-horizon // self.factor_)
        with quiet_single_thread():
            point_c = np.asarray(self.result_.forecast(coarse_h), dtype=np.float64)
        lead = np.arange(1, coarse_h + 1)
        scale_c = np.sqrt(1.0 + (lead - 1) * self.alpha_**2)
        out: FloatArray = expand(quantiles_around(point_c, self.offsets_, scale_c), self.factor_, horizon)
        return out


def fourier_terms(times: FloatArray, periods_s: Sequence[float], terms: int) -> FloatArray:
    """sin/cos pairs ``k = 1..terms`` of each period, evaluated at absolute Unix times (so phase is calendar-true)."""
    cols = [
        fn(2.0 * np.pi * k * times / period)
        for period in periods_s
        for k in range(1, terms + 1)
        for fn in (np.sin, np.cos)
    ]
    if not cols:
        return np.empty((times.size, 0))
    return np.column_stack(cols)


class FourierARIMA(BaseForecaster):
    """Non-seasonal ARMA with a constant and Fourier regressors for the daily/weekly seasons (statsmodels SARIMAX).

    A seasonal ARIMA with a 1,440-step season has a ~1,441-dimensional state and never finishes; ``fourier_terms``
    sin/cos pairs per season carry the same shape in a handful of regressors. A season's terms are included only
    when the (resampled) series spans two of them and, if ``require_detected_season``, ``detect_periods`` finds it
    (``periods_used_``). A series longer than ``max_fit_samples`` is fitted on block means (e.g. two weeks at one
    minute become 15-minute means) to keep a refit around a second.
    """

    def __init__(
        self,
        order: tuple[int, int, int] = (2, 0, 1),
        periods_s: Sequence[float] = (DAY_S, WEEK_S),
        fourier_terms: int = 3,
        require_detected_season: bool = True,
        resample_s: float | None = None,
        max_fit_samples: int | None = 1500,
        maxiter: int = 50,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        residual_half_life_s: float | None = DAY_S,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.order = order
        self.periods_s = periods_s
        self.fourier_terms = fourier_terms
        self.require_detected_season = require_detected_season
        self.resample_s = resample_s
        self.max_fit_samples = max_fit_samples
        self.maxiter = maxiter
        self.quantiles = quantiles
        self.residual_half_life_s = residual_half_life_s
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    def label(self) -> str:
        p, d, q = self.order
        return f"FourierARIMA({p},{d},{q})"

    def _exog(self, first_time: float, count: int) -> FloatArray | None:
        if not self.periods_used_:
            return None
        times = first_time + np.arange(count, dtype=np.float64) * self.coarse_step_s_
        return fourier_terms(times, self.periods_used_, int(self.fourier_terms))

    def _fit(self, y: FloatArray) -> None:
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        order = tuple(int(v) for v in self.order)
        if len(order) != 3 or min(order) < 0:
            raise ValueError(f"order must be (p, d, q) of non-negative integers, got {self.order!r}")
        self.factor_ = resample_factor(self.step_s_, self.resample_s, y.size, self.max_fit_samples)
        self.coarse_step_s_ = self.step_s_ * self.factor_
        coarse, drop = coarsen(y, self.factor_)
        if coarse.size < 3 * (sum(order) + 2):
            raise ValueError(f"FourierARIMA{order} needs more data: only {coarse.size} (resampled) observations")
        span = coarse.size * self.coarse_step_s_
        candidates = tuple(float(p) for p in self.periods_s if span >= 2 * float(p))
        if self.require_detected_season and candidates:
            detected = detect_periods(coarse, self.coarse_step_s_, candidates_s=candidates)
            candidates = tuple(p for p in candidates if p in detected)
        self.periods_used_ = candidates
        self.coarse_start_ = self.start_ + drop * self.step_s_
        finite = coarse[np.isfinite(coarse)]
        self.flat_level_ = float(finite[-1]) if finite.size and float(np.ptp(finite)) == 0.0 else None
        if self.flat_level_ is not None:
            # A flat history (a fixed-rate client, a probe): SARIMAX's likelihood is singular there (statsmodels raises
            # LinAlgError at every refit, the service never got a forecast); its forecast is its level, exactly.
            self._store_flat(y, drop)
            return
        exog = self._exog(self.coarse_start_, coarse.size)
        with quiet_single_thread():
            model = SARIMAX(coarse, exog=exog, order=order, trend="c" if order[1] == 0 else None)
            result = model.fit(disp=False, maxiter=int(self.maxiter))
        self._store(y, drop, result)

    def _store_flat(self, y: FloatArray, drop: int) -> None:
        self.result_: Any = None  # fitted flat: no statsmodels results to re-condition
        self.n_coarse_ = (y.size - drop) // self.factor_
        self.offsets_ = np.zeros(len(self.levels_))

    def _update(self, y: FloatArray) -> None:
        coarse, drop = coarsen(y, self.factor_)
        self.coarse_start_ = self.start_ + drop * self.step_s_
        if self.flat_level_ is not None:
            # fitted flat, no model to re-condition: the newest level (a naive forecast until the next refit)
            finite = coarse[np.isfinite(coarse)]
            if finite.size:
                self.flat_level_ = float(finite[-1])
            self._store_flat(y, drop)
            return
        with quiet_single_thread():
            result = self.result_.apply(coarse, exog=self._exog(self.coarse_start_, coarse.size))
        self._store(y, drop, result)

    def _store(self, y: FloatArray, drop: int, result: Any) -> None:
        self.result_ = result
        self.n_coarse_ = (y.size - drop) // self.factor_
        burn_in = max(_BURN_IN, sum(int(v) for v in self.order))
        fitted = np.asarray(result.fittedvalues, dtype=np.float64)
        resid = _fine_residuals(y, fitted, self.factor_, drop, burn_in)
        self.offsets_ = residual_offsets(resid, self.levels_, self.step_s_, self.residual_half_life_s)

    def _predict(self, horizon: int) -> FloatArray:
        coarse_h = -(-horizon // self.factor_)
        if self.flat_level_ is not None:
            flat: FloatArray = expand(
                quantiles_around(np.full(coarse_h, self.flat_level_), self.offsets_), self.factor_, horizon
            )
            return flat
        first = self.coarse_start_ + self.n_coarse_ * self.coarse_step_s_
        with quiet_single_thread():
            fc = self.result_.get_forecast(coarse_h, exog=self._exog(first, coarse_h))
        point = np.asarray(fc.predicted_mean, dtype=np.float64)
        se = np.asarray(fc.se_mean, dtype=np.float64)
        scale = se / se[0] if se[0] > 0 and np.all(np.isfinite(se)) else np.ones(coarse_h)
        out: FloatArray = expand(quantiles_around(point, self.offsets_, scale), self.factor_, horizon)
        return out
