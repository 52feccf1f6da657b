"""Rolling-origin backtests: fit on the past, forecast the next ``horizon_steps``, score, move the origin, repeat.

An *origin* ``o`` is the number of observations the model may see: it is fitted on ``y[:o]`` (or the last
``max_train_steps`` of them) and forecasts ``y[o : o + horizon_steps]``. Origins are ``origin_every`` steps apart
and the last one leaves exactly one full horizon of actuals. With ``refit_every = N > 1`` the model is re-estimated
at every N-th origin only and merely re-conditioned on the newer data (``update``) in between, which is what the
controller does between two refit jobs.

Metrics (definitions shared with ``forecast.types.ForecastQuality.from_observations``): MAE of the median, mean
pinball loss per level, share of actuals inside ``[q_lo, q_hi]`` (lowest and highest level), share at or below
``q_hi``. Everything is deterministic: no randomness beyond the models' own ``random_state``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from sklearn.base import clone

from forecast.base import BaseForecaster, check_time
from forecast.preprocessing import FloatArray, as_series
from forecast.types import ForecastQuality


def pinball_losses(actuals: FloatArray, predictions: FloatArray, levels: Sequence[float]) -> FloatArray:
    """Elementwise pinball loss; ``predictions`` has a leading level axis matching ``levels``."""
    lv = np.asarray(levels, dtype=np.float64).reshape((-1,) + (1,) * actuals.ndim)
    diff = actuals[None, ...] - predictions
    out: FloatArray = np.maximum(lv * diff, (lv - 1.0) * diff)
    return out


def median_of(predictions: FloatArray, levels: Sequence[float]) -> FloatArray:
    """Level 0.5 of stacked quantile predictions: linear between levels, nearest level outside their range."""
    lv = list(levels)
    if 0.5 in lv:
        out: FloatArray = predictions[lv.index(0.5)]
        return out
    if lv[0] >= 0.5 or lv[-1] <= 0.5:
        nearest: FloatArray = predictions[0] if lv[0] >= 0.5 else predictions[-1]
        return nearest
    hi = next(i for i, level in enumerate(lv) if level > 0.5)
    weight = (0.5 - lv[hi - 1]) / (lv[hi] - lv[hi - 1])
    blended: FloatArray = predictions[hi - 1] + weight * (predictions[hi] - predictions[hi - 1])
    return blended


def evaluate(
    model: str, actuals: npt.ArrayLike, predictions: npt.ArrayLike, levels: Sequence[float]
) -> ForecastQuality:
    """Score stacked quantile ``predictions`` (levels first) against ``actuals`` of any matching shape.

    Entries where the actual or a prediction is not finite are left out, as in ``ForecastQuality.from_observations``.
    """
    act = np.asarray(actuals, dtype=np.float64)
    pred = np.asarray(predictions, dtype=np.float64)
    if pred.shape != (len(levels), *act.shape):
        raise ValueError(f"predictions shape {pred.shape} does not match {len(levels)} levels x actuals {act.shape}")
    ok = np.isfinite(act) & np.all(np.isfinite(pred), axis=0)
    act, pred = act[ok], pred[:, ok]
    lo_hi = (float(levels[0]), float(levels[-1]))
    if act.size == 0:
        nan = float("nan")
        return ForecastQuality(model, 0, nan, {float(lv): nan for lv in levels}, nan, nan, lo_hi)
    losses = pinball_losses(act, pred, levels).mean(axis=1)
    return ForecastQuality(
        model=model,
        n=int(act.size),
        mae=float(np.mean(np.abs(act - median_of(pred, levels)))),
        pinball={float(lv): float(loss) for lv, loss in zip(levels, losses, strict=True)},
        interval_coverage=float(np.mean((act >= pred[0]) & (act <= pred[-1]))),
        upper_coverage=float(np.mean(act <= pred[-1])),
        interval_levels=lo_hi,
    )


@dataclass
class BacktestResult:
    """Everything a backtest saw: per origin the actuals and the stacked quantile predictions, and the costs."""

    model: str
    levels: tuple[float, ...]
    step_s: float
    origins: npt.NDArray[np.int64]  # index of the first forecast step of each origin
    origin_times: FloatArray  # Unix time of that step (= forecast.start)
    actuals: FloatArray  # (n_origins, horizon)
    predictions: FloatArray  # (n_levels, n_origins, horizon)
    fit_seconds: list[float] = field(default_factory=list)  # one entry per (re)fit
    update_seconds: list[float] = field(default_factory=list)
    predict_seconds: list[float] = field(default_factory=list)

    @property
    def horizon_steps(self) -> int:
        return int(self.actuals.shape[1])

    @property
    def quality(self) -> ForecastQuality:
        return evaluate(self.model, self.actuals, self.predictions, self.levels)

    def quality_at_lead(self, lead_steps: int) -> ForecastQuality:
        """Scores of the forecasts ``lead_steps`` ahead only (1 = the first forecast step)."""
        if not 1 <= lead_steps <= self.horizon_steps:
            raise ValueError(f"lead_steps must be in 1..{self.horizon_steps}, got {lead_steps}")
        i = lead_steps - 1
        return evaluate(self.model, self.actuals[:, i], self.predictions[:, :, i], self.levels)

    @property
    def mean_fit_seconds(self) -> float:
        return float(np.mean(self.fit_seconds)) if self.fit_seconds else float("nan")


def origin_indices(
    n: int,
    horizon_steps: int,
    *,
    min_train_steps: int,
    origin_every: int = 1,
    n_origins: int | None = None,
) -> npt.NDArray[np.int64]:
    """Origins (training sizes) ``origin_every`` apart, ending where the last full horizon ends at ``n``.

    With ``n_origins`` the latest ``n_origins`` of them; ValueError when none fits after ``min_train_steps``.
    """
    if horizon_steps < 1 or origin_every < 1 or min_train_steps < 1:
        raise ValueError("horizon_steps, origin_every and min_train_steps must be >= 1")
    last = n - horizon_steps
    if last < min_train_steps:
        raise ValueError(
            f"series of {n} steps is too short for {min_train_steps} training steps plus a {horizon_steps}-step horizon"
        )
    origins = np.arange(last, min_train_steps - 1, -origin_every, dtype=np.int64)[::-1]
    if n_origins is not None:
        if n_origins < 1:
            raise ValueError(f"n_origins must be >= 1, got {n_origins}")
        origins = origins[-n_origins:]
    return origins


def rolling_origin_backtest(
    model: BaseForecaster,
    y: npt.ArrayLike,
    *,
    step_s: float,
    horizon_steps: int,
    start: float = 0.0,
    n_origins: int | None = None,
    origin_every: int = 1,
    min_train_steps: int | None = None,
    max_train_steps: int | None = None,
    refit_every: int = 1,
) -> BacktestResult:
    """Backtest an (unfitted) forecaster on the regular series ``y`` (see the module docstring).

    ``model`` is cloned, never fitted in place. ``min_train_steps`` defaults to half the series. Actuals are the raw
    ``y`` values (NaN where missing, and then left out of the scores); the model sees them through its own gap
    filling.
    """
    arr = as_series(y)
    start, step_s = check_time(start, step_s)
    if refit_every < 1:
        raise ValueError(f"refit_every must be >= 1, got {refit_every}")
    min_train = min_train_steps if min_train_steps is not None else max(1, arr.size // 2)
    origins = origin_indices(
        arr.size, horizon_steps, min_train_steps=min_train, origin_every=origin_every, n_origins=n_origins
    )
    estimator: BaseForecaster = clone(model)
    levels: tuple[float, ...] = ()
    actuals = np.empty((origins.size, horizon_steps))
    predictions: FloatArray | None = None
    result_times = np.empty(origins.size)
    fit_s: list[float] = []
    update_s: list[float] = []
    predict_s: list[float] = []
    label = estimator.label()
    for i, origin in enumerate(origins):
        lo = 0 if max_train_steps is None else max(0, int(origin) - max_train_steps)
        window = arr[lo:origin]
        window_start = start + lo * step_s
        t0 = time.perf_counter()
        if i % refit_every == 0:
            estimator.fit(window, start=window_start, step_s=step_s)
            fit_s.append(time.perf_counter() - t0)
        else:
            estimator.update(window, start=window_start, step_s=step_s)
            update_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        forecast = estimator.predict(horizon_steps)
        predict_s.append(time.perf_counter() - t0)
        if predictions is None:
            levels = forecast.levels
            predictions = np.empty((len(levels), origins.size, horizon_steps))
            label = forecast.model
        for j, level in enumerate(levels):
            predictions[j, i] = forecast.quantiles[level]
        actuals[i] = arr[origin : origin + horizon_steps]
        result_times[i] = forecast.start
    assert predictions is not None  # origin_indices never returns an empty array
    return BacktestResult(
        model=label,
        levels=levels,
        step_s=step_s,
        origins=origins,
        origin_times=result_times,
        actuals=actuals,
        predictions=predictions,
        fit_seconds=fit_s,
        update_seconds=update_s,
        predict_seconds=predict_s,
    )
