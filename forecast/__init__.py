"""Demand forecasting for the GPU autoscaler: scikit-learn-style forecasters, backtests and model selection.

Importing the package is cheap on purpose: only the stdlib value types are loaded. The estimators (which need
numpy, scikit-learn, statsmodels) are imported on first attribute access, so ``from forecast import Forecast`` in the
controller's pure core does not pull in the scientific stack.
"""

from __future__ import annotations

import importlib
from typing import Any

from forecast.types import Forecast, ForecastQuality, assess_reliability, pinball_loss

# Public name -> submodule that defines it; loaded lazily (PEP 562).
_LAZY: dict[str, str] = {
    "BaseForecaster": "forecast.base",
    "LastValue": "forecast.baselines",
    "SeasonalNaive": "forecast.baselines",
    "HoltWinters": "forecast.statistical",
    "FourierARIMA": "forecast.statistical",
    "QuantileGBM": "forecast.gbm",
    "CountLevel": "forecast.smoothing",
    "fill_gaps": "forecast.preprocessing",
    "clip_outliers": "forecast.preprocessing",
    "detect_periods": "forecast.preprocessing",
    "rolling_origin_backtest": "forecast.backtest",
    "BacktestResult": "forecast.backtest",
    "select_model": "forecast.selection",
    "Selection": "forecast.selection",
    "make_model": "forecast.registry",
    "available_models": "forecast.registry",
}

__all__ = ["Forecast", "ForecastQuality", "assess_reliability", "pinball_loss", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forecast' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
