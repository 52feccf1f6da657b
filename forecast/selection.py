"""Per-series model selection by rolling-origin backtest against the seasonal-naive baseline.

Like Crane's EHPA, the choice is made per series by backtesting on its own recent history, but scored on pinball
loss (the quantiles are what the policy provisions for), and a candidate must beat the seasonal-naive baseline by a
margin to be chosen at all: a model that merely ties the baseline is not worth its fitting cost and its extra
failure modes. Whether the chosen model is then *trusted* is ``assess_reliability`` (``forecast.types``), applied
to the same scores here and, in production, to realised errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from sklearn.base import clone

from forecast.backtest import BacktestResult, evaluate, rolling_origin_backtest
from forecast.base import BaseForecaster
from forecast.types import ForecastQuality, assess_reliability

__all__ = ["Selection", "assess_reliability", "pinball_ratio", "select_model"]


def pinball_ratio(model: ForecastQuality, baseline: ForecastQuality) -> float:
    """Mean pinball loss of ``model`` divided by the baseline's (below 1 = better). NaN when undefined."""
    base = baseline.mean_pinball
    if not math.isfinite(base) or base <= 0:
        return math.nan
    return model.mean_pinball / base


@dataclass
class Selection:
    """The outcome of ``select_model``: the winner (unfitted), every backtest, and whether to trust the winner."""

    best: str
    estimator: BaseForecaster
    baseline: str
    results: dict[str, BacktestResult]
    ratios: dict[str, float]
    reliable: bool
    reason: str
    errors: dict[str, str] = field(default_factory=dict)  # candidates whose backtest failed, and why

    def table(self) -> list[dict[str, float | str]]:
        """One row per backtested candidate, best first: name, MAE, pinball ratio, coverages, mean fit seconds."""
        rows: list[dict[str, float | str]] = []
        for name, result in self.results.items():
            quality = result.quality
            rows.append(
                {
                    "model": name,
                    "mae": quality.mae,
                    "pinball_ratio": self.ratios[name],
                    "interval_coverage": quality.interval_coverage,
                    "upper_coverage": quality.upper_coverage,
                    "fit_seconds": result.mean_fit_seconds,
                }
            )

        def key(row: dict[str, float | str]) -> float:
            ratio = float(row["pinball_ratio"])
            return math.inf if math.isnan(ratio) else ratio

        return sorted(rows, key=key)


def _quality_at(result: BacktestResult, levels: Sequence[float]) -> ForecastQuality:
    """A backtest's scores at ``levels`` only (ValueError when its forecasts lack one)."""
    wanted = sorted(float(level) for level in levels)
    missing = [level for level in wanted if level not in result.levels]
    if not wanted or missing:
        raise ValueError(f"{result.model} forecasts levels {result.levels}, not {missing or 'any level'}")
    index = [list(result.levels).index(level) for level in wanted]
    return evaluate(result.model, result.actuals, result.predictions[index], wanted)


def select_model(
    y: npt.ArrayLike,
    candidates: Mapping[str, BaseForecaster],
    *,
    baseline: str,
    step_s: float,
    horizon_steps: int,
    start: float = 0.0,
    n_origins: int | None = None,
    origin_every: int = 1,
    min_train_steps: int | None = None,
    max_train_steps: int | None = None,
    refit_every: int = 1,
    min_improvement: float = 0.05,
    max_ratio: float = 1.0,
    min_samples: int = 30,
    score_levels: Sequence[float] | None = None,
) -> Selection:
    """Backtest every candidate on the same origins and pick the one with the lowest mean pinball loss.

    ``baseline`` names the candidate every score is divided by (normally a ``SeasonalNaive``). A challenger wins
    only if its ratio is at most ``1 - min_improvement``; otherwise the baseline is chosen. The verdict
    ``reliable``/``reason`` is ``assess_reliability(winner, baseline, max_ratio, min_samples)``. A candidate whose
    backtest raises (too little data for it, a numerical failure) is skipped and reported in ``errors``; the
    baseline must succeed.

    ``score_levels``: the levels the ranking and the verdict score (None = every level of the forecasts). A caller
    that provisions one quantile and judges the chosen model there (the controller) passes that one: ranked on the
    mean over the band as well, a model sharp in the band and short at a P99 was chosen and then judged unreliable
    at the P99 its service provisions, where the baseline it displaced was trusted. A candidate whose forecasts lack
    one of these levels is skipped like one whose backtest failed.
    """
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} must be one of the candidates {sorted(candidates)}")
    results: dict[str, BacktestResult] = {}
    errors: dict[str, str] = {}
    for name, model in candidates.items():
        try:
            results[name] = rolling_origin_backtest(
                model,
                y,
                step_s=step_s,
                horizon_steps=horizon_steps,
                start=start,
                n_origins=n_origins,
                origin_every=origin_every,
                min_train_steps=min_train_steps,
                max_train_steps=max_train_steps,
                refit_every=refit_every,
            )
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            if name == baseline:
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
    qualities: dict[str, ForecastQuality] = {}
    for name, result in results.items():
        try:
            qualities[name] = result.quality if score_levels is None else _quality_at(result, score_levels)
        except ValueError as exc:
            if name == baseline:
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
    results = {name: result for name, result in results.items() if name in qualities}
    base_quality = qualities[baseline]
    ratios = {name: pinball_ratio(quality, base_quality) for name, quality in qualities.items()}
    best = baseline
    challengers = [(r, name) for name, r in ratios.items() if name != baseline and math.isfinite(r)]
    if challengers:
        ratio, name = min(challengers)
        if ratio <= 1.0 - min_improvement:
            best = name
    reliable, reason = assess_reliability(qualities[best], base_quality, max_ratio=max_ratio, min_samples=min_samples)
    return Selection(
        best=best,
        estimator=clone(candidates[best]),
        baseline=baseline,
        results=results,
        ratios=ratios,
        reliable=reliable,
        reason=reason,
        errors=errors,
    )
