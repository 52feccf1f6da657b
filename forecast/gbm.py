"""Quantile gradient boosting (scikit-learn ``HistGradientBoostingRegressor(loss="quantile")``) on lag features.

Strategy: **direct multi-horizon, pooled over leads**. One model per quantile level learns
``y[t + h] - level(t)`` from features known at the origin ``t`` plus the lead ``h`` and the calendar of the target
time ``t + h``; training rows are all (origin, lead) pairs for ``h = 1..max_horizon_steps``. Compared with a recursive
model this never feeds its own predictions back (no error compounding, and quantiles stay quantiles), and compared
with one model per lead it costs one fit per level instead of ``levels x leads``. Leads beyond ``max_horizon_steps``
reuse the longest trained lead.

Features (all relative to ``level(t)``, the mean of the last ``level_window`` values, so trees learn shapes that
carry over between quiet and busy periods; the level itself is a feature too, because noise grows with demand):
the last ``lags`` values, the mean and standard deviation of that window, for each seasonal period the value at the
same phase one or more seasons before the target (smoothed over 3 steps, never reaching past ``t``), time of day
and day of week of the target as sin/cos of the absolute Unix time, and the lead ``h``. Features that need history
the series does not have are NaN, which the histogram booster handles natively.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from forecast.base import DEFAULT_QUANTILES, BaseForecaster, coarsen, expand, resample_factor, weighted_quantile
from forecast.preprocessing import DAY_S, WEEK_S, FloatArray

_SEASONAL_SMOOTH = 3


class QuantileGBM(BaseForecaster):
    """One ``HistGradientBoostingRegressor(loss="quantile")`` per level on lag and calendar features (direct strategy).

    Training rows beyond ``max_rows`` are subsampled (seeded by ``random_state``) to bound the refit cost.

    Calibration (conformalised quantile regression, one-sided per level): quantile boosting fits its training rows
    too well, so its intervals are too narrow out of sample (P10-P90 covered 59 % instead of 80 % on ServeGen
    m-large). The newest ``calibration_fraction`` of the series is held out of training; for each level the
    recency-weighted (``residual_half_life_s``) level-quantile of the held-out errors ``y - q(x)`` is added to that
    level's predictions (``shifts_``). 0 disables it and trains on everything.

    ``n_threads`` limits OpenMP threads during fit/predict (None = library default). The default is 1: refits run in
    parallel processes across series, and OpenMP threads spinning against each other on a busy 2-core node were
    several times slower than one thread.
    """

    def __init__(
        self,
        lags: int = 12,
        level_window: int = 6,
        periods_s: Sequence[float] = (DAY_S, WEEK_S),
        max_horizon_steps: int = 12,
        max_iter: int = 100,
        learning_rate: float = 0.1,
        max_leaf_nodes: int = 15,
        min_samples_leaf: int = 20,
        max_rows: int = 20_000,
        calibration_fraction: float = 0.2,
        resample_s: float | None = None,
        n_threads: int | None = 1,
        random_state: int = 0,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        residual_half_life_s: float | None = DAY_S,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.lags = lags
        self.level_window = level_window
        self.periods_s = periods_s
        self.max_horizon_steps = max_horizon_steps
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.max_rows = max_rows
        self.calibration_fraction = calibration_fraction
        self.resample_s = resample_s
        self.n_threads = n_threads
        self.random_state = random_state
        self.quantiles = quantiles
        self.residual_half_life_s = residual_half_life_s
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    # -- features ------------------------------------------------------------------------------------------------
    def _features(self, y: FloatArray, first_time: float, origins: np.ndarray, leads: np.ndarray) -> FloatArray:
        """Feature rows for (origin index, lead) pairs on series ``y`` whose sample 0 starts at ``first_time``."""
        lags, window = self.lags_, self.level_window_
        n = y.size
        csum = np.concatenate(([0.0], np.cumsum(y)))
        csum2 = np.concatenate(([0.0], np.cumsum(y * y)))
        lo_level = np.maximum(origins + 1 - window, 0)
        level = (csum[origins + 1] - csum[lo_level]) / (origins + 1 - lo_level)
        lo_lag = np.maximum(origins + 1 - lags, 0)
        count = origins + 1 - lo_lag
        mean = (csum[origins + 1] - csum[lo_lag]) / count
        var = np.maximum((csum2[origins + 1] - csum2[lo_lag]) / count - mean * mean, 0.0)
        cols: list[FloatArray] = [level, mean - level, np.sqrt(var), leads.astype(np.float64)]
        for i in range(lags):
            idx = origins - i
            cols.append(np.where(idx >= 0, y[np.maximum(idx, 0)] - level, np.nan))
        # Smoothed seasonal copies: mean of y[j-2..j] where j = target - k * period, the latest such j <= origin.
        targets = origins + leads
        for period in self.seasonal_steps_:
            cycles = -(-leads // period)
            src = targets - cycles * period
            lo = np.maximum(src - (_SEASONAL_SMOOTH - 1), 0)
            valid = src >= 0
            safe_src = np.clip(src, 0, n - 1)
            smooth = (csum[safe_src + 1] - csum[np.minimum(lo, safe_src)]) / (safe_src + 1 - np.minimum(lo, safe_src))
            cols.append(np.where(valid, smooth - level, np.nan))
        target_time = first_time + targets * self.step_
        for calendar_period in (DAY_S, WEEK_S):
            angle = 2.0 * np.pi * (target_time % calendar_period) / calendar_period
            cols.extend((np.sin(angle), np.cos(angle)))
        return np.column_stack(cols)

    # -- fit / update / predict ------------------------------------------------------------------------------------
    def _fit(self, y: FloatArray) -> None:
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        if int(self.lags) < 1 or int(self.level_window) < 1 or int(self.max_horizon_steps) < 1:
            raise ValueError("lags, level_window and max_horizon_steps must be >= 1")
        self.lags_, self.level_window_ = int(self.lags), int(self.level_window)
        self.factor_ = resample_factor(self.step_s_, self.resample_s)
        self.step_ = self.step_s_ * self.factor_
        self.max_lead_ = max(1, -(-int(self.max_horizon_steps) // self.factor_))
        coarse, drop = coarsen(y, self.factor_)
        # A period the series cannot show twice gives only NaN features: leave it out.
        self.seasonal_steps_ = tuple(
            round(float(p) / self.step_)
            for p in self.periods_s
            if float(p) >= 2 * self.step_ and coarse.size * self.step_ >= 2 * float(p)
        )
        first_time = self.start_ + drop * self.step_s_
        rng = np.random.default_rng(self.random_state)
        fraction = float(self.calibration_fraction)
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"calibration_fraction must be in [0, 1), got {fraction}")
        # Targets at or after ``cut`` are never trained on when calibrating: their errors are out of sample.
        cut = coarse.size - round(fraction * coarse.size) if fraction > 0 else coarse.size
        min_origin = min(self.lags_, coarse.size - 2)
        origin_list, lead_list = [], []
        for lead in range(1, self.max_lead_ + 1):
            origins = np.arange(min_origin, coarse.size - lead)
            origin_list.append(origins)
            lead_list.append(np.full(origins.size, lead))
        origins = np.concatenate(origin_list)
        leads = np.concatenate(lead_list)
        train_idx = np.flatnonzero(origins + leads < cut)
        cal_idx = np.flatnonzero(origins >= cut) if fraction > 0 else np.empty(0, dtype=np.int64)
        if train_idx.size < 2 * int(self.min_samples_leaf) or (fraction > 0 and cal_idx.size < 10):
            raise ValueError(f"QuantileGBM needs more data: {train_idx.size} training rows from {coarse.size} samples")
        # Subsample (origin, lead) pairs before building features: at one-minute resolution with an hour of leads
        # there are over a million pairs, and building all of their features cost more than the boosting.
        if train_idx.size > int(self.max_rows):
            train_idx = np.sort(rng.choice(train_idx, size=int(self.max_rows), replace=False))
        if cal_idx.size > int(self.max_rows) // 2:
            cal_idx = np.sort(rng.choice(cal_idx, size=int(self.max_rows) // 2, replace=False))
        train_x = self._features(coarse, first_time, origins[train_idx], leads[train_idx])
        train_y = coarse[origins[train_idx] + leads[train_idx]] - train_x[:, 0]
        self.models_: list[Any] = []
        with threadpool_limits(limits=self.n_threads, user_api="openmp"):
            for q in self.levels_:
                model = HistGradientBoostingRegressor(
                    loss="quantile",
                    quantile=q,
                    max_iter=int(self.max_iter),
                    learning_rate=float(self.learning_rate),
                    max_leaf_nodes=int(self.max_leaf_nodes),
                    min_samples_leaf=int(self.min_samples_leaf),
                    early_stopping=False,
                    random_state=self.random_state,
                )
                self.models_.append(model.fit(train_x, train_y))
            self.shifts_ = np.zeros(len(self.levels_))
            if fraction > 0:
                cal_x = self._features(coarse, first_time, origins[cal_idx], leads[cal_idx])
                cal_y = coarse[origins[cal_idx] + leads[cal_idx]] - cal_x[:, 0]
                # Age of each held-out error = how long before the end of the series its target was.
                age_steps = coarse.size - 1 - (origins[cal_idx] + leads[cal_idx])
                weights = (
                    np.ones(cal_idx.size)
                    if self.residual_half_life_s is None
                    else np.exp2(-age_steps * self.step_ / float(self.residual_half_life_s))
                )
                for i, (q, model) in enumerate(zip(self.levels_, self.models_, strict=True)):
                    scores = cal_y - model.predict(cal_x)
                    self.shifts_[i] = weighted_quantile(scores, weights, [q])[0]
        self._update(y)

    def _update(self, y: FloatArray) -> None:
        coarse, drop = coarsen(y, self.factor_)
        # Enough history for every feature of the longest trained lead plus a few seasons for later leads.
        longest = max(self.seasonal_steps_, default=0)
        keep = (
            max(self.lags_, self.level_window_) + longest * (2 + self.max_lead_ // max(longest, 1)) + _SEASONAL_SMOOTH
        )
        cut = max(0, coarse.size - keep)
        self.history_ = coarse[cut:].copy()
        self.history_start_ = self.start_ + (drop + cut * self.factor_) * self.step_s_

    def _predict(self, horizon: int) -> FloatArray:
        from threadpoolctl import threadpool_limits

        coarse_h = -(-horizon // self.factor_)
        leads = np.arange(1, coarse_h + 1)
        origins = np.full(coarse_h, self.history_.size - 1)
        features = self._features(self.history_, self.history_start_, origins, leads)
        # Past the longest trained lead the trees have never seen the lead value; present the longest they know.
        features[:, 3] = np.minimum(leads, self.max_lead_)
        level = features[:, 0]
        with threadpool_limits(limits=self.n_threads, user_api="openmp"):
            values = np.stack(
                [
                    level + model.predict(features) + shift
                    for model, shift in zip(self.models_, self.shifts_, strict=True)
                ]
            )
        out: FloatArray = expand(values, self.factor_, horizon)
        return out
