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

import bisect
import contextlib
import functools
import math
import warnings
from array import array
from collections.abc import Hashable, Sequence
from typing import ClassVar, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from forecast.preprocessing import FloatArray, as_series, clip_outliers, fill_missing
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
    # True where each level is learnt on its own and the levels never cross (empirical quantiles of residuals): a
    # forecast fitted with fewer levels then has the same values at the levels it keeps, so a caller that reads one
    # level (the simulator) may fit only that one. False where levels can cross and the rearrangement in ``predict``
    # moves values between them (quantile regression), or where that was not checked.
    levels_independent: ClassVar[bool] = False

    # -- public API ------------------------------------------------------------------------------------------------
    def fit(self, y: npt.ArrayLike, *, start: float = 0.0, step_s: float = 60.0) -> Self:
        # All or nothing, as ``update``: a fit that fails leaves the estimator as it was (unfitted, or the previous
        # fit at its own origin), not the previous fit stamped with the new origin, nor a half-fitted one that
        # passes the fitted check and fails in predict.
        kept = dict(self.__dict__)
        try:
            self.levels_ = check_levels(self.quantiles)
            clean = self._prepare(y, start, step_s)
            self._fit(clean)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(kept)
            raise
        return self

    def update(self, y: npt.ArrayLike, *, start: float = 0.0, step_s: float | None = None) -> Self:
        self._check_fitted()
        if step_s is not None and not math.isclose(float(step_s), self.step_s_):
            raise ValueError(f"update() needs the fitted step {self.step_s_} s, got {step_s} s: refit instead")
        # All or nothing: ``_prepare`` moves the origin (start_, n_obs_, last_value_, forecast_start_) before
        # ``_update`` conditions on the new data; an update that fails must leave the previous fit as it was, not
        # that fit stamped with the new origin (its forecast would be shifted in time).
        kept = dict(self.__dict__)
        try:
            clean = self._prepare(y, start, self.step_s_)
            self._update(clean)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(kept)
            raise
        return self

    def predict(self, horizon_steps: int) -> Forecast:
        self._check_fitted()
        if int(horizon_steps) != horizon_steps or horizon_steps < 1:
            raise ValueError(f"horizon_steps must be a positive integer, got {horizon_steps!r}")
        horizon = int(horizon_steps)
        values = np.asarray(self._predict(horizon), dtype=np.float64)
        if values.shape != (len(self.levels_), horizon):
            raise RuntimeError(f"{type(self).__name__}._predict returned shape {values.shape}")
        finite = np.isfinite(values)
        if not finite.all():
            # A diverged fit must not reach the policy as NaN or inf; the last observed value is the safest stand-in.
            values = np.where(finite, values, self.last_value_)
        if self.nonnegative:
            values = np.maximum(values, 0.0)
        if values.shape[0] > 1:
            # Rearrangement (sorting across levels at each step) turns crossing quantiles into valid ones and never
            # increases pinball loss (Chernozhukov, Fernandez-Val & Galichon 2010).
            values = np.sort(values, axis=0)
        if not math.isfinite(self.forecast_start_):
            return Forecast(  # validated: it raises the error
                start=self.forecast_start_,
                step_s=self.step_s_,
                quantiles={level: tuple(values[i].tolist()) for i, level in enumerate(self.levels_)},
                model=self.label(),
            )
        # Finite (NaN replaced, inf turned NaN first), sorted across levels, levels checked by ``fit``: what
        # ``Forecast`` would validate holds already, so it is built without validating again (an update every minute
        # of a simulated fortnight builds 40,000 of them).
        return Forecast._checked(self.forecast_start_, self.step_s_, self.levels_, values.tolist(), self.label())

    def _check_fitted(self) -> None:
        # ``check_is_fitted`` does what this does (the class defines ``__sklearn_is_fitted__``) after generic checks
        # that cost more than an update (about 12 us, twice a minute per model in a simulation)
        if not self.__sklearn_is_fitted__():
            check_is_fitted(self)  # raises its NotFittedError

    def label(self) -> str:
        """Short model name for forecasts, tables and metric labels."""
        return type(self).__name__

    # -- helpers for subclasses ------------------------------------------------------------------------------------
    def _prepare(self, y: npt.ArrayLike, start: float, step_s: float) -> FloatArray:
        start, step_s = check_time(start, step_s)
        arr = fill_missing(as_series(y))  # as_series copied: filled in place
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
def weighted_quantile(
    values: FloatArray, weights: FloatArray, levels: Sequence[float], order: npt.NDArray[np.intp] | None = None
) -> FloatArray:
    """Quantiles of ``values`` under ``weights`` (midpoint interpolation of the weighted empirical CDF).

    ``order``: ``np.argsort(values, kind="stable")`` when the caller already has it (``stable_order``)."""
    if order is None:
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
    residuals: FloatArray,
    levels: Sequence[float],
    step_s: float = 1.0,
    half_life_s: float | None = None,
    hints: OrderHints | None = None,
) -> FloatArray:
    """Empirical quantiles of in-sample errors (ordered oldest to newest) at each level, optionally recency-weighted.

    Weighting recent errors more follows volatility clustering: request rates have calm and bursty days, and
    intervals learnt from the whole history are too narrow on a bursty day (measured on ServeGen m-large: P90
    coverage 82 % unweighted, 86 % with a one-day half-life). 0 when there is no residual to learn from.

    ``hints``: where this set of residuals was learnt before (see ``OrderHints``); the result is the same up to
    float rounding (about 1e-12 relative), and cheap when the residuals are the previous ones with the oldest
    dropped and the newest appended.
    """
    if hints is not None and half_life_s is not None and residuals.size:
        kept = hints.quantiles(residuals, levels, step_s, half_life_s)
        if kept is not None:  # every residual finite
            return kept
    finite = np.isfinite(residuals)
    resid = residuals[finite]
    if resid.size == 0:
        return np.zeros(len(levels))
    weights = recency_weights(residuals.size, step_s, half_life_s)
    if weights is None:
        out: FloatArray = np.quantile(resid, levels)
        return out
    return weighted_quantile(resid, weights[finite], levels)


