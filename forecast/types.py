"""Plain-data results of forecasting: the ``Forecast`` a refit job publishes and the tick reads, and its quality.

Standard library only, on purpose: the controller's pure core imports this module and must not pay for (or depend on)
numpy, pandas, scikit-learn or statsmodels. Everything is immutable, so a ``Forecast`` can be handed from the refit
job to the tick without locks or copies.

Times are Unix seconds (float). A forecast covers ``len(forecast)`` consecutive steps of ``step_s`` seconds; step ``i``
is the half-open interval ``[start + i * step_s, start + (i + 1) * step_s)`` and its value is the quantity's value
(e.g. the mean request rate) over that interval.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# Quantiles from independently fitted models (one per level) can cross by rounding noise; anything within this of
# monotone is accepted and straightened rather than rejected.
_MONOTONE_TOLERANCE = 1e-9
# (time - start) / step_s lands a hair below an integer for exact step boundaries; this keeps a boundary in its step.
_BOUNDARY_EPS = 1e-9


def _freeze_quantiles(quantiles: Mapping[float, Iterable[float]]) -> Mapping[float, tuple[float, ...]]:
    frozen = {float(level): tuple(float(v) for v in values) for level, values in quantiles.items()}
    return MappingProxyType(dict(sorted(frozen.items())))


@dataclass(frozen=True)
class Forecast:
    """A quantile forecast on a regular grid, as pure data.

    ``quantiles`` maps a level in (0, 1) (e.g. 0.1, 0.5, 0.9) to one value per step. At every step the values are
    non-decreasing in the level (validated; crossings within 1e-9 are straightened). ``model`` names the estimator
    that produced it, for reasons, events and metric labels.
    """

    start: float
    step_s: float
    quantiles: Mapping[float, tuple[float, ...]]
    model: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.step_s)) or self.step_s <= 0:
            raise ValueError(f"start must be finite and step_s > 0, got start={self.start!r} step_s={self.step_s!r}")
        if not self.quantiles:
            raise ValueError("a forecast needs at least one quantile level")
        frozen = _freeze_quantiles(self.quantiles)
        levels = tuple(frozen)
        for level in levels:
            if not 0.0 < level < 1.0:
                raise ValueError(f"quantile levels must be in (0, 1), got {level!r}")
        lengths = {len(values) for values in frozen.values()}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"every level needs the same, non-zero number of steps, got lengths {sorted(lengths)}")
        for values in frozen.values():
            if not all(math.isfinite(v) for v in values):
                raise ValueError("forecast values must be finite (no NaN or inf)")
        straightened = dict(frozen)
        for lower, upper in itertools.pairwise(levels):
            lo_vals, hi_vals = straightened[lower], straightened[upper]
            worst = max(lo - hi for lo, hi in zip(lo_vals, hi_vals, strict=True))
            if worst > _MONOTONE_TOLERANCE * max(1.0, max(abs(v) for v in lo_vals)):
                raise ValueError(f"quantiles cross: level {lower} exceeds level {upper} by {worst:g}")
            if worst > 0:
                straightened[upper] = tuple(max(lo, hi) for lo, hi in zip(lo_vals, hi_vals, strict=True))
        object.__setattr__(self, "start", float(self.start))
        object.__setattr__(self, "step_s", float(self.step_s))
        object.__setattr__(self, "quantiles", MappingProxyType(straightened))
        self._derive()

    def _derive(self) -> None:
        # Derived once, read on every tick (``at``, ``max_over``): not fields, so equality and repr ignore them.
        object.__setattr__(self, "_levels", tuple(self.quantiles))
        object.__setattr__(self, "_steps", len(next(iter(self.quantiles.values()))))

    @classmethod
    def _checked(
        cls, start: float, step_s: float, levels: Sequence[float], rows: Sequence[Sequence[float]], model: str
    ) -> Forecast:
        """A forecast from values the caller has already validated: ``levels`` distinct, increasing, in (0, 1);
        ``rows[i]`` the finite values of ``levels[i]``, all rows the same non-zero length, non-decreasing across
        levels at every step; ``start`` and ``step_s`` finite floats, ``step_s > 0`` (what ``BaseForecaster.predict``
        produces). Equal to ``Forecast(start, step_s, dict(zip(levels, rows)), model)``, without checking again."""
        self = object.__new__(cls)
        object.__setattr__(self, "start", float(start))
        object.__setattr__(self, "step_s", float(step_s))
        quantiles = {float(level): tuple(row) for level, row in zip(levels, rows, strict=True)}
        object.__setattr__(self, "quantiles", MappingProxyType(quantiles))
        object.__setattr__(self, "model", model)
        self._derive()
        return self

    # Frozen dataclasses hash their fields, and a mapping is unhashable: say so explicitly instead of failing late.
    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return self._steps  # type: ignore[attr-defined,no-any-return]

    @property
    def levels(self) -> tuple[float, ...]:
        return self._levels  # type: ignore[attr-defined,no-any-return]

    @property
    def horizon_s(self) -> float:
        """Seconds covered, from ``start`` to ``end``."""
        return len(self) * self.step_s

    @property
    def end(self) -> float:
        """First instant *not* covered (exclusive)."""
        return self.start + self.horizon_s

    @property
    def origin(self) -> float:
        """Time of the last observation the model saw: one step before ``start``."""
        return self.start - self.step_s

    def times(self) -> tuple[float, ...]:
        """Start time of every step."""
        return tuple(self.start + i * self.step_s for i in range(len(self)))

    def step_index(self, time: float) -> int:
        """Index of the step containing ``time``; ValueError outside ``[start, end)``."""
        if not math.isfinite(time):
            raise ValueError(f"time must be finite, got {time!r}")
        index = math.floor((time - self.start) / self.step_s + _BOUNDARY_EPS)
        if index < 0 or index >= len(self):
            raise ValueError(
                f"time {time} is outside the forecast horizon [{self.start}, {self.end}) of model {self.model!r}"
            )
        return index

    def covers(self, time: float) -> bool:
        try:
            self.step_index(time)
        except ValueError:
            return False
        return True

    def at(self, time: float, level: float) -> float:
        """Value at quantile ``level`` for the step containing ``time``.

        Between two forecast levels the value is interpolated linearly in the level. A level outside the forecast's
        range raises ValueError rather than silently returning the nearest level: a policy asking for P95 from a
        forecast that stops at P90 would otherwise under-provision without anyone noticing.
        """
        return self._at_index(self.step_index(time), level)

    def _at_index(self, index: int, level: float) -> float:
        values = self.quantiles.get(level)
        if values is not None:
            return values[index]
        levels = self.levels
        if not levels[0] <= level <= levels[-1]:
            raise ValueError(f"level {level} is outside the forecast's levels {levels[0]}..{levels[-1]}")
        upper_pos = bisect.bisect_right(levels, level)
        lo, hi = levels[upper_pos - 1], levels[upper_pos]
        lo_val, hi_val = self.quantiles[lo][index], self.quantiles[hi][index]
        weight = (level - lo) / (hi - lo)
        return lo_val + weight * (hi_val - lo_val)

    def values(self, level: float) -> tuple[float, ...]:
        """All steps at one level (interpolated like ``at`` when the level is not stored)."""
        if level in self.quantiles:
            return self.quantiles[level]
        return tuple(self.at(t, level) for t in self.times())

    def max_over(self, t0: float, t1: float, level: float) -> float:
        """Largest value at ``level`` over the steps overlapping ``[t0, t1]`` (clipped to the horizon).

        For a scaler that must hold capacity from now until the end of a cold start, the peak matters, not the
        value at one instant. ValueError when the interval does not overlap the horizon.
        """
        if t1 < t0:
            raise ValueError(f"t1 ({t1}) must not precede t0 ({t0})")
        lo = max(t0, self.start)
        hi = min(t1, self.end - self.step_s * _BOUNDARY_EPS)
        if hi < lo:
            raise ValueError(f"[{t0}, {t1}] does not overlap the forecast horizon [{self.start}, {self.end})")
        # hi is just inside the horizon, but the boundary tolerance of step_index can round it onto the next step
        first = self.step_index(lo)
        last = min(len(self) - 1, max(first, math.floor((hi - self.start) / self.step_s + _BOUNDARY_EPS)))
        values = self.quantiles.get(level)
        if values is not None:
            return max(values[first : last + 1])
        return max(self._at_index(i, level) for i in range(first, last + 1))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (levels become strings, as JSON keys must be)."""
        return {
            "start": self.start,
            "step_s": self.step_s,
            "model": self.model,
            "quantiles": {repr(level): list(values) for level, values in self.quantiles.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Forecast:
        quantiles = {float(level): tuple(values) for level, values in data["quantiles"].items()}
        return cls(start=float(data["start"]), step_s=float(data["step_s"]), quantiles=quantiles, model=data["model"])


def pinball_loss(actual: float, predicted: float, level: float) -> float:
    """Quantile (pinball) loss of one prediction: under-prediction costs ``level``, over-prediction ``1 - level``."""
    diff = actual - predicted
    return level * diff if diff >= 0 else (level - 1.0) * diff


@dataclass(frozen=True)
class ForecastQuality:
    """How good a model's forecasts were on ``n`` realised values (a backtest, or live accountability).

    ``mae`` is the error of the median (level 0.5, interpolated if absent). ``pinball`` is the mean pinball loss per
    level. ``interval_coverage`` is the share of actuals inside ``[q_lo, q_hi]`` with ``interval_levels = (lo, hi)``
    (the lowest and highest levels); ``upper_coverage`` the share at or below ``q_hi`` (one-sided, what a scaler
    provisioning to ``q_hi`` gets).
    """

    model: str
    n: int
    mae: float
    pinball: Mapping[float, float]
    interval_coverage: float
    upper_coverage: float
    interval_levels: tuple[float, float]

    def __post_init__(self) -> None:
        object.__setattr__(self, "pinball", MappingProxyType(dict(sorted(self.pinball.items()))))

    __hash__ = None  # type: ignore[assignment]

    @property
    def mean_pinball(self) -> float:
        """Mean pinball loss over the levels: the score models are ranked by."""
        if not self.pinball:
            return math.nan
        return sum(self.pinball.values()) / len(self.pinball)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "n": self.n,
            "mae": self.mae,
            "mean_pinball": self.mean_pinball,
            "pinball": {repr(level): loss for level, loss in self.pinball.items()},
            "interval_coverage": self.interval_coverage,
            "upper_coverage": self.upper_coverage,
            "interval_levels": list(self.interval_levels),
        }

    @classmethod
    def from_observations(
        cls, model: str, actuals: Sequence[float], predicted: Mapping[float, Sequence[float]]
    ) -> ForecastQuality:
        """Score realised ``actuals`` against the quantiles that were predicted for them (same order).

        Pairs whose actual or any prediction is not finite are skipped: a missing scrape is no evidence either way.
        Pure Python so the controller can keep its forecast accountable without numpy.
        """
        levels = sorted(float(level) for level in predicted)
        if not levels:
            raise ValueError("predicted needs at least one quantile level")
        columns = [predicted[level] for level in levels]
        for column in columns:
            if len(column) != len(actuals):
                raise ValueError("every predicted level needs one value per actual")
        rows = [
            (a, [float(col[i]) for col in columns])
            for i, a in enumerate(actuals)
            if math.isfinite(a) and all(math.isfinite(col[i]) for col in columns)
        ]
        n = len(rows)
        lo_level, hi_level = levels[0], levels[-1]
        if n == 0:
            nan = math.nan
            return cls(model, 0, nan, {lv: nan for lv in levels}, nan, nan, (lo_level, hi_level))
        pinball = {lv: sum(pinball_loss(a, qs[j], lv) for a, qs in rows) / n for j, lv in enumerate(levels)}
        mae = sum(abs(a - _interpolate_level(levels, qs, 0.5)) for a, qs in rows) / n
        inside = sum(1 for a, qs in rows if qs[0] <= a <= qs[-1]) / n
        below = sum(1 for a, qs in rows if a <= qs[-1]) / n
        return cls(model, n, mae, pinball, inside, below, (lo_level, hi_level))


def _interpolate_level(levels: Sequence[float], values: Sequence[float], level: float) -> float:
    """Value at ``level`` by linear interpolation between levels, nearest level outside their range."""
    if level <= levels[0]:
        return values[0]
    if level >= levels[-1]:
        return values[-1]
    pos = bisect.bisect_right(levels, level)
    lo, hi = levels[pos - 1], levels[pos]
    if level == lo:
        return values[pos - 1]
    weight = (level - lo) / (hi - lo)
    return values[pos - 1] + weight * (values[pos] - values[pos - 1])


def assess_reliability(
    model: ForecastQuality,
    baseline: ForecastQuality,
    *,
    max_ratio: float = 1.0,
    min_samples: int = 30,
    min_upper_coverage: float | None = None,
) -> tuple[bool, str]:
    """Decide whether a model's recent forecasts are good enough to act on, with a reason fit for an Event.

    ``model`` and ``baseline`` (the seasonal-naive forecasts of the same series over the same window) are scored on
    the same realised values. The forecast is reliable when its mean pinball loss is below ``max_ratio`` times the
    baseline's, on at least ``min_samples`` values, and (optionally) when its top quantile covered at least
    ``min_upper_coverage`` of the actuals. Anything else means: fall back to reactive scaling. Not enough evidence is
    *not* reliable, because a forecast that has not earned trust must not raise the replica floor.
    """
    if model.n < min_samples:
        return False, f"{model.model}: only {model.n} scored values, need {min_samples} before trusting the forecast"
    score, base = model.mean_pinball, baseline.mean_pinball
    if not (math.isfinite(score) and math.isfinite(base)):
        return False, f"{model.model}: forecast error is not a finite number (pinball {score}, baseline {base})"
    if base <= 0.0:
        if score <= 0.0:
            ratio = 1.0
        else:
            return False, f"{model.model}: baseline {baseline.model} was exact (pinball 0) and the model was not"
    else:
        ratio = score / base
    if ratio > max_ratio:
        return False, (
            f"{model.model}: pinball loss {score:.4g} is {ratio:.2f}x the {baseline.model} baseline's {base:.4g}"
            f" over {model.n} values (limit {max_ratio:.2f}x)"
        )
    if min_upper_coverage is not None and model.upper_coverage < min_upper_coverage:
        return False, (
            f"{model.model}: P{model.interval_levels[1] * 100:g} covered {model.upper_coverage:.0%} of actuals"
            f" (need {min_upper_coverage:.0%})"
        )
    return True, (
        f"{model.model}: pinball loss {ratio:.2f}x the {baseline.model} baseline over {model.n} values"
        f" (limit {max_ratio:.2f}x), P{model.interval_levels[1] * 100:g} coverage {model.upper_coverage:.0%}"
    )
