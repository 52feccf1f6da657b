"""Forecasters by name, for the CLI (``autoscaler backtest --models``), the simulator and policy specs.

Names are stable identifiers (snake_case); ``make_model(name, **params)`` builds a fresh, unfitted estimator with
the given constructor parameters overriding the defaults. Importing this module is cheap (stdlib only): the model
classes, and with them numpy/scikit-learn/statsmodels, are imported by ``make_model``, so listing the models in
``autoscaler --help`` does not pay for the scientific stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from forecast.base import BaseForecaster

DAY_S = 86_400.0
WEEK_S = 604_800.0


class _Entry(NamedTuple):
    target: str  # "module:Class"
    defaults: dict[str, Any]  # constructor defaults that differ from the class's own
    description: str


_MODELS: dict[str, _Entry] = {
    "last_value": _Entry(
        "forecast.baselines:LastValue", {}, "naive: the last observed value; quantiles from past h-step changes"
    ),
    "seasonal_naive": _Entry(
        "forecast.baselines:SeasonalNaive",
        {"period_s": DAY_S},
        "the value one day earlier (falls back to naive with less than a day of history)",
    ),
    "seasonal_naive_weekly": _Entry(
        "forecast.baselines:SeasonalNaive",
        {"period_s": WEEK_S},
        "the value one week earlier (falls back to naive with less than a week of history)",
    ),
    "holt_winters": _Entry(
        "forecast.statistical:HoltWinters", {}, "Holt-Winters / additive ETS, damped trend, daily season when detected"
    ),
    "fourier_arima": _Entry(
        "forecast.statistical:FourierARIMA",
        {},
        "ARMA(2,1) + constant + Fourier terms of the detected daily/weekly seasons (statsmodels SARIMAX)",
    ),
    "quantile_gbm": _Entry(
        "forecast.gbm:QuantileGBM",
        {},
        "quantile gradient boosting on lag and calendar features, direct multi-horizon, conformally calibrated",
    ),
    "phase_naive": _Entry(
        "forecast.phase:PhaseNaive",
        {},
        "naive: the last value; quantiles learnt per phase of a detected window period (demand that jumps at"
        " 5/10/15/20/30/60-minute window edges), plain naive when there is none",
    ),
    "count_level": _Entry(
        "forecast.smoothing:CountLevel",
        {},
        "count-aware level: exponential smoothing chosen by h-step cross-validation, flat forecast,"
        " negative-binomial quantiles (over-dispersed counts at the level, widening with the lead)",
    ),
}

#: The model every other one is compared with (pinball ratio) and selection falls back to.
BASELINE = "seasonal_naive"
#: Levels a forecast always carries beside the one a service provisions for (the median scores MAE).
BAND_LEVELS = (0.1, 0.5, 0.9)


def available_models() -> dict[str, str]:
    """Model names and their one-line descriptions, in a stable order."""
    return {name: entry.description for name, entry in _MODELS.items()}


def make_model(name: str, *, horizon_steps: int | None = None, **params: Any) -> BaseForecaster:
    """A new, unfitted forecaster by name. ``params`` override constructor defaults.

    ``horizon_steps``, when given, sets ``max_horizon_steps`` of direct multi-horizon models (unless ``params``
    sets it), so they are trained for every lead they will be asked for.
    """
    try:
        entry = _MODELS[name]
    except KeyError:
        raise ValueError(f"unknown forecaster {name!r}; known: {', '.join(_MODELS)}") from None
    module, _, cls_name = entry.target.partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    model: BaseForecaster = cls(**{**entry.defaults, **params})
    if horizon_steps is not None and "max_horizon_steps" in model.get_params() and "max_horizon_steps" not in params:
        model.set_params(max_horizon_steps=int(horizon_steps))
    return model
