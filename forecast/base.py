"""The scikit-learn contract shared by every forecaster, and helpers for residual-based quantiles and resampling.

Contract (what ``tests/forecast/test_conformance.py`` checks for every model):

* ``__init__`` stores its keyword arguments unchanged as attributes and does nothing else (no validation, no work),
  so ``sklearn.base.clone`` and ``get_params``/``set_params`` work; parameters are validated in ``fit``.
* ``fit(y, *, start, step_s) -> self``: ``y`` is a 1-D array-like of a **regular** series, one value per ``step_s``
  seconds, ``y[i]`` being the value of the interval starting at ``start + i * step_s`` (Unix seconds). NaN/±inf
  mark missing samples and are filled (interpolated inside, held at the ends); ``y`` is never modified.
  Everything learnt is stored in attributes ending in ``_``.
* ``update(y, *, start, step_s) -> self``: re-condition a fitted model on a newer series (usually the training window
  moved forward) *without* re-estimating its parameters: the cheap step between two refits.
* ``predict(horizon_steps) -> Forecast``: quantiles for the ``horizon_steps`` steps right after the last observation
  (``forecast.start == start + len(y) * step_s``), monotone in the level, clipped at 0 when ``nonnegative``.
  Raises ``sklearn.exceptions.NotFittedError`` before ``fit``.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Sequence
from typing import Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from forecast.preprocessing import FloatArray, as_series, clip_outliers, fill_gaps
from forecast.types import Forecast

DEFAULT_QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)


def check_levels(quantiles: Sequence[float]) -> tuple[float, ...]:
    levels = tuple(sorted(float(q) for q in quantiles))
    if not levels:
        raise ValueError("quantiles must name at least one level")
    if any(not 0.0 < q < 1.0 for q in levels) or len(set(levels)) != len(levels):
        raise ValueError(f"quantiles must be distinct levels in (0, 1), got {quantiles!r}")
    return levels


def check_time(start: float, step_s: float) -> tuple[float, float]:
    start, step_s = float(start), float(step_s)
    if not (math.isfinite(start) and math.isfinite(step_s)) or step_s <= 0:
        raise ValueError(f"start must be finite and step_s > 0, got start={start} step_s={step_s}")
    return start, step_s


class BaseForecaster(BaseEstimator):  # type: ignore[misc]
    """Base class: input checking, pre-processing and the Forecast packaging around ``_fit``/``_predict``.

    Subclasses define ``__init__`` (parameters only, including ``quantiles``, ``nonnegative`` and ``clip_outliers``),
    ``_fit(y)`` (``y`` already cleaned; ``start_``/``step_s_``/``n_obs_``/``levels_`` are set),
    ``_update(y)`` and ``_predict(horizon_steps) -> array (n_levels, horizon_steps)`` in the order of ``levels_``.
    """

    quantiles: Sequence[float]
    nonnegative: bool
    clip_outliers: float | None

    # -- public API ------------------------------------------------------------------------------------------------
    def fit(self, y: npt.ArrayLike, *, start: float = 0.0, step_s: float = 60.0) -> Self:
        self.levels_ = check_levels(self.quantiles)
        clean = self._prepare(y, start, step_s)
        self._fit(clean)
        return self

    def update(self, y: npt.ArrayLike, *, start: float = 0.0, step_s: float | None = None) -> Self:
        check_is_fitted(self)
        if step_s is not None and not math.isclose(float(step_s), self.step_s_):
            raise ValueError(f"update() needs the fitted step {self.step_s_} s, got {step_s} s: refit instead")
        clean = self._prepare(y, start, self.step_s_)
        self._update(clean)
        return self

    def predict(self, horizon_steps: int) -> Forecast:
        check_is_fitted(self)
        if int(horizon_steps) != horizon_steps or horizon_steps < 1:
            raise ValueError(f"horizon_steps must be a positive integer, got {horizon_steps!r}")
        horizon = int(horizon_steps)
        values = np.asarray(self._predict(horizon), dtype=np.float64)
        if values.shape != (len(self.levels_), horizon):
            raise RuntimeError(f"{type(self).__name__}._predict returned shape {values.shape}")
        values = np.where(np.isfinite(values), values, np.nan)
        if np.isnan(values).any():
            # A diverged fit must not reach the policy as NaN; the last observed value is the safest stand-in.
            values = np.where(np.isnan(values), self.last_value_, values)
        if self.nonnegative:
            values = np.maximum(values, 0.0)
        # Rearrangement (sorting across levels at each step) turns crossing quantiles into valid ones and never
        # increases pinball loss (Chernozhukov, Fernandez-Val & Galichon 2010).
        values = np.sort(values, axis=0)
        return Forecast(
            start=self.forecast_start_,
            step_s=self.step_s_,
            quantiles={level: tuple(values[i].tolist()) for i, level in enumerate(self.levels_)},
            model=self.label(),
        )

    def label(self) -> str:
        """Short model name for forecasts, tables and metric labels."""
        return type(self).__name__

    # -- helpers for subclasses ------------------------------------------------------------------------------------
    def _prepare(self, y: npt.ArrayLike, start: float, step_s: float) -> FloatArray:
        start, step_s = check_time(start, step_s)
        arr = fill_gaps(as_series(y))
        if self.clip_outliers is not None:
            arr = clip_outliers(arr, k=float(self.clip_outliers))
        self.start_ = start
        self.step_s_ = step_s
        self.n_obs_ = int(arr.size)
        self.last_value_ = float(arr[-1])
        self.forecast_start_ = start + arr.size * step_s
        return arr

    def _fit(self, y: FloatArray) -> None:
        raise NotImplementedError

    def _update(self, y: FloatArray) -> None:
        # Default: conditioning is as expensive as fitting for models without a cheaper path.
        self._fit(y)

    def _predict(self, horizon: int) -> FloatArray:
        raise NotImplementedError

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "forecast_start_")


def quiet_single_thread() -> contextlib.ExitStack:
    """Context for statsmodels calls: BLAS limited to one thread, warnings silenced.

    The matrices of these state-space and smoothing models are tiny; OpenBLAS threads only add synchronisation.
    Measured on a busy 2-core node: SARIMAX fits took 0.5-6.6 s with two BLAS threads and 0.03-0.14 s with one.
    statsmodels warns freely (ConvergenceWarning, frequency warnings) on this kind of data; a refit job's log must
    not drown in them, and the backtest and accountability checks judge the result anyway.
    """
    from threadpoolctl import threadpool_limits

    stack = contextlib.ExitStack()
    stack.enter_context(threadpool_limits(limits=1, user_api="blas"))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


# -- residual quantiles -------------------------------------------------------------------------------------------
def weighted_quantile(values: FloatArray, weights: FloatArray, levels: Sequence[float]) -> FloatArray:
    """Quantiles of ``values`` under ``weights`` (midpoint interpolation of the weighted empirical CDF)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cdf = (np.cumsum(w) - 0.5 * w) / w.sum()
    out: FloatArray = np.interp(np.asarray(levels, dtype=np.float64), cdf, v)
    return out


