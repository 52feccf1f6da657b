"""Cleaning a demand series before fitting: gap filling, outlier clipping, period detection.

All functions take a 1-D array of a *regular* series (one value per ``step_s`` seconds, NaN marking a missing
sample) and return new arrays; the input is never modified.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatArray = npt.NDArray[np.float64]

DAY_S = 86_400.0
WEEK_S = 604_800.0

# 1.4826 * MAD estimates the standard deviation of normal data; keeps ``k`` in familiar "sigmas".
_MAD_TO_SIGMA = 1.4826


def as_series(y: npt.ArrayLike) -> FloatArray:
    """A float64 1-D copy of ``y`` (±inf become NaN, i.e. missing). ValueError for other shapes or an empty series."""
    arr = np.array(y, dtype=np.float64, copy=True)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D series, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("expected a non-empty series")
    finite = np.isfinite(arr)
    if not finite.all():  # the usual series has no inf: skip the masked write
        arr[~finite] = np.nan
    return arr


def fill_gaps(y: npt.ArrayLike) -> FloatArray:
    """Fill missing samples (NaN, ±inf): linear interpolation inside, hold the nearest value at either end.

    Holding (rather than zero-filling) matters: a scrape gap is not a drop in demand. ValueError when nothing is
    observed at all.
    """
    return fill_missing(as_series(y))


def fill_missing(arr: FloatArray) -> FloatArray:
    """``fill_gaps`` of a series ``as_series`` returned (float64, 1-D, non-empty, ±inf already NaN), in place; returns
    ``arr``. For callers that hold such a fresh copy: one copy and one pass fewer than ``fill_gaps``."""
    missing = np.isnan(arr)
    if not missing.any():
        return arr
    if missing.all():
        raise ValueError("the series has no finite value to fill gaps from")
    idx = np.arange(arr.size)
    arr[missing] = np.interp(idx[missing], idx[~missing], arr[~missing])
    return arr


def clip_outliers(y: npt.ArrayLike, k: float = 6.0, window: int = 11) -> FloatArray:
    """Clip samples further than ``k`` robust sigmas from a centred rolling median of ``window`` samples.

    A single scrape glitch (a counter reset, a 10x spike) would otherwise drag level and seasonal estimates for a
    whole season. The sigma is the MAD of the residuals around the rolling median over the whole series, so real
    daily peaks (which the rolling median follows) survive. NaN stays NaN.

    The newest ``window // 2`` samples are never clipped: there the window is one-sided, so its median lags a real
    ramp, and a jump at the very end cannot yet be told from a glitch. Clipping a real surge would make every model
    under-forecast it, which is the expensive mistake for a scaler.
    """
    arr = as_series(y)
    if k <= 0 or window < 1:
        raise ValueError(f"k must be > 0 and window >= 1, got k={k} window={window}")
    median = pd.Series(arr).rolling(window, center=True, min_periods=1).median().to_numpy()
    resid = arr - median
    finite = np.isfinite(resid)
    if not finite.any():
        return arr
    mad = float(np.median(np.abs(resid[finite] - np.median(resid[finite]))))
    scale = _MAD_TO_SIGMA * mad
    if scale <= 0:
        # More than half the residuals are exactly 0 (flat or step data): nothing is an outlier by this rule.
        return arr
    clipped = np.where(finite, np.clip(arr, median - k * scale, median + k * scale), arr)
    newest = window // 2
    if newest:
        clipped[-newest:] = arr[-newest:]
    out: FloatArray = clipped
    return out


def _autocorrelation(x: FloatArray, max_lag: int) -> FloatArray:
    """Sample autocorrelation for lags 0..max_lag via FFT (Wiener-Khinchin), O(n log n)."""
    x = x - x.mean()
    n = x.size
    size = 1 << int(np.ceil(np.log2(2 * n - 1)))
    spectrum = np.fft.rfft(x, size)
    acov = np.fft.irfft(spectrum * np.conjugate(spectrum), size)[: max_lag + 1]
    if acov[0] <= 0:
        return np.zeros(max_lag + 1)
    # Dividing by the overlap length (n - lag), not n, keeps long lags comparable to short ones.
    acf: FloatArray = acov / acov[0] * n / (n - np.arange(max_lag + 1))
    return acf


def seasonal_strength(y: npt.ArrayLike, step_s: float, period_s: float) -> float:
    """Autocorrelation at lag ``period_s`` after removing the trend (a centred moving average of one period).

    Near 1 for a clean seasonal pattern, near 0 for noise. NaN when the series holds fewer than two periods.
    """
    arr = fill_gaps(y)
    lag = round(period_s / step_s)
    if lag < 2 or arr.size < 2 * lag:
        return float("nan")
    # A moving average over exactly one period cancels that period's pattern and keeps the trend: subtracting it
    # leaves the seasonal part plus noise (classical decomposition), so a trend cannot fake a high correlation.
    trend = pd.Series(arr).rolling(lag, center=True, min_periods=lag // 2 + 1).mean().to_numpy()
    detrended = arr - trend
    detrended = detrended[np.isfinite(detrended)]
    if detrended.size <= lag or np.allclose(detrended, detrended[0]):
        return float("nan") if detrended.size <= lag else 0.0
    return float(_autocorrelation(detrended, lag)[lag])


def detect_periods(
    y: npt.ArrayLike,
    step_s: float,
    candidates_s: tuple[float, ...] = (DAY_S, WEEK_S),
    min_strength: float = 0.3,
    min_gain: float = 0.1,
) -> tuple[float, ...]:
    """Which of the candidate periods (seconds) the series shows, strongest first.

    A candidate counts when the series holds two full periods and its ``seasonal_strength`` is at least
    ``min_strength``. A longer candidate that is a multiple of an already detected shorter one (a week of a daily
    pattern) must also *predict* better: a purely daily series correlates at a week's lag too, so the week is kept
    only if the seasonal-naive error at a week's lag is at least ``min_gain`` (10 %) below the error at a day's lag,
    measured on the same samples (e.g. quiet weekends that a day-ago copy gets wrong on Saturday and Monday).
    """
    if step_s <= 0:
        raise ValueError(f"step_s must be > 0, got {step_s}")
    arr = fill_gaps(y)
    strengths: dict[float, float] = {}
    for period in sorted(candidates_s):
        strength = seasonal_strength(arr, step_s, period)
        if not np.isfinite(strength) or strength < min_strength:
            continue
        nested = [p for p in strengths if _is_multiple(period, p)]
        # kept only when it beats every shorter period it nests by min_gain: "not worse by more than" kept a week
        # beside an exact daily profile, where both errors are 0 (or float noise: below 1e-9 of the variance)
        noise = 1e-9 * float(np.var(arr))
        if any(
            not _lag_error(arr, step_s, period, period) < (1.0 - min_gain) * _lag_error(arr, step_s, p, period)
            or _lag_error(arr, step_s, p, period) <= noise
            for p in nested
        ):
            continue
        strengths[period] = strength
    return tuple(sorted(strengths, key=lambda p: -strengths[p]))


def _lag_error(arr: FloatArray, step_s: float, lag_s: float, skip_s: float) -> float:
    """Mean squared seasonal-naive error at lag ``lag_s``, on the samples after the first ``skip_s`` seconds."""
    lag, skip = round(lag_s / step_s), round(skip_s / step_s)
    diff = arr[skip:] - arr[skip - lag : arr.size - lag]
    return float(np.mean(diff * diff))


def dominant_periods(y: npt.ArrayLike, step_s: float, top: int = 3) -> tuple[float, ...]:
    """Periods (seconds) of the ``top`` strongest periodogram peaks (FFT of the mean-removed series).

    For discovery and reports; ``detect_periods`` is the decision rule. Only periods that fit at least twice in the
    series are considered.
    """
    arr = fill_gaps(y)
    n = arr.size
    if n < 4:
        return ()
    power = np.abs(np.fft.rfft(arr - arr.mean())) ** 2
    freqs = np.fft.rfftfreq(n, d=step_s)
    # Bin k >= 2 means at least two cycles in the series; bin 0 is the mean.
    candidates = np.arange(2, power.size)
    if candidates.size == 0:
        return ()
    order = candidates[np.argsort(power[candidates])[::-1]][:top]
    return tuple(float(1.0 / freqs[k]) for k in order if power[k] > 0)


def _is_multiple(long: float, short: float) -> bool:
    ratio = long / short
    return ratio > 1.0 and abs(ratio - round(ratio)) < 1e-6
