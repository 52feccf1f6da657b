"""A count-aware level model: exponential smoothing of a request rate, with negative-binomial quantiles.

A request rate per step is a count of arrivals divided by the interval it was counted over. Around a slowly moving
level those counts are Poisson, usually over-dispersed (sessions and retries come in bursts), so the last value of
the series is a noisy estimate of the level, and past changes of a noisy series are a noisy basis for intervals.
``CountLevel`` therefore

* estimates the level with simple exponential smoothing, its smoothing constant chosen on the training series by
  rolling-origin cross-validation of the h-step forecasts it will be asked for (leads ``1..max_horizon_steps``,
  squared error, recent origins weighing more): the smoothing that averages out as much noise as the level's own
  movement allows;
* forecasts that level flat, and gives quantiles from a predictive distribution rather than from past residuals:
  negative-binomial counts at the forecast level over the counting interval. Their variance is the one-step
  variance of the smoothed model, learnt from the history as a ratio to the level (Pearson residuals, so the spread
  follows the level the way Poisson noise does), times the local-level growth ``1 + (h - 1) alpha^2`` of the
  level's own uncertainty with the lead (the same factor as Holt-Winters' intervals in ``forecast.statistical``).

Nothing here assumes the series really are counts: the variance-to-level ratio is estimated, so a smooth series
gets a wide or narrow negative binomial as its residuals demand, and a series whose variance is below the Poisson
floor (or whose level is not positive) gets normal quantiles with the same variance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from forecast.base import DEFAULT_QUANTILES, BaseForecaster, recency_weights
from forecast.preprocessing import DAY_S, FloatArray

#: Smoothing constants tried by cross-validation: from heavy averaging (a half-life of ~34 steps) to the last value.
DEFAULT_ALPHAS: tuple[float, ...] = (0.02, 0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 1.0)


def smooth(y: FloatArray, alpha: float, initial: float) -> FloatArray:
    """Exponentially smoothed level after each observation: ``l[t] = alpha * y[t] + (1 - alpha) * l[t - 1]``."""
    from scipy.signal import lfilter

    level, _ = lfilter([alpha], [1.0, alpha - 1.0], y, zi=[(1.0 - alpha) * initial])
    out: FloatArray = np.asarray(level, dtype=np.float64)
    return out


def count_quantiles(mean: float, variance: FloatArray, count_interval_s: float, levels: Sequence[float]) -> FloatArray:
    """Quantiles (levels x leads, rate units) of counts over ``count_interval_s`` with this rate mean and variance.

    Negative binomial where the count variance exceeds the mean (the Poisson limit as they meet); normal with the
    same variance where it does not or the mean is not positive.
    """
    from scipy.stats import nbinom, norm

    lv = np.asarray(levels, dtype=np.float64)[:, None]
    var = np.asarray(variance, dtype=np.float64)[None, :]
    normal: FloatArray = mean + norm.ppf(lv) * np.sqrt(var)
    count_mean = mean * count_interval_s
    count_var = var * count_interval_s**2
    over = count_var > count_mean * (1.0 + 1e-9)
    if count_mean <= 0 or not over.any():
        return np.broadcast_to(normal, (lv.size, var.size)).copy()
    safe_var = np.where(over, count_var, 2.0 * count_mean)
    p = count_mean / safe_var
    n = count_mean * p / (1.0 - p)
    negbin: FloatArray = nbinom.ppf(lv, n, p) / count_interval_s
    out: FloatArray = np.where(over, negbin, normal)
    return out


class CountLevel(BaseForecaster):
    """Flat forecast of an exponentially smoothed level, quantiles from over-dispersed counts (see module docstring).

    ``alphas``: the smoothing constants cross-validated at each ``fit`` (one value = fixed smoothing); the chosen
    one is ``alpha_``. ``max_horizon_steps``: the leads the cross-validation scores (``make_model(...,
    horizon_steps=H)`` sets it to the forecast horizon). ``count_interval_s``: seconds the counts behind one value
    were counted over (None = the step, i.e. the series is counts per step divided by the step). ``burn_in``: the
    first steps, where the level still remembers its initial value (the median of those steps), are not scored.
    Learnt: ``alpha_``, ``dispersion_`` (variance-to-mean ratio of one-step errors, in counts: 1 = Poisson),
    ``level_`` (the smoothed level at the last observation).
    """

    def __init__(
        self,
        alphas: Sequence[float] = DEFAULT_ALPHAS,
        max_horizon_steps: int = 12,
        count_interval_s: float | None = None,
        burn_in: int = 10,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        residual_half_life_s: float | None = DAY_S,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.alphas = alphas
        self.max_horizon_steps = max_horizon_steps
        self.count_interval_s = count_interval_s
        self.burn_in = burn_in
        self.quantiles = quantiles
        self.residual_half_life_s = residual_half_life_s
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    def _fit(self, y: FloatArray) -> None:
        alphas = tuple(float(a) for a in self.alphas)
        if not alphas or any(not 0.0 < a <= 1.0 for a in alphas):
            raise ValueError(f"alphas must be smoothing constants in (0, 1], got {self.alphas!r}")
        if int(self.max_horizon_steps) < 1 or int(self.burn_in) < 0:
            raise ValueError(
                f"max_horizon_steps must be >= 1 and burn_in >= 0, got {self.max_horizon_steps}, {self.burn_in}"
            )
        interval = self.step_s_ if self.count_interval_s is None else float(self.count_interval_s)
        if not np.isfinite(interval) or interval <= 0:
            raise ValueError(f"count_interval_s must be > 0 or None, got {self.count_interval_s}")
        self.burn_in_ = int(self.burn_in)
        if y.size < self.burn_in_ + 3:
            raise ValueError(f"CountLevel needs at least {self.burn_in_ + 3} observations, got {y.size}")
        self.count_interval_s_ = interval
        self.alpha_ = self._cross_validate(y, alphas) if len(alphas) > 1 else alphas[0]
        self._update(y)

    def _initial(self, y: FloatArray) -> float:
        # The median of the first steps: a partial first bin (a log that starts mid-interval) must not seed the level.
        return float(np.median(y[: max(1, self.burn_in_)]))

    def _cross_validate(self, y: FloatArray, alphas: Sequence[float]) -> float:
        burn, n = self.burn_in_, y.size
        horizon = min(int(self.max_horizon_steps), n - burn - 1)
        future = sliding_window_view(y, horizon + 1)[burn:, 1:]  # row i: y[burn + i + 1 .. burn + i + horizon]
        origins = future.shape[0]
        weights = recency_weights(origins, self.step_s_, self.residual_half_life_s)
        weights = np.ones(origins) if weights is None else weights
        initial = self._initial(y)
        scores = []
        for alpha in alphas:
            level = smooth(y, alpha, initial)[burn : burn + origins]
            sq_error = np.mean((future - level[:, None]) ** 2, axis=1)
            scores.append(float(np.dot(weights, sq_error) / weights.sum()))
        return float(alphas[int(np.argmin(scores))])

    def _floor(self) -> float:
        # One count per interval: near zero, Poisson noise does not vanish with the level.
        return 1.0 / self.count_interval_s_

    def _update(self, y: FloatArray) -> None:
        level = smooth(y, self.alpha_, self._initial(y))
        self.level_ = float(level[-1])
        burn = min(self.burn_in_, max(0, y.size - 2))
        errors = y[burn + 1 :] - level[burn:-1]
        if errors.size == 0:
            if not hasattr(self, "dispersion_"):
                self.dispersion_ = 1.0
            return
        # Divided by the larger of the level before the step and the value observed: a level change (demand
        # leaving an idle night) is one large error on a level near zero, and divided by that level alone it read
        # as a dispersion of thousands, which put the median of steady demand at 0 for days after.
        pearson = errors**2 / np.maximum(np.maximum(level[burn:-1], y[burn + 1 :]), self._floor())
        weights = recency_weights(errors.size, self.step_s_, self.residual_half_life_s)
        mean_sq = float(np.mean(pearson)) if weights is None else float(np.dot(weights, pearson) / weights.sum())
        # In counts: Var(count) = dispersion * mean count.
        self.dispersion_ = mean_sq * self.count_interval_s_

    def _predict(self, horizon: int) -> FloatArray:
        lead = np.arange(1, horizon + 1, dtype=np.float64)
        one_step_var = self.dispersion_ * max(self.level_, self._floor()) / self.count_interval_s_
        variance: FloatArray = one_step_var * (1.0 + (lead - 1.0) * self.alpha_**2)
        out = count_quantiles(self.level_, variance, self.count_interval_s_, self.levels_)
        # One burst after a long idle stretch makes the dispersion huge, and a negative binomial that skewed puts
        # even its P99 at 0 while its mean is the level: a scaler provisioning an upper quantile would provision
        # nothing as demand starts. A level above the median is never below the forecast mean.
        upper = np.asarray(self.levels_) > 0.5
        out[upper] = np.maximum(out[upper], self.level_)
        return out