def sample_index(start: float, step_s: float) -> int:
    """The position of the sample starting at ``start`` on the grid of ``step_s`` steps since the Unix epoch, for
    ``OrderHints``: a window moved forward by k samples moves this by exactly k (``start`` is usually a whole number
    of steps, or a whole number plus a constant part: a metrics delay of half a step makes ``round`` alternate)."""
    return math.floor(start / step_s + 1e-6)


@functools.lru_cache(maxsize=64)
def _cached_recency_weights(count: int, step_s: float, half_life_s: float) -> FloatArray:
    """``recency_weights`` for the rows' plain path, computed once per window size (read-only)."""
    weights = recency_weights(count, step_s, half_life_s)
    assert weights is not None
    weights.setflags(write=False)
    return weights


def _doubles(values: FloatArray) -> array[float]:
    """A compact copy: 8 bytes a value, where a list of Python floats takes 32 (the kept residual sets of one
    model's update job hold hundreds of thousands of them, for as long as the controller runs)."""
    out = array("d")
    out.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
    return out


class SlidingQuantiles:
    """One set of residuals kept sorted with its recency weights, and where each level's quantile was last found,
    so that dropping the oldest residuals and appending the newest costs a few moves instead of a sort and a
    cumulative sum over the whole set.

    The weights halve every ``half_life_s``; they are kept relative to a fixed reference (the newest residual when
    the set was built), so a new residual weighs ``2 ** (age steps since the reference * rate)`` and the others keep
    theirs: the quantiles only depend on weights relative to their total, which this leaves unchanged. Each level
    keeps the index ``j`` of the sorted residual whose midpoint cumulative weight ``M[j] = sum(w[:j]) + w[j] / 2`` is
    the last at or below ``level * total`` and that sum; after an update it moves by about as many places as
    residuals changed. The quantile interpolates between ``j`` and ``j + 1`` as ``weighted_quantile`` does. Sums
    carried across updates drift by rounding: the owner rebuilds after ``MAX_UPDATES`` changed residuals.

    The sorted values and weights are ``array('d')``s, not numpy arrays: an update touches a handful of elements, and
    ``bisect``, ``insert`` and ``del`` on them cost a fraction of numpy's per-call overhead for a slice assignment or
    a ``searchsorted`` (measured on 8,640 residuals: about 6 us per update and quantiles, 10 with numpy arrays). Not
    lists of Python floats either: those take 32 bytes a value instead of 8, and a model's kept sets hold hundreds of
    thousands of values (``phase_naive``, a week of one-minute history: 44 MB per model with lists, 16 with arrays,
    the same values and no slower), kept by the controller's update job for every forecasting service.
    """

    MAX_UPDATES = 4096  # changed residuals before the sums are recomputed from scratch (bounds the rounding drift)
    MAX_CHANGE = 64  # more residuals than this changed at once: a rebuild is cheaper than moving each
    MAX_EXPONENT = 512.0  # log2 of the largest weight a slide may give: rebuilt before 2 ** 1024 overflows a float

    __slots__ = (
        "below",
        "changes",
        "first",
        "index",
        "levels",
        "previous",
        "rate",
        "reference",
        "spacing",
        "total",
        "values",
        "weights",
    )

    def __init__(self, residuals: FloatArray, first: int, spacing: int, levels: tuple[float, ...], rate: float) -> None:
        """Build from ``residuals`` (oldest first, all finite), the first one at position ``first``, the next every
        ``spacing``; ``rate``: the log2 weight gained per residual (``step_s / half_life_s``). ``residuals`` is
        kept, not copied, until the next slide (its oldest values are the ones dropped then): pass an array nobody
        writes to afterwards, as the models' fresh differences are."""
        order = np.argsort(residuals, kind="stable")
        size = residuals.size
        sorted_weights = np.exp2((np.arange(size, dtype=np.float64) - (size - 1)) * rate)[order]
        self.values = _doubles(residuals[order])
        self.weights = _doubles(sorted_weights)
        self.levels, self.rate = levels, rate
        self.reference = first // spacing + size - 1  # the ordinal whose weight is 1
        self.total = float(sorted_weights.sum())
        cumulative = np.cumsum(sorted_weights)
        midpoints = cumulative - 0.5 * sorted_weights
        self.index: list[int] = []
        self.below: list[float] = []
        for level in levels:
            j = min(max(int(np.searchsorted(midpoints, level * self.total, side="right")) - 1, 0), size - 1)
            self.index.append(j)
            self.below.append(float(cumulative[j] - sorted_weights[j]))
        self.previous, self.first, self.spacing, self.changes = residuals, first, spacing, 0

    def slide(self, residuals: FloatArray, first: int) -> bool:
        """Move to ``residuals`` (the first at ``first``): the previous ones without the oldest few, plus new ones.
        False, changing nothing, when that is not what happened or when a rebuild is due: the owner rebuilds."""
        shift, remainder = divmod(first - self.first, self.spacing)
        previous = self.previous
        kept = previous.size - shift
        added = residuals.size - kept
        if (
            remainder
            or shift < 0
            or kept <= 0
            or added < 0
            or shift > self.MAX_CHANGE
            or added > self.MAX_CHANGE
            or self.changes + shift + added > self.MAX_UPDATES
            # the newest weight, 2 ** (ordinal x rate) from the reference: past 2 ** 1023 it overflows (a short
            # half-life reaches it within the MAX_UPDATES), and a rebuild moves the reference to the newest
            or (first // self.spacing + residuals.size - 1 - self.reference) * self.rate > self.MAX_EXPONENT
            # the residuals both hold must be the kept ones to the bit: the oldest are dropped by value, and one that
            # is not there would take its neighbour's place (or run off the end). A model whose residuals are
            # recomputed each update must keep them bit-identical; if it does not, this rebuilds instead.
            or not np.array_equal(residuals[:kept], previous[shift:])
        ):
            return False
        fresh = residuals[kept:].tolist()
        if not all(map(math.isfinite, fresh)):
            return False
        values, weights, index, below = self.values, self.weights, self.index, self.below
        total = self.total
        for x in previous[:shift].tolist():
            # the oldest residual equal to x is the first of its equals: ties are kept in age order
            at = bisect.bisect_left(values, x)
            weight = weights[at]
            del values[at], weights[at]
            total -= weight
            size = len(values)
            for k, j in enumerate(index):
                if at < j:
                    index[k], below[k] = j - 1, below[k] - weight
                elif j >= size:  # the last residual went: step onto the new last
                    index[k], below[k] = size - 1, below[k] - weights[size - 1]
        ordinal = first // self.spacing + kept - self.reference
        rate = self.rate
        for x in fresh:
            weight = 2.0 ** (ordinal * rate)
            ordinal += 1
            at = bisect.bisect_right(values, x)  # after its equals: the newest comes last
            values.insert(at, x)
            weights.insert(at, weight)
            total += weight
            for k, j in enumerate(index):
                if at <= j:
                    index[k], below[k] = j + 1, below[k] + weight
        self.total, self.previous, self.first = total, residuals, first
        self.changes += shift + added
        return True

    def quantile_list(self) -> list[float]:
        """The weighted quantile at each level (midpoint interpolation of the weighted empirical CDF), as a list:
        several sets' lists stack into one array faster than their arrays do."""
        values, weights, total, index, below_at = self.values, self.weights, self.total, self.index, self.below
        last = len(values) - 1
        out = []
        for k, level in enumerate(self.levels):
            j, below, target = index[k], below_at[k], level * total
            wj = weights[j]
            while j > 0 and below + 0.5 * wj > target:
                j -= 1
                wj = weights[j]
                below -= wj
            while j < last:
                wn = weights[j + 1]
                if below + wj + 0.5 * wn > target:
                    break
                below += wj
                j += 1
                wj = wn
            index[k], below_at[k] = j, below
            mid = below + 0.5 * wj
            if mid >= target or j == last:  # at or below the first midpoint, or past the last
                out.append(values[j])
            else:
                lo, hi = values[j], values[j + 1]
                out.append(lo + (hi - lo) * (target - mid) / (0.5 * wj + 0.5 * weights[j + 1]))
        return out


class OrderHints:
    """The residual sets a model learnt its spreads from at its previous ``predict``, kept sorted with their weights
    (``SlidingQuantiles``), to learn them again cheaply after an update.

    A model's residuals at one lag (or one phase and lag) are, after an update that only appended samples, the
    previous residuals with the oldest few dropped and a few new ones appended: the kept set drops and inserts
    those (O(n) moves of memory, no sort, no cumulative sum) and moves each level's position by as many places.
    Measured: about 6 us instead of 65 us for 8,640 residuals. The quantiles are the same as learnt from scratch up
    to float rounding (the weights' sums are carried, not recomputed; about 1e-12 relative).

    The owner (a model) must call ``invalidate`` whenever its series changed other than by appending (``advance``
    does that check), and select a set with ``at`` before every ``quantiles`` call.
    """

    def __init__(self) -> None:
        self._sets: dict[Hashable, SlidingQuantiles] = {}
        self._series: FloatArray | None = None
        self._series_first = 0
        self._key: Hashable = None
        self._first = 0
        self._spacing = 1
        self.reused = 0  # how many sets were slid from a kept one (for tests and benchmarks)

    # A cache, and several MB per model (``SlidingQuantiles``): not shipped with a model pickled between processes (the
    # controller's refit workers send fitted models back); the first update after unpickling learns from scratch.
    def __getstate__(self) -> dict[str, object]:
        return {}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__()  # type: ignore[misc]

    def advance(self, series: FloatArray, first_index: int) -> None:
        """The model's series is now ``series``, its first sample at absolute step ``first_index``: keep the sets
        if the samples both series hold are identical and the series only moved forward, else forget them."""
        previous, previous_first = self._series, self._series_first
        self._series, self._series_first = series, first_index
        if previous is None:
            return
        offset = first_index - previous_first
        overlap = previous.size - offset
        if (
            offset < 0
            or first_index + series.size < previous_first + previous.size
            or overlap <= 0
            or not (np.array_equal(series[:overlap], previous[offset:]))
        ):
            self._sets.clear()

    def invalidate(self) -> None:
        self._sets.clear()
        self._series = None

    def at(self, key: Hashable, first_index: int, spacing: int = 1) -> OrderHints:
        """Select the residual set ``key`` (e.g. the lag): its first residual belongs to the origin at absolute step
        ``first_index``, the next ones every ``spacing`` steps. Returns self, for ``residual_offsets(..., hints=)``."""
        self._key, self._first, self._spacing = key, first_index, spacing
        return self

    def quantiles(
        self, residuals: FloatArray, levels: Sequence[float], step_s: float, half_life_s: float, row: int = -1
    ) -> FloatArray | None:
        """``residual_offsets`` of the selected set (``row``: of that row of it, ``residual_offset_rows``) from the
        kept set slid forward, or learnt from scratch and kept; None (and forgotten) when a residual is not
        finite."""
        found = self.quantile_list(residuals, levels, step_s, half_life_s, row)
        return None if found is None else np.array(found)

    def quantile_list(
        self, residuals: FloatArray, levels: Sequence[float], step_s: float, half_life_s: float, row: int = -1
    ) -> list[float] | None:
        """``quantiles`` as a list."""
        key, levels = (self._key, row), tuple(levels)
        rate = step_s / half_life_s
        kept = self._sets.get(key)
        if (
            kept is not None
            and kept.spacing == self._spacing
            and kept.levels == levels
            and kept.rate == rate
            and kept.slide(residuals, self._first)
        ):
            self.reused += 1
            return kept.quantile_list()
        if not np.isfinite(residuals).all():  # NaN and +-inf take the plain path, which masks them
            self._sets.pop(key, None)
            return None
        built = SlidingQuantiles(residuals, self._first, self._spacing, levels, rate)
        self._sets[key] = built
        return built.quantile_list()


def residual_offset_rows(
    series: FloatArray,
    first: int,
    spacing: int,
    count: int,
    lags: Sequence[int],
    levels: Sequence[float],
    step_s: float,
    half_life_s: float | None,
    hints: OrderHints | None = None,
) -> FloatArray:
    """``residual_offsets`` of several lags over the same origins, in one pass: row ``r`` is
    ``residual_offsets(series[o + lags[r]] - series[o], levels, step_s, half_life_s)`` for the ``count`` origins
    ``o = first, first + spacing, ...`` (every ``o + lags[r]`` inside ``series``); shape
    ``(len(lags), len(levels))``. ``hints`` (selected with ``OrderHints.at``) keeps each row's set."""
    lag_array = np.asarray(lags, dtype=np.intp)
    bases = series[first : first + spacing * count : spacing] if count else series[:0]
    if count and np.array_equal(lag_array, np.arange(lags[0], lags[0] + len(lags))) and series.flags.c_contiguous:
        # consecutive lags: row r is series[first + lags[0] + r :: spacing], a strided view, no index arrays
        # (np.ndarray over the series' buffer: as_strided does the same with about 5 us of Python around it)
        step = series.strides[0]
        ahead = np.ndarray(
            (len(lags), count), np.float64, series, (first + lags[0]) * step, (step, step * spacing)
        )
        residuals = ahead - bases[None, :]
    else:
        origins = first + spacing * np.arange(count)
        residuals = series[origins[None, :] + lag_array[:, None]] - bases[None, :]
    if hints is not None and half_life_s is not None and count:
        rows = [hints.quantile_list(values, levels, step_s, half_life_s, row=r) for r, values in enumerate(residuals)]
        if all(row is not None for row in rows):
            return np.array(rows)
    if half_life_s is None or count == 0 or not np.isfinite(residuals).all():
        return np.stack([residual_offsets(row, levels, step_s, half_life_s) for row in residuals])
    order = np.argsort(residuals, axis=1, kind="stable")
    v = residuals.ravel().take(order + (np.arange(len(lag_array)) * count)[:, None])
    w = _cached_recency_weights(count, step_s, half_life_s).take(order)
    cdf = (np.cumsum(w, axis=1) - 0.5 * w) / w.sum(axis=1, keepdims=True)
    at = np.asarray(levels, dtype=np.float64)
    return np.stack([np.interp(at, cdf[r], v[r]) for r in range(len(lag_array))])


def kept_order_hints(model: BaseForecaster) -> OrderHints:
    """The model's ``order_hints_`` if it has them (a refit, or ones handed over with ``carry_order_hints``), else
    new ones. They only make sorting cheaper; ``OrderHints.advance`` forgets whatever the new series invalidates."""
    hints = getattr(model, "order_hints_", None)
    return hints if isinstance(hints, OrderHints) else OrderHints()


def carry_order_hints(previous: object, new: BaseForecaster) -> None:
    """Hand the sorted residual sets a fitted model kept (``OrderHints``) to a new, unfitted model of the same class
    about to be fitted on the same series moved forward (a periodic refit), so the refit does not sort every residual
    set from scratch. Does nothing for models without hints. The forecasts are the same either way (up to float
    rounding)."""
    hints = getattr(previous, "order_hints_", None)
    if isinstance(hints, OrderHints) and type(previous) is type(new):
        new.order_hints_ = hints


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