def recency_weights(count: int, step_s: float, half_life_s: float | None) -> FloatArray | None:
    """Weights for ``count`` samples ordered oldest to newest, halving every ``half_life_s`` (None = equal)."""
    if half_life_s is None or count == 0:
        return None
    if half_life_s <= 0:
        raise ValueError(f"residual_half_life_s must be > 0 or None, got {half_life_s}")
    age_s = (count - 1 - np.arange(count)) * step_s
    out: FloatArray = np.exp2(-age_s / half_life_s)
    return out


def residual_offsets(
    residuals: FloatArray, levels: Sequence[float], step_s: float = 1.0, half_life_s: float | None = None
) -> FloatArray:
    """Empirical quantiles of in-sample errors (ordered oldest to newest) at each level, optionally recency-weighted.

    Weighting recent errors more follows volatility clustering: request rates have calm and bursty days, and
    intervals learnt from the whole history are too narrow on a bursty day (measured on ServeGen m-large: P90
    coverage 82 % unweighted, 86 % with a one-day half-life). 0 when there is no residual to learn from.
    """
    finite = np.isfinite(residuals)
    resid = residuals[finite]
    if resid.size == 0:
        return np.zeros(len(levels))
    weights = recency_weights(residuals.size, step_s, half_life_s)
    if weights is None:
        out: FloatArray = np.quantile(resid, levels)
        return out
    return weighted_quantile(resid, weights[finite], levels)


def quantiles_around(point: FloatArray, offsets: FloatArray, scale: FloatArray | float = 1.0) -> FloatArray:
    """``point[h] + offsets[level] * scale[h]``: a point forecast widened by (scaled) residual quantiles."""
    scale_arr = np.broadcast_to(np.asarray(scale, dtype=np.float64), point.shape)
    return point[None, :] + offsets[:, None] * scale_arr[None, :]


# -- resampling ---------------------------------------------------------------------------------------------------
def resample_factor(
    step_s: float, resample_s: float | None, n_samples: int | None = None, max_fit_samples: int | None = None
) -> int:
    """How many fine steps make one coarse step (1 = no resampling).

    At least ``resample_s / step_s``; and, when ``max_fit_samples`` is set, large enough that the coarse series has at
    most that many samples. An automatic factor is rounded up to a divisor of the number of steps in a day (when the
    step divides a day), so a daily season stays a whole number of coarse steps.
    """
    factor = 1 if resample_s is None or resample_s <= step_s else max(1, round(resample_s / step_s))
    if max_fit_samples is not None and n_samples is not None and n_samples > max_fit_samples:
        needed = -(-n_samples // max(1, int(max_fit_samples)))
        if needed > factor:
            factor = needed
            per_day = 86_400.0 / step_s
            if abs(per_day - round(per_day)) < 1e-9 and round(per_day) >= factor:
                day_steps = round(per_day)
                factor = next(f for f in range(needed, day_steps + 1) if day_steps % f == 0)
    return factor


def coarsen(y: FloatArray, factor: int) -> tuple[FloatArray, int]:
    """Block means of ``factor`` samples, aligned so the last block ends at the last sample.

    Returns the coarse series and the number of leading fine samples dropped: aligning to the end keeps the coarse
    forecast starting exactly where the fine one must (index continuity).
    """
    if factor == 1:
        return y, 0
    drop = y.size % factor
    return y[drop:].reshape(-1, factor).mean(axis=1), drop


def expand(coarse: FloatArray, factor: int, horizon: int) -> FloatArray:
    """Repeat each coarse step ``factor`` times (a rate forecast holds over its block) and keep ``horizon`` steps."""
    return np.repeat(coarse, factor, axis=-1)[..., :horizon]
