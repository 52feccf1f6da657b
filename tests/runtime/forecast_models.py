"""Deliberately bad forecasters for the refit-job tests, importable by name (``forecast_models:Zero``) in this process
and in spawned worker processes (which inherit ``sys.path``)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

import numpy as np

from forecast.base import DEFAULT_QUANTILES, BaseForecaster
from forecast.baselines import LastValue
from forecast.preprocessing import FloatArray


class Zero(BaseForecaster):
    """Always forecasts no demand at all: far worse than seasonal naive on any busy series."""

    def __init__(
        self,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        nonnegative: bool = True,
        clip_outliers: float | None = None,
    ) -> None:
        self.quantiles = quantiles
        self.nonnegative = nonnegative
        self.clip_outliers = clip_outliers

    def _fit(self, y: FloatArray) -> None:
        self.fitted_ = True

    def _predict(self, horizon: int) -> FloatArray:
        return np.zeros((len(self.levels_), horizon))


class FailsOnNegative(LastValue):
    """The last value, but its fit raises on a series holding a negative value (the test's marker)."""

    def _fit(self, y: FloatArray) -> None:
        if (y < 0).any():
            raise ValueError("negative request rate in the history")
        super()._fit(y)


class HangsOnNegative(LastValue):
    """The last value, but its fit never returns on a series holding a negative value."""

    def _fit(self, y: FloatArray) -> None:
        while (y < 0).any():
            time.sleep(0.05)
        super()._fit(y)


class DeafOnNegative(LastValue):
    """Like ``HangsOnNegative``, and it ignores SIGALRM first (as code stuck in C would): only killing its worker
    process stops it."""

    def _fit(self, y: FloatArray) -> None:
        if (y < 0).any():
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            while True:
                time.sleep(0.05)
        super()._fit(y)


class DiesOnNegative(LastValue):
    """The last value, but its fit kills its own process on a series holding a negative value (as an OOM kill or a
    crash in native code would)."""

    def _fit(self, y: FloatArray) -> None:
        if (y < 0).any():
            os._exit(137)
        super()._fit(y)
