"""Forecasters by name, for the CLI (``autoscaler backtest --models``), the simulator and policy specs.

Names are stable identifiers (snake_case); ``make_model(name, **params)`` builds a fresh, unfitted estimator with
the given constructor parameters overriding the defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forecast.base import BaseForecaster
from forecast.baselines import LastValue, SeasonalNaive
from forecast.gbm import QuantileGBM
from forecast.preprocessing import DAY_S, WEEK_S
from forecast.statistical import FourierARIMA, HoltWinters

# name -> (factory, one-line description for --help)
_MODELS: dict[str, tuple[Callable[..., BaseForecaster], str]] = {
    "last_value": (LastValue, "naive: the last observed value; quantiles from past h-step changes"),
    "seasonal_naive": (
        lambda **kw: SeasonalNaive(**{"period_s": DAY_S, **kw}),
        "the value one day earlier (falls back to naive with less than a day of history)",
    ),
    "seasonal_naive_weekly": (
        lambda **kw: SeasonalNaive(**{"period_s": WEEK_S, **kw}),
        "the value one week earlier (falls back to naive with less than a week of history)",
    ),
    "holt_winters": (HoltWinters, "Holt-Winters / additive ETS, damped trend, daily season when detected"),
    "fourier_arima": (FourierARIMA, "ARMA(2,1) + constant + Fourier terms of detected daily/weekly seasons (SARIMAX)"),
    "quantile_gbm": (QuantileGBM, "quantile gradient boosting on lag and calendar features, direct multi-horizon"),
}

#: The model every other one is compared with (pinball ratio) and selection falls back to.
BASELINE = "seasonal_naive"


def available_models() -> dict[str, str]:
    """Model names and their one-line descriptions, in a stable order."""
    return {name: description for name, (_, description) in _MODELS.items()}


def make_model(name: str, *, horizon_steps: int | None = None, **params: Any) -> BaseForecaster:
    """A new, unfitted forecaster by name. ``params`` override constructor defaults.

    ``horizon_steps``, when given, sets ``max_horizon_steps`` of direct multi-horizon models (unless ``params``
    sets it), so they are trained for every lead they will be asked for.
    """
    try:
        factory, _ = _MODELS[name]
    except KeyError:
        raise ValueError(f"unknown forecaster {name!r}; known: {', '.join(_MODELS)}") from None
    model = factory(**params)
    if horizon_steps is not None and "max_horizon_steps" in model.get_params() and "max_horizon_steps" not in params:
        model.set_params(max_horizon_steps=int(horizon_steps))
    return model
