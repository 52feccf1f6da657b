"""Naive forecast with phase-aware quantiles: demand that changes at the edges of fixed windows.

Much request traffic moves in steps at fixed boundaries: batch clients and cron jobs start on the hour or every ten
minutes, and traces aggregated per window (ServeGen publishes one rate per 10-minute window) jump at every window
edge and hardly move in between. A forecaster whose intervals are the same at every phase must then carry the
edge-jump spread all the time, and a scaler that provisions its upper quantile pays for that headroom around the
clock. ``PhaseNaive`` keeps the naive point forecast (the last value) but learns the spread of the change from the
origin to each lead *separately for the origin's phase* within a short period, so the interval is wide only where
the history shows the series jumps. When no period explains the changes (``detect_change_period`` finds none), it is
the naive forecast with the usual empirical quantiles (``LastValue``).

Where there is a period, changes are learnt as ratios (log space) by default, because the size of a jump scales with
the level: a regime twice as busy jumps twice as far. Without one, they are differences, as ``LastValue`` learns them.

*Mean reversion* (``reversion_periods``; with ratios only): a window well above the level of the last few windows is
more often followed by a fall than a rise, and one well below by a rise. The change at each (origin phase, lead) is
regressed on the origin's *deviation* -- its log level less the mean log level of the last ``reversion_periods``
periods -- and its quantiles are learnt from the changes less that part; the forecast moves by the slope times the
deviation at the origin: the band before an edge is lower after a rise, higher after a fall. Only a slope towards the
mean is kept (negative; else none, and the quantiles are the plain ones). The slopes are parameters: estimated by
``fit`` (a refit), kept by ``update``. A deviation whose span holds an idle sample is unknown (the return from a gap
is no reversion). It is what the hindsight-tuned causal policy of ``autoscaler.sim.bounds`` points to (edge margins
that shrink above the recent mean), learnt by each service from its own history instead of tuned.

**On by default since stop 52** (``reversion_periods=6``; ``modelParams: {reversion_periods: null}`` turns it off).
Measured at stop 51 with 6 periods: the packaged default scenario (ServeGen m-large, 14 days, P99 at a 90 s cold start)
99.61 % of requests within SLO at 1.254x the oracle's GPU-hours and 6,541 scaling actions -> 99.63 % at 1.234x and
6,148, the trace matrix's m-large rows 1-2 % fewer GPU-hours, lower pinball loss on every trace with a period. It
shipped off at stop 51 because on the packaged mixed inference + training scenario the controller then ran 14 % less
training (three training seeds, one inference path: 2,104 -> 1,800 GPU-hours) -- its replicas left on three nodes
instead of two, which nothing there gathers again. Stop 52 varied the inference path as well (``bench_arbitration
--paths wide``: six paths x three seeds): mean training done 1,844 GPU-hours either way, lost work 6.3 -> 2.1, within
SLO 99.67 -> 99.72 %, total cost 32 -> 21 $ -- the packaged path is one of those on which it runs less, others run
more (trace scale 0.08: 1,834 -> 2,164). No systematic cost is left to keep it off for (``benchmarks/README.md``,
*Trace matrix*, stops 51 and 52).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import numpy as np
from annotated_types import Ge

from forecast.base import (
    DEFAULT_QUANTILES,
    BaseForecaster,
    OrderHints,
    kept_order_hints,
    recency_weights,
    residual_offset_rows,
    residual_offsets,
    sample_index,
)
from forecast.preprocessing import DAY_S, FloatArray

#: Candidate periods, seconds: the boundaries traffic is scheduled or aggregated on.
CANDIDATE_PERIODS_S: tuple[float, ...] = (300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0)


def detect_change_period(
    y: FloatArray,
    step_s: float,
    candidates_s: Sequence[float] = CANDIDATE_PERIODS_S,
    min_share: float = 0.08,
    min_cycles: int = 20,
) -> float | None:
    """The candidate period whose phase best explains the variance of the series' step-to-step absolute changes
    (one-way ANOVA eta squared), if it explains at least ``min_share`` of it; else None.

    A series that jumps at window edges has large ``|y[t+1] - y[t]|`` at one phase and small ones elsewhere, so the
    phase explains much of their variance; for a series without edges the share is near its chance level,
    ``(period - 1) / (samples - 1)``, which is subtracted so that longer periods (more phase bins) gain nothing from
    chance. Multiples of the true period explain about as much as it does and its divisors less (they mix edge and
    non-edge steps), so the shortest period within 10 % of the best share is chosen. A candidate needs ``min_cycles``
    whole cycles of history to be considered.
    """
    values = np.asarray(y, dtype=np.float64)
    if values.size < 3:
        return None
    all_changes = np.abs(np.diff(_log_level(values)))
    position = np.flatnonzero(np.isfinite(all_changes))  # phases stay those of the samples, gaps or not
    change = all_changes[position]
    total = float(((change - change.mean()) ** 2).sum()) if change.size else 0.0
    if total <= 0.0:
        return None
    shares: dict[float, float] = {}
    for period_s in sorted(candidates_s):
        bins = period_s / step_s
        if bins < 2 or abs(bins - round(bins)) > 1e-9 or change.size < min_cycles * bins:
            continue
        period = round(bins)
        phase = position % period
        counts = np.bincount(phase, minlength=period)
        means = np.bincount(phase, weights=change, minlength=period) / np.maximum(counts, 1)
        chance = (period - 1) / max(change.size - 1, 1)
        shares[period_s] = float((counts * (means - change.mean()) ** 2).sum()) / total - chance
    if not shares:
        return None
    best = max(shares.values())
    if best < min_share:
        return None
    return min(period_s for period_s, share in shares.items() if share >= 0.9 * best)


# Origins at one phase (one per period) a reversion slope needs: 30 ten-minute windows are 5 hours of history
_MIN_REVERSION_ORIGINS = 30
# The tag of the residual sets learnt less a slope (``OrderHints`` keys), apart from the plain ones. A refit's new
# slopes change every residual: the kept set sees they are not the ones it holds and is rebuilt (``slide``)
_REVERTED = "reverted"


def _log_level(values: FloatArray) -> FloatArray:
    # log1p keeps near-zero rates finite; for rates of a few requests/s and above it is the log ratio.
    out: FloatArray = np.log1p(np.maximum(values, 0.0))
    return out


def _kept_overlap(values: FloatArray, first: int, previous: FloatArray, previous_first: int) -> int:
    """How many leading samples of ``values`` (the first at absolute step ``first``) ``previous`` (from
    ``previous_first``) holds, identical: the series moved forward only; else 0."""
    offset = first - previous_first
    overlap = min(previous.size - offset, values.size)
    if offset < 0 or overlap <= 0 or not np.array_equal(values[:overlap], previous[offset : offset + overlap]):
        return 0
    return overlap


def _log_level_after(
    values: FloatArray, first: int, previous: FloatArray, previous_logs: FloatArray, previous_first: int
) -> FloatArray:
    """``_log_level(values)`` (``values`` starting at absolute step ``first``), reusing ``previous_logs`` (those of
    ``previous``, starting at ``previous_first``) for the samples both series hold identically."""
    overlap = _kept_overlap(values, first, previous, previous_first)
    if overlap == 0:
        return _log_level(values)
    offset = first - previous_first
    out = np.empty(values.size)
    out[:overlap] = previous_logs[offset : offset + overlap]
    out[overlap:] = _log_level(values[overlap:])
    return out


class PhaseNaive(BaseForecaster):
    """Naive point forecast; quantiles of the change at each lead learnt from history origins at the same phase.

    ``period_s``: the window length whose edges the series jumps at; None detects it among
    ``CANDIDATE_PERIODS_S`` (none found: one phase, the plain naive forecast). ``multiplicative``: with a period,
    learn changes as ratios (log1p space) rather than differences. ``residual_window``: training samples the
    changes are learnt from; ``residual_half_life_s``: recent changes weigh more (see
    ``forecast.base.residual_offsets``). ``reversion_periods``: the periods the mean level a deviation is measured
    from spans (mean reversion, the module's docstring), periods; None: off.
    """

    levels_independent = True  # residual quantiles, one per level (BaseForecaster.levels_independent)

    def __init__(
        self,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        period_s: float | None = None,
        multiplicative: bool = True,
        residual_window: int = 10_080,
        residual_half_life_s: float | None = 2 * DAY_S,
        min_share: float = 0.08,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
        reversion_periods: Annotated[int, Ge(1)] | None = 6,
    ) -> None:
        self.quantiles = quantiles
        self.period_s = period_s
        self.multiplicative = multiplicative
        self.residual_window = residual_window
        self.residual_half_life_s = residual_half_life_s
        self.min_share = min_share
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers
        self.reversion_periods = reversion_periods

    def label(self) -> str:
        period_bins = getattr(self, "period_bins_", 1)  # the label of an unfitted model names no period
        return "PhaseNaive" if period_bins <= 1 else f"PhaseNaive({period_bins * self.step_s_:g}s)"

    def _fit(self, y: FloatArray) -> None:
        if int(self.residual_window) < 2:
            raise ValueError(f"residual_window must be >= 2, got {self.residual_window}")
        if self.reversion_periods is not None and (
            int(self.reversion_periods) != self.reversion_periods or self.reversion_periods < 1
        ):
            raise ValueError(f"reversion_periods must be None or a whole number >= 1, got {self.reversion_periods!r}")
        if self.period_s is not None:
            bins = float(self.period_s) / self.step_s_
            if self.period_s <= 0 or abs(bins - round(bins)) > 1e-9:
                raise ValueError(
                    f"period_s must be a positive multiple of the step {self.step_s_:g} s, got {self.period_s}"
                )
            self.period_bins_ = max(1, round(bins))
        else:
            detected = detect_change_period(y[-int(self.residual_window) :], self.step_s_, min_share=self.min_share)
            self.period_bins_ = 1 if detected is None else round(detected / self.step_s_)
        self.order_hints_ = kept_order_hints(self)
        self.reversion_basis_: tuple[FloatArray, FloatArray, int] | None = None
        self.reversion_slopes_: dict[tuple[int, int], float] = {}
        self._update(y)
        if self.deviation_ is not None:
            # the series and deviations the slopes are estimated from (lazily, per origin phase and lead): this fit's
            self.reversion_basis_ = (self.learn_series_, self.deviation_, self.hint_first_index_)

    def _update(self, y: FloatArray) -> None:
        # The period stays as fitted; the spreads are learnt again from the newest history, lazily per origin phase
        # and lead (``_offsets``), so an update costs a copy and a predict a few quantiles. Keeping the spreads of
        # the last (hourly) fit instead measured slightly worse in the simulator's default ServeGen scenario
        # (99.48 % within SLO at 1.255x the oracle's GPU-hours, against 99.51 % at 1.245x, before the detection fixes).
        previous = getattr(self, "history_", None)
        previous_learnt = getattr(self, "learn_series_", None)
        previous_first = getattr(self, "learn_first_index_", 0)
        previous_deviation = getattr(self, "deviation_", None)
        previous_hint_first = getattr(self, "hint_first_index_", 0)
        self.history_ = y[-int(self.residual_window) :].copy()
        end_index = round(self.start_ / self.step_s_) + self.n_obs_  # index since the Unix epoch, after the newest
        self.learn_first_index_ = end_index - self.history_.size
        # The scale changes are learnt in, computed once per update rather than per (phase, lead); an update that
        # only appended keeps the logs of the samples it already had (the same values: log1p is elementwise).
        if not self._in_ratios():
            self.learn_series_ = self.history_
        elif previous is not None and previous_learnt is not None and previous_learnt is not previous:
            self.learn_series_ = _log_level_after(
                self.history_, self.learn_first_index_, previous, previous_learnt, previous_first
            )
        else:
            self.learn_series_ = _log_level(self.history_)
        self.offsets_cache_: dict[tuple[int, int], FloatArray] = {}
        self.reversion_now_: dict[tuple[int, int], tuple[int, int, float] | None] = {}
        # The spreads' residuals sorted with their weights, kept across updates that only append to the history (the
        # spreads themselves are the same as learnt from scratch, up to float rounding; see forecast.base.OrderHints).
        # Positions for the hints: ``learn_first_index_`` rounds, which alternates for a start half a step off the
        # grid (it only has to be consistent within one update, for the phases).
        self.hint_first_index_ = sample_index(self.start_, self.step_s_) + self.n_obs_ - self.history_.size
        if not hasattr(self, "order_hints_"):
            self.order_hints_ = OrderHints()
        self.order_hints_.advance(self.learn_series_, self.hint_first_index_)
        # The origin: the newest value and its phase.
        self.origin_value_ = float(y[-1])
        self.origin_index_ = end_index - 1
        self.deviation_: FloatArray | None = None
        if self._reverting():
            kept = None
            if previous_learnt is not None and previous_deviation is not None:
                kept = (previous_learnt, previous_deviation, previous_hint_first)
            self.deviation_ = self._deviation(self.learn_series_, self.hint_first_index_, kept)

    def _in_ratios(self) -> bool:
        # Ratios only where there are edges: jump sizes scale with the level. Without a period this is the naive
        # forecast, and differences are its better spread: on the bursty Azure LLM hours, log-ratio spreads scored
        # 1.03x (conv) and 1.43x (code) the naive forecast's pinball loss, differences 1.00x.
        return bool(self.multiplicative) and self.period_bins_ > 1

    def _reverting(self) -> bool:
        return self.reversion_periods is not None and self._in_ratios()

    def _deviation(
        self, series: FloatArray, first_index: int, previous: tuple[FloatArray, FloatArray, int] | None
    ) -> FloatArray:
        """Each sample's log level less the mean of the last ``reversion_periods`` periods' samples (itself
        included); NaN where fewer samples than that precede it in ``series`` (its first at absolute step
        ``first_index``), and where one of them is idle (0: a service drained at night, a gap in the trace; the
        return from a gap is not a level reverting to its mean, and measured as one it taught the slopes to expect
        a fall after every restart). ``previous``: the last update's (series, deviations, first index); the samples
        both hold keep their deviations to the bit -- a kept residual set (``OrderHints``) slides only over residuals
        identical to the ones it holds, and a mean summed again from another start differs in the last bits (every
        update would rebuild every set)."""
        span = int(self.reversion_periods or 1) * self.period_bins_
        out = np.full(series.size, np.nan)
        if series.size < span:
            return out
        done = span - 1  # the samples before this one have their deviation (or none)
        if previous is not None and previous[0].size >= span:  # a shorter one had no deviation to keep
            old_series, old_deviation, old_first = previous
            overlap = _kept_overlap(series, first_index, old_series, old_first)
            if overlap:
                offset = first_index - old_first
                out[:overlap] = old_deviation[offset : offset + overlap]
                done = max(done, overlap)
        if done < series.size:
            tail = series[done - span + 1 :]
            sums = np.cumsum(np.concatenate(([0.0], tail)))
            idle = np.cumsum(np.concatenate(([0], tail <= 0.0)))
            deviation = tail[span - 1 :] - (sums[span:] - sums[:-span]) / span
            out[done:] = np.where(idle[span:] - idle[:-span] > 0, np.nan, deviation)
        out[: span - 1] = np.nan  # as learnt from scratch: too few samples before these
        return out

    def _slope(self, phase: int, lag: int) -> float:
        """The fitted slope of the change over ``lag`` steps from origins at true ``phase`` (their absolute step modulo
        the period) on their deviation: weighted least squares (the spreads' recency weights) on the fit's series,
        kept only if towards the mean (< 0); 0 without ``_MIN_REVERSION_ORIGINS`` origins with a deviation."""
        key = (phase, lag)
        slope = self.reversion_slopes_.get(key)
        if slope is None:
            slope = self._fitted_slope(phase, lag)
            self.reversion_slopes_[key] = slope
        return slope

    def _fitted_slope(self, phase: int, lag: int) -> float:
        if self.reversion_basis_ is None:
            return 0.0
        series, deviation, first_index = self.reversion_basis_
        found = self._reverted_origins(series, deviation, first_index, phase, lag)
        if found is None:
            return 0.0
        change, dev, first = found
        period = self.period_bins_
        weights = recency_weights(change.size, self.step_s_ * period, self.residual_half_life_s)
        if weights is None:
            weights = np.ones(change.size)
        # origins with a deviation whose change does not end idle (the start of a gap is no reversion either)
        ends = series[first + lag : first + lag + period * change.size : period]
        known = np.isfinite(dev) & (ends > 0.0)
        if np.count_nonzero(known) < _MIN_REVERSION_ORIGINS:
            return 0.0
        change, dev, weights = change[known], dev[known], weights[known]
        total = float(weights.sum())
        centred = dev - float(weights @ dev) / total
        spread = float(weights @ (centred * centred)) / total
        if spread <= 1e-12:
            return 0.0
        return min(0.0, float(weights @ (centred * change)) / total / spread)

    def _reverted_origins(
        self, series: FloatArray, deviation: FloatArray, first_index: int, phase: int, lag: int
    ) -> tuple[FloatArray, FloatArray, int] | None:
        """(change over ``lag``, deviation, first origin's position) at the origins of ``series`` (its first sample at
        absolute step ``first_index``) at true ``phase`` with a whole span before them; None with fewer than
        ``_MIN_REVERSION_ORIGINS`` of them."""
        period = self.period_bins_
        span = int(self.reversion_periods or 1) * period
        if lag < 1 or series.size <= lag:
            return None
        first = (phase - first_index) % period
        first += max(0, -(-(span - 1 - first) // period)) * period  # origins without a whole span before them
        count = -(-(series.size - lag - first) // period)
        if count < _MIN_REVERSION_ORIGINS:
            return None
        origins = slice(first, first + period * count, period)
        change = series[first + lag : first + lag + period * count : period] - series[origins]
        return change, deviation[origins], first

    def _true_phase(self, origin_phase: int, lead: int) -> tuple[int, int] | None:
        """(true phase, lag) of the origins the spread at (``origin_phase``, ``lead``) is learnt from: the phase by
        absolute step (``origin_phase`` labels can alternate between updates, see ``_update``); None when they are
        not one phase's (too few of them: every origin)."""
        lag, first, spacing, _ = self._origin_set(origin_phase, lead)
        if spacing == 1:
            return None
        return (self.hint_first_index_ + first) % spacing, lag

    def _origin_set(self, origin_phase: int, lead: int) -> tuple[int, int, int, int]:
        """(lag, first origin, spacing, count) of the history origins the spread at ``lead`` is learnt from: those at
        ``origin_phase``, every period-th from the first, or every origin when there are fewer than 10 of those."""
        size, period = self.learn_series_.size, self.period_bins_
        lag = min(lead, size - 1)
        origins = size - lag
        first = (origin_phase - self.learn_first_index_) % period
        count = -(-(origins - first) // period)
        if count < 10:
            return lag, 0, 1, origins
        return lag, first, period, count

    def _learn_together(self, origin_phase: int, horizon: int) -> None:
        """Fill ``offsets_cache_`` for every lead whose origins are the same as another lead's in one pass
        (``residual_offset_rows``): at the origin's phase, leads 1..period share their origins. Same spreads as
        ``_offsets`` one lead at a time (up to float rounding with kept sets)."""
        if self.learn_series_.size < 2:
            return
        groups: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        for lead in range(1, horizon + 1):
            if (origin_phase, lead) not in self.offsets_cache_ and not self._reverted(origin_phase, lead):
                lag, first, spacing, count = self._origin_set(origin_phase, lead)
                groups.setdefault((first, spacing, count), []).append((lead, lag))
        for (first, spacing, count), members in groups.items():
            lags = tuple(lag for _, lag in members)
            if len(lags) < 2 or len(set(lags)) < len(lags):
                continue  # one lead (or capped lags): one at a time
            position = self.hint_first_index_ + first  # keyed by the true phase: the phase labels can alternate
            hints = self.order_hints_.at(("rows", position % spacing, lags), position, spacing)
            rows = residual_offset_rows(
                self.learn_series_,
                first,
                spacing,
                count,
                lags,
                self.levels_,
                self.step_s_ * spacing,
                self.residual_half_life_s,
                hints,
            )
            for (lead, _), row in zip(members, rows, strict=True):
                self.offsets_cache_[(origin_phase, lead)] = row

    def _offsets(self, origin_phase: int, lead: int) -> FloatArray:
        """Quantiles of the change over ``lead`` steps from history origins at ``origin_phase`` (cached until the next
        update, which relearns them from the newest history)."""
        key = (origin_phase, lead)
        cached = self.offsets_cache_.get(key)
        if cached is not None:
            return cached
        if self._reverted(origin_phase, lead):
            out = self._reverted_offsets(origin_phase, lead)
        else:
            out = self._plain_offsets(origin_phase, lead)
        self.offsets_cache_[key] = out
        return out

    def _reversion(self, origin_phase: int, lead: int) -> tuple[int, int, float] | None:
        """(true phase, lag, slope) where the spread at (phase, lead) is learnt less a slope: a fitted slope, and a
        known deviation now; else None. Kept until the next update (asked for by the grouping and the spreads)."""
        key = (origin_phase, lead)
        if key in self.reversion_now_:
            return self.reversion_now_[key]
        found = None
        if self.reversion_basis_ is not None and self.deviation_ is not None and math.isfinite(self.deviation_[-1]):
            true_phase = self._true_phase(origin_phase, lead)
            if true_phase is not None:
                slope = self._slope(*true_phase)
                if slope < 0.0:
                    found = (*true_phase, slope)
        self.reversion_now_[key] = found
        return found

    def _reverted(self, origin_phase: int, lead: int) -> bool:
        return self._reversion(origin_phase, lead) is not None

    def _reverted_offsets(self, origin_phase: int, lead: int) -> FloatArray:
        """Quantiles of the change less slope x deviation at the current series' origins, plus slope x the
        deviation now; the plain spread when the current series has too few origins with a deviation."""
        reversion = self._reversion(origin_phase, lead)
        assert reversion is not None and self.deviation_ is not None
        phase, lag, slope = reversion
        found = self._reverted_origins(self.learn_series_, self.deviation_, self.hint_first_index_, phase, lag)
        if found is None:
            return self._plain_offsets(origin_phase, lead)
        change, deviation, first = found
        deviation = np.where(np.isfinite(deviation), deviation, 0.0)  # without a deviation, the change as it is
        period = self.period_bins_
        position = self.hint_first_index_ + first
        hints = self.order_hints_.at((_REVERTED, position % period, lag), position, period)
        residuals = change - slope * deviation
        offsets = residual_offsets(residuals, self.levels_, self.step_s_ * period, self.residual_half_life_s, hints)
        out: FloatArray = offsets + slope * float(self.deviation_[-1])
        return out

    def _plain_offsets(self, origin_phase: int, lead: int) -> FloatArray:
        series = self.learn_series_
        lag, first, spacing, count = self._origin_set(origin_phase, lead)
        if lag < 1:
            return np.zeros(len(self.levels_))
        # same-phase origins are one period apart (the spacing of their recency weights)
        residuals = (
            series[first + lag : first + lag + spacing * count : spacing]
            - series[first : first + spacing * count : spacing]
        )
        position = self.hint_first_index_ + first
        hints = self.order_hints_.at((position % spacing if spacing > 1 else -1, lag), position, spacing)
        out: FloatArray = residual_offsets(
            residuals, self.levels_, self.step_s_ * spacing, self.residual_half_life_s, hints
        )
        return out

    def _predict(self, horizon: int) -> FloatArray:
        origin_phase = self.origin_index_ % self.period_bins_
        self._learn_together(origin_phase, horizon)
        offsets = np.stack([self._offsets(origin_phase, h) for h in range(1, horizon + 1)], axis=1)
        if self._in_ratios():
            out: FloatArray = np.expm1(math.log1p(max(self.origin_value_, 0.0)) + offsets)
            return out
        out = self.origin_value_ + offsets
        return out
